"""Tabletop simulator throughput: control steps per second, physics only and with both cameras at 64x64,
single env and a 2-worker AsyncVectorEnv (steps summed over workers)."""

from __future__ import annotations

import statistics
import time

import numpy as np

from wmrl.benchutil import finish


def _rate(env, steps: int, batched: bool, repeats: int) -> float:
    rates = []
    n = env.num_envs if batched else 1
    for r in range(repeats):
        env.reset(seed=r)
        t = time.perf_counter()
        for _ in range(steps):
            env.step(env.action_space.sample())
        rates.append(steps * n / (time.perf_counter() - t))
    return statistics.median(rates)


def main(quick: bool = False) -> dict:
    import sim
    from sim.tabletop.env import TabletopEnv

    steps, reps = (30, 2) if quick else (300, 3)
    out = {}
    for name, cams in (("physics", ()), ("render_2cam_64", ("front", "wrist"))):
        env = TabletopEnv("push-red", cameras=cams, max_episode_steps=10**6)
        out[f"steps_per_s_{name}"] = _rate(env, steps, False, reps)
        env.close()
        venv = sim.make_vector_env("push-red", 2, cameras=cams, max_episode_steps=10**6)
        out[f"steps_per_s_{name}_vec2"] = _rate(venv, steps, True, reps)
        venv.close()
    out["control_hz"] = 10
    out["realtime_factor_render"] = out["steps_per_s_render_2cam_64"] / 10
    return finish("sim", out, quick)
