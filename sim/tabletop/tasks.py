"""Language-conditioned task families of the tabletop suite: layouts, instructions, shaped rewards, success.

A task is a family and a cube colour (`push-red`); the zone, where the family has one, is drawn per episode and
named in the instruction, so the language carries information the policy needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from sim.tabletop.twin import CUBE_COLOURS, ZONE_COLOURS, TwinParams

FAMILIES = ("reach", "push", "lift", "place")
MAX_STEPS = {"reach": 40, "push": 80, "lift": 60, "place": 100}  # at 10 Hz
LIFT_HEIGHT = 0.08  # success: cube raised this far above its resting height
SUCCESS_RADIUS = 0.04  # cube centre within this distance of the zone centre (zones have radius 0.05)


@dataclass(frozen=True)
class TaskSpec:
    family: str
    colour: str

    @property
    def name(self) -> str:
        return f"{self.family}-{self.colour}"


def all_tasks() -> list[TaskSpec]:
    return [TaskSpec(f, c) for f in FAMILIES for c in CUBE_COLOURS]


def parse_task(name: str) -> TaskSpec:
    """'push-red' -> TaskSpec('push', 'red'); unknown names list the valid ones."""
    m = re.fullmatch(r"([a-z]+)-([a-z]+)", name)
    if not m or m.group(1) not in FAMILIES or m.group(2) not in CUBE_COLOURS:
        valid = ", ".join(t.name for t in all_tasks())
        raise ValueError(f"unknown task {name!r}; valid tasks: {valid}")
    return TaskSpec(m.group(1), m.group(2))


def instruction(spec: TaskSpec, zone: str) -> str:
    c = spec.colour
    return {
        "reach": f"reach the {c} cube",
        "push": f"push the {c} cube to the {zone} zone",
        "lift": f"lift the {c} cube",
        "place": f"put the {c} cube in the {zone} zone",
    }[spec.family]


_INSTRUCTION = re.compile(
    r"(?P<verb>reach|push|lift|put) the (?P<cube>[a-z]+) cube(?: (?:to|in) the (?P<zone>[a-z]+) zone)?"
)


def parse_instruction(text: str) -> tuple[str, str, str | None]:
    """Inverse of `instruction`: returns (family, cube colour, zone colour or None). Used by scripted experts,
    which read the language instruction like any other policy."""
    m = _INSTRUCTION.fullmatch(text.strip().lower())
    if not m:
        raise ValueError(f"cannot parse task instruction {text!r}")
    family = "place" if m["verb"] == "put" else m["verb"]
    return family, m["cube"], m["zone"]


def task_from_instruction(text: str) -> str:
    """The task name ('push-red') whose episodes carry this instruction."""
    family, cube, _ = parse_instruction(text)
    return f"{family}-{cube}"


@dataclass
class Layout:
    cube_xy: dict[str, np.ndarray]
    cube_yaw: dict[str, float]
    zone_xy: dict[str, np.ndarray]
    zone: str  # the zone named in the instruction (or a dummy for zone-less families)


def _segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    ab = b - a
    t = np.clip(np.dot(p - a, ab) / max(np.dot(ab, ab), 1e-9), 0.0, 1.0)
    return float(np.linalg.norm(p - (a + t * ab)))


@dataclass(frozen=True)
class Region:
    """Where a cell's zones and the push approach point may lie (the cubes' ranges are `TwinParams`'): the tabletop
    arm's reach by default; the SO-101 cell (`sim.so101`) passes its own, smaller one."""

    zone_x: tuple[float, float] = (0.28, 0.54)
    zone_y: tuple[float, float] = (-0.24, 0.24)
    behind_x: tuple[float, float] = (0.22, 0.6)
    behind_y: float = 0.26  # |y| bound


TABLETOP_REGION = Region()


def sample_layout(spec: TaskSpec, rng: np.random.Generator, p: TwinParams, max_tries: int = 1000,
                  region: Region = TABLETOP_REGION) -> Layout:
    """Rejection-sample non-overlapping cubes and zones. For push, the straight path from the target cube to its
    zone and the approach point behind the cube are kept clear of the other cubes, so every layout is solvable."""
    (x0, x1), (y0, y1) = p.cube_x_range, p.cube_y_range
    for _ in range(max_tries):
        xy = {c: np.array([rng.uniform(x0, x1), rng.uniform(y0, y1)]) for c in CUBE_COLOURS}
        pts = list(xy.values())
        if min(np.linalg.norm(a - b) for i, a in enumerate(pts) for b in pts[i + 1 :]) < 0.085:
            continue
        zones = {z: np.array([rng.uniform(*region.zone_x), rng.uniform(*region.zone_y)]) for z in ZONE_COLOURS}
        zp = list(zones.values())
        if np.linalg.norm(zp[0] - zp[1]) < 0.15:
            continue
        zone = ZONE_COLOURS[int(rng.integers(len(ZONE_COLOURS)))]
        target = xy[spec.colour]
        # cubes must not start inside any zone; the target must start well away from its own zone
        if min(np.linalg.norm(c - z) for c in pts for z in zp) < 0.085:
            continue
        if spec.family in ("push", "place") and np.linalg.norm(target - zones[zone]) < 0.14:
            continue
        if spec.family == "push":
            u = (zones[zone] - target) / np.linalg.norm(zones[zone] - target)
            behind = target - u * 0.08
            others = [xy[c] for c in CUBE_COLOURS if c != spec.colour]
            if any(_segment_distance(o, behind, zones[zone] + u * 0.03) < 0.075 for o in others):
                continue
            if not (region.behind_x[0] <= behind[0] <= region.behind_x[1] and abs(behind[1]) <= region.behind_y):
                continue
        yaw = {c: float(rng.uniform(-p.cube_yaw_range, p.cube_yaw_range)) for c in CUBE_COLOURS}
        return Layout(xy, yaw, zones, zone)
    raise RuntimeError("could not sample a valid layout; the workspace ranges in TwinParams are too tight")


@dataclass
class SceneState:
    """Privileged state the reward and success functions read."""

    ee: np.ndarray  # (3,)
    gripper_opening: float  # distance between the fingers (m)
    cube: np.ndarray  # (3,) target cube centre
    zone_xy: np.ndarray  # (2,) instructed zone centre
    grasped: bool  # both fingers touch the target cube
    half_size: float


def _reach_target(s: SceneState) -> np.ndarray:
    return s.cube + np.array([0.0, 0.0, s.half_size + 0.03])


def success(family: str, s: SceneState) -> bool:
    if family == "reach":
        return bool(np.linalg.norm(s.ee - _reach_target(s)) < 0.02)
    d_zone = float(np.linalg.norm(s.cube[:2] - s.zone_xy))
    if family == "push":
        return d_zone < SUCCESS_RADIUS
    if family == "lift":
        return bool(s.cube[2] - s.half_size > LIFT_HEIGHT)
    if family == "place":
        resting = s.cube[2] < s.half_size + 0.01
        released = s.gripper_opening > 2 * s.half_size + 0.01
        return d_zone < SUCCESS_RADIUS and resting and released
    raise ValueError(family)


def reward(family: str, s: SceneState) -> float:
    """Dense shaped reward in [0, 1]; 1 is reached at success."""
    if success(family, s):
        return 1.0
    near = 1.0 - np.tanh(10.0 * np.linalg.norm(s.ee - s.cube))
    d_zone = float(np.linalg.norm(s.cube[:2] - s.zone_xy))
    if family == "reach":
        return float(0.9 * (1.0 - np.tanh(10.0 * np.linalg.norm(s.ee - _reach_target(s)))))
    if family == "push":
        return float(0.2 * near + 0.7 * (1.0 - np.tanh(5.0 * d_zone)))
    if family == "lift":
        height = np.clip((s.cube[2] - s.half_size) / LIFT_HEIGHT, 0.0, 1.0)
        return float(0.3 * near + 0.2 * s.grasped + 0.4 * height)
    if family == "place":
        return float(0.2 * near + 0.2 * s.grasped + 0.5 * (1.0 - np.tanh(5.0 * d_zone)))
    raise ValueError(family)


def scene_from_state(task_text: str, ee: np.ndarray, opening: float, env_state: np.ndarray,
                     half_size: float = 0.02) -> tuple[str, SceneState]:
    """The task family and the `SceneState` that `success` and `reward` read, from observation-level quantities:
    end-effector xyz, gripper opening and `observation.environment_state` (cube centres, then zone centres, in
    `CUBE_COLOURS` and `ZONE_COLOURS` order). A world model's state channel predicts exactly these, so imagined
    success is the task's own definition applied to predicted state. `grasped` (contacts) is not observable here;
    it is approximated by "closed on the cube" (it enters only the lift and place rewards, never success)."""
    from sim.tabletop.twin import CUBE_COLOURS, ZONE_COLOURS

    family, colour, zone = parse_instruction(task_text)
    env_state = np.asarray(env_state, np.float64)
    cube = env_state[3 * CUBE_COLOURS.index(colour) : 3 * CUBE_COLOURS.index(colour) + 3]
    zones = env_state[3 * len(CUBE_COLOURS) :].reshape(-1, 2)
    zone_xy = zones[ZONE_COLOURS.index(zone)] if zone else np.zeros(2)
    ee = np.asarray(ee, np.float64)
    grasped = bool(np.linalg.norm(ee - cube) < 0.03 and opening < 2 * half_size + 0.012)
    return family, SceneState(ee=ee, gripper_opening=float(opening), cube=cube, zone_xy=zone_xy, grasped=grasped,
                              half_size=half_size)


def success_and_reward(tasks, ee: np.ndarray, opening: np.ndarray, env_state: np.ndarray,
                       half_size: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """Batched `success` and `reward` on observation-level state (B rows); see `scene_from_state`."""
    tasks = [tasks] * len(ee) if isinstance(tasks, str) else list(tasks)
    ok, rew = np.zeros(len(tasks), bool), np.zeros(len(tasks))
    for i, t in enumerate(tasks):
        family, s = scene_from_state(t, ee[i], float(opening[i]), env_state[i], half_size)
        ok[i], rew[i] = success(family, s), reward(family, s)
    return ok, rew
