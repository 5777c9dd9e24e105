"""Measuring a video world model honestly: open-loop rollouts of held-out episodes under their recorded actions,
PSNR/SSIM per camera against the real frames, action controllability (Genie's Delta-t PSNR), proprioceptive error,
and side-by-side real/imagined videos."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from world_models.video.model import VideoWorldModel

STATE, ACTION = "observation.state", "action"


def psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-image PSNR (dB) of uint8 images (..., H, W, 3)."""
    mse = ((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean(axis=(-3, -2, -1))
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


def windows(held, n: int, length: int, K: int, seed: int = 0) -> list[tuple[int, int]]:
    """(episode id, start frame) pairs whose K context frames and `length` next frames all lie in the episode."""
    rng = np.random.default_rng(seed)
    eids = [e for e, (lo, T) in held.episodes.items() if T >= K + length]
    if not eids:
        raise ValueError(f"no held-out episode is long enough for horizon {length}")
    out = []
    for _ in range(n):
        e = eids[rng.integers(len(eids))]
        T = held.episodes[e][1]
        out.append((e, int(rng.integers(K - 1, T - length))))
    return out


@torch.no_grad()
def rollout(model: VideoWorldModel, held, starts: list[tuple[int, int]], horizon: int, steps: int | None = None,
            shuffle_actions: bool = False, seed: int = 0, decode: bool = True) -> dict:
    """Open-loop rollouts from real context frames under recorded actions. Returns predicted and real frames per
    camera (N, horizon, H, W, 3), predicted and real states (N, horizon, D), success probabilities (N, horizon)."""
    K, Hc = model.cfg.context, model.cfg.chunk
    cams = [f"observation.images.{c}" for c in model.cfg.cameras]
    ctx_imgs = {c: [] for c in cams}
    real = {c: [] for c in cams}
    acts, states, proprio, tasks = [], [], [], []
    for e, t0 in starts:
        lo, _ = held.episodes[e]
        for c in cams:
            ctx_imgs[c].append(held.data[c][lo + t0 - K + 1 : lo + t0 + 1])
            real[c].append(held.data[c][lo + t0 + 1 : lo + t0 + 1 + horizon])
        acts.append(held.data[ACTION][lo + t0 : lo + t0 + horizon])
        states.append(held.data[STATE][lo + t0 + 1 : lo + t0 + 1 + horizon])
        proprio.append(held.data[STATE][lo + t0])
        tasks.append(held.vocab["task"][held.data["task"][lo + t0]])
    acts = np.stack(acts)
    if shuffle_actions:  # the same action sequences, given to the wrong starts
        acts = acts[np.random.default_rng(seed).permutation(len(acts))]
    state = model.encode({**{c: np.stack(v) for c, v in ctx_imgs.items()}, STATE: np.stack(proprio), "task": tasks})
    lat, st, succ = [], [], []
    g = torch.Generator(device=model.device).manual_seed(seed)
    for i in range(0, horizon, Hc):
        state, p = model.step(state, torch.as_tensor(acts[:, i : i + Hc]), steps=steps, generator=g)
        lat.append(p["latents"])
        st.append(p[STATE])
        succ.append(p["success"])
    lat = torch.cat(lat, 1)
    out = {"pred_state": torch.cat(st, 1).cpu().numpy(), "real_state": np.stack(states),
           "success": torch.cat(succ, 1).cpu().numpy(), "latents": lat}
    if decode:
        out["pred"] = model.decode(lat)
        out["real"] = {c: np.stack(v) for c, v in real.items()}
    return out


def write_side_by_side(model: VideoWorldModel, held, out_dir: Path, n: int = 3, fps: int = 10) -> list[str]:
    """For n held-out episodes: real | imagined, every camera, whole episode from its first frame under the
    recorded actions. mp4 per episode and one GIF of all of them."""
    from wmrl.eval.video import write_clips

    K = model.cfg.context
    cams = [f"observation.images.{c}" for c in model.cfg.cameras]
    clips = []
    for e in list(held.episodes)[:n]:
        lo, T = held.episodes[e]
        horizon = T - 1
        # reset-like start: the first frame repeated as context
        ctx = {c: np.repeat(held.data[c][lo : lo + 1], K, 0)[None] for c in cams}
        state = model.encode({**ctx, STATE: held.data[STATE][lo : lo + 1], "task": [held.vocab["task"][held.data["task"][lo]]]})
        lat = []
        acts = held.data[ACTION][lo : lo + horizon][None]
        for i in range(0, horizon, model.cfg.chunk):
            state, p = model.step(state, torch.as_tensor(acts[:, i : i + model.cfg.chunk]))
            lat.append(p["latents"])
        pred = model.decode(torch.cat(lat, 1)[0])
        rows = [np.concatenate([held.data[c][lo + 1 : lo + 1 + horizon], pred[c]], axis=2) for c in cams]  # real | imagined
        clips.append((f"real_vs_imagined_{e:03d}", np.concatenate(rows, axis=1).repeat(3, 1).repeat(3, 2)))
    return write_clips(clips, out_dir, "real_vs_imagined.gif", fps=fps, cols=min(3, len(clips)))
