"""`estimated-state`: a pixel policy in two stages.

A perception module (`StateEstimator`: one `VisionEncoder` per camera, the VLA's, plus the proprioceptive state)
estimates the object channel (`observation.environment_state`: cube and zone centres) from the cameras; an MLP
actor maps [state, estimate] to the action. Both learn from supervision the simulator (or a twin, or a tracked
real cell) records: the estimator from the recorded object channel, the actor from the clean expert's action at
each recorded state (DART labels), with the *estimator's outputs* as its inputs so that it meets the estimator's
errors in training (a learner trained on the true state keeps 40% of its 98% under a 5 mm bias:
`benchmarks/imitation_ceiling.py`). Acting reads only cameras and proprioception, never the object channel.

Why two stages: the actor then trains on cached estimates at an MLP's speed (tens of thousands of steps in minutes
on a CPU) where an end-to-end pixel policy pays the convolutions at every step; the price is a deterministic head (no
likelihood: not a GRPO policy) and a perception supervised by the object channel the data must carry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from policies.state.networks import DeterministicActor
from policies.vla.modeling import VisionEncoder
from wmrl.core.checkpoint import load_state, read_config, save_pretrained
from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE, TASK, check_spaces, image_key
from wmrl.core.text import word_presence


@dataclass
class EstimatedStateConfig:
    cameras: tuple[str, ...] = ("front", "wrist")
    image_size: int = 64
    state_dim: int = 8
    env_state_dim: int = 13
    action_dim: int = 4
    width: int = 32
    """Channels of the first convolution of each camera's encoder."""
    hidden: int = 512
    layers: int = 3
    """The actor's MLP."""
    tasks: list[str] = field(default_factory=list)
    """The task names it was trained on."""
    task_vocab: list[str] = field(default_factory=list)
    """The instruction words the actor reads (present/absent): which zone, which cube."""
    state_mean: list[float] = field(default_factory=list)
    state_std: list[float] = field(default_factory=list)
    env_state_mean: list[float] = field(default_factory=list)
    env_state_std: list[float] = field(default_factory=list)

    def validate(self) -> None:
        if not self.cameras:
            raise ValueError("estimated-state needs at least one camera")
        if self.image_size % 16:
            raise ValueError(f"image_size must be a multiple of 16, got {self.image_size}")
        for name, dim in (("state", self.state_dim), ("env_state", self.env_state_dim)):
            for s in ("mean", "std"):
                v = getattr(self, f"{name}_{s}")
                if v and len(v) != dim:
                    raise ValueError(f"{name}_{s}: expected {dim} values, got {len(v)}")


class StateEstimator(nn.Module):
    """Cameras + proprioceptive state -> the object channel. Regresses the standardised channel; `estimate` returns
    it in the simulator's units (metres)."""

    def __init__(self, cameras: tuple[str, ...], state_dim: int, env_state_dim: int, width: int = 32,
                 image_size: int = 64):
        super().__init__()
        self.cameras = tuple(cameras)
        self.encoders = nn.ModuleDict({c: VisionEncoder(width, 256, image_size) for c in self.cameras})
        self.head = nn.Sequential(nn.Linear(256 * len(self.cameras) + state_dim, 512), nn.SiLU(),
                                  nn.Linear(512, env_state_dim))
        for name, dim in (("state", state_dim), ("env", env_state_dim)):
            self.register_buffer(f"{name}_mean", torch.zeros(dim))
            self.register_buffer(f"{name}_std", torch.ones(dim))

    def set_statistics(self, state: np.ndarray, env_state: np.ndarray) -> None:
        """Standardisation from training data (per dimension; a floor keeps constant dimensions finite)."""
        for name, x in (("state", state), ("env", env_state)):
            x = torch.as_tensor(np.asarray(x), dtype=torch.float32)
            getattr(self, f"{name}_mean").copy_(x.mean(0))
            getattr(self, f"{name}_std").copy_(x.std(0) + 1e-3)

    def forward(self, images: dict, state: torch.Tensor) -> torch.Tensor:
        """uint8 images (B, H, W, 3) per camera and the state (B, S) -> the standardised object channel (B, E)."""
        feats = [self.encoders[c](images[c].permute(0, 3, 1, 2).float() / 127.5 - 1) for c in self.cameras]
        return self.head(torch.cat(feats + [(state - self.state_mean) / self.state_std], 1))

    def loss(self, images: dict, state: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
        return self.standardised_loss(self(images, state), env_state)

    def standardised_loss(self, prediction: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
        """MSE between a standardised prediction and the object channel (metres), in standard units."""
        return ((prediction - (env_state - self.env_mean) / self.env_std) ** 2).mean()

    @torch.no_grad()
    def estimate(self, images: dict, state: np.ndarray, batch: int = 512) -> np.ndarray:
        """The object channel in metres for numpy inputs (any number of frames, in batches)."""
        was = self.training
        self.eval()
        device = self.state_mean.device
        out = []
        for i in range(0, len(state), batch):
            im = {c: torch.as_tensor(np.asarray(images[c][i : i + batch]), device=device) for c in self.cameras}
            st = torch.as_tensor(np.asarray(state[i : i + batch], np.float32), device=device)
            out.append((self(im, st) * self.env_std + self.env_mean).cpu().numpy())
        self.train(was)
        return np.concatenate(out) if out else np.zeros((0, len(self.env_mean)), np.float32)


class EstimatedStatePolicy(nn.Module):
    """`Policy` (reset / select_action) from cameras and proprioception: estimator, then actor."""

    def __init__(self, cfg: EstimatedStateConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.estimator = StateEstimator(cfg.cameras, cfg.state_dim, cfg.env_state_dim, cfg.width, cfg.image_size)
        if cfg.state_mean:
            self.estimator.state_mean.copy_(torch.tensor(cfg.state_mean))
            self.estimator.state_std.copy_(torch.tensor(cfg.state_std))
        if cfg.env_state_mean:
            self.estimator.env_mean.copy_(torch.tensor(cfg.env_state_mean))
            self.estimator.env_std.copy_(torch.tensor(cfg.env_state_std))
        self.actor = DeterministicActor(cfg.state_dim + cfg.env_state_dim + len(cfg.task_vocab), cfg.action_dim,
                                        cfg.hidden, cfg.layers)

    chunk_size = 1  # one action per observation (the evaluation loop's contract for non-chunking policies)

    def reset(self) -> None:
        pass

    def check_spaces(self, observation_space, action_space) -> None:
        """Refuse, at start, an environment whose cameras, state or actions this policy cannot use; both listed."""
        want = {image_key(c): (self.cfg.image_size, self.cfg.image_size, 3) for c in self.cfg.cameras}
        want[OBS_STATE] = (self.cfg.state_dim,)
        check_spaces(want, self.cfg.action_dim, observation_space, action_space)

    def actor_input(self, state, env_estimate, tasks) -> np.ndarray:
        """[state, estimated object channel, the instruction's words over `task_vocab`] (B, D)."""
        state = np.asarray(state, np.float32)
        parts = [state, np.asarray(env_estimate, np.float32)]
        if self.cfg.task_vocab:
            parts.append(word_presence(tasks, self.cfg.task_vocab).reshape(len(state), -1))
        return np.concatenate(parts, 1)

    def act_from_estimate(self, state: np.ndarray, env_estimate: np.ndarray, tasks) -> np.ndarray:
        x = torch.as_tensor(self.actor_input(state, env_estimate, tasks), device=self.actor.obs_mean.device)
        with torch.no_grad():
            return self.actor.mu(x).cpu().numpy()

    def predict_action_chunk(self, obs: dict) -> np.ndarray:
        """(B, 1, A): it plans one step at a time."""
        return self.select_action(obs)[:, None]

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """The two stages' losses on one batch (images, state, object channel, labels): the estimator's MSE on the
        standardised channel plus the actor's MSE from [state, the detached estimate]."""
        images = {c: torch.as_tensor(np.asarray(batch[image_key(c)])) for c in self.cfg.cameras}
        state = torch.as_tensor(np.asarray(batch[OBS_STATE], np.float32))
        est = self.estimator(images, state)
        est_loss = self.estimator.standardised_loss(est, torch.as_tensor(np.asarray(batch[OBS_ENV_STATE], np.float32)))
        estimate = (est.detach() * self.estimator.env_std + self.estimator.env_mean).numpy()
        x = torch.as_tensor(self.actor_input(state.numpy(), estimate, batch.get(TASK, "")))
        act_loss = ((self.actor.mu(x) - torch.as_tensor(np.asarray(batch[ACTION], np.float32))) ** 2).mean()
        return est_loss + act_loss, {"estimator_mse": est_loss.item(), "actor_mse": act_loss.item()}

    def select_action(self, obs: dict) -> np.ndarray:
        """Batched or single observation (LeRobot names) -> actions (B, A). Never reads the object channel."""
        need = [image_key(c) for c in self.cfg.cameras] + [OBS_STATE] + ([TASK] if self.cfg.task_vocab else [])
        missing = [k for k in need if k not in obs]
        if missing:
            raise ValueError(f"observation lacks {missing}; it has {sorted(obs)}")
        state = np.asarray(obs[OBS_STATE], np.float32).reshape(-1, self.cfg.state_dim)
        size = (self.cfg.image_size, self.cfg.image_size, 3)
        images = {c: np.asarray(obs[image_key(c)]).reshape(len(state), *size) for c in self.cfg.cameras}
        tasks = obs.get(TASK, "")
        if isinstance(tasks, str):
            tasks = [tasks] * len(state)
        return self.act_from_estimate(state, self.estimator.estimate(images, state), tasks)

    def save(self, path: str | Path) -> Path:
        cfg = dataclasses.replace(self.cfg, state_mean=self.estimator.state_mean.tolist(),
                                  state_std=self.estimator.state_std.tolist(),
                                  env_state_mean=self.estimator.env_mean.tolist(),
                                  env_state_std=self.estimator.env_std.tolist())
        return save_pretrained(self, cfg, path)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> "EstimatedStatePolicy":
        return load_state(cls(read_config(path, EstimatedStateConfig, what="estimated-state policy checkpoint")), path,
                          device).eval()


__all__ = ["EstimatedStateConfig", "EstimatedStatePolicy", "StateEstimator"]
