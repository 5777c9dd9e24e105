"""Behaviour cloning of the VLA policy (and of any policy whose `forward(batch)` returns a loss) on windows of an
`EpisodeReplay`: observations at t, the action chunk a_t..a_{t+H-1}, padded past the episode's end and masked.

`bc_train` is the loop itself; `wmrl train-policy` runs it on datasets, and fine-tuning on imagined successes
(Ctrl-World) reuses it on a replay of imagined episodes.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from wmrl.core.checkpoint import commit_checkpoint, save_train_state
from wmrl.core.features import (ACTION, INTERVENTION, IS_LAST, OBS_STATE, REWARD, SUCCESS, TASK, TERMINATED, TRUNCATED,
                                 image_key)
from wmrl.replay import EpisodeReplay


def load_replay(paths, seed: int = 0, successful_only: bool = False):
    """The episodes of one or more datasets in one replay (cameras, state, action, task and outcomes)."""
    dss, replay, _ = EpisodeReplay.from_datasets(
        paths, keys=lambda d: set(d.camera_keys) | {OBS_STATE, ACTION, TASK, INTERVENTION, SUCCESS, TERMINATED,
                                                   TRUNCATED, REWARD, IS_LAST},
        require=(OBS_STATE, ACTION), where=(lambda ep: ep[SUCCESS].any()) if successful_only else None, seed=seed)
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
