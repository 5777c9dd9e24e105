"""Simulated task suites. Importing `sim` registers every tabletop task in gymnasium's registry under `wmrl/`:
`gymnasium.make("wmrl/tabletop-push-red-v0")`, and the hidden-parameter "real" cell `wmrl/tabletop-real-push-red-v0`.
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must be set before mujoco is imported

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from sim.tabletop.tasks import all_tasks  # noqa: E402

ENTRY_POINT = "sim.tabletop.env:TabletopEnv"


def env_ids() -> list[str]:
    return [f"wmrl/tabletop-{t.name}-v0" for t in all_tasks()] + [f"wmrl/tabletop-real-{t.name}-v0" for t in all_tasks()]


def _register() -> None:
    for t in all_tasks():
        for suite, twin in (("tabletop", None), ("tabletop-real", "real")):
            env_id = f"wmrl/{suite}-{t.name}-v0"
            if env_id not in gym.registry:
                gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs={"task": t.name, "twin": twin})


def resolve_task(task: str) -> str:
    """Accept 'push-red', 'tabletop-push-red', 'tabletop-real-push-red' or a full gymnasium id; return the id."""
    ids = env_ids()
    for candidate in (task, f"wmrl/{task}-v0", f"wmrl/tabletop-{task}-v0", f"wmrl/{task}"):
        if candidate in ids:
            return candidate
    short = sorted({i.removeprefix("wmrl/").removesuffix("-v0") for i in ids})
    raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(short)}")


def make_env(task: str, **kwargs) -> gym.Env:
    return gym.make(resolve_task(task), disable_env_checker=True, **kwargs)


def _make_registered(env_id: str, kwargs: dict) -> gym.Env:
    # Module-level (pickled by reference), so a spawned worker imports `sim` and with it the registrations.
    return gym.make(env_id, disable_env_checker=True, **kwargs)


def make_vector_env(task: str, num_envs: int = 1, asynchronous: bool = True, **kwargs) -> gym.vector.VectorEnv:
    """A batched tabletop: `AsyncVectorEnv` (one process per env) or `SyncVectorEnv`. Episodes autoreset on the
    next step (gymnasium's NEXT_STEP mode)."""
    env_id = resolve_task(task)
    fns = [functools.partial(_make_registered, env_id, kwargs) for _ in range(num_envs)]
    if asynchronous and num_envs > 1:
        return gym.vector.AsyncVectorEnv(fns, shared_memory=False, context="spawn")
    return gym.vector.SyncVectorEnv(fns)


def replay_in_true_sim(task: str, seed: int, actions: np.ndarray) -> bool:
    """Open-loop replay of an action sequence from the seeded start; True if the task succeeds on the way."""
    env = make_env(task, cameras=()).unwrapped  # state only: no rendering needed
    env.reset(seed=seed)
    ok = False
    for a in actions:
        _, _, term, trunc, info = env.step(a)
        ok |= bool(info["success"])
        if term or trunc:
            break
    env.close()
    return ok


_register()
