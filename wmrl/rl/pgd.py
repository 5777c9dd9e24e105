"""Policy-Guided Diffusion (Jackson et al. 2024): offline RL on synthetic, near on-policy trajectories.

1. Train a trajectory diffusion model on windows of the behaviour data (`world_models.trajectory_diffusion`).
2. Fill a synthetic buffer (the common replay, tagged `source=world_model`) with `synthetic_windows` generated
   windows: unguided at first, then, every `regenerate_every` agent updates, guided by the current policy with
   coefficient `guidance` (PGD eq. 6 and its schedule, `guidance_schedule`).
3. Train TD3+BC or IQL on batches that mix synthetic and real transitions, `synthetic_ratio` synthetic
   (the paper: 240 of 256), through the same loop as every other offline agent (`wmrl.rl.ravl.train_offline`).

A generated batch that diverges (NaN or inf, e.g. from a guidance coefficient far too large) is dropped and
counted, never written to the buffer; if every batch of a refresh diverges, training stops with that message.

`wmrl pgd --agent td3bc --data DIR --out RUN [--guidance 1.0] [--diffusion_dir DIR]` writes RUN/diffusion (the
model, unless --diffusion_dir names a shared one) and RUN/agent (metrics.jsonl, checkpoints; --resume continues).
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sim.locomotion import state_from_obs
from wmrl.core.checkpoint import resolve_checkpoint
from wmrl.core.features import ACTION
from wmrl.core.io import write_json
from wmrl.core.run import start_run
from wmrl.rl.ravl import OfflineConfig, add_rollouts, dataset_env, load_offline_data, train_offline
from world_models.dynamics import TrueDynamics
from world_models.trajectory_diffusion import DivergedSamples, TrajectoryDiffusion, config_for, fit_trajectory_diffusion


AGENTS = ("td3bc", "iql")


@dataclass
class PGDConfig:
    data: Path = Path("data/halfcheetah-medium")
    out: Path = Path("runs/pgd")
    agent: str = "td3bc"
    """td3bc | iql"""
    env: str = ""
    """the environment to evaluate in; default: the dataset's `wmrl.env` entry"""
    # trajectory diffusion
    diffusion_dir: Path | None = None
    """where the diffusion model is saved and, when present, reused (default: RUN/diffusion); share it between runs"""
    horizon: int = 32
    widths: tuple[int, ...] = (64, 128, 256)
    diffusion_steps: int = 20_000
    diffusion_batch: int = 256
    sampler: str = "heun"
    sampling_steps: int = 24
    # guidance
    guidance: float = 1.0  # lambda
    guidance_cosine: float = 0.3  # c
    normalise_guidance: bool = True
    denoised_guidance: bool = False  # evaluate grad log pi at D(x; sigma) instead of the noisy x
    # synthetic data
    synthetic_windows: int = 2048  # windows per refresh (x (horizon - 1) transitions)
    synthetic_ratio: float = 240 / 256
    regenerate_every: int = 10_000  # agent updates between guided refreshes (M)
    # agent
    epochs: int = 100
    updates_per_epoch: int = 1000
    hidden: int = 256
    batch_size: int = 256
    eval_every: int = 10
    eval_episodes: int = 5
    seed: int = 0
    resume: bool = False
    overwrite: bool = False
    progress: bool = True

    def validate(self) -> None:
        if self.agent not in AGENTS:
            raise ValueError(f"agent: expected one of {', '.join(AGENTS)}, got {self.agent!r}")
        if not math.isfinite(self.guidance) or self.guidance < 0:
            raise ValueError(f"guidance must be a finite number >= 0, got {self.guidance}")
        if not 0.0 <= self.synthetic_ratio <= 1.0:
            raise ValueError(f"synthetic_ratio must be in [0, 1], got {self.synthetic_ratio}")
        if self.regenerate_every < self.updates_per_epoch or self.regenerate_every % self.updates_per_epoch:
            raise ValueError(f"regenerate_every ({self.regenerate_every}) must be a multiple of updates_per_epoch "
                             f"({self.updates_per_epoch})")


# ---------------------------------------------------------------------- generation
@torch.no_grad()
def policy_log_prob(policy, obs: np.ndarray, act: np.ndarray, length: np.ndarray) -> float:
    """Mean log pi(a_t | s_t) over the kept transitions of generated rollouts (n, T, .)."""
    n, T = obs.shape[:2]
    keep = np.arange(T)[None] < length[:, None]
    lp = policy.log_prob(torch.as_tensor(obs.reshape(n * T, -1)), torch.as_tensor(act.reshape(n * T, -1)))
    return float(lp.reshape(n, T).numpy()[keep].mean())


def generate(model: TrajectoryDiffusion, policy, n: int, guidance: float, batch: int = 256, **sample_kw) -> tuple[dict, dict]:
    """n windows as rollouts (see `TrajectoryDiffusion.decode`); diverged batches are dropped and counted."""
    if policy is not None and (policy.obs_dim != model.cfg.obs_dim or policy.act_dim != model.cfg.act_dim):
        raise ValueError(f"target policy acts on obs/action dims {policy.obs_dim}/{policy.act_dim}, "
                         f"the data has {model.cfg.obs_dim}/{model.cfg.act_dim}")
    xs, dropped, t0 = [], 0, time.time()
    sizes = [min(batch, n - i) for i in range(0, n, batch)]
    for size in sizes:
        try:
            xs.append(model.sample(size, policy, guidance, **sample_kw))
        except DivergedSamples as e:
            dropped += 1
            warnings.warn(str(e))
    if not xs:
        raise DivergedSamples(f"all {len(sizes)} generated batches diverged with guidance {guidance}; lower --guidance "
                              f"or keep --normalise_guidance")
    ro = model.decode(torch.cat(xs))
    info = {"synthetic_windows": len(ro["length"]), "synthetic_transitions": int(ro["length"].sum()),
            "synthetic_dropped_batches": dropped, "synthetic_seconds": time.time() - t0, "guidance": guidance}
    if policy is not None:
        info["target_logprob"] = policy_log_prob(policy, ro["obs"], ro["act"], ro["length"])
    return ro, info


def true_dynamics_error(env_id: str, ro: dict, scale: np.ndarray) -> np.ndarray:
    """Per-position one-step dynamics error of rollouts (n, T, .) (PGD Section 5.2): restore each generated s_t in
    the true simulator (`sim.locomotion.state_from_obs`), step a_t, and compare with the generated s_{t+1}.
    Returns the mean over kept transitions of mean_d ((s_{t+1} - s'_true) / scale)^2 per position t (NaN where none)."""
    oracle = TrueDynamics(env_id)
    obs, act, length = ro["obs"], ro["act"], ro["length"]
    err = np.full(obs.shape[1] - 1, np.nan)
    for t in range(obs.shape[1] - 1):
        alive = length > t
        if not alive.any():
            continue
        s = obs[alive, t].astype(np.float64)
        nxt = oracle.step(s, act[alive, t], state_from_obs(env_id, s))[0]
        err[t] = float(np.mean(((obs[alive, t + 1] - nxt) / scale) ** 2))
    return err


class SyntheticGenerator:
    """The `ModelDataSource` PGD gives `train_offline`: refreshes the buffer on the first epoch (unguided) and every
    `every` epochs after (guided by the agent's current actor). After a resume the empty buffer is refilled at once."""

    def __init__(self, model: TrajectoryDiffusion, cfg: PGDConfig):
        self.model, self.cfg = model, cfg
        self.every = cfg.regenerate_every // cfg.updates_per_epoch
        self.capacity = cfg.synthetic_windows * model.cfg.horizon
        self.generator = torch.Generator().manual_seed(cfg.seed)

    def refresh(self, agent, buffer, epoch: int) -> dict:
        if epoch % self.every and len(buffer):
            return {}
        c = self.cfg
        lam = 0.0 if epoch == 0 else c.guidance
        ro, info = generate(self.model, agent.actor, c.synthetic_windows, lam, cosine=c.guidance_cosine,
                            normalise=c.normalise_guidance, denoised_guidance=c.denoised_guidance,
                            generator=self.generator)
        add_rollouts(buffer, ro)
        return info


# ---------------------------------------------------------------------- the run
def diffusion_model(cfg: PGDConfig, real, spaces: dict, run: Path) -> tuple[TrajectoryDiffusion, dict]:
    """Train the trajectory diffusion model once (resuming an interrupted fit) or load the finished one."""
    mcfg = config_for(real, spaces["action_low"], spaces["action_high"], horizon=cfg.horizon, widths=tuple(cfg.widths),
                      sampler=cfg.sampler, sampling_steps=cfg.sampling_steps)
    ck = Path(cfg.diffusion_dir) if cfg.diffusion_dir else run / "diffusion"
    if (ck / "fit.json").exists():
        return TrajectoryDiffusion.load(resolve_checkpoint(ck), expect=mcfg), json.loads((ck / "fit.json").read_text())
    torch.manual_seed(cfg.seed)
    model = TrajectoryDiffusion(mcfg)
    info = fit_trajectory_diffusion(model, real, cfg.diffusion_steps, cfg.diffusion_batch, out=ck, seed=cfg.seed,
                                    progress=cfg.progress)

    write_json(ck / "fit.json", {k: v for k, v in info.items() if k != "losses"})
    return model, info


def train_pgd(cfg: PGDConfig) -> dict:
    from wmrl.rl.sac import spaces_of

    cfg.validate()
    env_id = cfg.env or dataset_env(cfg.data)
    if not env_id:
        raise ValueError(f"{cfg.data}: the dataset does not name its environment; pass --env")
    spaces = spaces_of(env_id)
    real = load_offline_data(cfg.data, cfg.seed)
    if real.data[ACTION].shape[1] != spaces["act_dim"]:
        raise ValueError(f"{cfg.data}: action dim {real.data[ACTION].shape[1]} does not match {env_id}'s {spaces['act_dim']}")

    run = start_run(cfg)
    model, fit = diffusion_model(cfg, real, spaces, run)
    ocfg = OfflineConfig(data=cfg.data, out=run / "agent", algo=cfg.agent, env=env_id, epochs=cfg.epochs,
                         updates_per_epoch=cfg.updates_per_epoch, real_ratio=1.0 - cfg.synthetic_ratio,
                         hidden=cfg.hidden, batch_size=cfg.batch_size, eval_every=cfg.eval_every,
                         eval_episodes=cfg.eval_episodes, seed=cfg.seed, resume=cfg.resume,
                         progress=cfg.progress)
    result = train_offline(ocfg, source=SyntheticGenerator(model, cfg))
    return {**result, "algo": f"pgd-{cfg.agent}", "dynamics": "trajectory-diffusion", "diffusion_fit": {k: v for k, v in fit.items() if k != "losses"}}


__all__ = ["PGDConfig", "train_pgd", "generate", "policy_log_prob", "true_dynamics_error", "SyntheticGenerator", "AGENTS"]
