"""Scripted experts for every tabletop task family, with action noise and near-success failure modes.

The expert is a reactive, state-machine-free controller: each action is a function of the current observation
(privileged `observation.environment_state`, the proprioceptive state and the language instruction, which it parses
like any other policy). That makes it batchable and lets it recover from perturbations.

Near-success failures (`failure_prob`) teach world models what failure looks like (World-VLA-Loop's SANS data):
reach hovers 4.5 cm short, push stops the cube just outside the zone, lift grasps a few millimetres beside the
cube, place sets the cube down just outside the zone.
"""

from __future__ import annotations

import numpy as np

from sim.tabletop.env import EE_STEP
from sim.tabletop.tasks import parse_instruction
from sim.tabletop.twin import CUBE_COLOURS, ZONE_COLOURS

H = 0.02  # nominal cube half size
GRASP_Z = H + 0.01  # end-effector height (finger centre) for grasping and pushing
HOVER_Z = 0.09
CARRY_Z = 0.11
TOL = 0.012


def _move(ee: np.ndarray, target: np.ndarray, gripper: float, speed: float = 1.0) -> np.ndarray:
    return np.concatenate([np.clip((target - ee) / EE_STEP, -speed, speed), [gripper]])


def _approach(ee: np.ndarray, xy: np.ndarray, z: float, gripper: float) -> np.ndarray:
    """Go to (xy, z) travelling above the clutter: rise first, then move across, then descend."""
    if np.linalg.norm(ee[:2] - xy) > TOL:
        if ee[2] < HOVER_Z - 0.03:
            return _move(ee, np.array([ee[0], ee[1], HOVER_Z]), gripper)
        return _move(ee, np.array([xy[0], xy[1], max(HOVER_Z, z)]), gripper)
    return _move(ee, np.array([xy[0], xy[1], z]), gripper)


def _holding(ee: np.ndarray, opening: float, cube: np.ndarray) -> bool:
    return 2 * H - 0.01 < opening < 2 * H + 0.012 and np.linalg.norm(ee - cube) < 0.03


def _grasp(ee: np.ndarray, opening: float, grasp_point: np.ndarray) -> np.ndarray:
    """Open above the grasp point, descend, close."""
    at_xy = np.linalg.norm(ee[:2] - grasp_point[:2]) < TOL
    if at_xy and abs(ee[2] - grasp_point[2]) < TOL:
        return _move(ee, grasp_point, 1.0)  # close
    if at_xy and opening > 0.075:
        return _move(ee, grasp_point, -1.0)  # descend, open
    if at_xy and ee[2] < grasp_point[2] + 0.03:
        return _move(ee, np.array([ee[0], ee[1], HOVER_Z]), -1.0)  # re-open above the cube
    return _approach(ee, grasp_point[:2], HOVER_Z, -1.0)


PUSH_PHASES = ("done", "push", "realign", "approach")


def push_phase(ee: np.ndarray, cube: np.ndarray, goal: np.ndarray,
               failure: bool = False) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """Which part of a push the expert is in, from the hand `ee` (3,), the cube's centre (3,) and its zone (2,):
    `done` (the cube reached its stop), `push` (low, just behind the cube and in line with the push), `realign`
    (low and behind but off the line: the hand moves sideways at pushing height) or `approach` (anything else: rise,
    travel above the clutter, descend behind the cube). Also returns the push direction u, the stop point and the
    hand's offset across the push line."""
    u = goal - cube[:2]
    u = u / max(np.linalg.norm(u), 1e-6)
    stop = goal - u * (0.09 if failure else 0.0)  # failure: the cube stops just outside the zone
    rel = ee[:2] - cube[:2]
    along = float(np.dot(rel, u))
    lateral = rel - along * u
    if np.dot(stop - cube[:2], u) < 0.008:
        return "done", u, stop, lateral
    if ee[2] < GRASP_Z + 0.02 and -(H + 0.04) < along < -H and np.linalg.norm(lateral) < 0.015:
        return "push", u, stop, lateral
    if ee[2] < GRASP_Z + 0.02 and along < -H - 0.005:
        return "realign", u, stop, lateral
    return "approach", u, stop, lateral


def expert_action(task: str, state: np.ndarray, env_state: np.ndarray, failure: bool) -> np.ndarray:
    family, colour, zone = parse_instruction(task)
    ee, opening = state[5:8].astype(np.float64), float(state[4])
    cubes = env_state[:9].reshape(3, 3).astype(np.float64)
    zones = env_state[9:13].reshape(2, 2).astype(np.float64)
    cube = cubes[CUBE_COLOURS.index(colour)]
    goal = zones[ZONE_COLOURS.index(zone)] if zone else None

    if family == "reach":
        target = cube + np.array([0.0, 0.0, H + 0.03 + (0.045 if failure else 0.0)])
        return _move(ee, target, -1.0)

    if family == "lift":
        grasp_point = cube + np.array([0.0, 0.0, GRASP_Z - H])
        if failure:  # a grasp that misses by a few millimetres: fingers land beside the cube
            radial = cube[:2] / np.linalg.norm(cube[:2])
            grasp_point[:2] += radial * (H + 0.016)
        if _holding(ee, opening, cube):
            return _move(ee, np.array([ee[0], ee[1], 0.2]), 1.0)
        return _grasp(ee, opening, grasp_point)

    if family == "push":
        phase, u, stop, lateral = push_phase(ee, cube, goal, failure)
        behind = cube[:2] - u * (H + 0.022)
        if phase == "done":
            return _move(ee, np.array([ee[0], ee[1], HOVER_Z]), 1.0)  # back off upwards
        if phase == "push":
            step = min(0.015, float(np.dot(stop - cube[:2], u)) + 0.004)
            target_xy = ee[:2] + u * step - lateral
            return _move(ee, np.array([target_xy[0], target_xy[1], GRASP_Z]), 1.0)
        if phase == "realign":  # low and behind the cube: re-align sideways, no hop
            return _move(ee, np.array([behind[0], behind[1], GRASP_Z]), 1.0)
        return _approach(ee, behind, GRASP_Z, 1.0)

    if family == "place":
        target_xy = goal.copy()
        if failure:  # set the cube down just outside the zone
            target_xy[0] += 0.085 if goal[0] < 0.42 else -0.085
        resting = cube[2] < H + 0.01
        if resting and np.linalg.norm(cube[:2] - target_xy) < 0.02:
            return _move(ee, np.array([ee[0], ee[1], 0.2]), -1.0)  # released: retreat
        if _holding(ee, opening, cube):
            err = float(np.linalg.norm(cube[:2] - target_xy))
            offset = ee[:2] - cube[:2]
            if err > 0.03 and cube[2] < CARRY_Z - GRASP_Z + H - 0.03:
                return _move(ee, np.array([ee[0], ee[1], CARRY_Z]), 1.0, speed=0.6)  # lift before carrying
            if err > 0.008:  # carry (or re-centre) at the current height
                return _move(ee, np.array([*(target_xy + offset), max(ee[2], GRASP_Z)]), 1.0, speed=0.5)
            if cube[2] > H + 0.004:  # lower gently
                return _move(ee, np.array([*(target_xy + offset), ee[2] - min(0.02, cube[2] - H)]), 1.0)
            return _move(ee, ee, -1.0)  # open
        return _grasp(ee, opening, cube + np.array([0.0, 0.0, GRASP_Z - H]))

    raise ValueError(f"no scripted expert for task family {family!r}")
