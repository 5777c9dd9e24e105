"""State-space dynamics for offline model-based RL: a bootstrapped ensemble of Gaussian MLPs (PETS; the MBPO/MOPO
recipe, as used by RAVL, Sims et al. 2024) and a true-dynamics oracle with the same `step` interface.

Each member predicts the Gaussian of [s' - s, r] from standardised [s, a]. Log-variances are soft-clamped between
learnable bounds (PETS, Chua et al. 2018, appendix A.1). Members train on their own bootstrap resample, stop early on
a shared hold-out set, and the `elites` best members by hold-out MSE generate rollouts.

    step(obs, act, state=None, rng) -> (next_obs, reward, terminated, state, info)

`state` is the simulator state (`qpos`, `qvel`) for the oracle and None for the learned model; `info["uncertainty"]`
is MOPO's penalty u(s, a) = max_i ||sigma_i(s, a)||_2.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from sim.locomotion import make_state_env


@dataclass
class EnsembleConfig:
    obs_dim: int = 17
    act_dim: int = 6
    members: int = 7
    elites: int = 5
    hidden: int = 200
    layers: int = 4
    weight_decay: tuple[float, ...] = (2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4)  # per layer, input to output (MBPO)
    lr: float = 1e-3
    batch_size: int = 256
    holdout: float = 0.2
    max_epochs: int = 200
    patience: int = 5  # epochs without a >1% hold-out improvement of any member
    min_improvement: float = 0.01
    max_holdout: int = 5000  # hold-out transitions scored per epoch (CPU budget)


class EnsembleLinear(nn.Module):
    """E independent linear layers applied to (E, B, in) in one batched matmul."""

    def __init__(self, members: int, fan_in: int, fan_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, fan_in, fan_out))
        self.bias = nn.Parameter(torch.zeros(members, 1, fan_out))
        nn.init.trunc_normal_(self.weight, std=1 / (2 * math.sqrt(fan_in)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class GaussianEnsemble(nn.Module):
    def __init__(self, cfg: EnsembleConfig):
        super().__init__()
        if not 1 <= cfg.elites <= cfg.members:
            raise ValueError(f"elites must be in [1, members={cfg.members}], got {cfg.elites}")
        if len(cfg.weight_decay) != cfg.layers + 1:
            raise ValueError(f"weight_decay: expected {cfg.layers + 1} values (one per layer), got {len(cfg.weight_decay)}")
        self.cfg = cfg
        d_in, d_out = cfg.obs_dim + cfg.act_dim, cfg.obs_dim + 1
        dims = [d_in] + [cfg.hidden] * cfg.layers
        self.hidden_layers = nn.ModuleList(EnsembleLinear(cfg.members, a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.out = EnsembleLinear(cfg.members, cfg.hidden, 2 * d_out)
        self.max_logvar = nn.Parameter(torch.full((d_out,), 0.5))
        self.min_logvar = nn.Parameter(torch.full((d_out,), -10.0))
        self.register_buffer("in_mean", torch.zeros(d_in))
        self.register_buffer("in_std", torch.ones(d_in))
        self.register_buffer("elite_idx", torch.arange(cfg.elites))

    def set_normaliser(self, inputs: np.ndarray) -> None:
        x = torch.as_tensor(inputs, dtype=torch.float32)
        self.in_mean.copy_(x.mean(0))
        self.in_std.copy_(x.std(0).clamp(min=1e-6))

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs (B, ds) or (E, B, ds) -> mean, log-variance of [delta s, r], each (E, B, ds + 1)."""
        x = (torch.cat([obs, act], -1) - self.in_mean) / self.in_std
        if x.ndim == 2:
            x = x.expand(self.cfg.members, *x.shape)
        for layer in self.hidden_layers:
            x = F.silu(layer(x))
        mean, logvar = self.out(x).chunk(2, dim=-1)
        logvar = self.max_logvar - F.softplus(self.max_logvar - logvar)  # soft clamp (PETS)
        logvar = self.min_logvar + F.softplus(logvar - self.min_logvar)
        return mean, logvar

    def loss(self, obs, act, target) -> torch.Tensor:
        """Gaussian NLL per member (summed over members), bounds regulariser and per-layer weight decay."""
        mean, logvar = self(obs, act)
        nll = (((mean - target) ** 2) * torch.exp(-logvar) + logvar).mean(dim=(1, 2)).sum()
        decay = sum(wd * (layer.weight**2).sum() / 2 for wd, layer in
                    zip(self.cfg.weight_decay, [*self.hidden_layers, self.out]))
        return nll + 0.01 * (self.max_logvar.sum() - self.min_logvar.sum()) + decay

    @torch.no_grad()
    def holdout_mse(self, obs, act, target) -> torch.Tensor:
        mean, _ = self(obs, act)
        return ((mean - target) ** 2).mean(dim=(1, 2))  # (E,)

    @torch.no_grad()
    def step(self, obs: np.ndarray, act: np.ndarray, state=None, rng: np.random.Generator | None = None,
             termination: Callable | None = None):
        """Sample s' and r from a random elite per sample (MBPO)."""
        rng = rng or np.random.default_rng()
        o = torch.as_tensor(obs, dtype=torch.float32)
        a = torch.as_tensor(act, dtype=torch.float32)
        mean, logvar = self(o, a)
        std = torch.exp(0.5 * logvar)
        B = len(o)
        pick = self.elite_idx[torch.as_tensor(rng.integers(0, len(self.elite_idx), B))]
        ar = torch.arange(B)
        sample = mean[pick, ar] + std[pick, ar] * torch.as_tensor(rng.standard_normal((B, mean.shape[-1])), dtype=torch.float32)
        next_obs = (o + sample[:, :-1]).numpy()
        reward = sample[:, -1].numpy()
        elite_std = std[self.elite_idx]
        unc = torch.linalg.vector_norm(elite_std, dim=-1).amax(0).numpy()  # MOPO: max_i ||sigma_i||
        term = termination(obs, act, next_obs) if termination else np.zeros(B, bool)
        return next_obs, reward, term, None, {"uncertainty": unc}


def bootstrap_indices(train: np.ndarray, members: int, rng: np.random.Generator) -> np.ndarray:
    """One resample with replacement of the training indices per member (members, len(train))."""
    return rng.choice(train, size=(members, len(train)), replace=True)


def fit_ensemble(model: GaussianEnsemble, obs: np.ndarray, act: np.ndarray, next_obs: np.ndarray, rew: np.ndarray,
                 seed: int = 0, progress: bool = True, log: Callable[[dict], None] | None = None) -> dict:
    """Train on transitions with bootstrap resamples per member, early stopping on a hold-out set, elite selection.
    Returns hold-out MSE per member, the elites and the number of epochs."""
    cfg = model.cfg
    for name, arr, d in (("observations", obs, cfg.obs_dim), ("actions", act, cfg.act_dim), ("next_observations", next_obs, cfg.obs_dim)):
        if arr.ndim != 2 or arr.shape[1] != d:
            raise ValueError(f"{name}: expected (N, {d}), got {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError(f"{name}: contains NaN or inf")
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    N = len(obs)
    inputs = np.concatenate([obs, act], 1).astype(np.float32)
    targets = np.concatenate([next_obs - obs, rew.reshape(-1, 1)], 1).astype(np.float32)
    perm = rng.permutation(N)
    n_hold = min(int(N * cfg.holdout), cfg.max_holdout)
    hold, train = perm[:n_hold], perm[n_hold:]
    model.set_normaliser(inputs[train])
    X = torch.as_tensor(inputs)
    Y = torch.as_tensor(targets)
    ds = cfg.obs_dim
    boot = torch.as_tensor(bootstrap_indices(train, cfg.members, rng))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    xh, yh = X[hold], Y[hold]
    best = model.holdout_mse(xh[:, :ds], xh[:, ds:], yh).numpy()
    best_state = copy.deepcopy(model.state_dict())
    stale, epoch = 0, 0
    bar = tqdm(range(cfg.max_epochs), desc="dynamics", disable=not progress, leave=False)
    for epoch in bar:
        order = boot[:, torch.randperm(boot.shape[1])]
        for i in range(0, order.shape[1], cfg.batch_size):
            idx = order[:, i : i + cfg.batch_size]  # (E, b): member e sees its own resample
            x, y = X[idx], Y[idx]
            loss = model.loss(x[..., :ds], x[..., ds:], y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        mse = model.holdout_mse(xh[:, :ds], xh[:, ds:], yh).numpy()
        improved = (best - mse) / np.maximum(best, 1e-12) > cfg.min_improvement
        if improved.any():
            sd = model.state_dict()
            for e in np.flatnonzero(improved):  # keep each member's best weights
                for k, v in sd.items():
                    if v.ndim and v.shape[0] == cfg.members:
                        best_state[k][e] = v[e].clone()
            best = np.where(improved, mse, best)
            stale = 0
        else:
            stale += 1
        bar.set_postfix(holdout_mse=float(mse.mean()))
        if log:
            log({"epoch": epoch, "train_loss": float(loss.item()), "holdout_mse": float(mse.mean())})
        if stale >= cfg.patience:
            break
    for k, v in best_state.items():  # shared tensors (bounds, normaliser) keep their latest values
        if v.ndim and v.shape[0] == cfg.members:
            model.state_dict()[k].copy_(v)
    final = model.holdout_mse(xh[:, :ds], xh[:, ds:], yh).numpy()
    model.elite_idx.copy_(torch.as_tensor(np.argsort(final)[: cfg.elites]))
    return {"holdout_mse": final.tolist(), "elites": model.elite_idx.tolist(), "epochs": epoch + 1,
            "train_transitions": int(len(train)), "holdout_transitions": int(n_hold)}


@dataclass
class TrueDynamics:
    """The oracle: restore (qpos, qvel), step the real simulator. Same `step` as `GaussianEnsemble`; zero error and
    zero uncertainty by construction, which is what the edge-of-reach experiments need."""

    env_id: str
    _env: object = field(default=None, repr=False)

    def __post_init__(self):
        self._env = make_state_env(self.env_id).unwrapped
        self._env.reset(seed=0)

    def step(self, obs: np.ndarray, act: np.ndarray, state: dict | None = None, rng=None, termination=None):
        if state is None or "qpos" not in state or "qvel" not in state:
            raise ValueError("true dynamics need the simulator state (qpos, qvel) of every start; "
                             "this dataset or rollout has none (make datasets with `wmrl datasets make`)")
        env = self._env
        B = len(obs)
        nxt = np.zeros_like(obs, dtype=np.float32)
        rew = np.zeros(B, np.float32)
        term = np.zeros(B, bool)
        qpos, qvel = np.array(state["qpos"], np.float64), np.array(state["qvel"], np.float64)
        for i in range(B):
            env.set_state(qpos[i], qvel[i])
            o, r, te, _, _ = env.step(act[i])
            nxt[i], rew[i], term[i] = o, r, te
            qpos[i], qvel[i] = env.data.qpos, env.data.qvel
        return nxt, rew, term, {"qpos": qpos, "qvel": qvel}, {"uncertainty": np.zeros(B, np.float32)}
