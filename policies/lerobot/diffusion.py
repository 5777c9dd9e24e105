"""LeRobot's Diffusion Policy (Chi et al., "Diffusion Policy: Visuomotor Policy Learning via Action Diffusion",
RSS 2023) loaded from a LeRobot checkpoint without lerobot.

Rebuilt module for module under LeRobot's parameter names (`diffusion.rgb_encoder.backbone.4.0.conv1.weight`,
`diffusion.unet.down_modules.0.0.conv1.block.0.weight`, ...), so `model.safetensors` loads strictly:

    global_cond = [state, ResNet -> spatial-softmax keypoints -> Linear+ReLU per camera, (env state)] x n_obs_steps
    x_T ~ N(0, I) (B, horizon, A) -> 1-D conditional U-Net with FiLM, DDPM or DDIM steps (diffusers' schedulers,
    as LeRobot uses) -> actions [n_obs_steps - 1, n_obs_steps - 1 + n_action_steps)

Observations are kept for the last `n_obs_steps` control steps (the first one repeated after a reset), so the
policy must see every step: `select_action` (the evaluation loop never steps it by chunks; see
`wmrl.eval.loop.chunk_steps`). The training loss (`forward`) is LeRobot's: MSE on the noise (or on the sample).
No tractable action likelihood: not trainable with GRPO here.
"""

from __future__ import annotations

import math
from collections import deque
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from policies.lerobot.common import LeRobotPolicy, ResNetTrunk
from wmrl.core.features import ACTION

DEFAULTS = dict(n_obs_steps=2, horizon=16, n_action_steps=8, vision_backbone="resnet18", resize_shape=None,
                crop_ratio=1.0, crop_shape=(84, 84), crop_is_random=True, use_group_norm=True,
                spatial_softmax_num_keypoints=32, use_separate_rgb_encoder_per_camera=False,
                down_dims=(512, 1024, 2048), kernel_size=5, n_groups=8, diffusion_step_embed_dim=128,
                use_film_scale_modulation=True, noise_scheduler_type="DDPM", num_train_timesteps=100,
                beta_schedule="squaredcos_cap_v2", beta_start=0.0001, beta_end=0.02, prediction_type="epsilon",
                clip_sample=True, clip_sample_range=1.0, num_inference_steps=None, do_mask_loss_for_padding=False)


class SpatialSoftmax(nn.Module):
    """Keypoints as the expected image coordinates of each channel's softmax (Finn et al., 2016), after a 1x1
    conv to `num_kp` channels; coordinates in [-1, 1], x then y."""

    def __init__(self, c: int, h: int, w: int, num_kp: int | None):
        super().__init__()
        self.nets = nn.Conv2d(c, num_kp, 1) if num_kp is not None else None
        self.h, self.w, self.k = h, w, num_kp or c
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h, dtype=torch.float64), torch.linspace(-1, 1, w, dtype=torch.float64), indexing="ij")
        self.register_buffer("pos_grid", torch.stack([xs.reshape(-1), ys.reshape(-1)], 1).float())

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        if self.nets is not None:
            f = self.nets(f)
        att = F.softmax(f.reshape(-1, self.h * self.w), -1)
        return (att @ self.pos_grid).view(-1, self.k, 2)


def _center_crop(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    H, W = x.shape[-2:]
    top, left = int(round((H - hw[0]) / 2.0)), int(round((W - hw[1]) / 2.0))  # torchvision's CenterCrop
    return x[..., top : top + hw[0], left : left + hw[1]]


class RgbEncoder(nn.Module):
    """LeRobot's `DiffusionRgbEncoder`: (resize), crop (random in training, centre at inference), ResNet trunk
    (BatchNorm, or GroupNorm(C/16) with `use_group_norm`), spatial softmax, Linear + ReLU."""

    def __init__(self, c: SimpleNamespace, image_shape: tuple[int, int, int]):
        super().__init__()
        self.c = c
        trunk = ResNetTrunk(c.vision_backbone, norm=(lambda n: nn.GroupNorm(n // 16, n)) if c.use_group_norm else nn.BatchNorm2d)
        self.backbone = nn.Sequential(*trunk.children_in_order())  # keys backbone.0 (conv1) ... backbone.7 (layer4)
        hw = c.crop_shape or c.resize_shape or image_shape[1:]
        with torch.no_grad():
            fh, fw = self.backbone(torch.zeros(1, image_shape[0], *hw)).shape[-2:]
        self.pool = SpatialSoftmax(trunk.out_channels, fh, fw, c.spatial_softmax_num_keypoints)
        self.feature_dim = c.spatial_softmax_num_keypoints * 2
        self.out = nn.Linear(self.feature_dim, self.feature_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.c.resize_shape is not None:
            x = F.interpolate(x, size=tuple(self.c.resize_shape), mode="bilinear", align_corners=False, antialias=True)
        if self.c.crop_shape is not None:
            ch, cw = self.c.crop_shape
            if self.training and self.c.crop_is_random:
                top = int(torch.randint(0, x.shape[-2] - ch + 1, ()))
                left = int(torch.randint(0, x.shape[-1] - cw + 1, ()))
                x = x[..., top : top + ch, left : left + cw]
            else:
                x = _center_crop(x, (ch, cw))
        return F.relu(self.out(self.pool(self.backbone(x)).flatten(1)))


class Conv1dBlock(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, groups: int = 8):
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(cin, cout, k, padding=k // 2), nn.GroupNorm(groups, cout), nn.Mish())

    def forward(self, x):
        return self.block(x)


class ResBlock1d(nn.Module):
    """Conv block, FiLM from the conditioning (scale and bias, or bias only), conv block, residual."""

    def __init__(self, cin: int, cout: int, cond_dim: int, k: int, groups: int, film_scale: bool):
        super().__init__()
        self.cout, self.film_scale = cout, film_scale
        self.conv1, self.conv2 = Conv1dBlock(cin, cout, k, groups), Conv1dBlock(cout, cout, k, groups)
        self.cond_encoder = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, cout * 2 if film_scale else cout))
        self.residual_conv = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, cond):
        out = self.conv1(x)
        e = self.cond_encoder(cond)[..., None]
        out = e[:, : self.cout] * out + e[:, self.cout :] if self.film_scale else out + e
        return self.conv2(out) + self.residual_conv(x)


class ConditionalUnet1d(nn.Module):
    """LeRobot's `DiffusionConditionalUnet1d` (global conditioning only)."""

    def __init__(self, c: SimpleNamespace, action_dim: int, global_cond_dim: int):
        super().__init__()
        e = c.diffusion_step_embed_dim
        self.embed_dim = e
        self.diffusion_step_encoder = nn.Sequential(nn.Identity(), nn.Linear(e, e * 4), nn.Mish(), nn.Linear(e * 4, e))
        kw = dict(cond_dim=e + global_cond_dim, k=c.kernel_size, groups=c.n_groups, film_scale=c.use_film_scale_modulation)
        dims = list(c.down_dims)
        in_out = [(action_dim, dims[0]), *zip(dims[:-1], dims[1:])]
        self.down_modules = nn.ModuleList(
            nn.ModuleList([ResBlock1d(i, o, **kw), ResBlock1d(o, o, **kw),
                           nn.Conv1d(o, o, 3, 2, 1) if n < len(in_out) - 1 else nn.Identity()])
            for n, (i, o) in enumerate(in_out))
        self.mid_modules = nn.ModuleList([ResBlock1d(dims[-1], dims[-1], **kw), ResBlock1d(dims[-1], dims[-1], **kw)])
        # LeRobot's "is_last" test never holds on the way up, so every up stage has its transposed conv (kept: the
        # checkpoints carry those weights)
        self.up_modules = nn.ModuleList(
            nn.ModuleList([ResBlock1d(i * 2, o, **kw), ResBlock1d(o, o, **kw), nn.ConvTranspose1d(o, o, 4, 2, 1)])
            for o, i in reversed(in_out[1:]))
        self.final_conv = nn.Sequential(Conv1dBlock(dims[0], dims[0], c.kernel_size), nn.Conv1d(dims[0], action_dim, 1))

    def step_embedding(self, t: torch.Tensor) -> torch.Tensor:
        half = self.embed_dim // 2
        f = torch.exp(torch.arange(half, device=t.device) * -(math.log(10000) / (half - 1)))
        arg = t.float()[:, None] * f[None]
        return self.diffusion_step_encoder(torch.cat([arg.sin(), arg.cos()], -1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, global_cond: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        cond = torch.cat([self.step_embedding(t), global_cond], -1)
        skips = []
        for r1, r2, down in self.down_modules:
            x = r2(r1(x, cond), cond)
            skips.append(x)
            x = down(x)
        for m in self.mid_modules:
            x = m(x, cond)
        for r1, r2, up in self.up_modules:
            x = up(r2(r1(torch.cat([x, skips.pop()], 1), cond), cond))
        return self.final_conv(x).transpose(1, 2)


class DiffusionModel(nn.Module):
    """LeRobot's `DiffusionModel` (`DiffusionPolicy.diffusion`): conditioning, U-Net and the noise scheduler."""

    def __init__(self, c: SimpleNamespace, state_dim: int, env_dim: int, action_dim: int,
                 image_shapes: list[tuple[int, int, int]]):
        super().__init__()
        from diffusers import DDIMScheduler, DDPMScheduler

        self.c, self.action_dim = c, action_dim
        cond = state_dim + env_dim
        if image_shapes:
            if c.use_separate_rgb_encoder_per_camera:
                self.rgb_encoder = nn.ModuleList(RgbEncoder(c, s) for s in image_shapes)
                cond += self.rgb_encoder[0].feature_dim * len(image_shapes)
            else:
                self.rgb_encoder = RgbEncoder(c, image_shapes[0])
                cond += self.rgb_encoder.feature_dim * len(image_shapes)
        self.unet = ConditionalUnet1d(c, action_dim, cond * c.n_obs_steps)
        if c.noise_scheduler_type not in ("DDPM", "DDIM"):
            raise ValueError(f"noise_scheduler_type {c.noise_scheduler_type!r}: DDPM or DDIM")
        sched = DDPMScheduler if c.noise_scheduler_type == "DDPM" else DDIMScheduler
        self.noise_scheduler = sched(num_train_timesteps=c.num_train_timesteps, beta_start=c.beta_start,
                                     beta_end=c.beta_end, beta_schedule=c.beta_schedule, clip_sample=c.clip_sample,
                                     clip_sample_range=c.clip_sample_range, prediction_type=c.prediction_type)
        self.num_inference_steps = c.num_inference_steps or c.num_train_timesteps

    def global_cond(self, state, env, images) -> torch.Tensor:
        """state (B, S, Ds), env (B, S, De) or None, images (B, S, N, C, H, W) or None -> (B, S * cond)."""
        B, S = (state if state is not None else env).shape[:2]
        feats = [state] if state is not None else []
        if images is not None:
            N = images.shape[2]
            if self.c.use_separate_rgb_encoder_per_camera:
                per_cam = [enc(images[:, :, n].flatten(0, 1)).reshape(B, S, -1) for n, enc in enumerate(self.rgb_encoder)]
                feats.append(torch.cat(per_cam, -1))
            else:
                feats.append(self.rgb_encoder(images.flatten(0, 2)).reshape(B, S, N * self.rgb_encoder.feature_dim))
        if env is not None:
            feats.append(env)
        return torch.cat(feats, -1).flatten(1)

    def sample(self, cond: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        x = torch.randn(cond.shape[0], self.c.horizon, self.action_dim, device=cond.device, generator=generator)
        self.noise_scheduler.set_timesteps(self.num_inference_steps)
        for t in self.noise_scheduler.timesteps:
            eps = self.unet(x, torch.full((x.shape[0],), int(t), dtype=torch.long, device=x.device), cond)
            x = self.noise_scheduler.step(eps, t, x, generator=generator).prev_sample
        return x

    def loss(self, cond: torch.Tensor, a: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        eps = torch.randn_like(a)
        t = torch.randint(0, self.c.num_train_timesteps, (a.shape[0],), device=a.device)
        pred = self.unet(self.noise_scheduler.add_noise(a, eps, t), t, cond)
        if self.c.prediction_type not in ("epsilon", "sample"):
            raise ValueError(f"prediction_type {self.c.prediction_type!r}: epsilon or sample")
        err = F.mse_loss(pred, eps if self.c.prediction_type == "epsilon" else a, reduction="none")
        if not self.c.do_mask_loss_for_padding:
            return err.mean()
        m = (~pad)[..., None].float()
        return (err * m).sum() / (m.sum() * err.shape[-1]).clamp(min=1)


class DiffusionPolicy(LeRobotPolicy):
    """`--policy.type diffusion --policy.path DIR`: a LeRobot Diffusion Policy checkpoint behind our Policy
    protocol."""

    policy_type = "diffusion"

    def __init__(self, config: dict, stats: dict):
        super().__init__(config, stats)
        c = SimpleNamespace(**{**DEFAULTS, **{k: config[k] for k in DEFAULTS if k in config}})
        for k in ("crop_shape", "resize_shape", "down_dims"):
            if getattr(c, k) is not None:
                setattr(c, k, tuple(getattr(c, k)))
        if c.resize_shape is not None:  # LeRobot's rule: with a resize, the crop comes from crop_ratio alone
            c.crop_shape = ((int(c.resize_shape[0] * c.crop_ratio), int(c.resize_shape[1] * c.crop_ratio))
                            if c.crop_ratio < 1.0 else None)
        if c.n_action_steps > c.horizon - c.n_obs_steps + 1:
            raise ValueError(f"n_action_steps {c.n_action_steps} > horizon - n_obs_steps + 1 ({c.horizon - c.n_obs_steps + 1})")
        if self.state_key is None:
            raise ValueError("Diffusion Policy needs observation.state among its inputs")
        if c.down_dims and c.horizon % (2 ** (len(c.down_dims) - 1)):
            raise ValueError(f"horizon {c.horizon} must be divisible by 2^(len(down_dims) - 1) for the U-Net")
        shapes = [tuple(config["input_features"][k]["shape"]) for k in self.image_keys]
        if c.crop_shape is not None and any(s[1] < c.crop_shape[0] or s[2] < c.crop_shape[1] for s in shapes) and c.resize_shape is None:
            raise ValueError(f"crop_shape {c.crop_shape} is larger than the images {shapes}")
        self.cfg = c
        feats = config["input_features"]
        self.diffusion = DiffusionModel(c, int(feats[self.state_key]["shape"][0]),
                                        int(feats[self.env_key]["shape"][0]) if self.env_key else 0, self.action_dim, shapes)
        self._history: deque = deque(maxlen=c.n_obs_steps)

    def reset(self) -> None:
        super().reset()
        self._history.clear()

    def _stack(self, b: dict) -> tuple:
        """Per-step normalised batches (oldest first) -> (state, env, images) with a time axis."""
        st = lambda k: torch.stack([h[k] for h in b], 1) if k is not None else None
        imgs = torch.stack([torch.stack([h[k] for k in self.image_keys], 1) for h in b], 1) if self.image_keys else None
        return st(self.state_key), st(self.env_key), imgs

    @torch.no_grad()
    def predict_action_chunk(self, obs: dict) -> torch.Tensor:
        """The next `n_action_steps` actions (B, n_action_steps, A) from the observation history (this step's
        observation added; after a reset it fills the whole history)."""
        self.eval()
        b = self.batch(obs)
        if len(self._history) and next(iter(self._history[0].values())).shape[0] != next(iter(b.values())).shape[0]:
            self._history.clear()  # another batch size: a new set of episodes
        while len(self._history) < self.cfg.n_obs_steps - 1:
            self._history.append(b)
        self._history.append(b)
        cond = self.diffusion.global_cond(*self._stack(list(self._history)))
        x = self.diffusion.sample(cond, self.generator)
        start = self.cfg.n_obs_steps - 1
        return self.normalizer.unnormalize(ACTION, x[:, start : start + self.cfg.n_action_steps])

    @torch.no_grad()
    def select_action(self, obs: dict) -> torch.Tensor:
        if self._queue:  # the history still needs this step's observation
            b = self.batch(obs)
            self._history.append(b)
            return self._queue.popleft()
        self._queue.extend(self.predict_action_chunk(obs).transpose(0, 1))
        return self._queue.popleft()

    def _loss(self, b: dict) -> tuple[torch.Tensor, dict]:
        """One observation step repeated n_obs_steps times (a batch from a replay holds one step), actions over
        the whole horizon."""
        a = b[ACTION]
        if a.shape[1] != self.cfg.horizon:
            raise ValueError(f"{ACTION}: expected chunks of horizon {self.cfg.horizon}, got {a.shape[1]}")
        cond = self.diffusion.global_cond(*self._stack([b] * self.cfg.n_obs_steps))
        loss = self.diffusion.loss(cond, a, b["action_is_pad"])
        return loss, {"diffusion_loss": float(loss.detach())}
