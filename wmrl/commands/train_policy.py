"""`wmrl train-policy --data DIR [DIR ...] --out RUN`: behaviour cloning of the VLA policy on one or more LeRobot v3
datasets (several tasks make a multi-task policy), optionally followed by DAgger rounds with the scripted expert as
the labeller (`--dagger.rounds N`); or, with `--type estimated-state`, the two-stage pixel policy
(`policies/estimated_state`: object positions estimated from the cameras, then an MLP actor on DART labels). Progress bar, checkpoints (safetensors + JSON; the EMA weights, the raw ones
beside them) every `ckpt_every` steps, `--resume` after an interruption, metrics to `metrics.jsonl`, and a
true-simulator evaluation with videos at the end.

The BC loop itself is `policies.vla.bc`; DAgger is `wmrl.rl.dagger`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from sim import task_from_instruction

import torch

from policies.vla import VLAConfig, VLAPolicy
from policies.vla.bc import EMA, bc_train, load_replay, weight_interventions
from wmrl.core.checkpoint import load_train_state, resume_checkpoint
from wmrl.core.run import Tracker, start_run
from wmrl.eval import evaluate_on_tasks
from wmrl.rl.dagger import DAggerConfig, dagger


@dataclass
class TrainPolicyConfig:
    data: tuple[Path, ...] = (Path("data/push-red"),)
    """One or more LeRobot v3 datasets (several tasks: a multi-task policy)."""
    out: Path = Path("runs/policy")
    type: str = "vla"
    """vla (end-to-end, RL-capable) or estimated-state (two-stage: perception then actor, trains in tens of minutes
    on a CPU; --steps are its actor's, --estimator-steps its perception's, --batch-size is not used)."""
    estimator_steps: int = 6000
    """estimated-state only: steps of the state estimator (batch 64); its actor then trains --steps (batch 256)."""
    head: str = "gaussian"
    """Action-chunk head: gaussian (exact log-prob, for RL) or flow (pi0-style flow matching)."""
    chunk_size: int = 4
    n_action_steps: int = 4
    """Actions of each predicted chunk executed before predicting again (1: receding horizon)."""
    temporal_ensemble_coeff: Optional[float] = None
    """ACT's temporal ensembling (needs --n-action-steps 1): m in w_i = exp(-m i), i = 0 the oldest prediction."""
    steps: int = 3000
    """BC steps on the datasets (DAgger's rounds come after them)."""
    batch_size: int = 64
    lr: float = 3e-4
    warmup: int = 0
    """Linear learning-rate warm-up steps."""
    schedule: str = "constant"
    """Learning rate after warm-up: constant or cosine (to 0 at the last step, DAgger's rounds included)."""
    ema: float = 0.0
    """Decay of the exponential moving average of the weights that is saved and evaluated (0: none; 0.999 typical)."""
    labels: str = "recorded"
    """Actions to clone: recorded (as in the data) or expert (the clean scripted expert's action at each recorded
    state, DART-style; needs observation.environment_state)."""
    dagger: DAggerConfig = field(default_factory=DAggerConfig)
    successful_only: bool = False
    """Clone only the episodes that succeeded (datasets recorded with near-success failures)."""
    intervention_weight: float = 1.0
    """Sample frames an operator produced (`intervention`, RaC/HIL-SERL corrections) this many times as often."""
    mirror: bool = False
    """vla: also clone every episode's reflection through the cell's plane of symmetry (tabletop data: images
    flipped, y negated; DAgger's aggregate too). estimated-state takes --extra mirror / mirror_actor instead."""
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
    """Further VLAConfig fields (e.g. hidden 512); for estimated-state: width, hidden, layers, holdout_episodes,
    estimator_batch (64; 128 on a GPU), cameras (a comma list, or none: the actor reads the recorded object channel, as from a tracked cell),
    actor_state_dims (e.g. 4,5,6,7: the proprioception a world model's state channel predicts; for RL in imagination),
    mirror (the share of the estimator's batches reflected through the cell's plane of symmetry, e.g. 0.5) and
    mirror_actor (true: the actor also learns every frame's reflection; with mirror 0.5, +15 points on the short
    recipe, README)."""


POLICY_TYPES = ("vla", "estimated-state")


def train_policy(cfg: TrainPolicyConfig, progress: bool = True) -> dict:
    if cfg.type not in POLICY_TYPES:
        raise ValueError(f"--type: expected one of {POLICY_TYPES}, got {cfg.type!r}")
    if cfg.type == "estimated-state":
        return _train_estimated_state(cfg, progress)
    if cfg.dagger.rounds and cfg.successful_only:
        raise ValueError("--dagger.rounds labels every state the learner visits; --successful-only would drop its "
                         "failures, which are what DAgger learns from")
    if cfg.ema and not 0 < cfg.ema < 1:
        raise ValueError(f"--ema must be in (0, 1) (or 0 for none), got {cfg.ema}")
    run = start_run(cfg)
    torch.manual_seed(cfg.seed)
    dss, replay = load_replay(cfg.data, cfg.seed, cfg.successful_only,
                              labels="expert" if cfg.dagger.rounds else cfg.labels, mirror=cfg.mirror)
    tasks = sorted({t for d in dss for t in d.tasks})
    if cfg.dagger.rounds and len({task_from_instruction(t) for t in tasks}) != 1:
        raise ValueError(f"--dagger.rounds runs the learner on one task; the data has {tasks}")
    weight_interventions(replay, cfg.intervention_weight)
    pcfg = VLAConfig.from_dataset(dss, head=cfg.head, chunk_size=cfg.chunk_size, n_action_steps=cfg.n_action_steps,
                                  temporal_ensemble_coeff=cfg.temporal_ensemble_coeff, **cfg.extra)
    ck, _ = resume_checkpoint(run / "checkpoints") if cfg.resume else (None, 0)
    resuming = ck is not None
    policy = VLAPolicy.load(ck, device=cfg.device) if resuming else VLAPolicy(pcfg).to(cfg.device)
    ema = (EMA.resume(policy, ck, cfg.ema) if resuming else EMA(policy, cfg.ema)) if cfg.ema else None
    opt = torch.optim.AdamW(policy.parameters(), cfg.lr, weight_decay=1e-4)
    start = 0
    if resuming:
        state = load_train_state(ck, {"policy": opt}, cfg.device)
        replay.rng.bit_generator.state = state["replay_rng"]
        start = state["step"]
    tracker = Tracker(run)
    total = cfg.steps + cfg.dagger.rounds * cfg.dagger.steps
    train_kwargs = dict(batch_size=cfg.batch_size, lr=cfg.lr, run=run, ckpt_every=cfg.ckpt_every,
                        keep_every=cfg.keep_every, opt=opt, tracker=tracker, ema=ema, warmup=cfg.warmup,
                        schedule=cfg.schedule, total_steps=total)
    result = {}
    if start < cfg.steps:
        result = bc_train(policy, replay, cfg.steps, start_step=start, progress=progress, desc="train-policy",
                          **train_kwargs)
    if cfg.dagger.rounds:
        result["dagger"] = dagger(policy, cfg.data, task_from_instruction(tasks[0]), run, cfg.dagger,
                                  bc_steps=cfg.steps, start_step=start, train_kwargs=train_kwargs, seed=cfg.seed,
                                  num_envs=cfg.num_envs, intervention_weight=cfg.intervention_weight,
                                  progress=progress, mirror=cfg.mirror)
    result.update(run_dir=str(run), steps=total)
    if cfg.eval_episodes:
        result["eval"] = evaluate_on_tasks(policy, tasks, cfg.eval_episodes, run / "eval", seed=10_000 + cfg.seed,
                                           num_envs=cfg.num_envs, progress=progress)
    tracker.log({"stage": "done", **{k: v for k, v in result.items() if k not in ("eval", "dagger")}})
    tracker.close()
    return result


def _dims(value) -> tuple[int, ...]:
    """--extra actor_state_dims 4,5,6,7 (the observation.state dimensions the actor reads); default: all."""
    if value is None or value == "" or value == "all":
        return ()
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        return tuple(int(v) for v in items)
    except ValueError:
        raise ValueError(f"--extra actor_state_dims: expected comma-separated integers, got {value!r}") from None


def _cameras(value) -> tuple[str, ...] | None:
    """--extra cameras front,wrist | none (an actor on the recorded object channel, no perception); default: all."""
    if value is None:
        return None
    return () if str(value).lower() == "none" else tuple(c for c in str(value).split(",") if c)


def _flag(name: str, value) -> bool:
    """--extra NAME true|false (also 1/0, yes/no); default false."""
    v = str(value if value is not None else "false").lower()
    if v not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"--extra {name}: expected true or false, got {value!r}")
    return v in ("true", "1", "yes")


def _train_estimated_state(cfg: TrainPolicyConfig, progress: bool) -> dict:
    """Both supervised stages, the policy committed as the run's checkpoint, then the true-simulator evaluation."""
    from policies.estimated_state.train import train_estimated_state
    from wmrl.core.checkpoint import commit_checkpoint

    unsupported = [flag for flag, on in (("--dagger.rounds", cfg.dagger.rounds), ("--successful-only", cfg.successful_only),
                                         ("--resume", cfg.resume)) if on]
    if unsupported:
        raise ValueError(f"--type estimated-state does not take {unsupported} (it trains on the DART labels of every "
                         "frame, in minutes)")
    if cfg.mirror:
        raise ValueError("--type estimated-state reflects through --extra mirror SHARE (its estimator) and "
                         "mirror_actor true (its actor), not --mirror")
    if cfg.steps < 1 or cfg.estimator_steps < 1:
        raise ValueError(f"--steps and --estimator-steps must be >= 1, got {cfg.steps} and {cfg.estimator_steps}")
    mirror, mirror_actor = float(cfg.extra.get("mirror", 0.0)), _flag("mirror_actor", cfg.extra.get("mirror_actor"))
    if not 0.0 <= mirror <= 1.0:
        raise ValueError(f"--extra mirror: a share of the estimator's batches in [0, 1], got {mirror}")
    run = start_run(cfg)
    tracker = Tracker(run)
    policy, record = train_estimated_state(cfg.data, cfg.estimator_steps, cfg.steps,
                                           holdout_episodes=int(cfg.extra.get("holdout_episodes", 20)),
                                           width=int(cfg.extra.get("width", 32)), hidden=int(cfg.extra.get("hidden", 512)),
                                           layers=int(cfg.extra.get("layers", 3)), seed=cfg.seed, device=cfg.device,
                                           progress=progress, cameras=_cameras(cfg.extra.get("cameras")),
                                           estimator_batch=int(cfg.extra.get("estimator_batch", 64)),
                                           mirror=mirror, mirror_actor=mirror_actor,
                                           actor_state_dims=_dims(cfg.extra.get("actor_state_dims")))
    commit_checkpoint(run / "checkpoints", cfg.estimator_steps + cfg.steps, policy.save)
    for row in record["estimator"]:
        tracker.log({"estimator_loss": row["loss"], "estimator_cubes_xy_cm": row["cubes_xy_cm"],
                     "estimator_zones_xy_cm": row["zones_xy_cm"]}, step=row["step"])
    result = {**record, "run_dir": str(run), "steps": cfg.estimator_steps + cfg.steps}
    if cfg.eval_episodes:
        result["eval"] = evaluate_on_tasks(policy, record["instructions"], cfg.eval_episodes, run / "eval",
                                           seed=10_000 + cfg.seed, num_envs=cfg.num_envs, progress=progress)
    tracker.log({"stage": "done", **{k: v for k, v in result.items() if k not in ("eval", "estimator")}})
    tracker.close()
    return result
