"""State-based actors and critics for offline and online RL (SAC, SAC-N/EDAC, RAVL, MOPO, WSRL).

`CriticEnsemble` evaluates N Q-functions in one batched matmul (SAC-N/EDAC's vectorised critic, An et al. 2021).
`TanhGaussianActor` is SAC's squashed Gaussian with the exact log-probability (Haarnoja et al. 2018, appendix C);
it follows the `Policy` protocol, so the evaluation loop runs it in any env with `observation.state`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from wmrl.core.features import ACTION, OBS_STATE

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class VectorizedLinear(nn.Module):
    """N linear layers on (N, B, in); initialised like nn.Linear per member (EDAC's initialisation)."""

    def __init__(self, fan_in: int, fan_out: int, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, fan_in, fan_out))
        self.bias = nn.Parameter(torch.empty(n, 1, fan_out))
        for i in range(n):
            nn.init.kaiming_uniform_(self.weight[i].T, a=math.sqrt(5))
        bound = 1 / math.sqrt(fan_in)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class CriticEnsemble(nn.Module):
    """Q_1..Q_N(s, a) -> (N, B). `layer_norm` is WSRL/REDQ's choice for fine-tuning stability."""

    def __init__(self, obs_dim: int, act_dim: int, n: int = 2, hidden: int = 256, layers: int = 3, layer_norm: bool = False):
        super().__init__()
        self.n = n
        dims = [obs_dim + act_dim] + [hidden] * layers
        mods: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            mods += [VectorizedLinear(a, b, n), nn.LayerNorm(b) if layer_norm else nn.Identity(), nn.ReLU()]
        self.body = nn.Sequential(*mods)
        self.head = VectorizedLinear(hidden, 1, n)
        # EDAC: small output layer init keeps the initial Q-values near zero
        nn.init.uniform_(self.head.weight, -3e-3, 3e-3)
        nn.init.uniform_(self.head.bias, -3e-3, 3e-3)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, act], -1)
        if x.ndim == 2:
            x = x.unsqueeze(0).expand(self.n, -1, -1)
        return self.head(self.body(x)).squeeze(-1)

    def q_and_action_grad(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q (N, B), grad_a Q (N, B, A)) from one forward pass, the gradient differentiable w.r.t. the weights (what
        EDAC's diversity term trains through, by a double backward). One forward serves both the TD loss and the
        diversity term, which a second forward for the gradients alone would cost again."""
        per_member = lambda t: t.unsqueeze(0).expand(self.n, -1, -1) if t.ndim == 2 else t
        a = per_member(act).detach().clone().requires_grad_(True)
        q = self(per_member(obs), a)
        (grad,) = torch.autograd.grad(q.sum(), a, create_graph=True)
        return q, grad


class StatePolicy:
    """The `Policy` protocol for actors on `observation.state`: each actor supplies `act(s) -> (B, A)` tensor."""

    chunk_size = 1

    def reset(self) -> None:
        pass

    @torch.no_grad()
    def select_action(self, obs: dict) -> np.ndarray:
        s = torch.as_tensor(np.asarray(obs[OBS_STATE]), dtype=torch.float32, device=self.act_scale.device)
        if s.ndim != 2 or s.shape[1] != self.obs_dim:
            raise ValueError(f"{OBS_STATE}: expected (B, {self.obs_dim}), got {tuple(s.shape)}")
        return self.act(s).cpu().numpy().astype(np.float32)

    def predict_action_chunk(self, obs: dict) -> np.ndarray:
        return self.select_action(obs)[:, None]


class TanhGaussianActor(StatePolicy, nn.Module):
    """pi(a|s) = tanh(N(mu(s), sigma(s))), scaled to the action box. `deterministic` evaluation uses tanh(mu)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256, layers: int = 3, layer_norm: bool = False,
                 action_low: np.ndarray | None = None, action_high: np.ndarray | None = None):
        super().__init__()
        dims = [obs_dim] + [hidden] * layers
        mods: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            mods += [nn.Linear(a, b), nn.LayerNorm(b) if layer_norm else nn.Identity(), nn.ReLU()]
        self.body = nn.Sequential(*mods)
        self.mu = nn.Linear(hidden, act_dim)
        self.log_std = nn.Linear(hidden, act_dim)
        low = np.full(act_dim, -1.0) if action_low is None else np.asarray(action_low)
        high = np.full(act_dim, 1.0) if action_high is None else np.asarray(action_high)
        self.register_buffer("act_scale", torch.as_tensor((high - low) / 2, dtype=torch.float32))
        self.register_buffer("act_bias", torch.as_tensor((high + low) / 2, dtype=torch.float32))
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.deterministic = True  # for select_action (evaluation); training calls sample()

    def dist(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(obs)
        return self.mu(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised a ~ pi(.|s) and its exact log-probability (tanh change of variables)."""
        mu, log_std = self.dist(obs)
        u = mu + log_std.exp() * torch.randn_like(mu)
        return self._squash(u, mu, log_std)

    def _squash(self, u, mu, log_std):
        logp = (-0.5 * ((u - mu) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        logp = logp - (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)  # log(1 - tanh(u)^2), stable
        logp = logp - torch.log(self.act_scale).sum()
        return torch.tanh(u) * self.act_scale + self.act_bias, logp

    def log_prob(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """log pi(a|s) for actions inside the box (clipped to |tanh| < 1 - 1e-6)."""
        mu, log_std = self.dist(obs)
        y = ((act - self.act_bias) / self.act_scale).clamp(-1 + 1e-6, 1 - 1e-6)
        return self._squash(torch.atanh(y), mu, log_std)[1]

    def act(self, s: torch.Tensor) -> torch.Tensor:
        if self.deterministic:
            return torch.tanh(self.dist(s)[0]) * self.act_scale + self.act_bias
        return self.sample(s)[0]

    def forward(self, batch: dict):
        """Behaviour-cloning NLL, so the actor also trains from data alone."""
        s = torch.as_tensor(batch[OBS_STATE], dtype=torch.float32)
        a = torch.as_tensor(batch[ACTION], dtype=torch.float32)
        loss = -self.log_prob(s, a).mean()
        return loss, {"bc_nll": loss.item()}


class DeterministicActor(StatePolicy, nn.Module):
    """a = tanh(f(s)) scaled to the box (TD3, TD3+BC). `log_prob` treats it as N(mu(s), 1) in the box's unit scale,
    the convention PGD uses to guide with a deterministic target policy (Jackson et al. 2024)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256, layers: int = 2,
                 action_low: np.ndarray | None = None, action_high: np.ndarray | None = None):
        super().__init__()
        dims = [obs_dim] + [hidden] * layers
        mods: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            mods += [nn.Linear(a, b), nn.ReLU()]
        self.net = nn.Sequential(*mods, nn.Linear(hidden, act_dim))
        low = np.full(act_dim, -1.0) if action_low is None else np.asarray(action_low)
        high = np.full(act_dim, 1.0) if action_high is None else np.asarray(action_high)
        self.register_buffer("act_scale", torch.as_tensor((high - low) / 2, dtype=torch.float32))
        self.register_buffer("act_bias", torch.as_tensor((high + low) / 2, dtype=torch.float32))
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))
        self.obs_dim, self.act_dim = obs_dim, act_dim

    def mu(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net((obs - self.obs_mean) / self.obs_std)) * self.act_scale + self.act_bias

    def log_prob(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        z = (act - self.mu(obs)) / self.act_scale
        return (-0.5 * z**2 - 0.5 * math.log(2 * math.pi)).sum(-1)

    def act(self, s: torch.Tensor) -> torch.Tensor:
        return self.mu(s)

    def forward(self, batch: dict):
        s = torch.as_tensor(batch[OBS_STATE], dtype=torch.float32)
        a = torch.as_tensor(batch[ACTION], dtype=torch.float32)
        loss = ((self.mu(s) - a) ** 2).mean()
        return loss, {"bc_mse": loss.item()}
