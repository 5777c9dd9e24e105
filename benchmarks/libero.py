"""LIBERO behind wmrl's env contract: scripted pick-and-place success on the official initial states, its failure
mode, a random baseline and throughput, with LIBERO's own renderer and our tabletop in the same run.

Per task (LIBERO-Object's ten and LIBERO-10's three basket tasks by default), on the first `episodes` official
initial states (LIBERO's evaluation protocol runs 50 per task), at the suite's evaluation horizon: our scripted
expert (`sim.libero.experts`; LIBERO ships none: its demonstrations are human teleoperation), the expert in failure
mode (released 12 cm beside the target: the metric's check, it should be near 0), and a uniform random policy (also
near 0). Success is LIBERO's own goal check, with Wilson 95% intervals.

Throughput: control steps per second of one env, state only and with both 64x64 cameras, against LIBERO's own
`OffScreenRenderEnv` rendering the same two cameras at 64x64 (robosuite's renderer, shadows on), and our tabletop
with two 64x64 cameras, in the same process.
"""

from __future__ import annotations

import time

import numpy as np

from wmrl.benchutil import env_steps_per_s, finish, tabletop_steps_per_s

TASKS = tuple(f"object-{i}" for i in range(10)) + ("10-0", "10-1", "10-7")


def run_episodes(task: str, policy, starts) -> np.ndarray:
    import sim
    from wmrl.eval.loop import evaluate

    env = sim.make_env(f"libero-{task}", cameras=()).unwrapped
    ok = np.array([evaluate(policy, env, 1, seed=int(s), record=False, progress=False).pc_success > 0 for s in starts])
    env.close()
    return ok


def throughput(task: str, steps: int) -> dict:
    import contextlib
    import io

    import sim
    from sim.libero.env import bddl_file, initial_states

    rng = np.random.default_rng(0)
    out = {}
    for name, cams in (("state_only", ()), ("two_cameras_64px", ("front", "wrist"))):
        env = sim.make_env(f"libero-{task}", cameras=cams).unwrapped
        out[f"steps_per_s_{name}"] = env_steps_per_s(env, rng.uniform(-1, 1, (steps, 7)))
        env.close()
    with contextlib.redirect_stdout(io.StringIO()):
        from libero.libero.envs import OffScreenRenderEnv

        own = OffScreenRenderEnv(bddl_file_name=str(bddl_file(task)), camera_heights=64, camera_widths=64)
    own.reset()
    own.set_init_state(initial_states(task)[0])
    own.step(np.zeros(7))  # makes the GL context: not timed
    n_own = max(10, steps // 4)
    t = time.perf_counter()
    for a in rng.uniform(-1, 1, (n_own, 7)):
        own.step(a)
    out["steps_per_s_libero_renderer_two_cameras_64px"] = n_own / (time.perf_counter() - t)
    own.close()
    out["steps_per_s_tabletop_two_cameras_64px"] = tabletop_steps_per_s(steps)
    out["render_speedup_vs_libero"] = out["steps_per_s_two_cameras_64px"] / out["steps_per_s_libero_renderer_two_cameras_64px"]
    out["tabletop_over_libero"] = out["steps_per_s_tabletop_two_cameras_64px"] / out["steps_per_s_two_cameras_64px"]
    return out


def main(quick: bool = False, episodes: int = 10, tasks: tuple[str, ...] = TASKS) -> dict:
    import gymnasium as gym

    import sim.libero
    from policies.random_policy import RandomPolicy
    from sim.experts import ScriptedExpert
    from wmrl.eval.loop import wilson_interval

    if not sim.libero.available():
        raise RuntimeError("LIBERO is not installed: pip install 'wmrl[libero]'")
    t0 = time.time()
    if quick:
        episodes, tasks = 2, ("object-0",)
    if isinstance(tasks, str):
        tasks = tuple(tasks.split(","))
    starts = np.arange(int(episodes))  # official initial states 0..episodes-1
    per_task = {}
    for task in tasks:
        row = {}
        runs = {"expert": ScriptedExpert(seed=0), "expert_failure_mode": ScriptedExpert(failure_prob=1.0, seed=0),
                "random": RandomPolicy(gym.spaces.Box(-1, 1, (7,), np.float32), seed=0)}
        for name, policy in runs.items():
            ok = run_episodes(task, policy, starts if name == "expert" else starts[: max(2, len(starts) // 2)])
            lo, hi = wilson_interval(int(ok.sum()), len(ok))
            row[name] = {"success": float(ok.mean()), "episodes": int(len(ok)), "success_ci95": [lo, hi],
                         "outcomes": "".join("1" if o else "0" for o in ok)}
        per_task[task] = row
        print(task, {k: v["success"] for k, v in row.items()}, flush=True)
    result = {
        "benchmark": "libero",
        "initial_states_per_task": int(episodes),
        "tasks": per_task,
        "expert_success_median": float(np.median([r["expert"]["success"] for r in per_task.values()])),
        "expert_success_pooled": float(np.mean([r["expert"]["success"] for r in per_task.values()])),
        "failure_mode_success_max": float(max(r["expert_failure_mode"]["success"] for r in per_task.values())),
        "random_success_max": float(max(r["random"]["success"] for r in per_task.values())),
        "throughput": throughput(tasks[0], 40 if quick else 300),
        "seconds": time.time() - t0,
    }
    return finish("libero", result, quick)
