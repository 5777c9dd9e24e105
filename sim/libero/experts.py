"""A scripted pick-and-place expert for LIBERO's tasks whose goal is to put objects in or on something.

LIBERO ships no scripted policies (its demonstrations are human teleoperation, on the Hugging Face hub). This one
reads the privileged `observation.environment_state` (every body's position, `sim.libero.env`) and is reactive,
like the tabletop's: its action is a function of the current state alone, so noise, DART labels and DAgger apply
unchanged. For each goal predicate `(In|On object target)` in the task's BDDL file, in order, it hovers over the
object, descends until the hand just clears the object's top (the fingers then hold the top 2-3 cm, a bottle by
its cap), closes, lifts, carries it over the target, lowers it into the container or to just above the target's top and opens. A goal counts as done (and the next one is taken) when the object rests inside the target's
footprint (its half-width less 2 cm, at least `DONE_XY`) and not in the hand. Grasps are top-down with the
gripper's resting orientation (no rotation commands), which suits LIBERO-Object's cans, bottles, cartons and
boxes, except where the arm cannot reach down: flat boxes (cream cheese, butter) on the far side of the floor
(x > 5 cm) are below the lowest point the vertical hand reaches there. Bowls and drawers (LIBERO-Spatial, -Goal)
need rim grasps, pulls and turns that it does not do; asking it for such a task is an error naming the tasks it
covers.

Near-success failures (World-VLA-Loop's SANS data): in failure mode it sets the object down `FAILURE_SHIFT`
beside the target (towards the robot), so episodes end with the object just outside it.

Object sizes come from the task's MuJoCo model (collision geoms' boxes around each body at its initial state),
built once per task and process (a few seconds).
"""

from __future__ import annotations

import functools

import numpy as np

from sim.libero.env import task_of

HOVER = 0.10  # m above an object's top while moving over it
GRASP_BELOW_TOP = 0.03  # the hand (2.4 cm above the grasp point) must clear the top; the pads reach 2.5 cm below
GRASP_ABOVE_BOTTOM = 0.012
RELEASE_CLEARANCE = 0.04  # the held object's bottom this far above the target's top while carried over it
TALL = 0.10  # m: objects taller than this are set down on the container's floor
DROP_CLEARANCE = 0.03  # and this far above the container's floor or the target's top when released
DONE_XY = 0.03
XY_TOL = 0.01
FAILURE_SHIFT = 0.14  # m: beside the basket (7.9 cm half-width) or plate, so the goal check fails
GAIN = 12.0  # action per metre of error (an action of 1 commands 5 cm)
OPEN_WIDTH = 0.077  # finger opening (sum of both joints) with the gripper fully open
HELD_SLACK = 0.006  # closed on the object: the opening is within this of its width (still closing: wider)


@functools.cache
def _layout(task: str) -> dict:
    """Per task: the goal's (object index, target index) pairs into `observation.environment_state` and each body's
    extent (bottom, top) relative to its position and its width along the fingers' axis, from the task's model at
    its first official initial state."""
    import mujoco

    from libero.libero.envs.bddl_utils import robosuite_parse_problem
    from sim.libero.env import LiberoEnv, bddl_file

    goal = robosuite_parse_problem(str(bddl_file(task)))["goal_state"]
    env = LiberoEnv(task, cameras=())
    try:
        env.reset(options={"init_state": 0})
        names = env.object_names()
        m, d = env.lib.sim.model._model, env.lib.sim.data._data
        parent = m.body_parentid
        ext = []
        for b in env._bodies:
            def under(c: int) -> bool:
                while c != 0:
                    if c == b:
                        return True
                    c = int(parent[c])
                return False
            boxes = []
            for g in range(m.ngeom):
                if not under(int(m.geom_bodyid[g])) or not (m.geom_contype[g] or m.geom_conaffinity[g]):
                    continue
                c, h = m.geom_aabb[g][:3], m.geom_aabb[g][3:]
                corners = d.geom_xpos[g][:, None] + d.geom_xmat[g].reshape(3, 3) @ (c[:, None] + h[:, None] * np.array(
                    np.meshgrid([-1, 1], [-1, 1], [-1, 1])).reshape(3, -1))
                boxes.append((corners.min(1), corners.max(1)))
            lo, hi = min(b0[2] for b0, _ in boxes), max(b1[2] for _, b1 in boxes)
            # where the fingers close: the middle of the geoms reaching the top centimetre (a bottle's cap, a can's
            # rim), and the width along the fingers' axis (y, the resting hand's) of those reaching the pads
            near_top = [(b0, b1) for b0, b1 in boxes if b1[2] > hi - 0.01]
            in_pads = [(b0, b1) for b0, b1 in boxes if b1[2] > hi - GRASP_BELOW_TOP - 0.01]
            width_y = max(b1[1] for _, b1 in in_pads) - min(b0[1] for b0, _ in in_pads)
            top_centre = (np.min([b0 for b0, _ in near_top], 0) + np.max([b1 for _, b1 in near_top], 0)) / 2
            top = d.xmat[b].reshape(3, 3).T @ (top_centre - d.xpos[b])  # in the body's frame
            # how far from its centre something counts as on or in it: its half-width, less a margin
            radius = max(DONE_XY, min(max(b1[k] for _, b1 in boxes) - min(b0[k] for b0, _ in boxes) for k in (0, 1)) / 2 - 0.02)
            ext.append((lo - d.xpos[b][2], hi - d.xpos[b][2], width_y, top, radius))
    finally:
        env.close()
    pairs = []
    for pred in goal:
        if pred[0] not in ("in", "on") or pred[1] not in names:
            raise ValueError(f"LIBERO task {task!r}: the scripted expert does pick-and-place only; its goal {goal} "
                             f"holds {pred[0]!r}. Tasks it covers: {', '.join(covered_tasks())}")
        target = next((n for n in names if pred[2] == n or pred[2].startswith(n + "_")), None)
        if target is None:
            raise ValueError(f"LIBERO task {task!r}: goal target {pred[2]!r} is a region of the table, not a body")
        pairs.append((names.index(pred[1]), names.index(target), pred[0]))
    return {"pairs": pairs, "extent": ext}


def covered_tasks() -> list[str]:
    """The tasks this expert is meant for: LIBERO-Object's ten and LIBERO-10's three basket tasks."""
    return [f"object-{i}" for i in range(10)] + ["10-0", "10-1", "10-7"]


def has_failure_mode(task: str) -> bool:
    return task in covered_tasks()


def _rotate(q_wxyz: np.ndarray, v: np.ndarray) -> np.ndarray:
    w, x, y, z = q_wxyz / max(np.linalg.norm(q_wxyz), 1e-9)
    R = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                  [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                  [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
    return R @ v


def _toward(ee: np.ndarray, target: np.ndarray) -> np.ndarray:
    return np.clip(GAIN * (target - ee), -1.0, 1.0)


def expert_action(text: str, state: np.ndarray, env_state: np.ndarray, failure: bool) -> np.ndarray:
    task = task_of(text)
    if task is None:
        raise ValueError(f"not a LIBERO instruction: {text!r}")
    lay = _layout(task)
    ee, opening = np.asarray(state[:3], np.float64), float(state[6] - state[7])
    pos = np.asarray(env_state, np.float64).reshape(-1, 7)[:, :3]
    quat = np.asarray(env_state, np.float64).reshape(-1, 7)[:, 3:]
    action = np.zeros(7)
    for obj, tgt, kind in lay["pairs"]:
        (o_lo, o_hi, o_w, o_top, _), (t_lo, t_hi, _, _, t_r) = lay["extent"][obj], lay["extent"][tgt]
        o, t = pos[obj], pos[tgt].copy()
        top_xy = o[:2] + _rotate(quat[obj], o_top)[:2]
        if failure:  # beside the target, towards the robot (along x the open fingers stay clear of its rim)
            t[0] -= FAILURE_SHIFT
        grasp = np.array([top_xy[0], top_xy[1], max(o[2] + o_hi - GRASP_BELOW_TOP, o[2] + o_lo + GRASP_ABOVE_BOTTOM)])
        # at the grasp point: within 1 cm to start closing; closing fingers can push the hand up, so 3 cm once closing
        closing = opening < OPEN_WIDTH - 0.01
        in_hand = np.linalg.norm(grasp[:2] - ee[:2]) < 0.02 and abs(grasp[2] - ee[2]) < (0.03 if closing else 0.01)
        if not in_hand and np.linalg.norm(o[:2] - t[:2]) < t_r and o[2] + o_lo < t[2] + t_hi:
            continue  # this goal is met: take the next
        below = ee[2] - (o[2] + o_lo)  # the held object's bottom is this far below the hand
        # into a container ("in"): a tall object (a carton dropped from above the rim stayed wedged between the open
        # fingers) down to just above the floor, a short one half its height below the rim (in LIBERO-10's scenes
        # a can stopped 5 cm above the basket's lowest point); onto a target ("on"): just above its top; then open
        if kind == "in" or failure:
            floor = t[2] + t_lo + DROP_CLEARANCE
            drop_z = (floor if failure or o_hi - o_lo > TALL else max(floor, t[2] + t_hi - 0.5 * (o_hi - o_lo))) + below
        else:
            drop_z = t[2] + t_hi + DROP_CLEARANCE + below
        if in_hand and np.linalg.norm(ee[:2] - t[:2]) <= XY_TOL * 2:  # over the target: down, then release
            if ee[2] > drop_z + 0.015 and opening < min(o_w, OPEN_WIDTH) + HELD_SLACK:
                action[:3], action[6] = _toward(ee, np.array([t[0], t[1], drop_z])), 1.0
            else:
                action[6] = -1.0
            return action
        if in_hand and opening < min(o_w, OPEN_WIDTH) + HELD_SLACK:  # closed on it: carry it over the target
            carry_z = t[2] + t_hi + RELEASE_CLEARANCE + below
            goal = np.array([t[0], t[1], carry_z]) if ee[2] > carry_z - 0.03 else np.array([ee[0], ee[1], carry_z + 0.02])
            action[:3], action[6] = _toward(ee, goal), 1.0
            return action
        if in_hand:  # at the grasp point, open: close (stay put while the fingers close)
            action[6] = 1.0
            return action
        hover_z = o[2] + o_hi + HOVER
        if np.linalg.norm(ee[:2] - grasp[:2]) > XY_TOL:
            goal = np.array([grasp[0], grasp[1], hover_z]) if ee[2] > hover_z - 0.04 else np.array([ee[0], ee[1], hover_z])
        else:
            goal = grasp
        action[:3], action[6] = _toward(ee, goal), -1.0
        return action
    action[6] = -1.0  # every goal met: hold still, open
    return action
