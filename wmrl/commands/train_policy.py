"""`wmrl train-policy --data DIR [DIR ...] --out RUN`: behaviour cloning of the VLA policy on one or more LeRobot v3
datasets (several tasks make a multi-task policy). Progress bar, checkpoints (safetensors + JSON) every
`ckpt_every` steps, `--resume` after an interruption, metrics to `metrics.jsonl`, and a true-simulator evaluation
with videos at the end.

The BC loop itself is `policies.vla.bc`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from policies.vla import VLAConfig, VLAPolicy
from policies.vla.bc import bc_train, load_replay, weight_interventions
from wmrl.core.checkpoint import load_train_state, resume_checkpoint
from wmrl.core.run import Tracker, start_run
from wmrl.eval import evaluate_on_tasks


@dataclass
class TrainPolicyConfig:
    data: tuple[Path, ...] = (Path("data/push-red"),)
    """One or more LeRobot v3 datasets (several tasks: a multi-task policy)."""
    out: Path = Path("runs/policy")
    head: str = "gaussian"
    """Action-chunk head: gaussian (exact log-prob, for RL) or flow (pi0-style flow matching)."""
    chunk_size: int = 4
    n_action_steps: int = 4
    steps: int = 3000
    batch_size: int = 64
    lr: float = 3e-4
    successful_only: bool = False
    """Clone only the episodes that succeeded (datasets recorded with near-success failures)."""
    intervention_weight: float = 1.0
    """Sample frames an operator produced (`intervention`, RaC/HIL-SERL corrections) this many times as often."""
    ckpt_every: int = 500
    keep_every: int = 0
    """Also keep a copy of the policy every this many steps (checkpoints/step_N; for policy populations)."""
    eval_episodes: int = 20
    """True-simulator episodes after training, on every task of the data (0: skip)."""
    num_envs: int = 2
    seed: int = 0
    device: str = "cpu"
    threads: Optional[int] = None
    overwrite: bool = False
    resume: bool = False
    extra: dict = field(default_factory=dict)
    """Further VLAConfig fields (e.g. {"hidden": 512})."""


def train_policy(cfg: TrainPolicyConfig, progress: bool = True) -> dict:
    run = start_run(cfg)
    torch.manual_seed(cfg.seed)
    dss, replay = load_replay(cfg.data, cfg.seed, cfg.successful_only)
    weight_interventions(replay, cfg.intervention_weight)
    pcfg = VLAConfig.from_dataset(dss, head=cfg.head, chunk_size=cfg.chunk_size, n_action_steps=cfg.n_action_steps, **cfg.extra)
    ck, _ = resume_checkpoint(run / "checkpoints") if cfg.resume else (None, 0)
    resuming = ck is not None
    policy = VLAPolicy.load(ck, device=cfg.device) if resuming else VLAPolicy(pcfg).to(cfg.device)
    opt = torch.optim.AdamW(policy.parameters(), cfg.lr, weight_decay=1e-4)
    start = 0
    if resuming:
        state = load_train_state(ck, {"policy": opt}, cfg.device)
        replay.rng.bit_generator.state = state["replay_rng"]
        start = state["step"]
    tracker = Tracker(run)
    result = bc_train(policy, replay, cfg.steps, cfg.batch_size, cfg.lr, run=run, ckpt_every=cfg.ckpt_every,
                      keep_every=cfg.keep_every, start_step=start, opt=opt, tracker=tracker, progress=progress,
                      desc="train-policy")
    result["run_dir"] = str(run)
    if cfg.eval_episodes:
        result["eval"] = evaluate_on_tasks(policy, sorted({t for d in dss for t in d.tasks}), cfg.eval_episodes,
                                           run / "eval", seed=10_000 + cfg.seed, num_envs=cfg.num_envs, progress=progress)
    tracker.log({"stage": "done", **{k: v for k, v in result.items() if k != "eval"}})
    tracker.close()
    return result
