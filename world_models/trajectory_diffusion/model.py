"""A diffusion model over whole trajectory windows, with policy guidance (Jackson, Matthews, Lu, Ellis, Whiteson,
Foerster 2024, "Policy-Guided Diffusion"; the 1-D temporal U-Net of Janner et al. 2022, "Diffuser").

A window is T consecutive frames of one episode, each frame the channels

    [ observation.state | atanh(action scaled to [-1, 1]) | next.reward | next.terminated ]

standardised per channel over the dataset. The denoiser is EDM-preconditioned (`world_models.edm`); sampling runs
Euler or Heun steps (EDM Algorithm 1) down the Karras noise levels. Policy guidance (PGD Section 4, eq. 6) adds,
before denoising step i of n,

    lambda_i * grad_{actions} sum_t log pi(a_t | s_t),   lambda_i = lambda ((1 - i/n) + c sin(pi (i+1)/n)),  lambda_{n-1} = 0

evaluated at the noisy sample or at the denoised estimate D(x; sigma_i), optionally normalised per trajectory.
A deterministic actor is guided as N(mu(s), 1) (its `log_prob`).

    encode(windows) -> x      standardised channels (B, T, D)
    denoise(x, sigma) -> D(x; sigma)
    loss(x0) -> EDM loss
    sample(n, policy, guidance) -> x, with diverged samples reported, never returned silently
    decode(x) -> {obs, act, rew, term, length}: rollouts that end at the first generated terminal
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from wmrl.core.checkpoint import load_state, read_config, save_pretrained
from wmrl.core.features import ACTION, OBS_STATE, REWARD, TERMINATED
from world_models.edm import edm_coefficients, edm_loss_weight, karras_sigmas

SAMPLERS = ("euler", "heun")


@dataclass
class TrajectoryDiffusionConfig:
    obs_dim: int = 0
    act_dim: int = 0
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    horizon: int = 32  # T frames per window (T - 1 transitions)
    widths: tuple[int, ...] = (64, 128, 256)  # U-Net levels; T must be divisible by 2^(levels - 1)
    emb_dim: int = 128
    sigma_data: float = 1.0  # channels are standardised
    sigma_min: float = 0.002
    sigma_max: float = 80.0
    p_mean: float = -1.2  # training ln(sigma) ~ N(p_mean, p_std), as in the PGD reference
    p_std: float = 1.2
    sampler: str = "heun"
    sampling_steps: int = 24  # the paper samples with 200 stochastic steps; CPU needs fewer
    action_clip: float = 0.999  # |a| in [-1, 1] units before atanh
    channel_names: list[str] = field(default_factory=list)

    @property
    def channels(self) -> int:
        return self.obs_dim + self.act_dim + 2

    def validate(self) -> None:
        if self.obs_dim <= 0 or self.act_dim <= 0:
            raise ValueError(f"obs_dim and act_dim must be positive, got {self.obs_dim}, {self.act_dim}")
        if len(self.action_low) != self.act_dim or len(self.action_high) != self.act_dim:
            raise ValueError(f"action_low/high need {self.act_dim} entries, got {len(self.action_low)}/{len(self.action_high)}")
        down = 2 ** (len(self.widths) - 1)
        if self.horizon < 2 or self.horizon % down:
            raise ValueError(f"horizon {self.horizon} must be >= 2 and divisible by {down} (U-Net with {len(self.widths)} levels)")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if not 0 < self.action_clip < 1:
            raise ValueError(f"action_clip must be in (0, 1), got {self.action_clip}")


# ---------------------------------------------------------------------- network
class SinusoidalEmbedding(nn.Module):
    """Transformer-style sinusoidal embedding of c_noise (Vaswani et al. 2017; Diffuser's time embedding)."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("freqs", torch.exp(-math.log(10_000) * torch.arange(dim // 2) / (dim // 2)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = x[:, None] * 1000 * self.freqs[None]  # c_noise = ln(sigma)/4 spans about [-1.6, 1.1]
        return torch.cat([f.sin(), f.cos()], dim=-1)


def _gn(c: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(8, c) if c % min(8, c) == 0 else 1, c)


class ResBlock1D(nn.Module):
    def __init__(self, cin: int, cout: int, emb_dim: int, kernel: int = 5):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv1d(cin, cout, kernel, padding=kernel // 2), _gn(cout), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(cout, cout, kernel, padding=kernel // 2), _gn(cout), nn.Mish())
        self.emb = nn.Sequential(nn.Mish(), nn.Linear(emb_dim, cout))
        self.skip = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x) + self.emb(emb)[:, :, None]
        return self.conv2(h) + self.skip(x)


class UNet1D(nn.Module):
    """Temporal U-Net over (B, D, T): residual conv blocks with GroupNorm, halving T per level, skip connections."""

    def __init__(self, channels: int, widths: tuple[int, ...], emb_dim: int):
        super().__init__()
        self.emb = nn.Sequential(SinusoidalEmbedding(emb_dim), nn.Linear(emb_dim, 2 * emb_dim), nn.Mish(),
                                 nn.Linear(2 * emb_dim, emb_dim))
        self.inp = nn.Conv1d(channels, widths[0], 5, padding=2)
        self.down, self.downsample = nn.ModuleList(), nn.ModuleList()
        for i, w in enumerate(widths):
            cin = widths[max(i - 1, 0)]
            self.down.append(nn.ModuleList([ResBlock1D(cin, w, emb_dim), ResBlock1D(w, w, emb_dim)]))
            self.downsample.append(nn.Conv1d(w, w, 3, stride=2, padding=1) if i < len(widths) - 1 else nn.Identity())
        self.mid = nn.ModuleList([ResBlock1D(widths[-1], widths[-1], emb_dim), ResBlock1D(widths[-1], widths[-1], emb_dim)])
        self.up, self.upsample = nn.ModuleList(), nn.ModuleList()
        for i in reversed(range(len(widths) - 1)):
            self.upsample.append(nn.ConvTranspose1d(widths[i + 1], widths[i + 1], 4, stride=2, padding=1))
            self.up.append(nn.ModuleList([ResBlock1D(widths[i + 1] + widths[i], widths[i], emb_dim),
                                          ResBlock1D(widths[i], widths[i], emb_dim)]))
        self.out = nn.Sequential(nn.Conv1d(widths[0], widths[0], 5, padding=2), _gn(widths[0]), nn.Mish(),
                                 nn.Conv1d(widths[0], channels, 1))

    def forward(self, x: torch.Tensor, c_noise: torch.Tensor) -> torch.Tensor:
        emb = self.emb(c_noise)
        h = self.inp(x)
        skips = []
        for blocks, down in zip(self.down, self.downsample):
            for b in blocks:
                h = b(h, emb)
            skips.append(h)
            h = down(h)
        for b in self.mid:
            h = b(h, emb)
        for blocks, up, skip in zip(self.up, self.upsample, reversed(skips[:-1])):
            h = torch.cat([up(h), skip], dim=1)
            for b in blocks:
                h = b(h, emb)
        return self.out(h)


# ---------------------------------------------------------------------- guidance
def guidance_schedule(guidance: float, steps: int, cosine: float = 0.3) -> np.ndarray:
    """lambda_i = lambda ((1 - i/n) + c sin(pi (i+1)/n)) for i < n - 1, and 0 on the final step (PGD Appendix)."""
    i = np.arange(steps)
    lam = guidance * ((1 - i / steps) + cosine * np.sin(np.pi * (i + 1) / steps))
    lam[-1] = 0.0
    return lam


class DivergedSamples(FloatingPointError):
    """Sampling produced NaN or inf (e.g. a guidance coefficient too large); nothing of the batch was kept."""


# ---------------------------------------------------------------------- the model
class TrajectoryDiffusion(nn.Module):
    def __init__(self, cfg: TrajectoryDiffusionConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        D = cfg.channels
        self.net = UNet1D(D, tuple(cfg.widths), cfg.emb_dim)
        self.register_buffer("mean", torch.zeros(D))
        self.register_buffer("std", torch.ones(D))
        low, high = np.asarray(cfg.action_low, np.float32), np.asarray(cfg.action_high, np.float32)
        self.register_buffer("act_scale", torch.as_tensor((high - low) / 2))
        self.register_buffer("act_bias", torch.as_tensor((high + low) / 2))

    @property
    def obs_slice(self) -> slice:
        return slice(0, self.cfg.obs_dim)

    @property
    def act_slice(self) -> slice:
        return slice(self.cfg.obs_dim, self.cfg.obs_dim + self.cfg.act_dim)

    # ------------------------------------------------------------------ data <-> channels
    def raw_channels(self, windows: dict[str, np.ndarray]) -> torch.Tensor:
        """{observation.state (B,T,O), action (B,T,A), next.reward (B,T), next.terminated (B,T)} -> (B, T, D)."""
        c = self.cfg
        obs = torch.as_tensor(np.asarray(windows[OBS_STATE]), dtype=torch.float32)
        act = torch.as_tensor(np.asarray(windows[ACTION]), dtype=torch.float32)
        if obs.ndim != 3 or obs.shape[-1] != c.obs_dim or act.shape[:2] != obs.shape[:2] or act.shape[-1] != c.act_dim:
            raise ValueError(f"windows: expected obs (B, T, {c.obs_dim}) and action (B, T, {c.act_dim}), "
                             f"got {tuple(obs.shape)} and {tuple(act.shape)}")
        y = ((act - self.act_bias) / self.act_scale).clamp(-c.action_clip, c.action_clip)
        rew = torch.as_tensor(np.asarray(windows[REWARD]), dtype=torch.float32).reshape(*obs.shape[:2], 1)
        term = torch.as_tensor(np.asarray(windows[TERMINATED]), dtype=torch.float32).reshape(*obs.shape[:2], 1)
        x = torch.cat([obs, torch.atanh(y), rew, term], dim=-1)
        if not torch.isfinite(x).all():
            raise ValueError("windows contain NaN or inf")
        return x

    def set_stats(self, raw: torch.Tensor) -> None:
        flat = raw.reshape(-1, raw.shape[-1])
        self.mean.copy_(flat.mean(0))
        self.std.copy_(flat.std(0).clamp(min=1e-2))  # constant channels (no terminals) stay finite

    def encode(self, windows: dict[str, np.ndarray]) -> torch.Tensor:
        return (self.raw_channels(windows).to(self.mean.device) - self.mean) / self.std

    def unstandardise(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Standardised x -> (observations, actions in the box)."""
        raw = x * self.std + self.mean
        return raw[..., self.obs_slice], torch.tanh(raw[..., self.act_slice]) * self.act_scale + self.act_bias

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> dict[str, np.ndarray]:
        """Generated windows -> rollouts like `wmrl.rl.ravl.rollout` returns: obs (B, T, O), act, rew, term (B, T) and
        `length`, the number of transitions kept: up to the first generated terminal, else T - 1."""
        raw = (x * self.std + self.mean).cpu()
        obs, act = self.unstandardise(x)
        term = (raw[..., -1] > 0.5).numpy()
        T = x.shape[1]
        first = np.where(term[:, : T - 1].any(1), term[:, : T - 1].argmax(1) + 1, T - 1)
        return {"obs": obs.cpu().numpy().astype(np.float32), "act": act.cpu().numpy().astype(np.float32),
                "rew": raw[..., -2].numpy().astype(np.float32), "term": term, "length": first}

    # ------------------------------------------------------------------ denoiser and loss
    def denoise(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """D(x; sigma) for x (B, T, D), sigma (B,) or scalar."""
        B = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device).reshape(-1).expand(B)
        c_skip, c_out, c_in, c_noise = (c.reshape(B, 1, 1) for c in edm_coefficients(sigma, self.cfg.sigma_data))
        F_ = self.net((c_in * x).transpose(1, 2), c_noise.reshape(B)).transpose(1, 2)
        return c_skip * x + c_out * F_

    def loss(self, x0: torch.Tensor) -> torch.Tensor:
        """EDM training loss E[lambda(sigma) ||D(x0 + sigma n; sigma) - x0||^2], ln sigma ~ N(p_mean, p_std^2)."""
        B = x0.shape[0]
        sigma = torch.exp(self.cfg.p_mean + self.cfg.p_std * torch.randn(B, device=x0.device))
        x = x0 + sigma.reshape(B, 1, 1) * torch.randn_like(x0)
        w = edm_loss_weight(sigma, self.cfg.sigma_data).reshape(B, 1, 1)
        return (w * (self.denoise(x, sigma) - x0) ** 2).mean()

    # ------------------------------------------------------------------ sampling
    def guidance_grad(self, x: torch.Tensor, log_prob: Callable, normalise: bool) -> torch.Tensor:
        """grad of sum_t log pi(a_t | s_t) w.r.t. the (standardised, pre-tanh) action channels of x."""
        with torch.enable_grad():
            a_std = x[..., self.act_slice].detach().requires_grad_(True)
            raw_a = a_std * self.std[self.act_slice] + self.mean[self.act_slice]
            obs = (x[..., self.obs_slice] * self.std[self.obs_slice] + self.mean[self.obs_slice]).detach()
            act = torch.tanh(raw_a) * self.act_scale + self.act_bias
            B, T = x.shape[:2]
            lp = log_prob(obs.reshape(B * T, -1), act.reshape(B * T, -1))
            (g,) = torch.autograd.grad(lp.sum(), a_std)
        if normalise:
            g = g / (g.flatten(1).norm(dim=1).reshape(B, 1, 1) + 1e-8)
        return g

    @torch.no_grad()
    def sample(self, n: int, policy=None, guidance: float = 0.0, cosine: float = 0.3, normalise: bool = True,
               denoised_guidance: bool = False, steps: int | None = None, sampler: str | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """n standardised windows (n, T, D). `policy` needs `log_prob(obs, act)` (all wmrl actors have it).
        Raises DivergedSamples if any sample is not finite: the caller drops the batch."""
        c = self.cfg
        sampler = sampler or c.sampler
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {sampler!r}")
        if not math.isfinite(guidance) or guidance < 0:
            raise ValueError(f"guidance must be a finite number >= 0, got {guidance}")
        if guidance > 0:
            if policy is None:
                raise ValueError("guidance > 0 needs a target policy")
            if getattr(policy, "act_dim", c.act_dim) != c.act_dim or getattr(policy, "obs_dim", c.obs_dim) != c.obs_dim:
                raise ValueError(f"target policy acts on obs/action dims {policy.obs_dim}/{policy.act_dim}, "
                                 f"the diffusion model's data has {c.obs_dim}/{c.act_dim}")
        sigmas = karras_sigmas(steps or c.sampling_steps, c.sigma_min, c.sigma_max, c.sigma_data).to(self.mean.device)
        lam = guidance_schedule(guidance, len(sigmas) - 1, cosine) if guidance > 0 else None
        x = torch.randn(n, c.horizon, c.channels, device=self.mean.device, generator=generator) * sigmas[0]
        for i in range(len(sigmas) - 1):
            s, s_next = sigmas[i], sigmas[i + 1]
            if lam is not None and lam[i] > 0:
                at = self.denoise(x, s) if denoised_guidance else x
                x = x.clone()
                x[..., self.act_slice] += float(lam[i]) * self.guidance_grad(at, policy.log_prob, normalise)
            d = (x - self.denoise(x, s)) / s
            x_next = x + (s_next - s) * d
            if sampler == "heun" and s_next > 0:  # EDM Algorithm 1: second-order correction
                d2 = (x_next - self.denoise(x_next, s_next)) / s_next
                x_next = x + (s_next - s) * 0.5 * (d + d2)
            x = x_next
        bad = ~torch.isfinite(x).flatten(1).all(1)
        if bad.any():
            raise DivergedSamples(f"{int(bad.sum())} of {n} samples are NaN or inf (guidance {guidance}, "
                                  f"normalise={normalise}); the batch was dropped")
        return x

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | Path) -> None:
        save_pretrained(self, self.cfg, path)

    @classmethod
    def load(cls, path: str | Path, expect: TrajectoryDiffusionConfig | None = None, device: str = "cpu") -> "TrajectoryDiffusion":
        cfg = read_config(path, TrajectoryDiffusionConfig, expect, what="trajectory diffusion checkpoint")
        return load_state(cls(cfg), path, device)


__all__ = ["TrajectoryDiffusionConfig", "TrajectoryDiffusion", "UNet1D", "guidance_schedule", "DivergedSamples", "SAMPLERS"]
