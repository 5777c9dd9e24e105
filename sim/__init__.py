"""Simulated task suites. Importing `sim` registers every task in gymnasium's registry under `wmrl/`: the embedded
tabletop (`gymnasium.make("wmrl/tabletop-push-red-v0")`, its hidden-parameter "real" cell
`wmrl/tabletop-real-push-red-v0`) and, when the optional packages are installed, Meta-World (`wmrl/metaworld-push-v0`),
the tabletop on LeRobot's SO-101 arm (`wmrl/so101-reach-red-v0`) and LIBERO (`wmrl/libero-object-0-v0`).
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must be set before mujoco is imported

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

import sim.libero  # noqa: E402
import sim.metaworld  # noqa: E402
import sim.so101  # noqa: E402
from sim.tabletop.tasks import all_tasks  # noqa: E402
from sim.tabletop.tasks import task_from_instruction as tabletop_task_from_instruction  # noqa: E402
from wmrl.core.features import OBS_ENV_STATE  # noqa: E402

ENTRY_POINT = "sim.tabletop.env:TabletopEnv"


def env_ids() -> list[str]:
    tabletop = [f"wmrl/tabletop-{t.name}-v0" for t in all_tasks()] + [f"wmrl/tabletop-real-{t.name}-v0" for t in all_tasks()]
    return tabletop + sim.metaworld.env_ids() + sim.so101.env_ids() + sim.libero.env_ids()


def _register() -> None:
    for t in all_tasks():
        for suite, twin in (("tabletop", None), ("tabletop-real", "real")):
            env_id = f"wmrl/{suite}-{t.name}-v0"
            if env_id not in gym.registry:
                gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs={"task": t.name, "twin": twin})
    for env_id in sim.metaworld.env_ids():
        if env_id not in gym.registry:
            task = env_id.removeprefix("wmrl/metaworld-").removesuffix("-v0")
            gym.register(id=env_id, entry_point=sim.metaworld.ENTRY_POINT, kwargs={"task": task})
    for env_id in sim.so101.env_ids():
        if env_id not in gym.registry:
            task = env_id.removeprefix("wmrl/so101-").removesuffix("-v0")
            gym.register(id=env_id, entry_point=sim.so101.ENTRY_POINT, kwargs={"task": task})
    for env_id in sim.libero.env_ids():
        if env_id not in gym.registry:
            task = env_id.removeprefix("wmrl/libero-").removesuffix("-v0")
            gym.register(id=env_id, entry_point=sim.libero.ENTRY_POINT, kwargs={"task": task})


def resolve_task(task: str) -> str:
    """Accept 'push-red', 'tabletop-push-red', 'tabletop-real-push-red', 'metaworld-push', 'so101-reach-red',
    'libero-object-0' or a full gymnasium id; return the id. A suite's name without its package installed says how to install it."""
    ids = env_ids()
    for candidate in (task, f"wmrl/{task}-v0", f"wmrl/tabletop-{task}-v0", f"wmrl/{task}"):
        if candidate in ids:
            return candidate
    if task.removeprefix("wmrl/").startswith("metaworld-") and not sim.metaworld.available():
        raise ValueError(f"task {task!r} needs Meta-World: pip install 'wmrl[metaworld]'")
    if task.removeprefix("wmrl/").startswith("so101-") and not sim.so101.available():
        raise ValueError(f"task {task!r} needs the SO-101 model: pip install 'wmrl[so101]'")
    if task.removeprefix("wmrl/").startswith("libero-"):
        if not sim.libero.available():
            raise ValueError(f"task {task!r} needs LIBERO: pip install 'wmrl[libero]'")
        from sim.libero.env import parse_task

        parse_task(task.removeprefix("wmrl/").removeprefix("libero-").removesuffix("-v0"))  # names the valid ones
    short = sorted({i.removeprefix("wmrl/").removesuffix("-v0") for i in ids})
    raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(short)}")


def task_from_instruction(text: str) -> str:
    """The task name whose episodes carry this instruction ('push-red', 'metaworld-push'); ValueError if none."""
    if sim.metaworld.available():
        from sim.metaworld.env import task_of

        if (mw := task_of(text)) is not None:
            return f"metaworld-{mw}"
    if sim.libero.available():
        from sim.libero.env import task_of as libero_task_of

        if (lt := libero_task_of(text)) is not None:
            return f"libero-{lt}"
    return tabletop_task_from_instruction(text)


def has_task_rules(text: str) -> bool:
    """Whether a task's success and reward can be computed from observation-level state (`success_and_reward`):
    the tabletop's tasks, Meta-World's with a rule (`sim.metaworld.tasks.RULES`) and LIBERO's whose goals are all
    `In` a region on a body (`sim.libero.tasks`)."""
    task = task_from_instruction(text)
    if task.startswith("metaworld-"):
        from sim.metaworld.tasks import has_rule

        return has_rule(task.removeprefix("metaworld-"))
    if task.startswith("libero-"):
        from sim.libero.tasks import has_rule

        return has_rule(task.removeprefix("libero-"))
    return True


def success_and_reward(tasks, ee: np.ndarray, opening: np.ndarray, env_state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each task's own success and dense reward on observation-level state (B rows; `tasks`: one instruction or B),
    whichever suite it belongs to: what imagination reads from a world model's predicted state
    (`sim.tabletop.tasks` / `sim.metaworld.tasks` / `sim.libero.tasks`)."""
    from sim.tabletop.tasks import success_and_reward as tabletop_rules

    tasks = [tasks] * len(ee) if isinstance(tasks, str) else list(tasks)
    suite = [task_from_instruction(t) for t in tasks]
    mw = np.array([s.startswith("metaworld-") for s in suite], bool)
    lib = np.array([s.startswith("libero-") for s in suite], bool)
    if not (mw | lib).any():
        return tabletop_rules(tasks, ee, opening, env_state)
    ok, rew = np.zeros(len(tasks), bool), np.zeros(len(tasks))
    ee, opening = np.asarray(ee), np.asarray(opening)
    if mw.any():
        from sim.metaworld.tasks import success_and_reward as metaworld_rules

        env = np.asarray(env_state)[mw]
        ok[mw], rew[mw] = metaworld_rules([s.removeprefix("metaworld-") for s, m in zip(suite, mw) if m], ee[mw], opening[mw], env)
    if lib.any():  # LIBERO's bodies differ between tasks: one task's rows at a time
        from sim.libero.tasks import success_and_reward as libero_rules

        for text in {t for t, m in zip(tasks, lib) if m}:
            rows = np.array([t == text for t in tasks])
            ok[rows], rew[rows] = libero_rules(text, ee[rows], opening[rows], np.asarray([env_state[i] for i in np.flatnonzero(rows)]))
    rest = ~(mw | lib)
    if rest.any():
        ok[rest], rew[rest] = tabletop_rules([t for t, m in zip(tasks, rest) if m], ee[rest], opening[rest],
                                             np.asarray(env_state)[rest])
    return ok, rew


def make_env(task: str, **kwargs) -> gym.Env:
    return gym.make(resolve_task(task), disable_env_checker=True, **kwargs)


def episode_horizon(task: str) -> int:
    """The task's own episode length in control steps (its `max_episode_steps`): what imagined episodes of it last."""
    env = make_env(task, cameras=()).unwrapped
    try:
        return int(env.max_episode_steps)
    finally:
        env.close()


def true_steps_taken() -> int:
    """True-simulator steps taken in this process, every suite (RL in imagination reports that it stays 0)."""
    import sys

    from sim.tabletop.env import TabletopEnv

    mw = sys.modules.get("sim.metaworld.env")  # not imported: no Meta-World step can have been taken
    lib = sys.modules.get("sim.libero.env")
    return (TabletopEnv.steps_taken + (mw.MetaWorldEnv.steps_taken if mw is not None else 0)
            + (lib.LiberoEnv.steps_taken if lib is not None else 0))


def worker_start_method() -> str:
    """How simulator worker processes start: from a fork server that has imported `sim` (MuJoCo, gymnasium, the
    tasks) once, so each worker forks ready instead of a spawned interpreter importing them again (measured: ~1 s of
    CPU per spawned env). The server never renders and holds no GL context or torch thread pool, so forking it is
    safe, which forking this process is not. Spawn where there is no fork server (Windows)."""
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    mp.get_context("forkserver").set_forkserver_preload(["sim"])  # read when the server starts; a no-op after that
    return "forkserver"


def _make_registered(env_id: str, kwargs: dict) -> gym.Env:
    # Module-level (pickled by reference), so a spawned worker imports `sim` and with it the registrations.
    return gym.make(env_id, disable_env_checker=True, **kwargs)


def make_vector_env(task: str, num_envs: int = 1, asynchronous: bool = True, workers: int = 0,
                    **kwargs) -> gym.vector.VectorEnv:
    """A batched tabletop: `AsyncVectorEnv` (one process per env) or `SyncVectorEnv`, without autoreset: call
    `reset()` for new episodes (as `wmrl.eval.evaluate` does per batch). Why not NEXT_STEP: gymnasium 1.4's
    AsyncVectorEnv without shared memory (our observations hold text) keeps a worker's pending-autoreset flag across
    `reset()`, so the first step after a seeded reset silently became an unseeded reset that ignored the action, and
    recorded episodes began with a frame from another layout. The synchronous one clears that flag on `reset()` but
    refuses (asserts) to step an ended env without autoreset, which the evaluation loop does while the batch's
    other episodes run on: it keeps NEXT_STEP (the ended env's next step is an ignored reset).
    `workers` > 1: `sim.batched.BatchedVectorEnv`, the envs split over that many processes, each stepping its slice
    synchronously (the synchronous env's semantics; for hundreds of envs on a few cores)."""
    env_id = resolve_task(task)
    if workers > 1:
        from sim.batched import BatchedVectorEnv

        return BatchedVectorEnv(env_id, num_envs, min(workers, num_envs), **kwargs)
    fns = [functools.partial(_make_registered, env_id, kwargs) for _ in range(num_envs)]
    if asynchronous and num_envs > 1:
        return gym.vector.AsyncVectorEnv(fns, shared_memory=False, context=worker_start_method(),
                                         autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


def replay_open_loop(task: str, actions: np.ndarray, seed: int = 0, start_qpos: np.ndarray | None = None,
                     cube_shift: float = 0.0, shift_seed: int = 0, until_done: bool = True) -> tuple[bool, np.ndarray]:
    """Open-loop replay of an action sequence in the true simulator from the seeded start (or from a recorded
    episode's first `qpos`: the arm's start is the same in every episode, the cubes are set from it). `cube_shift`
    moves every cube this far (m) in a random horizontal direction first: the start a model that is exact up to
    that error would see, which gives the ceiling of open-loop metrics (pushing is chaotic: a 1 mm shift moves the
    pushed cube's end by centimetres). `until_done=False` replays every action past the episode's end.
    Returns (success on the way, final observation.environment_state)."""
    import mujoco

    from sim.tabletop.twin import CUBE_COLOURS

    env = make_env(task, cameras=()).unwrapped  # state only: no rendering needed
    env.reset(seed=seed)
    if not hasattr(env, "_cube_qpos") and (start_qpos is not None or cube_shift):
        env.close()
        raise ValueError(f"{task}: replay from a recorded qpos or with shifted cubes is the tabletop's; replay from a "
                         "seed instead")
    rng = np.random.default_rng(shift_seed)
    for c in CUBE_COLOURS if hasattr(env, "_cube_qpos") else ():
        a = env._cube_qpos[c]
        if start_qpos is not None:
            env.data.qpos[a : a + 7] = np.asarray(start_qpos, np.float64)[a : a + 7]
        ang = rng.uniform(0, 2 * np.pi)
        env.data.qpos[a : a + 2] += cube_shift * np.array([np.cos(ang), np.sin(ang)])
    mujoco.mj_forward(env.model, env.data)
    ok, obs = False, env._obs()
    for a in actions:
        obs, _, term, trunc, info = env.step(a)
        ok |= bool(info["success"])
        if until_done and (term or trunc):
            break
    env.close()
    return ok, obs[OBS_ENV_STATE]


def replay_in_true_sim(task: str, seed: int, actions: np.ndarray, cube_shift: float = 0.0, shift_seed: int = 0) -> bool:
    """Open-loop replay of an action sequence from the seeded start; True if the task succeeds on the way."""
    return replay_open_loop(task, actions, seed, cube_shift=cube_shift, shift_seed=shift_seed)[0]


_register()
