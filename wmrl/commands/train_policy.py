"""`wmrl train-policy --data DIR [DIR ...] --out RUN`: behaviour cloning of the VLA policy on one or more LeRobot v3
datasets (several tasks make a multi-task policy). Progress bar, checkpoints (safetensors + JSON) every
`ckpt_every` steps, `--resume` after an interruption, metrics to `metrics.jsonl`, and a true-simulator evaluation
with videos at the end.

`bc_train` is the loop itself; fine-tuning on imagined successes (Ctrl-World) reuses it on a replay of imagined
episodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from wmrl.core.features import ACTION, INTERVENTION, OBS_STATE, TASK, image_key


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


def load_replay(paths, seed: int = 0, successful_only: bool = False):
    """The episodes of one or more datasets in one replay (cameras, state, action, task and outcomes)."""
    from wmrl.datasets import LeRobotV3Dataset
    from wmrl.replay import EpisodeReplay

    dss = [LeRobotV3Dataset(p) for p in paths]
    replay = EpisodeReplay(sum(d.num_frames for d in dss), seed=seed)
    for d in dss:
        keep = set(d.camera_keys) | {OBS_STATE, ACTION, TASK, INTERVENTION, "next.success", "next.terminated",
                                     "next.truncated", "next.reward", "is_last"}
        missing = sorted({OBS_STATE, ACTION} - set(d.features))
        if missing:
            raise ValueError(f"{d.root}: dataset lacks {missing}; it has {sorted(d.features)}")
        for ep in d.iter_episodes():
            if successful_only and not ep["next.success"].any():
                continue
            replay.add_episode({k: v for k, v in ep.items() if k in keep})
    if replay.num_episodes == 0:
        raise ValueError(f"{list(map(str, paths))}: no episodes to clone" + (" (none succeeded)" if successful_only else ""))
    return dss, replay


def weight_interventions(replay, weight: float) -> int:
    """Frames labelled `intervention` get sampling priority `weight` (windows starting there are drawn that many
    times as often as policy frames). Returns how many frames were up-weighted."""
    if not (np.isfinite(weight) and weight > 0):
        raise ValueError(f"intervention_weight must be a finite number > 0, got {weight}")
    if weight == 1.0:
        return 0
    if INTERVENTION not in replay.data:
        raise ValueError("intervention_weight needs datasets with an `intervention` column (recorded corrections)")
    live = np.flatnonzero(replay.frame_episode[: replay.high_water] >= 0)
    idx = live[replay.data[INTERVENTION][live].astype(bool)]
    if len(idx) == 0:
        raise ValueError("intervention_weight: no frame of the data is labelled `intervention`")
    replay.update_priorities(idx, np.full(len(idx), weight))
    return int(len(idx))


def bc_batch(replay, batch_size: int, chunk: int, cameras) -> dict:
    """Observations at t and the chunk a_t..a_{t+H-1} (padded past the episode's end, masked by `action_mask`)."""
    keys = [image_key(c) for c in cameras] + [OBS_STATE, ACTION, TASK]
    w = replay.sample_windows(batch_size, chunk, keys=keys)
    batch = {k: w[k][:, 0] for k in keys if k not in (ACTION, TASK)}
    batch[TASK] = replay.decode_strings(TASK, w[TASK][:, 0]).tolist()
    batch[ACTION] = w[ACTION]
    batch["action_mask"] = w["action_mask"]
    return batch


def bc_train(policy, replay, steps: int, batch_size: int, lr: float, run: Path | None = None, ckpt_every: int = 500,
             keep_every: int = 0, start_step: int = 0, opt: torch.optim.Optimizer | None = None, tracker=None,
             progress: bool = True, desc: str = "bc") -> dict:
    """Behaviour cloning: `policy.forward(batch)` minimised for `steps` steps on windows of `replay`."""
    from wmrl.core.checkpoint import commit_checkpoint, save_train_state

    opt = opt or torch.optim.AdamW(policy.parameters(), lr, weight_decay=1e-4)
    policy.train()
    last: dict = {}
    losses = []
    t0 = time.time()
    bar = tqdm(total=steps, initial=start_step, desc=desc, disable=not progress)
    for step in range(start_step + 1, steps + 1):
        loss, info = policy(bc_batch(replay, batch_size, policy.cfg.chunk_size, policy.cfg.cameras))
        if not torch.isfinite(loss):
            raise RuntimeError(f"BC loss became {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        last = info
        bar.update(1)
        if tracker is not None and (step % 50 == 0 or step == steps):
            tracker.log({"bc_loss": float(np.mean(losses[-50:])), **info}, step=step)
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
        if run is not None and (step % ckpt_every == 0 or step == steps):
            commit_checkpoint(run / "checkpoints", step, lambda d: (
                policy.save(d), save_train_state(d, step, {"policy": opt}, replay_rng=replay.rng.bit_generator.state)))
        if run is not None and keep_every and step % keep_every == 0:
            policy.save(run / "checkpoints" / f"step_{step:06d}")
    bar.close()
    policy.eval()
    return {"steps": steps, "seconds": time.time() - t0, "loss_first": float(np.mean(losses[:50])) if losses else None,
            "loss_last": float(np.mean(losses[-50:])) if losses else None, **last}


def train_policy(cfg: TrainPolicyConfig, progress: bool = True) -> dict:
    from policies.vla import VLAConfig, VLAPolicy
    from wmrl.core.checkpoint import load_train_state, resume_checkpoint
    from wmrl.run import Tracker, prepare_run_dir, save_config

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run = prepare_run_dir(cfg.out, cfg.overwrite, cfg.resume)
    save_config(run, cfg)
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


def evaluate_on_tasks(policy, instructions: list[str], episodes: int, out: Path | None, seed: int, num_envs: int = 2,
                      progress: bool = True) -> dict:
    """True-simulator success of `policy` on each task named by an instruction (per task: metrics, videos)."""
    import sim
    from sim.tabletop.tasks import task_from_instruction
    from wmrl.eval import evaluate

    out_ = {}
    for task in sorted({task_from_instruction(t) for t in instructions}):
        env = sim.make_vector_env(task, num_envs)
        try:
            policy.check_spaces(env.single_observation_space, env.single_action_space)
            r = evaluate(policy, env, episodes, seed=seed, progress=progress,
                         video_dir=(out / task / "videos") if out is not None else None, max_videos=4)
        finally:
            env.close()
        out_[task] = r.metrics()
    return out_
