"""The state channel's held-out error at fixed horizons, comparable across channels trained with any unroll.

A channel's own validation loss is measured over its training unroll (`--state-unroll`), so channels trained with
different unrolls cannot be compared by it. Here every channel is scored on the same held-out windows (its run's
held-out episodes, windows drawn with one seed) at each horizon: the unrolled loss's position error (cm per state
entry, Huber as in training, soft contact gate as in training), each member rolling on its own predictions. Per part, on one set of windows shared
by all members: the end-effector's and the cubes' Euclidean error (cm) of the ensemble mean at the horizon (median
over windows that run the whole horizon; the cubes' as the largest over the cubes of a window).

`split_horizon` (default 16; 0: none): the video benchmark's fixed held-out windows (`fixed_windows`, 240, seed 0)
rolled as imagination rolls them (the run's contact gate, the hand bounded to the workspace, the members' mean read
out), split as its frames are: `static` (nothing moves more than 2 cm), `motion`, and `edge` (the hand within 1 cm of
the workspace's horizontal bounds somewhere in the window). Per split: the hand's error (cm, largest over the window)
median and 90th percentile, and the cubes' error at the window's end (largest cube, median).

    wmrl bench state-channel-heldout-error --json --options world_models=RUN[,RUN] [horizons=1,4,12 windows=512]
"""

from __future__ import annotations

import time
from pathlib import Path

from wmrl.benchutil import finish


def part_errors(channel, x, a, m) -> tuple[float, float]:
    """x (1, N, h+1, D), a (1, N, h, A), mask (1, N, h): every member rolls the same windows h steps (soft gate);
    the median end-effector error and the median of each window's largest cube error (cm) of the members' mean,
    over the windows whose h steps are all real."""
    import torch

    M, h = channel.cfg.members, a.shape[2]
    cur = x[:, :, 0].expand(M, -1, -1)
    with torch.no_grad():
        for t in range(h):
            cur = channel.next(cur, a[:, :, t].expand(M, -1, -1), gate="soft")[0]
    mean, real, full = cur.mean(0), x[0, :, h], m[0].all(-1)
    ee = (mean[:, :3] - real[:, :3]).norm(dim=-1) * 100
    P = channel.cfg.n_arm_objects
    cubes = (mean[:, 4:P] - real[:, 4:P]).reshape(len(mean), -1, 3).norm(dim=-1).amax(-1) * 100
    return float(ee[full].median()), float(cubes[full].median())


def window_split_errors(model, held, n_windows: int, horizon: int) -> dict:
    """The hand's and cubes' error on the fixed held-out windows, rolled as imagination rolls them (see above)."""
    import numpy as np
    import torch

    from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE
    from world_models.video.evaluate import fixed_windows
    from world_models.video.model import bound_arm, channel_states

    cfg, sc = model.cfg, model.state_channel
    wins = fixed_windows(held, n_windows, horizon, cfg.context, seed=0, ee_index=cfg.ee_index, object_xyz=cfg.object_xyz)
    d, P = held.data, sc.cfg.n_arm_objects
    idx = np.stack([held.episodes[w["episode"]][0] + w["start"] + np.arange(horizon + 1) for w in wins])
    t = lambda k: torch.as_tensor(np.asarray(d[k])[idx], dtype=torch.float32)
    real = torch.stack([channel_states(cfg, s, e) for s, e in zip(t(OBS_STATE), t(OBS_ENV_STATE))])  # (N, h+1, D)
    acts = t(ACTION)
    x, gen, preds = real[None, :, 0].expand(cfg.state_members, -1, -1).clone(), torch.Generator().manual_seed(0), []
    for j in range(horizon):
        x = bound_arm(sc.rollout_step(x, acts[:, j], cfg.state_gate, gen), cfg)
        preds.append(sc.readout(x))
    pred = torch.stack(preds, 1)  # (N, h, D)
    hand = ((pred[..., :3] - real[:, 1:, :3]).norm(dim=-1).amax(1) * 100).numpy()
    cube = ((pred[:, -1, 4:P] - real[:, -1, 4:P]).reshape(len(wins), -1, 3).norm(dim=-1).amax(-1) * 100).numpy()
    lo, hi = torch.tensor(cfg.workspace_low[:2]), torch.tensor(cfg.workspace_high[:2])
    xy = real[..., :2]
    edge = (torch.minimum((xy - lo).abs(), (xy - hi).abs()).amin(-1) < 0.01).any(1).numpy()
    motion = np.array([w["motion"] for w in wins])
    out = {}
    for split, sel in (("static", ~motion), ("motion", motion), ("edge", edge), ("all", np.ones_like(motion))):
        out[split] = {"windows": int(sel.sum())}
        if sel.any():
            out[split].update(hand_error_cm_median=float(np.median(hand[sel])),
                              hand_error_cm_p90=float(np.percentile(hand[sel], 90)),
                              cube_error_cm_median=float(np.median(cube[sel])))
    return out


def main(quick: bool = False, world_models: str = "", horizons: str = "1,4,12", windows: int = 512,
         name: str = "", split_horizon: int = 16) -> dict:
    import torch

    from world_models.factory import make_world_model
    from world_models.video.train import WindowSampler, load_split, world_model_data

    runs = [r for r in world_models.split(",") if r]
    if not runs:
        raise ValueError("options world_models=RUN[,RUN...] is required (runs with a state channel)")
    hs = [int(h) for h in str(horizons).split(",")]
    if min(hs) < 1 or int(windows) < 1:
        raise ValueError(f"horizons and windows must be >= 1, got {horizons}, {windows}")
    n = 8 if quick else int(windows)
    t0, rows = time.time(), []
    for run in runs:
        model = make_world_model("video", run)
        if model.state_channel is None:
            raise ValueError(f"{run} has no state channel")
        _, _, held = load_split(world_model_data(run), 0.1)
        sampler = WindowSampler(held, "cpu", model.cfg)
        err, ee, cube = {}, {}, {}
        for h in hs:  # the same windows for every run of one dataset: one generator seed per horizon
            x, a, m = sampler.state_sequences(model.cfg.state_members, n, h, torch.Generator().manual_seed(0))
            with torch.no_grad():
                err[str(h)] = float(model.state_channel.unrolled_loss(x, a, m)[1]["state_huber_cm"])
            x, a, m = sampler.state_sequences(1, n, h, torch.Generator().manual_seed(1))
            ee[str(h)], cube[str(h)] = part_errors(model.state_channel, x, a, m)
        rows.append({"world_model": run, "error_cm_by_horizon": err, "ee_error_cm_by_horizon": ee,
                     "cube_error_cm_by_horizon": cube})
        if int(split_horizon):
            torch.manual_seed(0)
            rows[-1][f"windows_h{int(split_horizon)}"] = window_split_errors(model, held, 8 if quick else 240,
                                                                           int(split_horizon))
    out = {"horizons": hs, "windows": n, "rows": rows, "minutes": (time.time() - t0) / 60}
    label = name or "-".join(Path(r).name for r in runs)
    return finish(f"state-channel-heldout-error-{label}" if not quick else "state-channel-heldout-error", out, quick,
                  command=f"wmrl bench state-channel-heldout-error --json --options world_models={world_models} "
                          f"horizons={horizons} windows={n}" + (f" name={name}" if name else "")
                          + (f" split_horizon={split_horizon}" if int(split_horizon) != 16 else ""))
