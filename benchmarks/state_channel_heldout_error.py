"""The state channel's held-out error at fixed horizons, comparable across channels trained with any unroll.

A channel's own validation loss is measured over its training unroll (`--state-unroll`), so channels trained with
different unrolls cannot be compared by it. Here every channel is scored on the same held-out windows (its run's
held-out episodes, windows drawn with one seed) at each horizon: the unrolled loss's position error (cm per state
entry, Huber as in training, soft contact gate as in training), each member rolling on its own predictions.

    wmrl bench state-channel-heldout-error --json --options world_models=RUN[,RUN] [horizons=1,4,12 windows=512]
"""

from __future__ import annotations

import time
from pathlib import Path

from wmrl.benchutil import finish


def main(quick: bool = False, world_models: str = "", horizons: str = "1,4,12", windows: int = 512,
         name: str = "") -> dict:
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
        err = {}
        for h in hs:  # the same windows for every run of one dataset: one generator seed per horizon
            x, a, m = sampler.state_sequences(model.cfg.state_members, n, h, torch.Generator().manual_seed(0))
            with torch.no_grad():
                err[str(h)] = float(model.state_channel.unrolled_loss(x, a, m)[1]["state_huber_cm"])
        rows.append({"world_model": run, "error_cm_by_horizon": err})
    out = {"horizons": hs, "windows": n, "rows": rows, "minutes": (time.time() - t0) / 60}
    label = name or "-".join(Path(r).name for r in runs)
    return finish(f"state-channel-heldout-error-{label}" if not quick else "state-channel-heldout-error", out, quick,
                  command=f"wmrl bench state-channel-heldout-error --json --options world_models={world_models} "
                          f"horizons={horizons} windows={n}" + (f" name={name}" if name else ""))
