"""TD3+BC (Fujimoto & Gu 2021, "A Minimalist Approach to Offline RL").

    critic   y = r + gamma (1 - d) min_{i=1,2} Qbar_i(s', clip(pibar(s') + clip(N(0, 0.2), -0.5, 0.5), box))
    actor    every `policy_delay` steps:  L = -lambda Q_1(s, pi(s)) + (pi(s) - a)^2,  lambda = alpha / mean|Q_1(s, a~)|
States are standardised with the dataset's mean and std (the paper's only other change to TD3).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from policies.state.networks import CriticEnsemble, DeterministicActor


@dataclass
class TD3BCConfig:
    obs_dim: int = 0
    act_dim: int = 0
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    alpha: float = 2.5
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    policy_delay: int = 2
    gamma: float = 0.99
    tau: float = 5e-3
    lr: float = 3e-4
    hidden: int = 256
    batch_size: int = 256


class TD3BC(torch.nn.Module):
    def __init__(self, cfg: TD3BCConfig):
        super().__init__()
        if cfg.obs_dim <= 0 or cfg.act_dim <= 0 or len(cfg.action_low) != cfg.act_dim:
            raise ValueError(f"TD3BCConfig needs obs_dim, act_dim and the action box; got {cfg.obs_dim}, {cfg.act_dim}")
        self.cfg = cfg
        low, high = np.asarray(cfg.action_low), np.asarray(cfg.action_high)
        self.actor = DeterministicActor(cfg.obs_dim, cfg.act_dim, cfg.hidden, 2, low, high)
        self.critic = CriticEnsemble(cfg.obs_dim, cfg.act_dim, 2, cfg.hidden, 2)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.opt_actor = torch.optim.Adam(self.actor.parameters(), lr=cfg.lr)
        self.opt_critic = torch.optim.Adam(self.critic.parameters(), lr=cfg.lr)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def optimizers(self) -> dict:
        return {"actor": self.opt_actor, "critic": self.opt_critic}

    def set_obs_stats(self, obs: np.ndarray) -> None:
        for net in (self.actor, self.actor_target):
            net.obs_mean.copy_(torch.as_tensor(obs.mean(0), dtype=torch.float32))
            net.obs_std.copy_(torch.as_tensor(obs.std(0) + 1e-3, dtype=torch.float32))

    def _norm(self, obs: torch.Tensor) -> torch.Tensor:  # critics see the same standardised states as the actor
        return (obs - self.actor.obs_mean) / self.actor.obs_std

    def update(self, b: dict[str, torch.Tensor]) -> dict:
        c = self.cfg
        s, s2 = self._norm(b["obs"]), self._norm(b["next_obs"])
        with torch.no_grad():
            scale = self.actor.act_scale
            noise = (torch.randn_like(b["act"]) * c.policy_noise).clamp(-c.noise_clip, c.noise_clip) * scale
            low, high = self.actor.act_bias - scale, self.actor.act_bias + scale
            a2 = torch.maximum(torch.minimum(self.actor_target.mu(b["next_obs"]) + noise, high), low)
            y = b["rew"] + c.gamma * (1 - b["term"]) * self.target(s2, a2).min(0).values
        q = self.critic(s, b["act"])
        critic_loss = ((q - y) ** 2).mean(1).sum()
        if not torch.isfinite(critic_loss):
            raise FloatingPointError(f"critic loss is {critic_loss.item()}")
        self.opt_critic.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.opt_critic.step()
        info = {"critic_loss": critic_loss.item(), "q_mean": q.mean().item()}
        self.steps += 1
        if int(self.steps) % c.policy_delay == 0:
            pi = self.actor.mu(b["obs"])
            q_pi = self.critic(s, pi)[0]
            lam = c.alpha / q_pi.abs().mean().detach().clamp(min=1e-6)
            bc = ((pi - b["act"]) ** 2).mean()
            actor_loss = -lam * q_pi.mean() + bc
            self.opt_actor.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.opt_actor.step()
            with torch.no_grad():
                for net, tgt in ((self.critic, self.target), (self.actor, self.actor_target)):
                    for p, tp in zip(net.parameters(), tgt.parameters()):
                        tp.lerp_(p, c.tau)
            info.update(actor_loss=actor_loss.item(), bc_mse=bc.item())
        return info

    @torch.no_grad()
    def q_values(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.critic(self._norm(obs), act)
