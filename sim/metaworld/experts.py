"""Meta-World's own scripted policies (`metaworld.policies`, one hand-written controller per task) as wmrl experts.

Each policy maps Meta-World's 39-entry observation (our `observation.environment_state`) to an action, so it is
reactive like the tabletop expert: noise, perturbation segments, DART labels and DAgger apply unchanged.

Near-success failures (World-VLA-Loop's SANS data): for the 16 tasks whose policy steers to the goal it reads from
the observation (reach, push, pick-place and their wall variants, ...), the failure mode hands the policy a goal
moved `FAILURE_SHIFT` sideways, so the object ends just outside Meta-World's success radius (5 cm for most).
The other tasks have their targets written into the policy and have no failure mode: asking for one is an error.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from sim.metaworld.env import INSTRUCTIONS, task_of

# The tasks whose scripted policy steers to the goal it reads from the observation (metaworld 3.1.1's policies).
GOAL_READING = frozenset({"door-close", "hand-insert", "peg-insert-side", "pick-out-of-hole", "pick-place",
                          "pick-place-wall", "push-back", "push", "push-wall", "reach", "reach-wall", "soccer",
                          "stick-pull", "stick-push", "sweep-into", "sweep"})
FAILURE_SHIFT = 0.08  # m: beyond the 5 cm success radius, close enough to look like a near miss


@functools.cache
def _policy(task: str):
    from metaworld.policies import ENV_POLICY_MAP

    return ENV_POLICY_MAP[f"{task}-v3"]()


def has_failure_mode(task: str) -> bool:
    return task in GOAL_READING


def expert_action(text: str, state: np.ndarray, env_state: np.ndarray, failure: bool) -> np.ndarray:
    task = task_of(text)
    obs = np.asarray(env_state, np.float64).copy()
    if failure:
        if not has_failure_mode(task):
            raise ValueError(f"Meta-World task {task!r} has no near-success failure mode (its scripted policy does "
                             "not read the goal); record it with --failures 0")
        goal = obs[-3:]
        obs[-3] += FAILURE_SHIFT if goal[0] < 0 else -FAILURE_SHIFT  # towards the table's centre line
    with warnings.catch_warnings():  # Meta-World's `move` warns at every gain above 1 (its policies use 10-25)
        warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high")
        return np.asarray(_policy(task).get_action(obs), np.float64)


__all__ = ["INSTRUCTIONS", "expert_action", "has_failure_mode", "task_of"]
