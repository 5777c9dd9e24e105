"""PPO in imagination (Schulman et al., 2017): the clipped surrogate with the policy's value head and GAE; advantages
standardised over all valid steps. One policy decision is one action chunk, which is also one world-model step.

`prepare` turns a batch of rollouts into targets (once per iteration); `loss` is the objective on a minibatch of
whole rollouts (`wmrl.rl.imagine.update` runs the epochs and minibatches for every algorithm).
"""

from __future__ import annotations

import numpy as np
import torch

from wmrl.rl.rollouts import Rollouts, take


LOG_RATIO_MAX = 20.0  # |log rho| beyond this carries no gradient (exp(89) already overflows float32)


def clipped_surrogate(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, clip_low: float,
                      clip_high: float) -> torch.Tensor:
    """PPO's per-step objective (to maximise): min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A).

    log rho is clamped to +-LOG_RATIO_MAX first. A narrow Gaussian (a gripper sigma of 0.018 fitted on pushes) can
    move a step's log-probability by tens of nats in one update; unclamped, rho overflows to inf, and inf times the
    zero mask of a padded step (or a negative advantage) turns the loss and every weight into NaN."""
    rho = torch.exp((logp - logp_old).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX))
    return torch.minimum(rho * adv, rho.clamp(1 - clip_low, 1 + clip_high) * adv)


def gae(rewards: torch.Tensor, values: torch.Tensor, terminal: torch.Tensor, valid: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over (T, N) steps; values (T+1, N) include the observation after the last
    step (bootstrapped at truncation, not at termination). Returns (advantages, returns), zero where invalid."""
    T = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    cont = torch.cat([valid[1:], torch.zeros_like(valid[:1])]).float()  # the next step belongs to the episode
    for t in reversed(range(T)):
        nonterminal = 1.0 - terminal[t].float()
        delta = rewards[t] + gamma * values[t + 1] * nonterminal - values[t]
        last = (delta + gamma * lam * nonterminal * cont[t] * last) * valid[t].float()
        adv[t] = last
    return adv, (adv + values[:-1]) * valid.float()


def ppo_loss(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, value: torch.Tensor, ret: torch.Tensor,
             valid: torch.Tensor, clip: float, vf_coef: float) -> tuple[torch.Tensor, dict]:
    """Clipped PPO loss averaged over valid steps: -surrogate + vf_coef * (V - R)^2."""
    v = valid.float()
    n = v.sum().clamp(min=1)
    pg = -(clipped_surrogate(logp, logp_old, adv, clip, clip) * v).sum() / n
    vf = (((value - ret) ** 2) * v).sum() / n
    return pg + vf_coef * vf, {"pg_loss": pg.item(), "vf_loss": vf.item()}


def prepare(policy, ro: Rollouts, cfg) -> tuple[dict, np.ndarray, dict]:
    """GAE advantages (standardised over valid steps) and returns; every rollout is used."""
    with torch.no_grad():
        values = torch.stack([policy.value(o) for o in ro.obs])  # (T + 1, N)
    adv, ret = gae(ro.rewards, values, ro.terminal, ro.valid, cfg.gamma, cfg.gae_lambda)
    v = ro.valid.bool()
    adv = torch.where(v, (adv - adv[v].mean()) / (adv[v].std() + 1e-8), torch.zeros_like(adv))
    return {"adv": adv, "ret": ret}, np.arange(ro.actions.shape[1]), {}


def clip_range(cfg) -> tuple[float, float]:
    return cfg.clip_low, cfg.clip_low  # symmetric, as in the paper


def clipped_fraction(ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """The share of steps whose gradient the clip removed: the clipped branch of the min is the one taken, i.e.
    rho > 1 + high with A > 0, or rho < 1 - low with A < 0 (a ratio outside the range on the other side still
    carries its gradient)."""
    return (((ratio > 1 + high) & (adv > 0)) | ((ratio < 1 - low) & (adv < 0))).float().mean()


def loss(policy, ro: Rollouts, ids: np.ndarray, logp: torch.Tensor, targets: dict, cfg) -> torch.Tensor:
    value = torch.stack([policy.value(take(o, ids)) for o in ro.obs[: len(ro.actions)]])
    out, _ = ppo_loss(logp, ro.logp[:, ids], targets["adv"][:, ids], value, targets["ret"][:, ids], ro.valid[:, ids],
                      cfg.clip_low, cfg.vf_coef)
    return out
