"""GRPO in imagination as in WoVR (Jiang et al., 2025), on top of DeepSeekMath's GRPO (Shao et al., 2024, Eq. 3) with
DAPO's asymmetric clip (Yu et al., 2025).

Groups of G imagined rollouts share one start (a real first frame, or a real keyframe: WoVR's KIR); each rollout's
reward is its binary outcome (success within the horizon, `reward="success"`, as in WoVR and DeepSeekMath's outcome
supervision; `"progress"`: the sum of the world model's relative success reward, which can rank a success below a
failure that climbed further; `"shuffled"`: a placebo control, each rollout given the outcome of a random rollout
of its own group, so the updates are as many and as large but say nothing about which actions succeeded); the advantage is the reward standardised within the group; groups whose rollouts all
succeeded or all failed carry no signal and are dropped; the clipped surrogate (clip 1-0.2 .. 1+0.28) is averaged
over every valid step of the minibatch (DAPO's token-level mean, Eq. 8: a long rollout's steps count as much as a
short one's, instead of each rollout weighing the same). No value function.

`prepare` turns a batch of rollouts into targets (once per iteration); `loss` is the objective on a minibatch of
whole rollouts (`wmrl.rl.imagine.update` runs the epochs and minibatches for every algorithm).
"""

from __future__ import annotations

import numpy as np
import torch

from wmrl.rl.ppo import clipped_surrogate
from wmrl.rl.rollouts import Rollouts


def grpo_advantages(returns: torch.Tensor, success: torch.Tensor, group_size: int,
                    eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-standardised advantages (N,) and the rollouts to keep (N,): groups (consecutive blocks of G) whose
    rollouts all succeeded or all failed are dropped."""
    if returns.shape[0] % group_size:
        raise ValueError(f"{returns.shape[0]} rollouts do not split into groups of {group_size}")
    r = returns.reshape(-1, group_size).double()
    s = success.reshape(-1, group_size).bool()
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, unbiased=False, keepdim=True) + eps)
    mixed = s.any(1) & ~s.all(1)
    return adv.reshape(-1).float(), mixed[:, None].expand(-1, group_size).reshape(-1)


REWARDS = ("success", "progress", "shuffled")


def masked_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of x (T, N) over every valid step of every rollout (DAPO's token-level mean) -> scalar."""
    v = valid.float()
    return (x * v).sum() / v.sum().clamp(min=1)


def rollout_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of x (T, N) over each rollout's valid steps -> (N,)."""
    v = valid.float()
    return (x * v).sum(0) / v.sum(0).clamp(min=1)


def prepare(policy, ro: Rollouts, cfg) -> tuple[dict, np.ndarray, dict]:
    """One advantage per rollout, broadcast over its steps; only the rollouts of mixed groups are kept."""
    reward = getattr(cfg, "reward", "success")
    if reward not in REWARDS:
        raise ValueError(f"reward: expected one of {REWARDS}, got {reward!r}")
    outcome = ro.success.float()
    if reward == "shuffled":  # permuted within each group: the same groups are mixed, the labels are random
        g = outcome.reshape(-1, cfg.group_size)
        outcome = torch.gather(g, 1, torch.argsort(torch.rand(g.shape), dim=1)).reshape(-1)
    adv_r, keep = grpo_advantages(ro.returns if reward == "progress" else outcome, ro.success, cfg.group_size)
    adv = adv_r[None].expand(ro.actions.shape[0], -1)
    return {"adv": adv}, np.flatnonzero(keep.numpy()), {"kept_groups": float(keep.float().mean())}


def loss(policy, ro: Rollouts, ids: np.ndarray, logp: torch.Tensor, targets: dict, cfg) -> torch.Tensor:
    surr = clipped_surrogate(logp, ro.logp[:, ids], targets["adv"][:, ids], cfg.clip_low, cfg.clip_high)
    return -masked_mean(surr, ro.valid[:, ids])


def clip_range(cfg) -> tuple[float, float]:
    return cfg.clip_low, cfg.clip_high
