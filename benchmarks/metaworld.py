"""Meta-World behind wmrl's env contract: scripted-policy success, near-success failures, a random baseline and
throughput, per task; rendering compared with Meta-World's own renderer in the same run.

Per task, on the same seeded starts (`episodes` of them, horizon 150): the suite's scripted policy clean and with
translational noise 0.3 (0.3 cm per step at Meta-World's 1 cm action scale) and perturbation segments (the data
mix `wmrl collect --perturbed` records), its failure mode (goal moved 8 cm; tasks whose policy reads the goal), and a
uniform random policy (the metric's check: it should be near 0). Success with Wilson 95% intervals; for the failure
mode also the median final distance to the goal (it should sit just outside the 5 cm success radius).

Throughput: control steps per second of one env, state only and with both 64x64 cameras, against Meta-World's own
`render_mode="rgb_array"` (its `MujocoRenderer`, the same 64x64 size, the corner2 camera, its default shadows and
multisampling) in the same process, as a ratio, and our tabletop (push-red, both cameras) in the same run.
"""

from __future__ import annotations

import time

import numpy as np

from wmrl.benchutil import env_steps_per_s, finish, tabletop_steps_per_s

TASKS = ("reach", "push", "pick-place", "drawer-open", "button-press-topdown", "door-open")


def run_episodes(task: str, policy, seeds) -> tuple[np.ndarray, np.ndarray]:
    """(success per episode, final distance to the goal in m: hand for reach, first object otherwise)."""
    import sim
    from sim.metaworld.env import goal_distance
    from wmrl.core.features import OBS_ENV_STATE, SUCCESS
    from wmrl.eval.loop import evaluate

    env = sim.make_env(f"metaworld-{task}", cameras=()).unwrapped
    eps = [evaluate(policy, env, 1, seed=int(s), record=True, progress=False).episodes[0] for s in seeds]
    env.close()
    return (np.array([bool(np.any(ep[SUCCESS])) for ep in eps]),
            np.array([goal_distance(task, ep[OBS_ENV_STATE][-1]) for ep in eps]))


def throughput(task: str, steps: int) -> dict:
    import warnings

    import sim
    from sim.metaworld.env import CAMERAS, _sawyer_class

    out = {}
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (steps, 4))
    for name, cams in (("state_only", ()), ("two_cameras_64px", ("front", "wrist"))):
        env = sim.make_env(f"metaworld-{task}", cameras=cams).unwrapped
        out[f"steps_per_s_{name}"] = env_steps_per_s(env, actions)
        env.close()
    # Meta-World's own renderer, one camera, same size
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        own = _sawyer_class(task)(render_mode="rgb_array", camera_name=CAMERAS["front"], width=64, height=64)
        own._partially_observable, own._set_task_called, own._freeze_rand_vec = False, True, False
        own.reset()
        own.render()  # makes the GL context: not timed
        n_own = max(20, steps // 6)  # about 30x slower: fewer steps for the same timing precision
        t = time.perf_counter()
        for a in actions[:n_own]:
            own.step(a.astype(np.float32))
            own.render()
        out["steps_per_s_metaworld_renderer_one_camera"] = n_own / (time.perf_counter() - t)
        own.close()
    env = sim.make_env(f"metaworld-{task}", cameras=("front",)).unwrapped
    out["steps_per_s_ours_one_camera"] = env_steps_per_s(env, actions)
    env.close()
    out["render_speedup_vs_metaworld"] = out["steps_per_s_ours_one_camera"] / out["steps_per_s_metaworld_renderer_one_camera"]
    out["steps_per_s_tabletop_two_cameras_64px"] = tabletop_steps_per_s(steps)
    out["tabletop_over_metaworld"] = out["steps_per_s_tabletop_two_cameras_64px"] / out["steps_per_s_two_cameras_64px"]
    return out


def main(quick: bool = False, episodes: int = 50, tasks: tuple[str, ...] = TASKS) -> dict:
    import gymnasium as gym

    import sim.metaworld
    from policies.random_policy import RandomPolicy
    from sim.experts import ScriptedExpert
    from sim.metaworld.experts import has_failure_mode
    from wmrl.eval.loop import wilson_interval

    if not sim.metaworld.available():
        raise RuntimeError("Meta-World is not installed: pip install 'wmrl[metaworld]'")
    t0 = time.time()
    if quick:
        episodes, tasks = 4, ("reach",)
    seeds = np.arange(episodes) + 7_000
    per_task = {}
    for task in tasks:
        row = {}
        runs = {"expert": ScriptedExpert(seed=0), "expert_noisy_perturbed": ScriptedExpert(noise=0.3, perturb_prob=1.0, seed=0),
                "random": RandomPolicy(gym.spaces.Box(-1, 1, (4,), np.float32), seed=0)}
        if has_failure_mode(task):
            runs["expert_failure_mode"] = ScriptedExpert(failure_prob=1.0, seed=0)
        for name, policy in runs.items():
            ok, dist = run_episodes(task, policy, seeds)
            lo, hi = wilson_interval(int(ok.sum()), len(ok))
            row[name] = {"success": float(ok.mean()), "success_ci95": [lo, hi], "median_final_goal_distance_cm": float(np.median(dist) * 100)}
        row.update(throughput(task, 60 if quick else 600))
        per_task[task] = row
    result = {
        "benchmark": "metaworld",
        "episodes_per_policy": int(episodes),
        "horizon": 150,
        "tasks": per_task,
        "expert_success_median": float(np.median([r["expert"]["success"] for r in per_task.values()])),
        "random_success_max": float(max(r["random"]["success"] for r in per_task.values())),
        "render_speedup_vs_metaworld_median": float(np.median([r["render_speedup_vs_metaworld"] for r in per_task.values()])),
        "tabletop_over_metaworld_median": float(np.median([r["tabletop_over_metaworld"] for r in per_task.values()])),
        "seconds": time.time() - t0,
    }
    return finish("metaworld", result, quick)
