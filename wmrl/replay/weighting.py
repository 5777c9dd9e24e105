"""Trajectory-weighted sampling for mixed-quality datasets (Hong et al. 2023, "Harnessing Mixed Offline RL Datasets
via Trajectory Weighting"): each transition is drawn with probability proportional to its episode's weight.

    return-weighted (RW):     w_i ∝ exp(G_hat_i / alpha),  G_hat = min-max normalised episode return
    advantage-weighted (AW):  w_i ∝ exp(A_hat_i / alpha),  A_i = G_i - V_hat(s_0,i), V_hat a least-squares linear fit
                              of G on the initial state, A_hat min-max normalised
Works with any agent that samples from the common replay (`EpisodeReplay.set_episode_weights`).
"""

from __future__ import annotations

import numpy as np

from wmrl.core.features import OBS_STATE, REWARD

MODES = ("none", "return", "advantage")


def trajectory_weights(replay, mode: str = "return", alpha: float = 0.1) -> dict[int, float]:
    if mode not in MODES:
        raise ValueError(f"weighting: expected one of {', '.join(MODES)}, got {mode!r}")
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    eids = list(replay.episodes)
    if mode == "none" or not eids:
        return {e: 1.0 for e in eids}
    G = np.array([replay.data[REWARD][lo : lo + T - 1].sum() for lo, T in (replay.episodes[e] for e in eids)], np.float64)
    score = G
    if mode == "advantage":
        s0 = np.stack([replay.data[OBS_STATE][replay.episodes[e][0]] for e in eids]).astype(np.float64)
        X = np.concatenate([s0, np.ones((len(s0), 1))], 1)
        coef, *_ = np.linalg.lstsq(X, G, rcond=None)
        score = G - X @ coef
    span = score.max() - score.min()
    norm = (score - score.min()) / span if span > 0 else np.zeros_like(score)
    w = np.exp((norm - 1.0) / alpha)  # shifted by the max: same proportions, no overflow
    return {e: float(x) for e, x in zip(eids, w)}


def apply_weighting(replay, mode: str, alpha: float = 0.1) -> dict[int, float]:
    weights = trajectory_weights(replay, mode, alpha)
    if mode != "none":
        replay.set_episode_weights(weights)
    return weights
