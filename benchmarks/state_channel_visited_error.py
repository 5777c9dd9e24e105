"""Where the state channel errs: on the recorded data's states, or on the states its own imagination visits?

A model can fit the recorded episodes better and still let the scripted expert succeed less often in imagination
(README, world model: 1,200 episodes vs 300). This separates the two kinds of error. For each model listed, the noisy
expert (noise 0.1) acts closed-loop in its state channel from `starts` fresh layouts (one ensemble member per
episode, as state DAgger imagines) and every `every`-th imagined scene is kept; the true simulator is put in those
scenes and the expert's true `length`-step continuation is recorded (`world_models/video/state_dagger.py`). The
scenes of all models are pooled, so every model is scored on the same true continuations; `length`-step windows of
the held-out recorded episodes are the data's side. Each model unrolls its channel from the true first state under
the recorded actions exactly as a rollout does (hard contact gates, the hand kept in the workspace, ensemble mean).

Per model and set: the cubes' mean position error (cm) after 1 step and after the last step (median, mean with a
bootstrap 95% interval over continuations), the hand's, and two contact mistakes per continuation: a cube the
channel moves more than 1 cm that truly stayed within 5 mm (`dragged`) and one that truly moved more than 1 cm
that the channel left within 5 mm (`missed`); and for cubes that truly moved more than 1 cm, how far along their
true displacement the channel carried them (`travel_ratio`: 1 all the way, below 1 a shrunk push). Every model
after the first also gets its paired difference in the last-step cube error (this model minus the first, same
continuations, bootstrap 95% interval). The trivial baseline each model must beat: every cube held still (`still`
row, the last-step error of predicting no motion).

    wmrl bench state-channel-visited-error --json --options world_models=RUN_A,RUN_B [starts=100 length=12]
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from wmrl.benchutil import finish

MOVED, STILL = 0.01, 0.005  # m: a cube counts as moved beyond MOVED and as still within STILL over a continuation


def episodes_from_replay(replay, length: int, stride: int) -> list[dict]:
    """`length`+1-frame windows, every `stride` frames, of each episode of a replay, as continuation episodes; windows
    in which a cube has left the table are dropped (it falls without end; training masks them, and the visited
    continuations refuse them)."""
    from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE
    from wmrl.core.arm import OFF_TABLE_Z

    out = []
    for first, n in replay.episodes.values():
        for t in range(first, first + n - length, stride):
            w = {k: np.asarray(replay.data[k][t : t + length + 1]) for k in (OBS_STATE, OBS_ENV_STATE, ACTION)}
            if (w[OBS_ENV_STATE][:, 2:9:3] > OFF_TABLE_Z).all():
                out.append(w)
    return out


@torch.no_grad()
def unroll_errors(model, episodes: list[dict], length: int) -> dict[str, np.ndarray]:
    """Per episode: cube and hand errors (m) after the first and the last step of the channel's rollout from the true
    first state under the recorded actions, and the dragged/missed cube counts over the episode."""
    from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE
    from world_models.video.model import bound_arm, channel_states

    cfg, ch = model.cfg, model.state_channel
    n_c = ch.cfg.n_cubes
    keep = [e for e in episodes if len(e[ACTION]) == length + 1]  # continuations cut short by success are dropped
    x_true = torch.stack([channel_states(cfg, torch.as_tensor(e[OBS_STATE]), torch.as_tensor(e[OBS_ENV_STATE]))
                          for e in keep])  # (N, L+1, D); a window's first frame taken at rest
    acts = torch.stack([torch.as_tensor(e[ACTION][:length]) for e in keep])  # (N, L, A)
    x = x_true[:, 0][None].expand(ch.cfg.members, -1, -1).contiguous()
    preds = []
    for t in range(length):
        x = bound_arm(ch.rollout_step(x, acts[:, t]), cfg)
        preds.append(ch.readout(x))
    pred = torch.stack(preds, 1)  # (N, L, D)
    cube = lambda v: v[..., 4 : 4 + 3 * n_c].reshape(*v.shape[:-1], n_c, 3)  # noqa: E731
    c_err = (cube(pred) - cube(x_true[:, 1:])).norm(dim=-1).mean(-1)  # (N, L): mean over cubes
    h_err = (pred[..., :3] - x_true[:, 1:, :3]).norm(dim=-1)
    true_move = (cube(x_true[:, -1]) - cube(x_true[:, 0])).norm(dim=-1)  # (N, cubes)
    pred_move = (cube(pred[:, -1]) - cube(x_true[:, 0])).norm(dim=-1)
    # how far the channel carries a truly moved cube along its true path (1: all the way; a mean model shrinks kicks)
    true_d, pred_d = cube(x_true[:, -1]) - cube(x_true[:, 0]), cube(pred[:, -1]) - cube(x_true[:, 0])
    ratio = (pred_d * true_d).sum(-1) / true_move.clamp(min=1e-9) ** 2
    return {"cube_h1": c_err[:, 0].numpy(), "cube_end": c_err[:, -1].numpy(), "hand_h1": h_err[:, 0].numpy(),
            "hand_end": h_err[:, -1].numpy(), "dragged": ((pred_move > MOVED) & (true_move < STILL)).sum(-1).numpy(),
            "missed": ((true_move > MOVED) & (pred_move < STILL)).sum(-1).numpy(),
            "travel_ratio": ratio[true_move > MOVED].numpy(),
            "cube_end_still": (cube(x_true[:, :1]) - cube(x_true[:, -1:])).norm(dim=-1).mean(-1)[:, 0].numpy()}


def bootstrap_ci(v: np.ndarray, n: int = 2000, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (n, len(v)))].mean(1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def summarise(err: dict[str, np.ndarray]) -> dict:
    out = {"n": int(len(err["cube_end"]))}
    for k in ("cube_h1", "cube_end", "hand_h1", "hand_end"):
        cm = err[k] * 100
        out[f"{k}_cm_median"], out[f"{k}_cm_mean"], out[f"{k}_cm_mean_ci"] = float(np.median(cm)), float(cm.mean()), bootstrap_ci(cm)
    out["dragged_per_continuation"], out["missed_per_continuation"] = float(err["dragged"].mean()), float(err["missed"].mean())
    tr = err["travel_ratio"]
    out["moved_cubes"] = int(len(tr))
    out["travel_ratio_median"] = float(np.median(tr)) if len(tr) else None
    out["travel_ratio_mean_ci"] = bootstrap_ci(np.clip(tr, -2, 3)) if len(tr) else None  # clipped: glancing pushes
    return out


def main(quick: bool = False, world_models: str = "", starts: int = 100, length: int = 12, every: int = 3,
         name: str = "") -> dict:
    """`name`: the result file's label (default: the runs' folder names)."""
    from world_models.factory import make_world_model
    from world_models.video.state_dagger import imagined_visits, true_continuations
    from world_models.video.train import load_split, world_model_data

    runs = [r for r in world_models.split(",") if r]
    if not runs:
        raise ValueError("options world_models=RUN[,RUN...] is required (runs with a state channel)")
    if length < 1 or starts < 1 or every < 1:
        raise ValueError(f"starts, length and every must be >= 1, got {starts}, {length}, {every}")
    n = 3 if quick else int(starts)
    seeds = list(range(80_000, 80_000 + n))  # apart from the closed-loop benchmark's 70,000+ and DAgger's 1,000,000+
    t0 = time.time()
    models = [make_world_model("video", r) for r in runs]  # a list: the same run may be listed twice
    for r, m in zip(runs, models):
        if m.state_channel is None:
            raise ValueError(f"{r} has no state channel")
    splits = [load_split(world_model_data(r), 0.1) for r in runs]
    scenes, visits = [], []
    for r, m, (_, train, _) in zip(runs, models, splits):
        kept, success = imagined_visits(m, train, "push-red", seeds, 0.1, int(every), seed=0)
        visits.append({"world_model": r, "scenes": len(kept), "imagined_success": success})
        scenes += kept
    visited, refused = true_continuations("push-red", scenes, 0.1, int(length), seed=0)
    recorded = episodes_from_replay(splits[0][2], int(length), int(every))
    out: dict = {"task": "push-red", "policy": "scripted expert, noise 0.1", "starts": n, "length": int(length),
                 "every": int(every), "visited_scenes": len(scenes), "visited_continuations": len(visited),
                 "visited_refused": refused, "recorded_windows": len(recorded), "visits": visits, "rows": []}
    for which, eps in (("visited", visited), ("recorded", recorded)):
        errs = [unroll_errors(m, eps, int(length)) for m in models]
        for r, err in zip(runs, errs):
            d = (err["cube_end"] - errs[0]["cube_end"]) * 100  # this model minus the first, continuation by continuation
            out["rows"].append({"world_model": r, "set": which, **summarise(err),
                                "paired_vs_first_cube_end_cm": {"mean": float(d.mean()), "ci": bootstrap_ci(d),
                                                                "share_better": float((d < 0).mean()),
                                                                "share_worse": float((d > 0).mean())}})
        still = errs[0]["cube_end_still"] * 100
        out["rows"].append({"world_model": "still (every cube held still)", "set": which, "n": int(len(still)),
                            "cube_end_cm_median": float(np.median(still)), "cube_end_cm_mean": float(still.mean())})
    out["minutes"] = (time.time() - t0) / 60
    label = name or "-".join(Path(r).parent.name if Path(r).name == "model" else Path(r).name for r in runs)
    return finish(f"state-channel-visited-error-{label}" if not quick else "state-channel-visited-error", out, quick,
                  command=f"wmrl bench state-channel-visited-error --json --options world_models={world_models} "
                          f"starts={n} length={length}" + (f" name={name}" if name else ""))
