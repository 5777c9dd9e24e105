"""Measuring a video world model honestly: a fixed set of held-out windows split into motion and static, open-loop
rollouts under the recorded actions, PSNR/SSIM (whole frame and masked to the arm and objects) paired per window
against copy-last-frame with bootstrap confidence intervals, action controllability (Genie's Delta-t PSNR), state
errors in cm, success AUROC over pairs scored on the same number of steps, and side-by-side real/imagined videos.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE
from wmrl.datasets.episode_videos import write_clips
from world_models.video.model import VideoWorldModel, channel_state, scene_points


STATE, ENV_STATE = OBS_STATE, OBS_ENV_STATE


def psnr(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Per-image PSNR (dB) of uint8 images (..., H, W, 3); with `mask` (..., H, W) only over the masked pixels
    (images with an empty mask give NaN)."""
    se = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean(axis=-1)
    if mask is None:
        mse = se.mean(axis=(-2, -1))
    else:
        m = mask.astype(np.float64)
        n = m.sum(axis=(-2, -1))
        mse = np.where(n > 0, (se * m).sum(axis=(-2, -1)) / np.maximum(n, 1), np.nan)
    return 10 * np.log10(255.0**2 / np.maximum(mse, 1e-10))


def ssim(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-image SSIM (Wang et al. 2004) with an 7x7 uniform window on luminance, images uint8 (..., H, W, 3)."""
    from scipy.ndimage import uniform_filter

    def lum(x):
        return x.astype(np.float64) @ np.array([0.299, 0.587, 0.114])

    x, y = lum(a), lum(b)
    lead = x.shape[:-2]
    x, y = x.reshape(-1, *x.shape[-2:]), y.reshape(-1, *y.shape[-2:])
    f = lambda z: uniform_filter(z, size=(1, 7, 7))
    mx, my = f(x), f(y)
    vx, vy, cxy = f(x * x) - mx**2, f(y * y) - my**2, f(x * y) - mx * my
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return s.mean(axis=(-2, -1)).reshape(lead)


def bootstrap_ci(x: np.ndarray, n: int = 2000, seed: int = 0, stat=np.mean,
                 groups: np.ndarray | None = None) -> tuple[float, float]:
    """95% percentile-bootstrap interval of `stat` over the entries of x (NaNs dropped).

    `groups`: one label per entry (e.g. the episode a window comes from). Then whole groups are resampled (the cluster
    bootstrap) and `stat` is taken over all entries of the drawn groups: windows cut from one episode are not
    independent, so resampling them one by one gives intervals that are too narrow when there are few episodes."""
    x = np.asarray(x, np.float64)
    if groups is not None:
        groups = np.asarray(groups)
        if groups.shape != x.shape:
            raise ValueError(f"bootstrap_ci: groups must label every entry, got shapes {groups.shape} and {x.shape}")
        groups = groups[np.isfinite(x)]
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    if groups is None:
        boots = stat(x[rng.integers(0, len(x), (n, len(x)))], axis=1)
    else:
        _, label = np.unique(groups, return_inverse=True)
        members = [x[label == g] for g in range(label.max() + 1)]
        draws = rng.integers(0, len(members), (n, len(members)))
        if stat is np.mean:  # per-group sums and counts: the mean of a draw without concatenating it
            sums, counts = np.array([m.sum() for m in members]), np.array([len(m) for m in members])
            boots = sums[draws].sum(1) / counts[draws].sum(1)
        else:
            boots = np.array([stat(np.concatenate([members[g] for g in d])) for d in draws])
    return float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def paired_difference(a: np.ndarray, b: np.ndarray, sel: np.ndarray | None = None,
                      groups: np.ndarray | None = None) -> dict:
    """B minus A per item (e.g. per window, both measured on the same windows), over `sel` (all when None), NaNs
    dropped: the mean, its bootstrap 95% interval, the share of items B wins (ties count half) and their number.
    `groups` (one label per item, e.g. the window's episode): also `ci_groups`, the interval with whole groups
    resampled (`bootstrap_ci`), `group_wins` (the share of groups whose mean difference B wins) and `n_groups`."""
    d = np.asarray(b, np.float64) - np.asarray(a, np.float64)
    g = None if groups is None else np.asarray(groups)
    if g is not None and g.shape != d.shape:
        raise ValueError(f"paired_difference: groups must label every item, got shapes {g.shape} and {d.shape}")
    if sel is not None:
        d, g = d[sel], (None if g is None else g[sel])
    keep = np.isfinite(d)
    d, g = d[keep], (None if g is None else g[keep])
    if len(d) == 0:
        out = {"mean": float("nan"), "ci": [float("nan")] * 2, "wins": float("nan"), "n": 0}
        return out if g is None else {**out, "ci_groups": [float("nan")] * 2, "group_wins": float("nan"), "n_groups": 0}
    out = {"mean": float(d.mean()), "ci": list(bootstrap_ci(d)), "wins": float(((d > 0) + 0.5 * (d == 0)).mean()),
           "n": int(len(d))}
    if g is not None:
        per = np.array([d[g == k].mean() for k in np.unique(g)])
        out.update(ci_groups=list(bootstrap_ci(d, groups=g)), group_wins=float(((per > 0) + 0.5 * (per == 0)).mean()),
                   n_groups=int(len(per)))
    return out


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Probability that a positive outscores a negative (ties count half)."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels, bool)
    pos, neg = scores[labels], scores[~labels]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    return float(((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean())


def pair_auroc_ci(scores: np.ndarray, labels: np.ndarray, n: int = 2000, seed: int = 0) -> list[float]:
    """95% bootstrap interval of `auroc` over episode pairs (entries 2i and 2i+1 are a pair and are drawn together,
    as `success_pairs` lays them out)."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels, bool)
    if len(scores) % 2 or len(scores) != len(labels):
        raise ValueError(f"pair_auroc_ci: expected pairs of scores and labels, got {len(scores)} and {len(labels)}")
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(scores) // 2, (n, len(scores) // 2))
    idx = np.stack([2 * pick, 2 * pick + 1], -1).reshape(n, -1)
    boots = np.array([auroc(scores[i], labels[i]) for i in idx])
    boots = boots[np.isfinite(boots)]
    return [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))] if len(boots) else [float("nan")] * 2


def pair_auroc_difference(scores_a: np.ndarray, scores_b: np.ndarray, labels: np.ndarray, n: int = 2000,
                          seed: int = 0) -> dict:
    """B's AUROC minus A's on the same episode pairs (laid out as `pair_auroc_ci` reads them), with a 95% bootstrap
    interval that redraws the pairs once for both, so the two scorers are compared on each resample's same pairs."""
    a, b, labels = np.asarray(scores_a, np.float64), np.asarray(scores_b, np.float64), np.asarray(labels, bool)
    if not (len(a) == len(b) == len(labels)) or len(a) % 2:
        raise ValueError(f"pair_auroc_difference: expected equal numbers of paired scores, got {len(a)}, {len(b)}, {len(labels)}")
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(a) // 2, (n, len(a) // 2))
    idx = np.stack([2 * pick, 2 * pick + 1], -1).reshape(n, -1)
    boots = np.array([auroc(b[i], labels[i]) - auroc(a[i], labels[i]) for i in idx])
    boots = boots[np.isfinite(boots)]
    ci = [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))] if len(boots) else [float("nan")] * 2
    return {"mean": float(auroc(b, labels) - auroc(a, labels)), "ci": ci}


def held_level(p: np.ndarray, hold: int) -> np.ndarray:
    """Per-step probabilities (B, h) -> the level each step's last `hold` steps all reach (their minimum): a score
    that a one-step spike of the success head cannot raise. An episode's first hold - 1 steps cannot hold (0).
    hold=1 is `p` itself. Measured as a frames-path success readout (`wmrl bench world-model-frame-head`): on the
    demo's model it lowers the AUROC at every hold, so success stays read from the peak (hold 1)."""
    if int(hold) != hold or hold < 1:
        raise ValueError(f"hold: expected an integer >= 1, got {hold!r}")
    p = np.asarray(p, np.float64)
    if hold == 1:
        return p
    padded = np.concatenate([np.zeros((p.shape[0], int(hold) - 1)), p], 1)
    return np.lib.stride_tricks.sliding_window_view(padded, int(hold), axis=1).min(-1)


def matched_max(per_step: list[np.ndarray], n_steps, hold: int = 1) -> np.ndarray:
    """Each episode's score: the max of its per-step scores over its first n_steps[i] steps. Scoring both episodes
    of a success / near-success pair on the same number of steps keeps the score from reading episode length
    (success episodes end early; with whole-episode maxima a scorer of pure noise gets an AUROC well below 0.5).
    `hold`: the max of the level held for that many steps in a row (`held_level`)."""
    return np.array([np.max(held_level(np.asarray(x[:n])[None], hold)[0]) for x, n in zip(per_step, n_steps)])


def fixed_windows(held, n: int, length: int, K: int, seed: int = 0, motion_cm: float = 2.0,
                  ee_index: tuple[int, ...] = (5, 6, 7), object_xyz: tuple[int, ...] = (0, 3, 6)) -> list[dict]:
    """`n` (episode, start frame) windows whose `length` next frames lie in the episode, drawn by `seed` and sorted,
    so every run and baseline sees the same ones. A window is `motion` when the end-effector (`ee_index` inside
    observation.state) or any object (centres starting at `object_xyz` inside observation.environment_state; the
    defaults are the tabletop's, a model's config has its suite's) moves more than `motion_cm` over it, else
    `static`."""
    rng = np.random.default_rng(seed)
    eids = sorted(e for e, (lo, T) in held.episodes.items() if T >= length + 1)
    if not eids:
        raise ValueError(f"no held-out episode is long enough for horizon {length}")
    chosen = set()
    while len(chosen) < n:
        e = eids[rng.integers(len(eids))]
        T = held.episodes[e][1]
        chosen.add((int(e), int(rng.integers(0, T - length))))
        if len(chosen) >= sum(held.episodes[e][1] - length for e in eids):
            break
    out = []
    for e, t0 in sorted(chosen):
        lo = held.episodes[e][0]
        s = held.data[STATE][lo + t0 : lo + t0 + length + 1]
        ee = s[:, list(ee_index)]
        move = np.linalg.norm(ee[1:] - ee[:1], axis=-1).max()
        if ENV_STATE in held.data and object_xyz:
            env = held.data[ENV_STATE][lo + t0 : lo + t0 + length + 1][:, [o + k for o in object_xyz for k in range(3)]]
            env = env.reshape(length + 1, len(object_xyz), 3)
            move = max(move, np.linalg.norm(env[1:] - env[:1], axis=-1).max())
        out.append({"episode": e, "start": t0, "motion": bool(move * 100 > motion_cm)})
    return out


def window_inputs(model: VideoWorldModel, held, starts: list[tuple[int, int]], horizon: int) -> tuple[dict, dict, dict]:
    """What a rollout from each window starts with (context frames, anchor, state, task), the recorded actions
    (N, horizon, A), and the real future: frames per camera, state, environment state."""
    K = model.cfg.context
    cams = [f"observation.images.{c}" for c in model.cfg.cameras]
    d = held.data
    obs, anchor, real = {c: [] for c in cams}, {c: [] for c in cams}, {c: [] for c in cams}
    real[STATE], acts, st, env, tasks, env_real = [], [], [], [], [], []
    for e, t0 in starts:
        lo, _ = held.episodes[e]
        ctx_idx = np.maximum(np.arange(t0 - K + 1, t0 + 1), 0) + lo
        for c in cams:
            obs[c].append(d[c][ctx_idx])
            anchor[c].append(d[c][lo])
            real[c].append(d[c][lo + t0 + 1 : lo + t0 + 1 + horizon])
        acts.append(d[ACTION][lo + t0 : lo + t0 + horizon])
        real[STATE].append(d[STATE][lo + t0 + 1 : lo + t0 + 1 + horizon])
        st.append(d[STATE][lo + t0])
        tasks.append(held.vocab["task"][d["task"][lo + t0]])
        if ENV_STATE in d:
            env.append(d[ENV_STATE][lo + t0])
            env_real.append(d[ENV_STATE][lo + t0 + 1 : lo + t0 + 1 + horizon])
    start = {**{c: np.stack(v) for c, v in obs.items()}, STATE: np.stack(st), "task": tasks}
    if env:
        start[ENV_STATE] = np.stack(env)
        real[ENV_STATE] = env_real
    real = {k: np.stack(v) for k, v in real.items()}
    return {"obs": start, "anchor": {c: np.stack(v) for c, v in anchor.items()}}, {ACTION: np.stack(acts)}, real


def first_frame_inputs(model: VideoWorldModel, eps: list[dict], horizon: int | None = None) -> tuple[list[int], np.ndarray, dict]:
    """For replaying recorded episodes from their first frame (`eps`: per episode its arrays by feature name, `task`
    its instruction or one per step): each episode's steps, min(T - 1, horizon); the actions over them padded to the
    longest with each episode's last one (B, max, A); and the start observation `model.encode` takes (the
    environment state where every episode has it)."""
    T = [len(ep[ACTION]) - 1 if horizon is None else min(horizon, len(ep[ACTION]) - 1) for ep in eps]
    if min(T, default=0) < 1:
        raise ValueError(f"first_frame_inputs: every episode needs a step to replay, got steps {T}")
    Tm = max(T)
    acts = np.stack([np.concatenate([ep[ACTION][:t], np.repeat(ep[ACTION][t - 1 : t], Tm - t, 0)]) for ep, t in zip(eps, T)])
    obs = {**{c: np.stack([ep[c][0] for ep in eps]) for c in (f"observation.images.{k}" for k in model.cfg.cameras)},
           STATE: np.stack([ep[STATE][0] for ep in eps]),
           "task": [ep["task"] if isinstance(ep["task"], str) else ep["task"][0] for ep in eps]}
    if all(ENV_STATE in ep for ep in eps):
        obs[ENV_STATE] = np.stack([ep[ENV_STATE][0] for ep in eps])
    return T, acts, obs


def recorded_points(model: VideoWorldModel, real: dict) -> torch.Tensor:
    """The recorded [hand, object] points (..., 1 + k, 3) of recorded states (`window_inputs`' third value: a window's
    real future), as the state channel's `points` would be if it were exact."""
    x = channel_state(model.cfg, torch.as_tensor(np.asarray(real[OBS_STATE])).float(),
                      torch.as_tensor(np.asarray(real[OBS_ENV_STATE])).float())
    return scene_points(x, model.cfg.n_objects)


@torch.no_grad()
def rollout(model: VideoWorldModel, held, starts: list[tuple[int, int]], horizon: int, steps: int | None = None,
            shuffle_actions: bool = False, seed: int = 0, decode: bool = True, state_oracle: bool = False) -> dict:
    """Open-loop rollouts from real context frames under recorded actions. Returns predicted and real frames per
    camera (N, horizon, H, W, 3), predicted and real states (N, horizon, D) and, with a state channel, predicted and
    real environment states, the predicted end-effector, the ensemble disagreement and the [hand, objects] points
    (N, horizon, 1 + k, 3) (`points0` (N, 1 + k, 3): the start frame's); `pose` (N, horizon, pose_dim) the frames'
    commanded poses and `pose0` (N, pose_dim) the start frame's. `state_oracle`: the state channel is set to the
    recorded state at every chunk's end (`VideoWorldModel.reanchor_state`; it still predicts within a chunk), the
    frames stay generated: a diagnostic of how much of the frames' error the state channel's drift causes."""
    start, acts, real = window_inputs(model, held, starts, horizon)
    a = acts[ACTION]
    if shuffle_actions:  # the same action sequences, given to the wrong starts
        a = a[np.random.default_rng(seed).permutation(len(a))]
    if state_oracle and (model.state_channel is None or ENV_STATE not in real):
        raise ValueError("state_oracle: needs a world model with a state channel and data with the environment state")
    state = model.encode(start["obs"], anchor=start["anchor"])
    start_state = state
    g = torch.Generator(device=model.device).manual_seed(seed)
    chunks = []
    for i in range(0, horizon, model.cfg.chunk):
        state, p = model.step(state, torch.as_tensor(a[:, i : i + model.cfg.chunk]), steps=steps, generator=g)
        chunks.append(p)
        t = min(i + model.cfg.chunk, horizon) - 1  # the chunk's last frame (real[...][:, t] is t + 1 steps ahead)
        if state_oracle and t + 1 < horizon:
            prev = real[ENV_STATE][:, t - 1] if t > 0 else start["obs"][ENV_STATE]
            state = model.reanchor_state(state, real[STATE][:, t], real[ENV_STATE][:, t], prev)
    cat = lambda k: torch.cat([p[k] for p in chunks], 1)
    out = {"pred_state": cat(STATE).cpu().numpy(), "real_state": real[STATE], "success": cat("success").cpu().numpy(),
           "latents": cat("latents"), "pose": cat("pose").cpu().numpy(), "pose0": start_state["pose0"].cpu().numpy()}
    if ENV_STATE in chunks[0]:
        out.update(pred_env=cat(ENV_STATE).cpu().numpy(), real_env=real[ENV_STATE], ee=cat("ee").cpu().numpy(),
                   disagreement=cat("disagreement").cpu().numpy(), points=cat("points").cpu().numpy(),
                   points0=start_state["points0"].cpu().numpy())
    if decode:
        out["pred"] = model.decode(out["latents"], start_state, out["pose"], out.get("points"))
        out["real"] = {k: v for k, v in real.items() if k.startswith("observation.images.")}
    return out


def write_side_by_side(model: VideoWorldModel, held, out_dir: Path, n: int = 3, fps: int = 10) -> list[str]:
    """For n held-out episodes: real | imagined, every camera, whole episode from its first frame under the
    recorded actions. mp4 per episode and one GIF of all of them."""
    cams = [f"observation.images.{c}" for c in model.cfg.cameras]
    clips = []
    for e in list(held.episodes)[:n]:
        lo, T = held.episodes[e]
        r = rollout(model, held, [(e, 0)], T - 1)
        rows = [np.concatenate([held.data[c][lo + 1 : lo + T], r["pred"][c][0]], axis=2) for c in cams]  # real | imagined
        clips.append((f"real_vs_imagined_{e:03d}", np.concatenate(rows, axis=1).repeat(3, 1).repeat(3, 2)))
    return write_clips(clips, out_dir, "real_vs_imagined.gif", fps=fps, cols=min(3, len(clips)))
