"""A small vision-language-action policy: one CNN per camera, the instruction through a pluggable text encoder
(bag of words by default), the proprioceptive state, and an action-chunk head of one of two kinds:

- `gaussian`: a diagonal Gaussian over the normalised chunk (state-independent log-std), with an exact
  log-probability, for RL (GRPO/PPO in imagination) and NLL behaviour cloning;
- `flow`: pi0's flow-matching head (Black et al., 2024, Sec. IV): x_t = t * noise + (1 - t) * a, the network
  regresses u = noise - a, and sampling integrates dx/dt = v from t = 1 to 0 with Euler steps. Expressive BC, no
  likelihood.

Inputs are LeRobot-named observation dicts; states and actions are normalised with the dataset's
`meta/stats.json` (mean/std), kept in the config so that a checkpoint carries them. `select_action` executes
`n_action_steps` actions of each predicted chunk from a queue (LeRobot/ACT style; 1 = receding horizon), or, with
`temporal_ensemble_coeff`, predicts a chunk every step and executes ACT's temporal ensemble of every prediction made
for the current step (Zhao et al., 2023, Sec. 3.3).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sim import task_from_instruction
from wmrl.core.arm import N_CUBES, on_table_mask
from wmrl.core.checkpoint import load_state, read_config, save_pretrained
from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE, TASK, check_spaces, image_key
from wmrl.core.text import TEXT_ENCODERS, words


HEADS = ("gaussian", "flow")


def object_channel_mse(prediction: torch.Tensor, env_state: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                       mask_off_table: bool = True) -> torch.Tensor:
    """MSE between a standardised prediction (B, E) and the object channel (metres) standardised by mean / std, over
    the values a camera can see: the coordinates of a cube that has left the table are masked (it falls without end,
    metres within seconds, unseen; regressing it is memorising the episode, and its squares rule the mean)."""
    if mask_off_table and env_state.shape[1] >= 3 * N_CUBES:
        mask = on_table_mask(env_state).to(env_state.dtype)
    else:
        mask = torch.ones_like(env_state)
    target = torch.where(mask.bool(), (env_state - mean) / std, prediction.detach())
    return ((prediction - target) ** 2 * mask).sum() / mask.sum().clamp(min=1)


def add_translation_noise(actions: torch.Tensor, std: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Gaussian noise of `std` (action units) on the translational dims (the first three) of actions (..., A),
    clamped to [-1, 1]: a strong policy degraded to a chosen level, as the scripted expert's `noise` does. Acting
    only; training and log-probabilities never see it."""
    if not std > 0:
        return actions
    k = min(3, actions.shape[-1])
    out = actions.clone()
    out[..., :k] = (out[..., :k] + std * torch.randn(out[..., :k].shape, device=out.device, generator=generator)).clamp(-1.0, 1.0)
    return out


@dataclass
class VLAConfig:
    cameras: tuple[str, ...] = ("front", "wrist")
    image_size: int = 64
    state_dim: int = 8
    action_dim: int = 4
    chunk_size: int = 4  # H actions predicted at once
    n_action_steps: int = 4  # actions of each chunk executed before predicting again
    temporal_ensemble_coeff: float | None = None  # ACT's m (0.01 there): predict every step, ensemble overlapping chunks
    head: str = "gaussian"
    text_encoder: str = "bow"
    vision_width: int = 32
    hidden: int = 256
    text_dim: int = 64
    init_log_std: float = -1.0
    log_std_min: float = -4.0
    log_std_max: float = 0.5
    flow_steps: int = 10
    augment_shift: int = 4  # random-shift augmentation (DrQ) in pixels during training; 0 = off
    aux_env_state: float = 0.0  # weight of the privileged auxiliary loss: predict the environment state (training only)
    env_state_dim: int = 0
    task_vocab: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)  # the task names it was trained on (push-red); empty: unknown
    state_mean: list[float] = field(default_factory=list)
    state_std: list[float] = field(default_factory=list)
    action_mean: list[float] = field(default_factory=list)
    action_std: list[float] = field(default_factory=list)
    env_state_mean: list[float] = field(default_factory=list)
    env_state_std: list[float] = field(default_factory=list)

    def validate(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"head: expected one of {HEADS}, got {self.head!r}")
        if not 1 <= self.n_action_steps <= self.chunk_size:
            raise ValueError(f"n_action_steps must be in [1, chunk_size={self.chunk_size}], got {self.n_action_steps}")
        if self.temporal_ensemble_coeff is not None:
            if not math.isfinite(self.temporal_ensemble_coeff):
                raise ValueError(f"temporal_ensemble_coeff must be finite, got {self.temporal_ensemble_coeff}")
            if self.n_action_steps != 1:
                raise ValueError("temporal ensembling predicts a chunk every step: it needs n_action_steps=1, got "
                                 f"{self.n_action_steps}")
        if not (math.isfinite(self.aux_env_state) and self.aux_env_state >= 0):
            raise ValueError(f"aux_env_state must be a finite weight >= 0, got {self.aux_env_state}")
        if self.aux_env_state and not self.env_state_dim:
            raise ValueError("aux_env_state needs data with observation.environment_state (env_state_dim is 0)")
        for name, dim in (("state", self.state_dim), ("action", self.action_dim), ("env_state", self.env_state_dim)):
            for s in ("mean", "std"):
                v = getattr(self, f"{name}_{s}")
                if v and len(v) != dim:
                    raise ValueError(f"{name}_{s}: expected {dim} values, got {len(v)}")

    @classmethod
    def from_dataset(cls, ds, **overrides) -> "VLAConfig":
        """Sizes, vocabulary and normalisation from a LeRobot v3 dataset (or a list of them, multi-task)."""
        dss = ds if isinstance(ds, (list, tuple)) else [ds]
        first = dss[0]
        cams = tuple(k.split(".")[-1] for k in first.camera_keys)
        for d in dss[1:]:
            if d.features[ACTION]["shape"] != first.features[ACTION]["shape"]:
                raise ValueError(f"{d.root}: action shape {d.features[ACTION]['shape']} differs from {first.root}'s")
        stats = [d.stats for d in dss]

        def pooled(key: str, dim: int) -> tuple[list[float], list[float]]:
            if not all(key in s for s in stats):
                return [0.0] * dim, [1.0] * dim
            n = np.array([float(s[key]["count"].reshape(-1)[0]) for s in stats])
            mean = sum(w * s[key]["mean"] for w, s in zip(n, stats)) / n.sum()
            var = sum(w * (s[key]["std"] ** 2 + (s[key]["mean"] - mean) ** 2) for w, s in zip(n, stats)) / n.sum()
            return mean.tolist(), np.maximum(np.sqrt(var), 1e-2).tolist()

        sd, ad = int(first.features[OBS_STATE]["shape"][0]), int(first.features[ACTION]["shape"][0])
        sm, ss = pooled(OBS_STATE, sd)
        am, as_ = pooled(ACTION, ad)
        vocab = sorted({w for d in dss for t in d.tasks for w in words(t)})
        names = sorted({task_from_instruction(t) for d in dss for t in d.tasks if _parses(t)})
        ed = int(first.features[OBS_ENV_STATE]["shape"][0]) if all(OBS_ENV_STATE in d.features for d in dss) else 0
        em, es = pooled(OBS_ENV_STATE, ed) if ed else ([], [])
        cfg = cls(cameras=cams, state_dim=sd, action_dim=ad, task_vocab=vocab, tasks=names, state_mean=sm, state_std=ss,
                  action_mean=am, action_std=as_, env_state_dim=ed, env_state_mean=em, env_state_std=es)
        return dataclasses.replace(cfg, **overrides)


def _parses(instruction: str) -> bool:
    try:
        task_from_instruction(instruction)
        return True
    except ValueError:  # data from outside the tabletop suite: its instructions name no task here
        return False


class VisionEncoder(nn.Module):
    """An image in [-1, 1] (B, 3, S, S) -> a feature vector: 4 strided convolutions with GroupNorm over the image
    plus x/y coordinate channels (CoordConv: where the cube is matters more than what it looks like)."""

    def __init__(self, width: int, out: int, image_size: int = 64):
        super().__init__()
        w = width
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, image_size), torch.linspace(-1, 1, image_size), indexing="ij")
        self.register_buffer("coords", torch.stack([xs, ys])[None], persistent=False)
        layers, cin = [], 5
        for c in (w, 2 * w, 2 * w, 4 * w):
            layers += [nn.Conv2d(cin, c, 4, stride=2, padding=1), nn.GroupNorm(8, c), nn.SiLU()]
            cin = c
        self.conv = nn.Sequential(*layers, nn.Flatten())
        self.fc = nn.Linear(4 * w * (image_size // 16) ** 2, out)

    def forward(self, x: torch.Tensor, shift: int = 0) -> torch.Tensor:
        """`shift`: DrQ's random shift, applied to the image *and* its coordinate channels together, so that the
        coordinates still name where each pixel's content is on the table (shifting only the image would teach the
        policy that the cube is up to `shift` pixels from where it is)."""
        x = torch.cat([x, self.coords.expand(len(x), -1, -1, -1)], dim=1)
        return self.fc(self.conv(random_shift(x, shift) if shift else x))


def random_shift(x: torch.Tensor, pad: int) -> torch.Tensor:
    """DrQ's augmentation: pad by replication and crop back at a random offset per image (all channels alike)."""
    n, _, h, w = x.shape
    x = F.pad(x, (pad,) * 4, mode="replicate")
    ox = torch.randint(0, 2 * pad + 1, (n,), device=x.device)
    oy = torch.randint(0, 2 * pad + 1, (n,), device=x.device)
    rows = (oy[:, None] + torch.arange(h, device=x.device)[None])[:, None, :, None].expand(-1, x.shape[1], -1, w + 2 * pad)
    x = x.gather(2, rows)
    cols = (ox[:, None] + torch.arange(w, device=x.device)[None])[:, None, None, :].expand(-1, x.shape[1], h, -1)
    return x.gather(3, cols)


class TemporalEnsembler:
    """ACT's temporal ensembling (Zhao et al., 2023, Sec. 3.3): a chunk a^(s) is predicted at every step s; the action
    executed at step t averages every prediction made for t, a_t = sum_i w_i a^(s_i)_{t - s_i} / sum_i w_i with
    w_i = exp(-m * i) and i = 0 the *oldest* prediction (ACT's convention: m > 0 trusts earlier predictions more,
    m < 0 newer ones, m = 0 a plain mean). Kept as the running weighted sums, one slot per future step."""

    def __init__(self, coeff: float, chunk_size: int):
        self.weights = torch.exp(-coeff * torch.arange(chunk_size, dtype=torch.float64))
        self.chunk_size = chunk_size
        self.reset()

    def reset(self) -> None:
        self.sums: torch.Tensor | None = None  # (B, H, A) weighted sums for steps t, t+1, ..., t+H-1
        self.counts: torch.Tensor | None = None  # (H,) predictions so far for each of those steps

    def update(self, chunk: torch.Tensor) -> torch.Tensor:
        """chunk (B, H, A) predicted now -> the ensembled action (B, A) to execute now."""
        chunk = chunk.detach().cpu().to(torch.float64)  # the running sums live on the host, next to the env
        H = self.chunk_size
        if self.sums is None or self.sums.shape != chunk.shape:
            self.sums, self.counts = torch.zeros_like(chunk), torch.zeros(H, dtype=torch.long)
            self.norm = torch.zeros(H, dtype=torch.float64)
        w = self.weights[self.counts.clamp(max=H - 1)]  # this prediction is the counts-th one for each step
        self.sums += w[None, :, None] * chunk
        self.norm = self.norm + w
        self.counts = self.counts + 1
        action = self.sums[:, 0] / self.norm[0]
        # shift by one step: the oldest slot is done, a fresh empty one opens at the end
        self.sums = torch.cat([self.sums[:, 1:], torch.zeros_like(self.sums[:, :1])], 1)
        self.norm = torch.cat([self.norm[1:], torch.zeros(1, dtype=torch.float64)])
        self.counts = torch.cat([self.counts[1:], torch.zeros(1, dtype=torch.long)])
        return action.float()


class VLAPolicy(nn.Module):
    def __init__(self, cfg: VLAConfig):
        super().__init__()
        cfg.validate()
        if not cfg.task_vocab:
            raise ValueError("task_vocab is empty: build the config with VLAConfig.from_dataset")
        self.cfg = cfg
        H, A, D = cfg.chunk_size, cfg.action_dim, cfg.hidden
        self.vision = nn.ModuleDict({c: VisionEncoder(cfg.vision_width, 128, cfg.image_size) for c in cfg.cameras})
        self.text = TEXT_ENCODERS.get(cfg.text_encoder)(cfg.task_vocab, cfg.text_dim)
        self.trunk = nn.Sequential(nn.Linear(128 * len(cfg.cameras) + cfg.text_dim + cfg.state_dim, D), nn.LayerNorm(D),
                                   nn.SiLU(), nn.Linear(D, D), nn.SiLU())
        for name, dim in (("state", cfg.state_dim), ("action", cfg.action_dim)):
            mean, std = getattr(cfg, f"{name}_mean") or [0.0] * dim, getattr(cfg, f"{name}_std") or [1.0] * dim
            self.register_buffer(f"{name}_mean", torch.tensor(mean, dtype=torch.float32))
            self.register_buffer(f"{name}_std", torch.tensor(std, dtype=torch.float32))
        if cfg.head == "gaussian":
            self.mu = nn.Linear(D, H * A)
            nn.init.zeros_(self.mu.bias)
            nn.init.normal_(self.mu.weight, std=1e-3)
            self.log_std = nn.Parameter(torch.full((H * A,), cfg.init_log_std))
        else:
            self.time_emb = nn.Linear(32, D)
            self.velocity = nn.Sequential(nn.Linear(H * A + D, D), nn.SiLU(), nn.Linear(D, D), nn.SiLU(), nn.Linear(D, H * A))
        self.value_head = nn.Sequential(nn.Linear(D, D), nn.SiLU(), nn.Linear(D, 1))  # PPO's critic V(s)
        if cfg.aux_env_state:  # training signal only: acting never needs the privileged state
            self.env_state_head = nn.Linear(D, cfg.env_state_dim)
            self.register_buffer("env_state_mean", torch.tensor(cfg.env_state_mean or [0.0] * cfg.env_state_dim))
            self.register_buffer("env_state_std", torch.tensor(cfg.env_state_std or [1.0] * cfg.env_state_dim))
        self.stochastic = False  # select_action: sample (True) or act with the mean / a fixed-noise flow (False)
        self.generator: torch.Generator | None = None  # acting noise; None: torch's global generator
        # Gaussian noise (std, in action units) added to the translational dims of every action acted with: a strong
        # policy degraded to a chosen level (ranking populations that spread over success rates; the scripted
        # expert's `noise`). Acting only; training and log-probabilities never see it.
        self.action_noise = 0.0
        self._queue: deque = deque()
        self.ensembler = (TemporalEnsembler(cfg.temporal_ensemble_coeff, cfg.chunk_size)
                          if cfg.temporal_ensemble_coeff is not None else None)

    @property
    def device(self) -> torch.device:
        return self.state_mean.device

    # ------------------------------------------------------------------ observations -> features
    def check_obs(self, obs: dict) -> None:
        missing = [k for k in [image_key(c) for c in self.cfg.cameras] + [OBS_STATE, TASK] if k not in obs]
        if missing:
            raise ValueError(f"observation lacks {missing}; it has {sorted(obs)}")

    def check_spaces(self, observation_space, action_space) -> None:
        """Refuse, at start, an environment (true or imagined) whose spaces this policy cannot drive; both specs are
        printed."""
        want_obs = {image_key(c): (self.cfg.image_size, self.cfg.image_size, 3) for c in self.cfg.cameras}
        want_obs[OBS_STATE] = (self.cfg.state_dim,)
        check_spaces(want_obs, self.cfg.action_dim, observation_space, action_space)

    def features(self, obs: dict, augment: bool = False) -> torch.Tensor:
        """Observation dict (batched, LeRobot names) -> (B, hidden)."""
        self.check_obs(obs)
        feats = []
        for c in self.cfg.cameras:
            x = torch.as_tensor(np.asarray(obs[image_key(c)]), device=self.device)
            if x.ndim != 4 or x.shape[-1] != 3:
                raise ValueError(f"{image_key(c)}: expected uint8 (B, H, W, 3), got {tuple(x.shape)}")
            x = x.permute(0, 3, 1, 2).float() / 127.5 - 1.0
            feats.append(self.vision[c](x, self.cfg.augment_shift if augment else 0))
        state = torch.as_tensor(np.asarray(obs[OBS_STATE]), dtype=torch.float32, device=self.device)
        if state.ndim != 2 or state.shape[1] != self.cfg.state_dim:
            raise ValueError(f"{OBS_STATE}: expected (B, {self.cfg.state_dim}), got {tuple(state.shape)}")
        tasks = [obs[TASK]] * len(state) if isinstance(obs[TASK], str) else list(obs[TASK])
        feats += [self.text(tasks), (state - self.state_mean) / self.state_std]
        return self.trunk(torch.cat(feats, dim=-1))

    def normalize_actions(self, a: torch.Tensor) -> torch.Tensor:
        return (a - self.action_mean) / self.action_std

    def unnormalize_actions(self, a: torch.Tensor) -> torch.Tensor:
        return a * self.action_std + self.action_mean

    # ------------------------------------------------------------------ the Gaussian head
    def dist(self, feats: torch.Tensor) -> torch.distributions.Normal:
        """pi(chunk | o) over normalised actions, (B, H, A)."""
        self._need("gaussian", "a distribution")
        B, H, A = feats.shape[0], self.cfg.chunk_size, self.cfg.action_dim
        std = self.log_std.clamp(self.cfg.log_std_min, self.cfg.log_std_max).exp()
        return torch.distributions.Normal(self.mu(feats).reshape(B, H, A), std.reshape(H, A).expand(B, H, A))

    def log_prob(self, obs: dict, actions: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Exact log pi(chunk | o) (B,), summed over the chunk's actions that `mask` (B, H) marks valid. Actions in
        the environment's units; the normalisation's Jacobian is included, so this is the density of those units."""
        a = self.normalize_actions(torch.as_tensor(actions, dtype=torch.float32, device=self.device))
        lp = self.dist(self.features(obs)).log_prob(a).sum(-1) - torch.log(self.action_std).sum()
        return (lp * mask).sum(-1) if mask is not None else lp.sum(-1)

    def sample(self, obs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled chunk (B, H, A) in the environment's units and its log-probability (B,)."""
        d = self.dist(self.features(obs))
        a = d.sample()
        lp = d.log_prob(a).sum((-1, -2)) - self.cfg.chunk_size * torch.log(self.action_std).sum()
        return self.unnormalize_actions(a), lp

    def value(self, obs: dict) -> torch.Tensor:
        return self.value_head(self.features(obs)).squeeze(-1)

    def _need(self, head: str, what: str) -> None:
        if self.cfg.head != head:
            raise ValueError(f"{what} needs the {head} head; this policy has the {self.cfg.head} head")

    # ------------------------------------------------------------------ the flow-matching head
    def _velocity(self, feats: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        freqs = torch.exp(torch.linspace(0, math.log(1000.0), 16, device=x.device))
        te = torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], dim=-1)
        return self.velocity(torch.cat([x.flatten(1), feats + self.time_emb(te)], dim=-1)).reshape(x.shape)

    def _flow_sample(self, feats: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        x, dt = noise, 1.0 / self.cfg.flow_steps
        for i in range(self.cfg.flow_steps):
            t = torch.full((len(x),), 1.0 - i * dt, device=x.device)
            x = x - dt * self._velocity(feats, x, t)
        return x

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def predict_action_chunk(self, obs: dict, stochastic: bool | None = None) -> torch.Tensor:
        """(B, H, A) in the environment's units."""
        stochastic = self.stochastic if stochastic is None else stochastic
        feats = self.features(obs)
        B, H, A = feats.shape[0], self.cfg.chunk_size, self.cfg.action_dim
        # acting draws from the policy's own generator when it has one (`make_policy(seed=...)`), so a sampling
        # policy's evaluation does not depend on what else consumed torch's global generator before it
        noise = (torch.randn(B, H, A, device=self.device, generator=self.generator) if stochastic
                 else torch.zeros(B, H, A, device=self.device))
        if self.cfg.head == "gaussian":
            d = self.dist(feats)
            a = d.mean + d.stddev * noise
        else:
            a = self._flow_sample(feats, noise)
        return add_translation_noise(self.unnormalize_actions(a), self.action_noise, self.generator)

    @torch.no_grad()
    def select_action(self, obs: dict) -> torch.Tensor:
        if self.ensembler is not None:
            return self.ensembler.update(self.predict_action_chunk(obs))
        if not self._queue:
            chunk = self.predict_action_chunk(obs)
            self._queue.extend(chunk[:, : self.cfg.n_action_steps].transpose(0, 1))
        return self._queue.popleft()

    def reset(self) -> None:
        self._queue.clear()
        if self.ensembler is not None:
            self.ensembler.reset()

    # ------------------------------------------------------------------ behaviour cloning
    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """BC loss on a batch: observations at t and `action` (B, H, A) = a_t..a_{t+H-1}, `action_mask` (B, H)."""
        feats = self.features(batch, augment=self.training)
        a = self.normalize_actions(torch.as_tensor(batch[ACTION], dtype=torch.float32, device=self.device))
        if a.ndim != 3 or a.shape[1:] != (self.cfg.chunk_size, self.cfg.action_dim):
            raise ValueError(f"{ACTION}: expected (B, {self.cfg.chunk_size}, {self.cfg.action_dim}), got {tuple(a.shape)}")
        m = torch.as_tensor(batch.get("action_mask", np.ones(a.shape[:2], bool)), device=self.device).float()
        n = m.sum().clamp(min=1)
        if self.cfg.head == "gaussian":
            d = self.dist(feats)
            loss = -(d.log_prob(a).sum(-1) * m).sum() / n
            info = {"nll": loss.item(), "mse": ((((d.mean - a) ** 2).mean(-1) * m).sum() / n).item()}
        else:
            t = torch.distributions.Beta(1.5, 1.0).sample((len(a),)).to(self.device) * 0.999 + 0.001  # pi0's schedule
            noise = torch.randn_like(a)
            x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * a
            loss = (((self._velocity(feats, x_t, t) - (noise - a)) ** 2).mean(-1) * m).sum() / n
            info = {"flow_mse": loss.item()}
        if self.cfg.aux_env_state:
            # privileged auxiliary target (cube and zone positions from the simulator): it teaches the vision
            # encoder *where* things are, which the action loss alone conveys slowly through a 4-d action
            if OBS_ENV_STATE not in batch:
                raise ValueError(f"aux_env_state needs {OBS_ENV_STATE} in the training batch")
            e = torch.as_tensor(np.asarray(batch[OBS_ENV_STATE]), dtype=torch.float32, device=self.device)
            aux = object_channel_mse(self.env_state_head(feats), e, self.env_state_mean, self.env_state_std)
            loss = loss + self.cfg.aux_env_state * aux
            info["aux_env_state_mse"] = aux.item()
        return loss, info

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | Path) -> Path:
        return save_pretrained(self, self.cfg, path)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> "VLAPolicy":
        return load_state(cls(read_config(path, VLAConfig, what="VLA policy checkpoint")), path, device)
