"""Behaviour cloning of the VLA policy (and of any policy whose `forward(batch)` returns a loss) on windows of an
`EpisodeReplay`: observations at t, the action chunk a_t..a_{t+H-1}, padded past the episode's end and masked.

`bc_train` is the loop itself (AdamW, linear warm-up then cosine decay, an exponential moving average of the weights
that is what gets saved and evaluated, as in Diffusion Policy and LeRobot); `wmrl train-policy` runs it on datasets
(and DAgger rounds, `wmrl.rl.dagger`), and fine-tuning on imagined successes (Ctrl-World) reuses it on a replay of
imagined episodes.

Labels: the recorded actions, or (`labels="expert"`) the clean scripted expert's action at every recorded state
(DART; DAgger's relabelling), so that exploration noise shapes the states the data covers but not what is taught.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from safetensors.torch import load_file, save_file

from sim.experts import expert_labels
from sim.tabletop.env import mirror_episode
from wmrl.core.checkpoint import commit_checkpoint, save_train_state
from wmrl.core.features import (ACTION, INTERVENTION, IS_LAST, OBS_ENV_STATE, OBS_STATE, REWARD, SUCCESS, TASK, TERMINATED, TRUNCATED,
                                 image_key)
from wmrl.replay import EpisodeReplay


LABELS = ("recorded", "expert")


def load_replay(paths, seed: int = 0, successful_only: bool = False, labels: str = "recorded", mirror: bool = False):
    """The episodes of one or more datasets in one replay (cameras, state, action, task and outcomes). `labels`:
    the recorded actions, or `expert` (the clean scripted expert's action at each recorded state; needs
    `observation.environment_state`). `mirror`: every episode is followed by its reflection through the cell's plane
    of symmetry (`sim.tabletop.env.mirror_episode`, after the labels: the reflected labels), twice the layouts."""
    if labels not in LABELS:
        raise ValueError(f"labels: expected one of {LABELS}, got {labels!r}")
    dss, replay, _ = EpisodeReplay.from_datasets(
        paths, keys=lambda d: set(d.camera_keys) | {OBS_STATE, ACTION, TASK, INTERVENTION, SUCCESS, TERMINATED,
                                                   TRUNCATED, REWARD, IS_LAST, OBS_ENV_STATE},
        require=(OBS_STATE, ACTION) + ((OBS_ENV_STATE,) if labels == "expert" else ()),
        where=(lambda ep: ep[SUCCESS].any()) if successful_only else None,
        transform=expert_labels if labels == "expert" else None, seed=seed,
        augment=(lambda ep: mirror_episode(ep, "--mirror")) if mirror else None)
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
    live = replay.live_frames()
    idx = live[replay.data[INTERVENTION][live].astype(bool)]
    if len(idx) == 0:
        raise ValueError("intervention_weight: no frame of the data is labelled `intervention`")
    replay.update_priorities(idx, np.full(len(idx), weight))
    return int(len(idx))


def bc_batch(replay, batch_size: int, chunk: int, cameras) -> dict:
    """Observations at t and the chunk a_t..a_{t+H-1} (padded past the episode's end, masked by `action_mask`)."""
    keys = [image_key(c) for c in cameras] + [OBS_STATE, ACTION, TASK] + ([OBS_ENV_STATE] if OBS_ENV_STATE in replay.data else [])
    w = replay.sample_windows(batch_size, chunk, keys=keys)
    batch = {k: w[k][:, 0] for k in keys if k not in (ACTION, TASK)}
    batch[TASK] = replay.decode_strings(TASK, w[TASK][:, 0]).tolist()
    batch[ACTION] = w[ACTION]
    batch["action_mask"] = w["action_mask"]
    return batch


class EMA:
    """An exponential moving average of a module's weights, theta_ema <- d theta_ema + (1 - d) theta, with the
    warm-up d_k = min(decay, (1 + k) / (10 + k)) so early averages are not dominated by the random start. Buffers
    (normalisation statistics) are copied.

    `bc_train` leaves the policy holding the average (what is saved and evaluated) and parks the raw weights in
    `raw`; handing the same EMA to a later `bc_train` call (DAgger's rounds, a resume) restores them first, so
    training always continues from the raw weights."""

    def __init__(self, module: torch.nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.module = copy.deepcopy(module).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.raw: dict[str, torch.Tensor] | None = None

    @torch.no_grad()
    def update(self, module: torch.nn.Module, step: int) -> None:
        d = min(self.decay, (1 + step) / (10 + step))
        for e, p in zip(self.module.parameters(), module.parameters()):
            e.lerp_(p.detach(), 1 - d)
        for e, b in zip(self.module.buffers(), module.buffers()):
            e.copy_(b)

    @classmethod
    def resume(cls, policy: torch.nn.Module, checkpoint: Path, decay: float) -> "EMA":
        """`policy` was loaded from `checkpoint` (the averaged weights); the raw ones are read from beside them."""
        ema = cls(policy, decay)
        if (checkpoint / TRAIN_WEIGHTS).exists():
            ema.raw = load_file(str(checkpoint / TRAIN_WEIGHTS))
        return ema


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Linear warm-up over `warmup` steps, then constant or cosine decay to 0 at `total` (LeRobot's
    diffuser_cosine / SGDR without restarts)."""
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"lr schedule: expected constant or cosine, got {schedule!r}")
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))


TRAIN_WEIGHTS = "train_weights.safetensors"  # the raw (non-averaged) weights, next to the saved EMA policy


def bc_train(policy, replay, steps: int, batch_size: int, lr: float, run: Path | None = None, ckpt_every: int = 500,
             keep_every: int = 0, start_step: int = 0, opt: torch.optim.Optimizer | None = None, tracker=None,
             progress: bool = True, desc: str = "bc", ema: EMA | None = None, warmup: int = 0,
             schedule: str = "constant", total_steps: int | None = None) -> dict:
    """Behaviour cloning: `policy.forward(batch)` minimised for steps `start_step+1 .. steps` on windows of
    `replay`. With `ema` the averaged weights are what the policy holds at the end and what checkpoints save (the
    raw ones go beside them, `train_weights.safetensors`, and into `ema.raw`). `total_steps`: the length of the
    whole learning-rate schedule when this call is one part of it (DAgger's rounds); default `steps`."""
    opt = opt or torch.optim.AdamW(policy.parameters(), lr, weight_decay=1e-4)
    total = total_steps or steps
    if ema is not None and ema.raw is not None:
        policy.load_state_dict(ema.raw)
    policy.train()
    last: dict = {}
    losses = []
    t0 = time.time()
    bar = tqdm(total=steps, initial=start_step, desc=desc, disable=not progress)

    def save(d: Path, step: int) -> None:
        if ema is None:
            policy.save(d)
        else:
            ema.module.save(d)
            save_file({k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}, str(d / TRAIN_WEIGHTS))
        save_train_state(d, step, {"policy": opt}, replay_rng=replay.rng.bit_generator.state)

    for step in range(start_step + 1, steps + 1):
        for g in opt.param_groups:
            g["lr"] = lr * lr_factor(step - 1, total, warmup, schedule)
        loss, info = policy(bc_batch(replay, batch_size, policy.cfg.chunk_size, policy.cfg.cameras))
        if not torch.isfinite(loss):
            raise RuntimeError(f"BC loss became {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        if ema is not None:
            ema.update(policy, step)
        losses.append(loss.item())
        last = info
        bar.update(1)
        if tracker is not None and (step % 50 == 0 or step == steps):
            tracker.log({"bc_loss": float(np.mean(losses[-50:])), "lr": opt.param_groups[0]["lr"], **info}, step=step)
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
        if run is not None and (step % ckpt_every == 0 or step == steps):
            commit_checkpoint(run / "checkpoints", step, lambda d: save(d, step))
        if run is not None and keep_every and step % keep_every == 0:
            (ema.module if ema is not None else policy).save(run / "checkpoints" / f"step_{step:06d}")
    bar.close()
    if ema is not None:  # the policy leaves holding the averaged weights (what was saved and is evaluated)
        ema.raw = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        policy.load_state_dict(ema.module.state_dict())
    policy.eval()
    return {"steps": steps, "seconds": time.time() - t0, "loss_first": float(np.mean(losses[:50])) if losses else None,
            "loss_last": float(np.mean(losses[-50:])) if losses else None, **last}
