"""LeRobot's ACT (Action Chunking Transformer; Zhao et al., "Learning Fine-Grained Bimanual Manipulation with
Low-Cost Hardware", RSS 2023) loaded from a LeRobot checkpoint without lerobot.

The network is rebuilt module for module under LeRobot's parameter names (`model.backbone.layer1.0.conv1.weight`,
`model.encoder.layers.0.self_attn.in_proj_weight`, ...), so `model.safetensors` loads strictly:

    tokens  = [latent z, (robot state), (env state), image feature-map pixels per camera]   (post-norm encoder)
    queries = chunk_size learned positions (DETR-style)                        -> decoder -> action_head -> chunk

At inference the CVAE's latent is zero (its prior mean), as in LeRobot and the paper. The training loss
(`forward`) is LeRobot's: L1 on the chunk plus `kl_weight` x KL of the CVAE posterior (Eq. 1 of the paper).
Temporal ensembling (`temporal_ensemble_coeff`, Algorithm 2) uses the same ensembler as our VLA.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from policies.lerobot.common import FrozenBatchNorm2d, LeRobotPolicy, ResNetTrunk
from policies.vla.modeling import TemporalEnsembler
from wmrl.core.features import ACTION

DEFAULTS = dict(n_obs_steps=1, chunk_size=100, n_action_steps=100, vision_backbone="resnet18",
                replace_final_stride_with_dilation=False, pre_norm=False, dim_model=512, n_heads=8,
                dim_feedforward=3200, feedforward_activation="relu", n_encoder_layers=4, n_decoder_layers=1,
                use_vae=True, latent_dim=32, n_vae_encoder_layers=4, temporal_ensemble_coeff=None, dropout=0.1,
                kl_weight=10.0)
_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "glu": F.glu}


def sinusoid_1d(n: int, d: int) -> torch.Tensor:
    """(n, d) fixed sinusoidal positions of "Attention is all you need" (sin on even, cos on odd dims)."""
    pos = np.arange(n)[:, None] / np.power(10000, 2 * (np.arange(d) // 2) / d)[None]
    pos[:, 0::2], pos[:, 1::2] = np.sin(pos[:, 0::2]), np.cos(pos[:, 1::2])
    return torch.from_numpy(pos).float()


def sinusoid_2d(feat: torch.Tensor, d: int) -> torch.Tensor:
    """(1, 2d, H, W) positions of a feature map: y then x, each normalised to (0, 2 pi] (DETR's variant)."""
    H, W = feat.shape[-2:]
    y = torch.arange(1, H + 1, dtype=torch.float32, device=feat.device)[:, None].expand(H, W)
    x = torch.arange(1, W + 1, dtype=torch.float32, device=feat.device)[None].expand(H, W)
    y, x = y / (H + 1e-6) * 2 * math.pi, x / (W + 1e-6) * 2 * math.pi
    freq = 10000 ** (2 * (torch.arange(d, dtype=torch.float32, device=feat.device) // 2) / d)
    px, py = x[..., None] / freq, y[..., None] / freq
    px = torch.stack((px[..., 0::2].sin(), px[..., 1::2].cos()), -1).flatten(2)
    py = torch.stack((py[..., 0::2].sin(), py[..., 1::2].cos()), -1).flatten(2)
    return torch.cat((py, px), -1).permute(2, 0, 1)[None]


class EncoderLayer(nn.Module):
    def __init__(self, c: SimpleNamespace):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(c.dim_model, c.n_heads, dropout=c.dropout)
        self.linear1, self.linear2 = nn.Linear(c.dim_model, c.dim_feedforward), nn.Linear(c.dim_feedforward, c.dim_model)
        self.norm1, self.norm2 = nn.LayerNorm(c.dim_model), nn.LayerNorm(c.dim_model)
        self.dropout, self.dropout1, self.dropout2 = nn.Dropout(c.dropout), nn.Dropout(c.dropout), nn.Dropout(c.dropout)
        self.act, self.pre_norm = _ACTIVATIONS[c.feedforward_activation], c.pre_norm

    def forward(self, x, pos=None, key_padding_mask=None):
        skip = x
        if self.pre_norm:
            x = self.norm1(x)
        q = k = x if pos is None else x + pos
        x = skip + self.dropout1(self.self_attn(q, k, value=x, key_padding_mask=key_padding_mask)[0])
        if self.pre_norm:
            skip, x = x, self.norm2(x)
        else:
            x = skip = self.norm1(x)
        x = skip + self.dropout2(self.linear2(self.dropout(self.act(self.linear1(x)))))
        return x if self.pre_norm else self.norm2(x)


class Encoder(nn.Module):
    def __init__(self, c: SimpleNamespace, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(c) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(c.dim_model) if c.pre_norm else nn.Identity()

    def forward(self, x, pos=None, key_padding_mask=None):
        for layer in self.layers:
            x = layer(x, pos, key_padding_mask)
        return self.norm(x)


class DecoderLayer(nn.Module):
    def __init__(self, c: SimpleNamespace):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(c.dim_model, c.n_heads, dropout=c.dropout)
        self.multihead_attn = nn.MultiheadAttention(c.dim_model, c.n_heads, dropout=c.dropout)
        self.linear1, self.linear2 = nn.Linear(c.dim_model, c.dim_feedforward), nn.Linear(c.dim_feedforward, c.dim_model)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(c.dim_model) for _ in range(3))
        self.dropout = nn.Dropout(c.dropout)
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(c.dropout) for _ in range(3))
        self.act, self.pre_norm = _ACTIVATIONS[c.feedforward_activation], c.pre_norm

    def forward(self, x, mem, pos_dec, pos_enc):
        skip = x
        if self.pre_norm:
            x = self.norm1(x)
        q = k = x + pos_dec
        x = skip + self.dropout1(self.self_attn(q, k, value=x)[0])
        if self.pre_norm:
            skip, x = x, self.norm2(x)
        else:
            x = skip = self.norm1(x)
        x = skip + self.dropout2(self.multihead_attn(query=x + pos_dec, key=mem + pos_enc, value=mem)[0])
        if self.pre_norm:
            skip, x = x, self.norm3(x)
        else:
            x = skip = self.norm2(x)
        x = skip + self.dropout3(self.linear2(self.dropout(self.act(self.linear1(x)))))
        return x if self.pre_norm else self.norm3(x)


class Decoder(nn.Module):
    def __init__(self, c: SimpleNamespace):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c.n_decoder_layers)])
        self.norm = nn.LayerNorm(c.dim_model)

    def forward(self, x, mem, pos_dec, pos_enc):
        for layer in self.layers:
            x = layer(x, mem, pos_dec, pos_enc)
        return self.norm(x)


class ACT(nn.Module):
    """The network (LeRobot's `ACT`, `ACTPolicy.model`), in normalised space."""

    def __init__(self, c: SimpleNamespace, state_dim: int, env_dim: int, action_dim: int, n_cameras: int):
        super().__init__()
        self.c, D = c, c.dim_model
        self.has_state, self.has_env, self.n_cameras = state_dim > 0, env_dim > 0, n_cameras
        if c.use_vae:
            self.vae_encoder = Encoder(c, c.n_vae_encoder_layers)
            self.vae_encoder_cls_embed = nn.Embedding(1, D)
            if self.has_state:
                self.vae_encoder_robot_state_input_proj = nn.Linear(state_dim, D)
            self.vae_encoder_action_input_proj = nn.Linear(action_dim, D)
            self.vae_encoder_latent_output_proj = nn.Linear(D, c.latent_dim * 2)
            self.register_buffer("vae_encoder_pos_enc", sinusoid_1d(1 + c.chunk_size + self.has_state, D)[None])
        if n_cameras:
            self.backbone = ResNetTrunk(c.vision_backbone, norm=FrozenBatchNorm2d)
        self.encoder, self.decoder = Encoder(c, c.n_encoder_layers), Decoder(c)
        if self.has_state:
            self.encoder_robot_state_input_proj = nn.Linear(state_dim, D)
        if self.has_env:
            self.encoder_env_state_input_proj = nn.Linear(env_dim, D)
        self.encoder_latent_input_proj = nn.Linear(c.latent_dim, D)
        if n_cameras:
            self.encoder_img_feat_input_proj = nn.Conv2d(self.backbone.out_channels, D, 1)
        self.encoder_1d_feature_pos_embed = nn.Embedding(1 + self.has_state + self.has_env, D)
        self.decoder_pos_embed = nn.Embedding(c.chunk_size, D)
        self.action_head = nn.Linear(D, action_dim)

    def forward(self, state, env, images: list[torch.Tensor], actions=None, action_is_pad=None):
        """Normalised inputs -> (chunk (B, chunk_size, A), (mu, log sigma^2) or (None, None))."""
        B = (images[0] if images else env).shape[0]
        ref = images[0] if images else env
        if self.c.use_vae and actions is not None and self.training:
            tokens = [self.vae_encoder_cls_embed.weight[None].expand(B, -1, -1)]
            if self.has_state:
                tokens.append(self.vae_encoder_robot_state_input_proj(state)[:, None])
            tokens.append(self.vae_encoder_action_input_proj(actions))
            pad = torch.cat([torch.zeros(B, 1 + self.has_state, dtype=torch.bool, device=ref.device), action_is_pad], 1)
            cls = self.vae_encoder(torch.cat(tokens, 1).transpose(0, 1), self.vae_encoder_pos_enc.transpose(0, 1),
                                   key_padding_mask=pad)[0]
            params = self.vae_encoder_latent_output_proj(cls)
            mu, logvar = params[:, : self.c.latent_dim], params[:, self.c.latent_dim :]
            z = mu + (logvar / 2).exp() * torch.randn_like(mu)
        else:
            mu = logvar = None
            z = torch.zeros(B, self.c.latent_dim, device=ref.device)
        tokens = [self.encoder_latent_input_proj(z)]
        pos = list(self.encoder_1d_feature_pos_embed.weight[:, None])
        if self.has_state:
            tokens.append(self.encoder_robot_state_input_proj(state))
        if self.has_env:
            tokens.append(self.encoder_env_state_input_proj(env))
        for img in images:
            f = self.backbone(img)
            p = sinusoid_2d(f, self.c.dim_model // 2).to(f.dtype)
            f = self.encoder_img_feat_input_proj(f)
            tokens.extend(f.flatten(2).permute(2, 0, 1))  # (h w) tokens of (B, D)
            pos.extend(p.flatten(2).permute(2, 0, 1))
        tokens, pos = torch.stack(tokens), torch.stack(pos)
        mem = self.encoder(tokens, pos)
        out = self.decoder(torch.zeros(self.c.chunk_size, B, self.c.dim_model, device=ref.device), mem,
                           self.decoder_pos_embed.weight[:, None], pos)
        return self.action_head(out.transpose(0, 1)), (mu, logvar)


class ACTPolicy(LeRobotPolicy):
    """`--policy.type act --policy.path DIR`: a LeRobot ACT checkpoint behind our Policy protocol."""

    policy_type = "act"

    def __init__(self, config: dict, stats: dict):
        super().__init__(config, stats)
        c = SimpleNamespace(**{**DEFAULTS, **{k: config[k] for k in DEFAULTS if k in config}})
        if c.n_obs_steps != 1:
            raise ValueError(f"ACT uses one observation step; config.json has n_obs_steps={c.n_obs_steps}")
        if c.n_action_steps > c.chunk_size:
            raise ValueError(f"n_action_steps {c.n_action_steps} > chunk_size {c.chunk_size}")
        if c.temporal_ensemble_coeff is not None and c.n_action_steps > 1:
            raise ValueError("temporal ensembling needs n_action_steps = 1 (the policy is queried every step)")
        if c.replace_final_stride_with_dilation:  # torchvision refuses it for resnet18/34; not built here for 50
            raise ValueError("replace_final_stride_with_dilation is not supported (a dilated layer4)")
        if not self.image_keys and self.env_key is None:
            raise ValueError("ACT needs at least one image or observation.environment_state among its inputs")
        self.cfg = c
        feats = config["input_features"]
        self.model = ACT(c, int(feats[self.state_key]["shape"][0]) if self.state_key else 0,
                         int(feats[self.env_key]["shape"][0]) if self.env_key else 0, self.action_dim, len(self.image_keys))
        self.ensembler = (TemporalEnsembler(c.temporal_ensemble_coeff, c.chunk_size)
                          if c.temporal_ensemble_coeff is not None else None)

    def reset(self) -> None:
        super().reset()
        if self.ensembler is not None:
            self.ensembler.reset()

    @torch.no_grad()
    def select_action(self, obs: dict) -> torch.Tensor:
        if self.ensembler is not None:
            return self.ensembler.update(self.predict_action_chunk(obs))
        return super().select_action(obs)

    def _inputs(self, b: dict):
        return b.get(self.state_key), b.get(self.env_key), [b[k] for k in self.image_keys]

    def _chunk(self, b: dict) -> torch.Tensor:
        return self.model(*self._inputs(b))[0]

    def _loss(self, b: dict) -> tuple[torch.Tensor, dict]:
        a, pad = b[ACTION], b["action_is_pad"]
        if a.shape[1] != self.cfg.chunk_size:
            raise ValueError(f"{ACTION}: expected chunks of {self.cfg.chunk_size}, got {a.shape[1]}")
        pred, (mu, logvar) = self.model(*self._inputs(b), actions=a, action_is_pad=pad)
        valid = (~pad)[..., None].float()
        l1 = (F.l1_loss(pred, a, reduction="none") * valid).sum() / (valid.sum() * a.shape[-1]).clamp(min=1)
        info = {"l1_loss": float(l1.detach())}
        if mu is None:
            return l1, info
        kld = (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp())).sum(-1).mean()
        info["kld_loss"] = float(kld.detach())
        return l1 + self.cfg.kl_weight * kld, info
