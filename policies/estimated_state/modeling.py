"""`estimated-state`: a pixel policy in two stages.

A perception module (`StateEstimator`: one `VisionEncoder` per camera, the VLA's, plus the proprioceptive state)
estimates the object channel (`observation.environment_state`: cube and zone centres) from the cameras; an MLP
actor maps [state, estimate] to the action. Both learn from supervision the simulator (or a twin, or a tracked
real cell) records: the estimator from the recorded object channel, the actor from the clean expert's action at
each recorded state (DART labels), with the *estimator's outputs* as its inputs so that it meets the estimator's
errors in training (a learner trained on the true state keeps 40% of its 98% under a 5 mm bias:
`benchmarks/imitation_ceiling.py`). Acting reads only cameras and proprioception, never the object channel.

Why two stages: the actor then trains on cached estimates at an MLP's speed (tens of thousands of steps in minutes
on a CPU) where an end-to-end pixel policy pays the convolutions at every step; the price is a perception
supervised by the object channel the data must carry.

The actor is a Gaussian pi(a | s, e) = N(mu(s, e), diag(sigma^2)) with a state-independent sigma set, after
regression, to the per-dimension RMS of the actor's training residual (the maximum-likelihood sigma for that
mean), so GRPO has an exact log-probability. Acting uses the mean unless `stochastic`.

Without cameras (`cameras=()`) the policy reads the object channel itself (a tracked cell, the simulator). RL in
imagination sets `read_object_channel`: the actor then reads the world model's state channel (its predicted object
channel), which the imagination env perturbs with Gaussian noise of the estimator's held-out error per dimension
(`estimate_noise`, recorded at training), the kind of input the actor meets at deployment; the estimator is left
untouched.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from policies.state.networks import DeterministicActor
from policies.vla.modeling import VisionEncoder, add_translation_noise, object_channel_mse
from wmrl.core.arm import clip_to_table, on_table_mask
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
    log_std_min: float = -4.0
    log_std_max: float = 0.5
    actor_state_dims: list[int] = field(default_factory=list)
    """The `observation.state` dimensions the actor reads (empty: all); the others are masked to 0. In imagination a
    world model's state channel predicts the end-effector and gripper, while other proprioception (the tabletop's
    joint angles, dims 0-3) is read back from generated frames, and an actor that reads them acts on their error
    (the issue notes of 2026-11-25 measure what that does to imagined success)."""
    residual_hidden: int = 0
    """Width of a residual actor on top of the behaviour-cloned one (0: none). RL fine-tunes the residual with the
    base actor frozen (`add_residual`; Ankile et al., 2024, ResiP)."""
    residual_scale: float = 0.1
    """The residual's output scale (action units): mu = mu_base + residual_scale * r."""
    estimate_noise: list[float] = field(default_factory=list)
    """Scale of the estimator's held-out error per object-channel dimension (metres; `train.robust_std`, a
    median-absolute-deviation std since policies trained after 2026-11-26, the plain std before): the noise the
    actor's input gets when it reads a world model's object channel instead of the estimator (`read_object_channel`)."""

    chunk_size = 1  # one action per observation (not a field: the actor plans one step)

    def validate(self) -> None:
        if self.image_size % 16:
            raise ValueError(f"image_size must be a multiple of 16, got {self.image_size}")
        for name, dim in (("state", self.state_dim), ("env_state", self.env_state_dim)):
            for s in ("mean", "std"):
                v = getattr(self, f"{name}_{s}")
                if v and len(v) != dim:
                    raise ValueError(f"{name}_{s}: expected {dim} values, got {len(v)}")
        if self.estimate_noise and len(self.estimate_noise) != self.env_state_dim:
            raise ValueError(f"estimate_noise: expected {self.env_state_dim} values, got {len(self.estimate_noise)}")
        bad = [d for d in self.actor_state_dims if not 0 <= d < self.state_dim]
        if bad:
            raise ValueError(f"actor_state_dims: {bad} outside observation.state's {self.state_dim} dimensions")
        if self.residual_hidden < 0 or not self.residual_scale > 0:
            raise ValueError(f"residual: hidden must be >= 0 and scale > 0, got {self.residual_hidden}, {self.residual_scale}")
        if not self.log_std_min < self.log_std_max:
            raise ValueError(f"log_std_min ({self.log_std_min}) must be below log_std_max ({self.log_std_max})")


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
        # training only (not saved): False regresses fallen cubes too, as before 2026-12-05 (the benchmark's ablation)
        self.mask_off_table = True
        for name, dim in (("state", state_dim), ("env", env_state_dim)):
            self.register_buffer(f"{name}_mean", torch.zeros(dim))
            self.register_buffer(f"{name}_std", torch.ones(dim))

    def set_statistics(self, state: np.ndarray, env_state: np.ndarray) -> None:
        """Standardisation from training data (per dimension; a floor keeps constant dimensions finite). The object
        channel's from the cubes on the table only: one cube falling off it for a few seconds (metres) otherwise sets
        the scale (in 876 clean push episodes, one fall doubles the red cube's y scale and multiplies its z scale
        by 1,500), and a centimetre on the table becomes a hundredth of a standard unit."""
        state = np.asarray(state, np.float64)
        self.state_mean.copy_(torch.as_tensor(state.mean(0)))
        self.state_std.copy_(torch.as_tensor(state.std(0, ddof=1) + 1e-3))
        env = np.asarray(env_state, np.float64)
        if self.mask_off_table:
            env = np.where(on_table_mask(env_state), env, np.nan)
        seen = ~np.isnan(env).all(0)  # a cube never on the table (not in practice) keeps 0 / 1
        mean, std = np.zeros(env.shape[1]), np.ones(env.shape[1])
        mean[seen] = np.nanmean(env[:, seen], 0)
        std[seen] = np.nanstd(env[:, seen], 0, ddof=1) + 1e-3 if len(env) > 1 else 1.0
        self.env_mean.copy_(torch.as_tensor(mean))
        self.env_std.copy_(torch.as_tensor(std))

    def forward(self, images: dict, state: torch.Tensor) -> torch.Tensor:
        """uint8 images (B, H, W, 3) per camera and the state (B, S) -> the standardised object channel (B, E)."""
        feats = [self.encoders[c](images[c].permute(0, 3, 1, 2).float() / 127.5 - 1) for c in self.cameras]
        return self.head(torch.cat(feats + [(state - self.state_mean) / self.state_std], 1))

    def loss(self, images: dict, state: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
        return self.standardised_loss(self(images, state), env_state)

    def standardised_loss(self, prediction: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
        """MSE between a standardised prediction and the object channel (metres), in standard units, over the values
        a camera can see: the coordinates of a cube that has left the table are masked (`on_table_mask`; its fall
        is unobservable, and fitting it is memorising the episode)."""
        return object_channel_mse(prediction, env_state, self.env_mean, self.env_std, self.mask_off_table)

    @torch.no_grad()
    def estimate(self, images: dict, state: np.ndarray, batch: int = 512, flip: bool = False) -> np.ndarray:
        """The object channel in metres for numpy inputs (any number of frames, in batches). `flip`: read the images
        flipped left-right (a reflected scene, whose reflected `state` the caller passes)."""
        was = self.training
        self.eval()
        device = self.state_mean.device
        out = []
        for i in range(0, len(state), batch):
            im = {c: torch.as_tensor(np.asarray(images[c][i : i + batch]), device=device) for c in self.cameras}
            if flip:
                im = {c: x.flip(2) for c, x in im.items()}
            st = torch.as_tensor(np.asarray(state[i : i + batch], np.float32), device=device)
            out.append((self(im, st) * self.env_std + self.env_mean).cpu().numpy())
        self.train(was)
        return np.concatenate(out) if out else np.zeros((0, len(self.env_mean)), np.float32)


class ResidualActor(nn.Module):
    """r(x, mu_base) -> a correction added to a frozen base actor's mean (ResiP: Ankile et al., 2024, "From Imitation
    to Refinement"). The last layer starts at zero, so the policy starts exactly as the base; its input is the base
    actor's normalised input and the base action, as ResiP's residual reads the observation and the base action."""

    def __init__(self, in_dim: int, act_dim: int, hidden: int, scale: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim + act_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, act_dim))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)
        self.scale = scale

    def forward(self, x_norm: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        return self.scale * self.net(torch.cat([x_norm, base], -1))


class EstimatedStatePolicy(nn.Module):
    """`Policy` (reset / select_action) from cameras and proprioception: estimator, then actor. Also GRPO's
    interface (`sample`, `log_prob`, `features`, `dist`) over one-action chunks (B, 1, A)."""

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
        D = cfg.state_dim + cfg.env_state_dim + len(cfg.task_vocab)  # the actor's input
        self.actor = DeterministicActor(D, cfg.action_dim, cfg.hidden, cfg.layers)
        self.log_std = nn.Parameter(torch.full((cfg.action_dim,), -1.0))
        self.residual = None
        if cfg.residual_hidden:
            self.residual = ResidualActor(D, cfg.action_dim, cfg.residual_hidden, cfg.residual_scale)
            self.actor.requires_grad_(False)
        # V(s) for PPO's GAE (`wmrl imagine --algo ppo`): the actor's normalised input, its own MLP
        self.critic = nn.Sequential(nn.Linear(D, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 1))
        self.read_object_channel = not cfg.cameras
        self.stochastic = False
        self.generator: torch.Generator | None = None  # acting/sampling noise (`make_policy(seed=...)`)
        self.action_noise = 0.0  # acting only: Gaussian noise on the translational dims (a degraded copy)

    chunk_size = 1  # one action per observation (the evaluation loop's contract for non-chunking policies)

    @property
    def device(self) -> torch.device:
        return self.log_std.device

    def reset(self) -> None:
        pass

    def observation_keys(self) -> list[str]:
        cams = [] if self.read_object_channel else [image_key(c) for c in self.cfg.cameras]
        return cams + [OBS_STATE] + ([OBS_ENV_STATE] if self.read_object_channel else [])

    def check_spaces(self, observation_space, action_space) -> None:
        """Refuse, at start, an environment whose cameras (or object channel), state or actions this policy cannot
        use; both listed."""
        want = {image_key(c): (self.cfg.image_size, self.cfg.image_size, 3) for c in self.cfg.cameras}
        if self.read_object_channel:
            want = {OBS_ENV_STATE: (self.cfg.env_state_dim,)}
        want[OBS_STATE] = (self.cfg.state_dim,)
        check_spaces(want, self.cfg.action_dim, observation_space, action_space)

    def actor_input(self, state, env_estimate, tasks) -> np.ndarray:
        """[state (dimensions outside `actor_state_dims` masked to 0), estimated object channel, the instruction's
        words over `task_vocab`] (B, D)."""
        state = np.asarray(state, np.float32)
        if self.cfg.actor_state_dims:
            keep = np.zeros(state.shape[-1], bool)
            keep[list(self.cfg.actor_state_dims)] = True
            state = np.where(keep, state, 0.0).astype(np.float32)
        # a fallen cube (estimated, or read from a simulator's or world model's channel) reads as at the table's edge
        parts = [state, clip_to_table(env_estimate)]
        if self.cfg.task_vocab:
            parts.append(word_presence(tasks, self.cfg.task_vocab).reshape(len(state), -1))
        return np.concatenate(parts, 1)

    def add_residual(self, hidden: int = 256, scale: float = 0.1) -> "EstimatedStatePolicy":
        """Put a zero-initialised residual actor on top of this (behaviour-cloned) one and freeze the base, so that RL
        trains the residual, sigma and the critic only (in place; kept in the config, so checkpoints load with it)."""
        if self.residual is not None:
            raise ValueError("this policy already has a residual actor")
        self.cfg = dataclasses.replace(self.cfg, residual_hidden=int(hidden), residual_scale=float(scale))
        self.cfg.validate()
        self.residual = ResidualActor(self.actor.obs_dim, self.cfg.action_dim, hidden, scale).to(self.device)
        self.actor.requires_grad_(False)
        return self

    def mu(self, feats: torch.Tensor) -> torch.Tensor:
        """The acting mean: the base actor's, plus the residual's correction when there is one."""
        base = self.actor.mu(feats)
        if self.residual is None:
            return base
        return base + self.residual((feats - self.actor.obs_mean) / self.actor.obs_std, base.detach())

    def act_from_estimate(self, state: np.ndarray, env_estimate: np.ndarray, tasks) -> np.ndarray:
        x = torch.as_tensor(self.actor_input(state, env_estimate, tasks), device=self.device)
        with torch.no_grad():
            return self.mu(x).cpu().numpy()

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

    # ------------------------------------------------------------------ perception, then the Gaussian actor
    def _estimate(self, obs: dict, state: np.ndarray) -> np.ndarray:
        if self.read_object_channel:
            return np.asarray(obs[OBS_ENV_STATE], np.float32).reshape(len(state), self.cfg.env_state_dim)
        size = (self.cfg.image_size, self.cfg.image_size, 3)
        images = {c: np.asarray(obs[image_key(c)]).reshape(len(state), *size) for c in self.cfg.cameras}
        return self.estimator.estimate(images, state)

    def features(self, obs: dict) -> torch.Tensor:
        """Observation dict (batched or single, LeRobot names) -> the actor's input (B, D). Reads the object channel
        only when `read_object_channel` is set."""
        missing = [k for k in self.observation_keys() + ([TASK] if self.cfg.task_vocab else []) if k not in obs]
        if missing:
            raise ValueError(f"observation lacks {missing}; it has {sorted(obs)}")
        state = np.asarray(obs[OBS_STATE], np.float32).reshape(-1, self.cfg.state_dim)
        tasks = obs.get(TASK, "")
        if isinstance(tasks, str):
            tasks = [tasks] * len(state)
        return torch.as_tensor(self.actor_input(state, self._estimate(obs, state), tasks), device=self.device)

    def dist(self, feats: torch.Tensor) -> torch.distributions.Normal:
        """pi(a | o) as a one-action chunk (B, 1, A)."""
        std = self.log_std.clamp(self.cfg.log_std_min, self.cfg.log_std_max).exp()
        mu = self.mu(feats)[:, None]
        return torch.distributions.Normal(mu, std.expand_as(mu))

    def sample(self, obs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled one-action chunk (B, 1, A) and its exact log-probability (B,)."""
        return self._sample(self.features(obs))

    def _sample(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.dist(feats)
        a = d.mean + d.stddev * torch.randn(d.mean.shape, generator=self.generator, device=self.device)
        return a, d.log_prob(a).sum((-1, -2))

    def value(self, obs: dict) -> torch.Tensor:
        """V(o) (B,): PPO's baseline (not used when acting)."""
        return self.critic((self.features(obs) - self.actor.obs_mean) / self.actor.obs_std).squeeze(-1)

    def log_prob(self, obs: dict, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a | o) (B,) for one-action chunks (B, 1, A) (or actions (B, A))."""
        a = torch.as_tensor(actions, dtype=torch.float32, device=self.device)
        return self.dist(self.features(obs)).log_prob(a.reshape(len(a), 1, -1)).sum((-1, -2))

    @torch.no_grad()
    def select_action(self, obs: dict) -> np.ndarray:
        """Batched or single observation (LeRobot names) -> actions (B, A): the actor's mean, or a sample when
        `stochastic`, plus `action_noise` on the translational dims. Reads the object channel only without cameras or when
        `read_object_channel` is set."""
        feats = self.features(obs)
        a = self._sample(feats)[0][:, 0] if self.stochastic else self.mu(feats)
        return add_translation_noise(a, self.action_noise, self.generator).cpu().numpy()

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


__all__ = ["EstimatedStateConfig", "EstimatedStatePolicy", "ResidualActor", "StateEstimator"]
