"""Why pixel policies cannot be ranked on generated frames: a two-stage pixel policy's estimator reading the world
model's frames, against the model's own state channel.

The policy (`estimated-state` with cameras) acts in the world model on its generated frames from the true
simulator's starts (the rank protocol's pairing). At every step its estimator's object estimate from the generated
frames is compared with the objects the state channel predicts for the same step (cube centres, xy, cm): the
perception gap the policy meets in imagination. Step 0 is the real start frame, so it shows the estimator's own
error level. The reference is the same policy in the true simulator: its estimate from rendered frames against the
true objects, step for step.

    wmrl bench estimator-on-generated-frames --json --options policy=FOLDER world_model=RUN data=DIR [episodes=16 steps=24]

With `windows=N` it also asks which generated pixels mislead the estimator (`open_loop`): on N fixed held-out
windows of the world model's data (`evaluate.fixed_windows`, seed 0) the model rolls out under the recorded actions
(16 steps, as imagination samples), and the estimator reads, at h1, h4, h8 and h16, the real frames, the generated
ones, each camera generated with the other real, and each camera's real frame with the generated pixels only where
the cubes are (every pixel whose ray meets a cube at its recorded place, `camera.cube_pixels`) or everywhere but
there. Its red-cube and mean cube xy errors against the recorded objects and against the state channel's own.
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


def which_pixels(model, estimator, data: Path, n_windows: int, horizons=(1, 4, 8, 16)) -> dict:
    """The open-loop split of the module docstring: {horizon: {frames read: {"red_true", "mean_true", "red_model",
    "mean_model"} (cm)}}."""
    import torch

    from world_models.video.camera import cube_pixels
    from world_models.video.evaluate import fixed_windows, recorded_points, rollout
    from world_models.video.train import load_split

    _, _, held = load_split(data, 0.1)
    H = max(horizons)
    wins = fixed_windows(held, n_windows, H, model.cfg.context, seed=0, ee_index=model.cfg.ee_index,
                         object_xyz=model.cfg.object_xyz)
    r = rollout(model, held, [(w["episode"], w["start"]) for w in wins], H, steps=1, seed=0)
    cams = list(model.cfg.cameras)
    key = {c: f"observation.images.{c}" for c in cams}
    points = recorded_points(model, {"observation.state": r["real_state"], "observation.environment_state": r["real_env"]})
    out = {}
    for h in horizons:
        real = {c: r["real"][key[c]][:, h - 1] for c in cams}
        gen = {c: r["pred"][key[c]][:, h - 1] for c in cams}
        cubes = {}
        for c in cams:  # where each camera sees a cube at its recorded place
            q = points[:, h - 1].float()
            hit = cube_pixels(q, model.cfg.camera_geometry[c], model.cfg.object_radius, *real[c].shape[1:3])
            cubes[c] = hit[:, 0, :, :, None].numpy()
        reads = {"real": real, "generated": gen}
        for c in cams:
            reads[f"generated_{c}_only"] = {o: gen[o] if o == c else real[o] for o in cams}
            reads[f"real_{c}_generated_cubes"] = {**real, c: np.where(cubes[c], gen[c], real[c])}
            reads[f"generated_{c}_real_cubes"] = {**real, c: np.where(cubes[c], real[c], gen[c])}
        row = {}
        for name, frames in reads.items():
            est = estimator.estimate(frames, r["real_state"][:, h - 1])
            row[name] = {}
            for ref, objects in (("true", r["real_env"][:, h - 1]), ("model", r["pred_env"][:, h - 1])):
                d = np.linalg.norm((est - objects)[:, :9].reshape(-1, 3, 3)[..., :2], axis=-1) * 100
                row[name][f"red_{ref}"], row[name][f"mean_{ref}"] = float(d[:, 0].mean()), float(d.mean())
        d = np.linalg.norm((r["pred_env"][:, h - 1] - r["real_env"][:, h - 1])[:, :9].reshape(-1, 3, 3)[..., :2], axis=-1) * 100
        row["state_channel_vs_true"] = {"red": float(d[:, 0].mean()), "mean": float(d.mean())}
        out[f"h{h}"] = row
    return out


def main(quick: bool = False, policy: str = "", world_model: str = "", data: str = "", episodes: int = 16,
         steps: int = 24, layer: str = "", windows: int = 0) -> dict:
    """`policy`: an estimated-state policy folder with cameras; `world_model`: a run with a state channel; `data`:
    its real episodes (default: its training data); `layer`: blend | rigid, how the model's fixed cameras show the
    objects (`WorldModelConfig.object_layer`; default: the model's own); `windows`: the open-loop split on that many
    held-out windows (module docstring; 0: none)."""
    import sim
    from policies.factory import PolicyConfig
    from world_models.env import make_imagination_env
    from world_models.factory import make_world_model
    from world_models.video.train import world_model_data

    if not policy or not world_model:
        raise ValueError("options policy=FOLDER and world_model=RUN are required")
    episodes, steps = (2, 3) if quick else (int(episodes), int(steps))
    t0 = time.time()
    model = make_world_model("video", world_model, object_layer=layer or None)
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
    out = {"policy": policy, "world_model": str(world_model), "object_layer": model.cfg.object_layer,
           "episodes": episodes, "steps": at,
           "generated_vs_model_cm": mean(generated), "real_vs_true_cm": mean(real),
           "live_episodes_generated": [int(np.isfinite(generated[t]).sum()) for t in at],
           "live_episodes_real": [int(np.isfinite(real[t]).sum()) for t in at],
           "minutes": (time.time() - t0) / 60}
    if int(windows):
        out["open_loop"] = which_pixels(model, pol.estimator, data, 4 if quick else int(windows), (1, 2) if quick else (1, 4, 8, 16))
        out["open_loop_windows"] = 4 if quick else int(windows)
        out["minutes"] = (time.time() - t0) / 60
    run = Path(policy).parents[1] if Path(policy).parent.name == "checkpoints" else Path(policy)  # RUN/checkpoints/last
    name = ("estimator-on-generated-frames" + (f"-{run.name}" if not quick else "")
            + (f"-layer-{layer}" if layer else ""))
    return finish(name, out, quick, command=f"wmrl bench estimator-on-generated-frames --json --options policy={policy} "
                  f"world_model={world_model}" + (f" data={data}" if data else "") + f" episodes={episodes} steps={steps}" + (f" layer={layer}" if layer else "")
                  + (f" windows={int(windows)}" if int(windows) else ""))
