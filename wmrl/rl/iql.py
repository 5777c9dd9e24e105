"""IQL (Kostrikov, Nair, Levine 2022, "Offline RL with Implicit Q-Learning").

    value    L_V = E[L2_tau(min_i Qbar_i(s, a) - V(s))],  L2_tau(u) = |tau - 1(u < 0)| u^2      (eq. 5)
    critic   L_Q = E[(r + gamma (1 - d) V(s') - Q_i(s, a))^2]                                (eq. 6)
    actor    L_pi = -E[min(exp(beta (Qbar(s, a) - V(s))), 100) log pi(a|s)]                   (eq. 7, AWR)
Only dataset actions are ever evaluated by Q, so no out-of-distribution action is queried.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from policies.state.networks import CriticEnsemble, TanhGaussianActor


@dataclass
class IQLConfig:
    obs_dim: int = 0
    act_dim: int = 0
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    expectile: float = 0.7
    beta: float = 3.0
    max_weight: float = 100.0
    gamma: float = 0.99
    tau: float = 5e-3
    lr: float = 3e-4
    hidden: int = 256
    batch_size: int = 256


def expectile_loss(diff: torch.Tensor, tau: float) -> torch.Tensor:
    """L2_tau(u) = |tau - 1(u < 0)| u^2, u = Q - V."""
    return (torch.abs(tau - (diff < 0).float()) * diff**2).mean()


class IQL(torch.nn.Module):
    def __init__(self, cfg: IQLConfig):
        super().__init__()
        if cfg.obs_dim <= 0 or cfg.act_dim <= 0 or len(cfg.action_low) != cfg.act_dim:
            raise ValueError(f"IQLConfig needs obs_dim, act_dim and the action box; got {cfg.obs_dim}, {cfg.act_dim}")
        if not 0.5 <= cfg.expectile < 1.0:
            raise ValueError(f"expectile must be in [0.5, 1), got {cfg.expectile}")
        self.cfg = cfg
        self.actor = TanhGaussianActor(cfg.obs_dim, cfg.act_dim, cfg.hidden, 2, False, np.asarray(cfg.action_low),
                                       np.asarray(cfg.action_high))
        self.critic = CriticEnsemble(cfg.obs_dim, cfg.act_dim, 2, cfg.hidden, 2)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = nn.Sequential(nn.Linear(cfg.obs_dim, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden),
                                   nn.ReLU(), nn.Linear(cfg.hidden, 1))
        self.opt_actor = torch.optim.Adam(self.actor.parameters(), lr=cfg.lr)
        self.opt_critic = torch.optim.Adam(self.critic.parameters(), lr=cfg.lr)
        self.opt_value = torch.optim.Adam(self.value.parameters(), lr=cfg.lr)

    def optimizers(self) -> dict:
        return {"actor": self.opt_actor, "critic": self.opt_critic, "value": self.opt_value}

    def V(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value(obs).squeeze(-1)

    def update(self, b: dict[str, torch.Tensor]) -> dict:
        c = self.cfg
        with torch.no_grad():
            q_t = self.target(b["obs"], b["act"]).min(0).values
        adv = q_t - self.V(b["obs"])
        v_loss = expectile_loss(adv, c.expectile)
        self.opt_value.zero_grad(set_to_none=True)
        v_loss.backward()
        self.opt_value.step()
        with torch.no_grad():
            y = b["rew"] + c.gamma * (1 - b["term"]) * self.V(b["next_obs"])
        q = self.critic(b["obs"], b["act"])
        q_loss = ((q - y) ** 2).mean(1).sum()
        if not torch.isfinite(q_loss):
            raise FloatingPointError(f"critic loss is {q_loss.item()}")
        self.opt_critic.zero_grad(set_to_none=True)
        q_loss.backward()
        self.opt_critic.step()
        w = torch.exp(c.beta * adv.detach()).clamp(max=c.max_weight)
        actor_loss = -(w * self.actor.log_prob(b["obs"], b["act"])).mean()
        self.opt_actor.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.opt_actor.step()
        with torch.no_grad():
            for p, tp in zip(self.critic.parameters(), self.target.parameters()):
                tp.lerp_(p, c.tau)
        return {"value_loss": v_loss.item(), "critic_loss": q_loss.item(), "actor_loss": actor_loss.item(),
                "q_mean": q.mean().item(), "adv_mean": adv.mean().item()}

    @torch.no_grad()
    def q_values(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.critic(obs, act)
