"""Why pixel policies cannot be ranked on generated frames: a two-stage pixel policy's estimator reading the world
model's frames, against the model's own state channel.

The policy (`estimated-state` with cameras) acts in the world model on its generated frames from the true
simulator's starts (the rank protocol's pairing). At every step its estimator's object estimate from the generated
frames is compared with the objects the state channel predicts for the same step (cube centres, xy, cm): the
perception gap the policy meets in imagination. Step 0 is the real start frame, so it shows the estimator's own
error level. The reference is the same policy in the true simulator: its estimate from rendered frames against the
true objects, step for step.

    wmrl bench estimator-on-generated-frames --json --options policy=FOLDER world_model=RUN data=DIR [episodes=16 steps=24]
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish

REPORT_STEPS = (0, 1, 2, 4, 8, 16, 23)


def cube_xy_error_cm(estimate: np.ndarray, objects: np.ndarray) -> np.ndarray:
    """Mean xy distance of the three cube centres (the object channel's first 9 values), per row, in cm."""
    d = (np.asarray(estimate) - np.asarray(objects))[:, :9].reshape(-1, 3, 3)[..., :2]
    return np.linalg.norm(d, axis=-1).mean(-1) * 100


def errors_per_step(policy, env, starts: dict | None, steps: int, seed: int) -> np.ndarray:
    """(steps, B) cube xy error of the policy's estimate against the env's `observation.environment_state` (NaN once
    an env's first episode has ended). `starts`: true-simulator observations to start a world model's env from."""
    from wmrl.core.features import OBS_ENV_STATE, OBS_STATE

    if starts is None:
        obs, _ = env.reset(seed=[seed + i for i in range(env.num_envs)])
    else:
        obs, _ = env.reset(options={"observations": starts})
    live = np.ones(env.num_envs, bool)
    out = np.full((steps, env.num_envs), np.nan)
    policy.reset()
    for t in range(steps):
        est = policy.estimator.estimate({c: obs[f"observation.images.{c}"] for c in policy.cfg.cameras}, obs[OBS_STATE])
        out[t, live] = cube_xy_error_cm(est, obs[OBS_ENV_STATE])[live]
        obs, _, term, trunc, _ = env.step(policy.select_action(obs))
        live &= ~(np.asarray(term) | np.asarray(trunc))
    return out


def main(quick: bool = False, policy: str = "", world_model: str = "", data: str = "", episodes: int = 16,
         steps: int = 24) -> dict:
    """`policy`: an estimated-state policy folder with cameras; `world_model`: a run with a state channel; `data`:
    its real episodes (default: its training data)."""
    import sim
    from policies.factory import PolicyConfig
    from world_models.env import make_imagination_env
    from world_models.factory import make_world_model
    from world_models.video.train import world_model_data

    if not policy or not world_model:
        raise ValueError("options policy=FOLDER and world_model=RUN are required")
    episodes, steps = (2, 3) if quick else (int(episodes), int(steps))
    t0 = time.time()
    model = make_world_model("video", world_model)
    if model.state_channel is None:
        raise ValueError(f"{world_model} has no state channel to compare the estimates with")
    data = Path(data) if data else world_model_data(world_model)
    true_env = sim.make_vector_env("push-red", episodes, asynchronous=False)
    try:
        pcfg = PolicyConfig(type="estimated-state", path=Path(policy))
        pol = pcfg.build(true_env, seed=0)
        if not pol.cfg.cameras:
            raise ValueError(f"{policy} reads no cameras: nothing to estimate from frames")
        starts, _ = true_env.reset(seed=list(range(episodes)))
        wm_env = make_imagination_env(model, data, episodes, steps + 1, sampling_steps=1)
        generated = errors_per_step(pol, wm_env, starts, steps, seed=0)
        real = errors_per_step(pcfg.build(true_env, seed=0), true_env, None, steps, seed=0)
    finally:
        true_env.close()
    at = [t for t in REPORT_STEPS if t < steps]
    mean = lambda a: [float(np.nanmean(a[t])) if np.isfinite(a[t]).any() else None for t in at]  # noqa: E731
    out = {"policy": policy, "world_model": str(world_model), "episodes": episodes, "steps": at,
           "generated_vs_model_cm": mean(generated), "real_vs_true_cm": mean(real),
           "live_episodes_generated": [int(np.isfinite(generated[t]).sum()) for t in at],
           "live_episodes_real": [int(np.isfinite(real[t]).sum()) for t in at],
           "minutes": (time.time() - t0) / 60}
    name = "estimator-on-generated-frames" + (f"-{Path(policy).name}" if not quick else "")
    return finish(name, out, quick, command=f"wmrl bench estimator-on-generated-frames --json --options policy={policy} "
                  f"world_model={world_model}" + (f" data={data}" if data else "") + f" episodes={episodes} steps={steps}")
