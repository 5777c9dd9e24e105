"""Action-conditioned latent video world model (DIAMOND's EDM recipe in a learned latent space, WoVR's chunked
steps, Ctrl-World's shared multi-camera latent layout, World-VLA-Loop's success head).

    encode(obs)                 -> state   K context latent frames (all cameras stacked), proprio, task
    step(state, action_chunk)   -> state, preds   one denoising pass predicts the next H frames at once
    decode(latents)             -> {camera: uint8 frames}   only when asked: the costly part

The denoiser D(x; sigma) = c_skip x + c_out F(c_in x, c_noise, cond) follows Karras et al. (2022), Table 1, with
c_skip, c_out, c_in and c_noise taken from diffusers' EDMEulerScheduler (`edm_coefficients`), which also samples.
Training noises the context latents too (DIAMOND's fix for autoregressive drift); the noise level is conditioned on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import EDMEulerScheduler
from torch import nn

from wmrl.core.checkpoint import load_state, read_config, save_pretrained
from world_models.edm import edm_coefficients
from world_models.video.networks import FourierEmbedding, FrameAutoencoder, FrameHeads, TaskEncoder, UNet

SIZES = {"tiny": (16, 32), "small": (48, 96), "base": (128, 256), "large": (192, 384)}


@dataclass
class WorldModelConfig:
    cameras: tuple[str, ...] = ("front", "wrist")
    image_size: int = 64
    latent_channels: int = 4  # per camera; a frame latent is (cameras * latent_channels, image_size / 4, ...)
    context: int = 2  # K context frames
    chunk: int = 4  # H frames predicted per step (one action per frame)
    action_dim: int = 4
    state_dim: int = 8
    env_state_dim: int = 0  # > 0: a head predicts observation.environment_state (scripted policies can act in imagination)
    size: str = "small"  # U-Net widths, see SIZES; scales up on a GPU without code changes
    ae_width: int = 16
    cond_dim: int = 128
    task_dim: int = 32
    sigma_data: float = 1.0  # latents are standardised per channel
    sigma_min: float = 0.002
    sigma_max: float = 5.0
    p_mean: float = -0.4  # training ln(sigma) ~ N(p_mean, p_std), DIAMOND
    p_std: float = 1.2
    context_noise_max: float = 0.3
    motion_weight: float = 3.0  # extra dynamics-loss weight where the future differs from the last context frame
    sampling_steps: int = 3
    deterministic: bool = False  # baseline: same backbone regressing the next latents directly, no diffusion
    task_vocab: list[str] = field(default_factory=list)

    @property
    def latent_size(self) -> int:
        return self.image_size // 4

    @property
    def frame_channels(self) -> int:
        return len(self.cameras) * self.latent_channels


class VideoWorldModel(nn.Module):
    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        if cfg.size not in SIZES:
            raise ValueError(f"size: expected one of {sorted(SIZES)}, got {cfg.size!r}")
        if not cfg.task_vocab:
            raise ValueError("task_vocab is empty: build the config from a dataset (its task strings)")
        self.cfg = cfg
        C, K, H = cfg.frame_channels, cfg.context, cfg.chunk
        self.ae = FrameAutoencoder(cfg.latent_channels, cfg.ae_width)
        self.register_buffer("lat_mean", torch.zeros(C, 1, 1))
        self.register_buffer("lat_std", torch.ones(C, 1, 1))
        self.noise_emb = FourierEmbedding(cfg.cond_dim)
        self.ctx_noise_emb = FourierEmbedding(cfg.cond_dim)
        self.action_emb = nn.Linear(cfg.action_dim, cfg.cond_dim // 4)  # per action: frame-level conditioning
        self.cond = nn.Sequential(
            nn.Linear(2 * cfg.cond_dim + H * (cfg.cond_dim // 4) + cfg.state_dim, cfg.cond_dim), nn.SiLU(),
            nn.Linear(cfg.cond_dim, cfg.cond_dim))
        # Input: noisy future, context, and maps that give convolutions spatial access to the conditioning:
        # x/y coordinates (CoordConv) and the actions and proprioception broadcast over the latent grid.
        self.unet = UNet(H * C + K * C + 2 + H * cfg.action_dim + cfg.state_dim, H * C, cfg.cond_dim, SIZES[cfg.size])
        S = cfg.latent_size
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, S), torch.linspace(-1, 1, S), indexing="ij")
        self.register_buffer("coords", torch.stack([xs, ys])[None], persistent=False)
        self.task = TaskEncoder(cfg.task_vocab, cfg.task_dim)
        self.heads = FrameHeads(C, cfg.state_dim, cfg.task_dim, cfg.latent_size, env_state_dim=cfg.env_state_dim)
        self.scheduler = EDMEulerScheduler(sigma_min=cfg.sigma_min, sigma_max=cfg.sigma_max,
                                           sigma_data=cfg.sigma_data, prediction_type="epsilon")

    @property
    def device(self) -> torch.device:
        return self.lat_mean.device

    has_success_head = True  # imagined episodes can be scored (imagine, rank)

    # ------------------------------------------------------------------ frames <-> latents
    def encode_frames(self, images: dict[str, torch.Tensor | np.ndarray]) -> torch.Tensor:
        """{camera key: uint8 (N, H, W, 3)} -> standardised latents (N, C, S, S), cameras stacked on channels."""
        zs = []
        for cam in self.cfg.cameras:
            key = f"observation.images.{cam}"
            if key not in images:
                raise ValueError(f"missing camera {key!r}; got {sorted(images)}")
            x = torch.as_tensor(np.asarray(images[key]), device=self.device)
            if x.ndim != 4 or x.shape[1:] != (self.cfg.image_size, self.cfg.image_size, 3):
                raise ValueError(f"{key}: expected (N, {self.cfg.image_size}, {self.cfg.image_size}, 3), got {tuple(x.shape)}")
            zs.append(self.ae.encode(x.permute(0, 3, 1, 2).float() / 127.5 - 1.0))
        z = torch.cat(zs, dim=1)
        return (z - self.lat_mean) / self.lat_std

    def decode_frames(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        z = z * self.lat_std + self.lat_mean
        out = {}
        for i, cam in enumerate(self.cfg.cameras):
            zc = z[:, i * self.cfg.latent_channels : (i + 1) * self.cfg.latent_channels]
            x = self.ae.decode(zc).clamp(-1, 1)
            out[f"observation.images.{cam}"] = ((x + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1)
        return out

    # ------------------------------------------------------------------ the denoiser
    def _inputs(self, x_in: torch.Tensor, ctx: torch.Tensor, actions: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        B, S = x_in.shape[0], x_in.shape[-1]
        maps = torch.cat([actions.reshape(B, -1), proprio], dim=1)[:, :, None, None].expand(-1, -1, S, S)
        return torch.cat([x_in, ctx.flatten(1, 2), self.coords.expand(B, -1, -1, -1), maps], dim=1)

    def _condition(self, c_noise, ctx_sigma, actions, proprio):
        B = actions.shape[0]
        a = self.action_emb(actions).reshape(B, -1)
        return self.cond(torch.cat([self.noise_emb(c_noise), self.ctx_noise_emb(ctx_sigma), a, proprio], dim=-1))

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor, ctx: torch.Tensor, ctx_sigma: torch.Tensor,
                actions: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """D(x; sigma): the denoised future latents (B, H*C, S, S) given noisy ones."""
        B = x.shape[0]
        c_skip, c_out, c_in, c_noise = (c.reshape(B, 1, 1, 1) if c.ndim else c for c in edm_coefficients(sigma, self.cfg.sigma_data))
        cond = self._condition(c_noise.reshape(B), ctx_sigma, actions, proprio)
        F_ = self.unet(self._inputs(c_in * x, ctx, actions, proprio), cond)
        return c_skip * x + c_out * F_

    # ------------------------------------------------------------------ losses
    def dynamics_loss(self, ctx: torch.Tensor, future: torch.Tensor, actions: torch.Tensor, proprio: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
        """ctx (B,K,C,S,S), future (B,H,C,S,S), actions (B,H,A), proprio (B,state_dim), mask (B,H) of real frames."""
        B, H, C = future.shape[:3]
        ctx_sigma = torch.rand(B, device=ctx.device) * self.cfg.context_noise_max
        ctx = ctx + ctx_sigma.reshape(B, 1, 1, 1, 1) * torch.randn_like(ctx)
        x0 = future.flatten(1, 2)
        if self.cfg.deterministic:
            sigma = torch.full((B,), self.cfg.sigma_max, device=x0.device)
            pred = self.denoise(torch.zeros_like(x0), sigma, ctx, ctx_sigma, actions, proprio)
            err = (pred - x0) ** 2
        else:
            sigma = torch.exp(self.cfg.p_mean + self.cfg.p_std * torch.randn(B, device=x0.device))
            x = x0 + sigma.reshape(B, 1, 1, 1) * torch.randn_like(x0)
            c_skip, c_out, c_in, c_noise = (c.reshape(B, 1, 1, 1) for c in edm_coefficients(sigma, self.cfg.sigma_data))
            cond = self._condition(c_noise.reshape(B), ctx_sigma, actions, proprio)
            F_ = self.unet(self._inputs(c_in * x, ctx, actions, proprio), cond)
            err = (F_ - (x0 - c_skip * x) / c_out) ** 2  # EDM loss: lambda(sigma) ||D(x) - x0||^2
        err = err.reshape(B, H, C, *err.shape[-2:])
        if self.cfg.motion_weight:  # most of a frame is static background; the arm and cubes are what matter
            moved = (future - ctx[:, -1:]).abs().mean(dim=2, keepdim=True)  # (B, H, 1, S, S), standardised units
            err = err * (1 + self.cfg.motion_weight * (moved / 0.5).clamp(max=1))
        err = err.mean(dim=(2, 3, 4))
        return (err * mask).sum() / mask.sum().clamp(min=1)

    def heads_loss(self, z: torch.Tensor, tasks: list[str], labels: dict[str, torch.Tensor], mask: torch.Tensor,
                   noise: float = 0.2, pos_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """Per-frame heads on latents z (N,C,S,S), noised a little so they transfer to generated latents."""
        z = z + noise * torch.rand(len(z), 1, 1, 1, device=z.device) * torch.randn_like(z)
        out = self.heads(z, self.task(tasks))
        m = mask.float()
        n = m.sum().clamp(min=1)
        l_state = (((out["state"] - labels["state"]) ** 2).mean(-1) * m).sum() / n
        l_succ = (F.binary_cross_entropy_with_logits(out["success_logit"], labels["success"], pos_weight=pos_weight,
                                                     reduction="none") * m).sum() / n
        l_rew = (((out["reward"] - labels["reward"]) ** 2) * m).sum() / n
        l_done = (F.binary_cross_entropy_with_logits(out["done_logit"], labels["done"], reduction="none") * m).sum() / n
        loss = l_state + l_succ + l_rew + 0.5 * l_done
        info = {"state": l_state.item(), "success": l_succ.item(), "reward": l_rew.item(), "done": l_done.item()}
        if "env_state" in out and "env_state" in labels:  # positions in metres: weighted so that 1 cm matters
            l_env = (((out["env_state"] - labels["env_state"]) ** 2).mean(-1) * m).sum() / n
            loss = loss + 100.0 * l_env
            info["env_state"] = l_env.item()
        return loss, info

    # ------------------------------------------------------------------ imagination
    @torch.no_grad()
    def sample_future(self, ctx: torch.Tensor, actions: torch.Tensor, proprio: torch.Tensor, steps: int | None = None,
                      generator: torch.Generator | None = None) -> torch.Tensor:
        """Latents of the next H frames (B, H, C, S, S) by Euler sampling through diffusers' EDM scheduler."""
        B = ctx.shape[0]
        H, C, S = self.cfg.chunk, self.cfg.frame_channels, self.cfg.latent_size
        ctx_sigma = torch.zeros(B, device=ctx.device)
        if self.cfg.deterministic:
            sigma = torch.full((B,), self.cfg.sigma_max, device=ctx.device)
            x = self.denoise(torch.zeros(B, H * C, S, S, device=ctx.device), sigma, ctx, ctx_sigma, actions, proprio)
            return x.reshape(B, H, C, S, S)
        sched = EDMEulerScheduler.from_config(self.scheduler.config)
        sched.set_timesteps(steps or self.cfg.sampling_steps, device=ctx.device)
        x = torch.randn(B, H * C, S, S, device=ctx.device, generator=generator) * sched.init_noise_sigma
        for t in sched.timesteps:  # EDM's timesteps are c_noise = ln(sigma) / 4
            x_in = sched.scale_model_input(x, t)  # c_in * x
            cond = self._condition(t.reshape(1).expand(B).to(ctx.device), ctx_sigma, actions, proprio)
            F_ = self.unet(self._inputs(x_in, ctx, actions, proprio), cond)
            x = sched.step(F_, t, x).prev_sample  # c_skip x + c_out F, then the Euler step
        return x.reshape(B, H, C, S, S)

    @torch.no_grad()
    def encode(self, obs: dict) -> dict:
        """Observation dict with K context frames per camera (B, K, H, W, 3) (or one frame (B, H, W, 3), repeated),
        `observation.state` (B, state_dim) and `task` (B strings) -> imagination state."""
        imgs = {k: torch.as_tensor(np.asarray(v)) for k, v in obs.items() if k.startswith("observation.images.")}
        first = next(iter(imgs.values()))
        if first.ndim == 4:
            imgs = {k: v[:, None].expand(-1, self.cfg.context, *v.shape[1:]) for k, v in imgs.items()}
        B, K = next(iter(imgs.values())).shape[:2]
        if K != self.cfg.context:
            raise ValueError(f"expected {self.cfg.context} context frames, got {K}")
        z = self.encode_frames({k: v.reshape(B * K, *v.shape[2:]) for k, v in imgs.items()})
        proprio = torch.as_tensor(np.asarray(obs["observation.state"]), dtype=torch.float32, device=self.device)
        tasks = list(obs["task"]) if not isinstance(obs["task"], str) else [obs["task"]] * B
        return {"ctx": z.reshape(B, K, *z.shape[1:]), "proprio": proprio, "task": tasks}

    @torch.no_grad()
    def step(self, state: dict, action_chunk: torch.Tensor, steps: int | None = None,
             generator: torch.Generator | None = None) -> tuple[dict, dict]:
        """Advance by h <= H actions (B, h, A). Returns the new state and per-frame predictions (B, h, ...):
        `latents`, `observation.state`, `success` (probability), `reward`, `done` (probability)."""
        a = torch.as_tensor(action_chunk, dtype=torch.float32, device=self.device)
        if a.ndim != 3 or a.shape[-1] != self.cfg.action_dim or not 1 <= a.shape[1] <= self.cfg.chunk:
            raise ValueError(f"action_chunk: expected (B, 1..{self.cfg.chunk}, {self.cfg.action_dim}), got {tuple(a.shape)}")
        if not torch.isfinite(a).all():
            raise ValueError("action_chunk: contains NaN or inf")
        h = a.shape[1]
        if h < self.cfg.chunk:  # pad with the last real action; only the first h frames are kept
            a = torch.cat([a, a[:, -1:].expand(-1, self.cfg.chunk - h, -1)], dim=1)
        fut = self.sample_future(state["ctx"], a, state["proprio"], steps, generator)[:, :h]
        B = fut.shape[0]
        out = self.heads(fut.flatten(0, 1), self.task(state["task"]).repeat_interleave(h, dim=0))
        preds = {"latents": fut, "observation.state": out["state"].reshape(B, h, -1),
                 "success": torch.sigmoid(out["success_logit"]).reshape(B, h),
                 "reward": out["reward"].reshape(B, h), "done": torch.sigmoid(out["done_logit"]).reshape(B, h)}
        if "env_state" in out:
            preds["observation.environment_state"] = out["env_state"].reshape(B, h, -1)
        ctx = torch.cat([state["ctx"], fut], dim=1)[:, -self.cfg.context :].contiguous()
        return {"ctx": ctx, "proprio": preds["observation.state"][:, -1], "task": state["task"]}, preds

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> dict[str, np.ndarray]:
        """Latents (..., C, S, S) -> {camera key: uint8 (..., H, W, 3)}."""
        lead = latents.shape[:-3]
        frames = self.decode_frames(latents.reshape(-1, *latents.shape[-3:]))
        return {k: v.reshape(*lead, *v.shape[1:]).cpu().numpy() for k, v in frames.items()}

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | Path) -> None:
        save_pretrained(self, self.cfg, path)

    @classmethod
    def load(cls, path: str | Path, expect: WorldModelConfig | None = None, device: str = "cpu") -> "VideoWorldModel":
        cfg = read_config(path, WorldModelConfig, expect, what="world-model checkpoint")
        return load_state(cls(cfg), path, device)
