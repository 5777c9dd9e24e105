"""Imagined rollouts for policy-gradient RL in a world model: one episode per env of a `WorldModelEnv` (groups of
envs may share a start), sampled action chunks and their log-probabilities, masked after each episode's end."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from wmrl.core.features import TASK


@dataclass
class Rollouts:
    obs: list[dict]  # T + 1 observation batches (the last one follows the last step)
    actions: torch.Tensor  # (T, N, H, A)
    logp: torch.Tensor  # (T, N)
    rewards: torch.Tensor  # (T, N)
    terminal: torch.Tensor  # (T, N) the step ended the episode by success
    valid: torch.Tensor  # (T, N) the step belongs to the rollout's episode
    success: torch.Tensor  # (N,)
    flagged: torch.Tensor | None = None  # (N,) stopped by the world model's hallucination flag

    @property
    def returns(self) -> torch.Tensor:
        return (self.rewards * self.valid).sum(0)


def take(obs: dict, idx: np.ndarray) -> dict:
    return {k: ([v[i] for i in idx] if k == TASK else v[idx]) for k, v in obs.items()}


@torch.no_grad()
def collect_rollouts(policy, env, group_size: int, seed: int) -> Rollouts:
    """One imagined episode per env (each group of `group_size` envs shares its start); sampled action chunks.
    `flagged`: the episodes the world model's hallucination flag truncated (`info["flagged"]`, a `WorldModelEnv`
    with `stop_cm`)."""
    obs, _ = env.reset(seed=seed, options={"group_size": group_size} if group_size > 1 else None)
    N, H = env.num_envs, policy.cfg.chunk_size
    T = math.ceil(env.max_episode_steps / H)
    alive = np.ones(N, bool)
    success, flagged = np.zeros(N, bool), np.zeros(N, bool)
    out = {"obs": [], "actions": [], "logp": [], "rewards": [], "terminal": [], "valid": []}
    for _ in range(T):
        a, lp = policy.sample(obs)
        out["obs"].append(obs)
        obs, r, term, trunc, info = env.step(a.cpu().numpy())
        out["actions"].append(a)
        out["logp"].append(lp)
        out["valid"].append(torch.as_tensor(alive.copy()))
        out["rewards"].append(torch.as_tensor(r * alive, dtype=torch.float32))
        out["terminal"].append(torch.as_tensor(alive & term))
        success |= alive & np.asarray(info["success"], bool)
        flagged |= alive & np.asarray(info.get("flagged", False), bool)
        alive &= ~(term | trunc)
        if not alive.any():
            break
    out["obs"].append(obs)
    return Rollouts(obs=out["obs"], **{k: torch.stack(v) for k, v in out.items() if k != "obs"},
                    success=torch.as_tensor(success), flagged=torch.as_tensor(flagged))


def step_logp(policy, ro: Rollouts, rollout_ids: np.ndarray) -> torch.Tensor:
    """log pi(chunk_t | o_t) for the given rollouts at every step (T, n), recomputed with gradients."""
    return torch.stack([policy.log_prob(take(o, rollout_ids), ro.actions[t][rollout_ids])
                        for t, o in enumerate(ro.obs[: len(ro.actions)])])
