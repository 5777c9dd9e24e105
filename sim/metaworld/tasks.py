"""Meta-World's success definitions on observation-level state, for imagination (a world model's state channel
predicts the state; success is then the suite's own rule applied to it, as `sim.tabletop.tasks` does for the
tabletop).

Meta-World's 39-entry observation (`observation.environment_state` here): hand xyz [0:3], gripper opening [3],
first object xyz [4:7] and quaternion [7:11], second object xyz [11:14] and quaternion [14:18], the previous frame's
first 18 entries [18:36], goal xyz [36:39]. Each v3 task's `evaluate_state` computes success from these (the
thresholds below are the package's); `RULES` holds the tasks whose success is such a distance. Other tasks have no
rule here: their world models use the frames path (`wmrl train-wm --no-state-channel`).
"""

from __future__ import annotations

import numpy as np

HAND, OBJ, GOAL = slice(0, 3), slice(4, 7), slice(36, 39)
OBJECT_XYZ = (4, 11)  # the two object centres a state channel predicts
ENV_ARM = 0  # [hand xyz, gripper opening] repeat at the start of the observation
ENV_PREVIOUS = (18, 18)  # the previous frame's first 18 entries
# Reach tasks measure the fingertips' centre (`tcp_center`), which sits this far from the observed hand position
# (measured: the spread over random motion and gripper states is below 0.6 mm)
TCP_OFFSET = np.array([0.0, 0.0, -0.045])

# task -> (what is measured, threshold in m); "hand"/"obj": Euclidean distance to the goal, "obj_z"/"obj_x": along
# one axis (button-press-topdown, door-open)
RULES: dict[str, tuple[str, float]] = {
    "reach": ("hand", 0.05),
    "reach-wall": ("hand", 0.05),
    "push": ("obj", 0.05),
    "push-wall": ("obj", 0.05),
    "pick-place": ("obj", 0.07),
    "pick-place-wall": ("obj", 0.07),
    "drawer-open": ("obj", 0.03),
    "button-press-topdown": ("obj_z", 0.024),
    "door-open": ("obj_x", 0.08),
}


def has_rule(task: str) -> bool:
    return task in RULES


def goal_error(task: str, env_state: np.ndarray) -> np.ndarray:
    """(B,) the quantity the task's success thresholds: distance (m) of the hand or the first object to the goal."""
    if task not in RULES:
        raise ValueError(f"Meta-World task {task!r} has no state rule; tasks with one: {', '.join(sorted(RULES))}")
    e = np.asarray(env_state, np.float64).reshape(-1, 39)
    what, _ = RULES[task]
    if what == "hand":
        return np.linalg.norm(e[:, HAND] + TCP_OFFSET - e[:, GOAL], axis=-1)
    if what == "obj":
        return np.linalg.norm(e[:, OBJ] - e[:, GOAL], axis=-1)
    axis = {"obj_x": 0, "obj_z": 2}[what]
    return np.abs(e[:, OBJ.start + axis] - e[:, GOAL.start + axis])


def success_and_reward(tasks, ee: np.ndarray, opening: np.ndarray, env_state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Batched `success` and a dense reward in [0, 1] (1 at success, 1 - tanh(10 * error) below the threshold's
    band) on observation-level state (B rows). `tasks`: Meta-World task names (one, or one per row). The hand is
    taken from `ee` (what a state channel predicts), not from the observation's copy."""
    env = np.array(env_state, np.float64).reshape(len(ee), 39)
    env[:, HAND] = np.asarray(ee, np.float64)
    tasks = [tasks] * len(env) if isinstance(tasks, str) else list(tasks)
    ok, rew = np.zeros(len(env), bool), np.zeros(len(env))
    for t in set(tasks):
        rows = np.array([i for i, x in enumerate(tasks) if x == t])
        err = goal_error(t, env[rows])
        ok[rows] = err <= RULES[t][1]
        rew[rows] = np.where(ok[rows], 1.0, 0.9 * (1.0 - np.tanh(10.0 * err)))
    return ok, rew
