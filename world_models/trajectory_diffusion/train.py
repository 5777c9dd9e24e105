"""Training windows from the common replay, and the training loop of the trajectory diffusion model.

A window is T frames of one episode that fits inside it: windows never cross episode boundaries, and since a
termination can only be an episode's last transition, a terminal can only end a window (the PGD reference's rule:
no done flag before a window's last step). Episodes shorter than T frames give no window.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from wmrl.core.checkpoint import commit_checkpoint, load_state, load_train_state, resume_checkpoint, save_train_state
from wmrl.core.features import ACTION, OBS_STATE, REWARD, TERMINATED
from world_models.trajectory_diffusion.model import TrajectoryDiffusion, TrajectoryDiffusionConfig


WINDOW_KEYS = (OBS_STATE, ACTION, REWARD, TERMINATED)


def window_starts(replay, horizon: int) -> np.ndarray:
    """Slots where a T-frame window starts and stays inside its episode."""
    starts = [np.arange(lo, lo + T - horizon + 1) for lo, T in replay.episodes.values() if T >= horizon]
    if not starts:
        longest = max((T for _, T in replay.episodes.values()), default=0)
        raise ValueError(f"no episode has {horizon} frames (the longest has {longest}); use a shorter --horizon")
    return np.concatenate(starts)


def gather_windows(replay, starts: np.ndarray, horizon: int) -> dict[str, np.ndarray]:
    idx = starts[:, None] + np.arange(horizon)[None]
    return {k: replay.data[k][idx] for k in WINDOW_KEYS}


def config_for(replay, action_low, action_high, **fields) -> TrajectoryDiffusionConfig:
    obs_dim, act_dim = replay.data[OBS_STATE].shape[1], replay.data[ACTION].shape[1]
    names = [f"obs{i}" for i in range(obs_dim)] + [f"act{i}" for i in range(act_dim)] + ["reward", "terminal"]
    return TrajectoryDiffusionConfig(obs_dim=obs_dim, act_dim=act_dim, action_low=tuple(map(float, action_low)),
                                     action_high=tuple(map(float, action_high)), channel_names=names, **fields)


def fit_trajectory_diffusion(model: TrajectoryDiffusion, replay, steps: int, batch_size: int = 256, lr: float = 3e-4,
                             out: str | Path | None = None, save_every: int = 1000, seed: int = 0,
                             progress: bool = True) -> dict:
    """Adam on the EDM loss over uniformly drawn windows; standardisation statistics come from all windows.
    With `out`, checkpoints every `save_every` steps and resumes from the last one."""
    T = model.cfg.horizon
    starts = window_starts(replay, T)
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    step0, losses = 0, []
    home = Path(out) if out else None
    ck = resume_checkpoint(home)[0] if home is not None else None
    if ck is not None:
        load_state(model, ck)
        st = load_train_state(ck, {"diffusion": opt})
        step0, losses = st["step"], st.get("losses", [])
        rng = np.random.default_rng(seed + step0)
    else:
        probe = starts if len(starts) <= 20_000 else rng.choice(starts, 20_000, replace=False)
        model.set_stats(model.raw_channels(gather_windows(replay, probe, T)))
    t0 = time.time()
    bar = tqdm(range(step0, steps), desc="trajectory diffusion", disable=not progress, initial=step0, total=steps)
    for step in bar:
        x0 = model.encode(gather_windows(replay, rng.choice(starts, batch_size), T))
        loss = model.loss(x0)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"trajectory diffusion loss is {loss.item()} at step {step}"
                                     + (f"; the last good checkpoint is in {home / 'last'}" if home else ""))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
        if home is not None and ((step + 1) % save_every == 0 or step + 1 == steps):
            commit_checkpoint(home, step + 1, lambda d: (
                model.save(d), save_train_state(d, step + 1, {"diffusion": opt}, losses=losses)))
    return {"steps": steps, "windows": int(len(starts)), "loss_first": float(np.mean(losses[:50])) if losses else None,
            "loss_last": float(np.mean(losses[-50:])) if losses else None, "seconds": time.time() - t0, "losses": losses}


__all__ = ["window_starts", "gather_windows", "config_for", "fit_trajectory_diffusion", "WINDOW_KEYS"]
