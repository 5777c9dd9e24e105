"""Training the `estimated-state` policy from LeRobot v3 datasets, in two supervised stages:

1. the `StateEstimator` regresses the recorded `observation.environment_state` from the cameras and the state
   (MSE on the standardised channel, Adam with warm-up, cosine decay and gradient clipping; the held-out episodes'
   position error logged);
2. the actor regresses the clean scripted expert's action at each recorded state (DART labels,
   `sim.experts.expert_labels`) from [state, the estimator's estimate, the instruction's words], trained on the
   cached estimates; its Gaussian sigma is then the residual's RMS per dimension (the maximum-likelihood sigma for
   the fitted mean).

With `cameras=()` there is no first stage: the actor reads the recorded object channel (a tracked cell).
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from policies.estimated_state.modeling import EstimatedStateConfig, EstimatedStatePolicy, StateEstimator
from policies.vla.bc import load_replay
from sim import task_from_instruction
from sim.tabletop.env import MIRROR_ACTION_SIGN, MIRROR_ENV_STATE_SIGN, MIRROR_STATE_SIGN, check_mirrorable
from wmrl.core.arm import cubes_on_table, on_table_mask
from wmrl.core.features import ACTION, IS_LAST, OBS_ENV_STATE, OBS_STATE, TASK, image_key
from wmrl.core.text import words


def position_error_cm(pred: np.ndarray, true: np.ndarray) -> dict:
    """Mean xy error of the cube centres on the table and of the zone centres, in cm (the tabletop's object channel:
    3 cubes x xyz, then 2 zones x xy). A cube that has left the table is not counted: it falls metres within
    seconds where no camera sees it, and one such frame in a few hundred would add centimetres to the mean."""
    true = np.asarray(true)
    diff = np.asarray(pred) - true
    d = np.linalg.norm(diff[:, :9].reshape(-1, 3, 3)[..., :2], axis=-1)
    on = cubes_on_table(true)
    return {"cubes_xy_cm": float(d[on].mean() * 100) if on.any() else float("nan"),
            "zones_xy_cm": float(np.linalg.norm(diff[:, 9:13].reshape(-1, 2, 2), axis=-1).mean() * 100)}


def robust_std(err: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Per-column scale of errors as 1.4826 x the median absolute deviation (the std for Gaussian errors), over the
    values `mask` keeps (default: all; a column with none gets 0). The plain std is ruled by a few frames: in held-out
    episodes where a cube left the table (z far below it, unseen by the cameras) the red cube's z error has a std of
    decimetres where its MAD scale is centimetres, and imagination adds this scale as noise to every step."""
    err = np.asarray(err, np.float64)
    if mask is not None:
        err = np.where(mask, err, np.nan)
    keep = ~np.isnan(err).all(0)
    out = np.zeros(err.shape[1])
    e = err[:, keep]
    out[keep] = 1.4826 * np.nanmedian(np.abs(e - np.nanmedian(e, 0)), 0)
    return out.astype(np.float32)


def fit(loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], params, X, Y, steps: int, batch: int = 256,
        lr: float = 1e-3, seed: int = 0) -> None:
    """Minimise `loss(x, y)` over random batches of (X, Y): Adam, cosine decay to 1e-5 (the regression loop the
    actor stage and the imitation-ceiling benchmark share)."""
    torch.manual_seed(seed)
    params = list(params)
    X_, Y_ = (torch.as_tensor(v, device=params[0].device) for v in (X, Y))  # resident where the model is
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, steps), eta_min=1e-5)
    for _ in range(steps):
        idx = torch.randint(0, len(X_), (batch,))
        value = loss(X_[idx], Y_[idx])
        opt.zero_grad()
        value.backward()
        opt.step()
        sched.step()


def fit_estimator(est: StateEstimator, frames: dict, held: dict | None, steps: int, batch: int = 64,
                  lr: float = 1e-3, seed: int = 0, log_every: int = 500, progress: bool = False,
                  mirror: float = 0.0) -> list:
    """Stage 1. `frames`/`held`: {"images": {camera: uint8 (N, H, W, 3)}, observation.state, observation.environment_state}.
    `mirror`: the share of each batch reflected through the cell's plane of symmetry (images flipped left-right,
    the y coordinates and the base's yaw negated: `sim.tabletop.env.MIRROR_*`), a second layout for every recorded
    one that keeps absolute positions consistent, unlike a shift. Returns the held-out position error every
    `log_every` steps (and at the end)."""
    torch.manual_seed(seed)
    device = est.state_mean.device  # uint8 frames resident on the model's device: no host copy per step
    imgs = {c: torch.as_tensor(frames["images"][c], device=device) for c in est.cameras}
    S, E = (torch.as_tensor(frames[k], device=device) for k in (OBS_STATE, OBS_ENV_STATE))
    if not 0.0 <= mirror <= 1.0:
        raise ValueError(f"mirror: a share of each batch in [0, 1], got {mirror}")
    if mirror:
        check_mirrorable("mirror", est.cameras, S.shape[1], E.shape[1])
    s_sign, e_sign = (torch.as_tensor(v, device=device) for v in (MIRROR_STATE_SIGN, MIRROR_ENV_STATE_SIGN))
    opt = torch.optim.Adam(est.parameters(), lr=lr)
    warmup = max(1, min(200, steps // 10))  # an unwarmed, unclipped run spiked (loss 0.01 -> 6.8) mid-training
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, 0.01, 1.0, warmup),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, steps - warmup), eta_min=1e-5)], [warmup])
    log = []
    finite, checked = torch.ones((), dtype=torch.bool, device=device), 0
    bar = tqdm(range(1, steps + 1), desc="estimator", disable=not progress)
    for step in bar:
        est.train()
        idx = torch.randint(0, len(S), (batch,), device=device)
        im, s, e = {c: x[idx] for c, x in imgs.items()}, S[idx], E[idx]
        if mirror:
            flip = torch.rand(batch, device=device) < mirror
            im = {c: torch.where(flip[:, None, None, None], x.flip(2), x) for c, x in im.items()}
            s, e = torch.where(flip[:, None], s * s_sign, s), torch.where(flip[:, None], e * e_sign, e)
        loss = est.loss(im, s, e)
        finite &= torch.isfinite(loss)  # a device flag, read at log steps (no host sync per step)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(est.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps:
            if not bool(finite):
                raise RuntimeError(f"estimator loss became non-finite between steps {checked + 1} and {step}")
            checked = step
        if held is not None and (step % log_every == 0 or step == steps):
            err = position_error_cm(est.estimate(held["images"], held[OBS_STATE]), held[OBS_ENV_STATE])
            log.append({"step": step, "loss": loss.item(), **err})
            bar.set_postfix(cubes_cm=f"{err['cubes_xy_cm']:.2f}")
    return log


def fit_actor(policy: EstimatedStatePolicy, state: np.ndarray, estimate: np.ndarray, tasks, labels: np.ndarray,
              steps: int, batch: int = 256, seed: int = 0) -> float:
    """Stage 2: the actor's MSE on the labels from [state, estimate, instruction words]; returns the final training
    MSE."""
    X = policy.actor_input(state, estimate, tasks)
    actor = policy.actor
    actor.obs_mean.copy_(torch.as_tensor(X.mean(0)))
    actor.obs_std.copy_(torch.as_tensor(X.std(0) + 1e-3))
    Y = np.asarray(labels, np.float32)
    fit(lambda x, y: ((actor.mu(x) - y) ** 2).mean(), actor.parameters(), X, Y, steps, batch, seed=seed)
    with torch.no_grad():
        sq = ((actor.mu(torch.as_tensor(X, device=policy.device)) - torch.as_tensor(Y, device=policy.device)) ** 2).mean(0)
        policy.log_std.copy_((0.5 * torch.log(sq.clamp(min=1e-8))).clamp(policy.cfg.log_std_min, policy.cfg.log_std_max))
        return float(sq.mean())


def dataset_frames(paths, cameras: tuple[str, ...] | None = None, holdout_episodes: int = 0, seed: int = 0
                   ) -> tuple[dict, dict | None, list[str]]:
    """The frames of LeRobot v3 datasets as arrays (images per camera, state, object channel, DART labels, and
    whether a frame carries a real action), split into training and the last `holdout_episodes` episodes.
    `cameras`: None for all of the dataset's, () for none."""
    dss, replay = load_replay(paths, seed, labels="expert")
    cameras = tuple([k.split(".")[-1] for k in dss[0].camera_keys] if cameras is None else cameras)
    tasks = sorted({t for d in dss for t in d.tasks})
    live = replay.live_frames()
    episode = replay.frame_episode[live]
    ids = sorted(set(episode.tolist()), key=lambda e: replay.episodes[e][0])
    if holdout_episodes >= len(ids):
        raise ValueError(f"holdout_episodes={holdout_episodes} leaves nothing to train on ({len(ids)} episodes)")
    held_ids = set(ids[len(ids) - holdout_episodes:]) if holdout_episodes else set()

    def take(mask: np.ndarray) -> dict:
        idx = live[mask]
        return {"images": {c: np.asarray(replay.data[image_key(c)][idx]) for c in cameras},
                OBS_STATE: np.asarray(replay.data[OBS_STATE][idx], np.float32),
                OBS_ENV_STATE: np.asarray(replay.data[OBS_ENV_STATE][idx], np.float32),
                ACTION: np.asarray(replay.data[ACTION][idx], np.float32),
                TASK: replay.decode_strings(TASK, replay.data[TASK][idx]),
                "has_action": ~np.asarray(replay.data[IS_LAST][idx], bool)}

    is_held = np.isin(episode, list(held_ids))
    return take(~is_held), (take(is_held) if held_ids else None), tasks


def train_estimated_state(data, estimator_steps: int = 6000, actor_steps: int = 30_000,
                          holdout_episodes: int = 20, seed: int = 0, cameras: tuple[str, ...] | None = None,
                          **kwargs) -> tuple[EstimatedStatePolicy, dict]:
    """Both stages on the datasets `data` (`cameras`: None for all of the data's, () for an actor on the recorded
    object channel); the last `holdout_episodes` episodes measure the estimator. `kwargs`: `train_on_frames`'s."""
    t0 = time.time()
    frames, held, tasks = dataset_frames(data, cameras, holdout_episodes=holdout_episodes, seed=seed)
    policy, record = train_on_frames(frames, held, tasks, estimator_steps, actor_steps, seed=seed, **kwargs)
    record["load_minutes"] = (time.time() - t0) / 60 - record["estimator_minutes"] - record["actor_minutes"]
    return policy, record


def train_on_frames(frames: dict, held: dict | None, tasks: list[str], estimator_steps: int = 6000,
                    actor_steps: int = 30_000, width: int = 32, hidden: int = 512, layers: int = 3, seed: int = 0,
                    device: str = "cpu", progress: bool = True, min_std: float = 0.0,
                    actor_state_dims: tuple[int, ...] = (), estimator_batch: int = 64,
                    task_vocab: list[str] | None = None, log_every: int = 500,
                    mask_off_table: bool = True, mirror: float = 0.0, mirror_actor: bool = False
                    ) -> tuple[EstimatedStatePolicy, dict]:
    """Both stages on frames in memory (`dataset_frames`' layout: images per camera, observation.state, the object
    channel, DART labels under `action`, `task`, and `has_action`; no images: an actor on the recorded object channel).
    `held`: the same for held-out episodes (the estimator's error is logged on them and becomes `estimate_noise`).
    `min_std`: a floor on the actor's sigma (the residual's RMS can be tiny on a dimension the expert holds
    constant, e.g. the gripper while pushing, and then dominates a policy gradient). `actor_state_dims`: the
    proprioceptive dimensions the actor reads (empty: all; for RL in imagination, those the world model's state
    channel predicts, e.g. (4, 5, 6, 7), the tabletop's gripper opening and end-effector). `task_vocab`: the
    instruction words the actor reads (default: those of `tasks`). `log_every`: steps between held-out
    measurements of the estimator. `mask_off_table`: the estimator neither regresses nor scales by cubes that have
    left the table (False: the earlier estimator, for ablations). `mirror`: the share of the estimator's batches
    reflected through the cell's plane of symmetry (`fit_estimator`). `mirror_actor`: the actor also learns every
    frame's reflection (the estimate of the flipped images, the reflected state and label: the scripted expert is
    itself symmetric, its label of a reflected scene is the reflected label), twice the layouts it imitates. Returns
    the policy (in eval mode; `policy.save(folder)` writes it as safetensors + JSON) and its training record."""
    t0 = time.time()
    names = sorted({task_from_instruction(t) for t in tasks})
    if frames[OBS_ENV_STATE].shape[1] < 13:
        raise ValueError("estimated-state needs the tabletop's observation.environment_state (cubes and zones)")
    cfg = EstimatedStateConfig(cameras=tuple(frames["images"]), image_size=int(next(iter(frames["images"].values()), np.zeros((0, 64))).shape[1]),
                               state_dim=frames[OBS_STATE].shape[1], env_state_dim=frames[OBS_ENV_STATE].shape[1],
                               action_dim=frames[ACTION].shape[1], width=width, hidden=hidden, layers=layers, tasks=names,
                               log_std_min=max(-4.0, math.log(min_std)) if min_std > 0 else -4.0,
                               actor_state_dims=list(actor_state_dims),
                               task_vocab=sorted({w for t in tasks for w in words(t)}) if task_vocab is None else list(task_vocab))
    torch.manual_seed(seed)
    policy = EstimatedStatePolicy(cfg).to(device)
    policy.estimator.mask_off_table = bool(mask_off_table)
    policy.estimator.set_statistics(frames[OBS_STATE], frames[OBS_ENV_STATE])
    act = frames["has_action"]
    log = []
    if cfg.cameras:
        log = fit_estimator(policy.estimator, frames, held, estimator_steps, batch=estimator_batch, seed=seed,
                            log_every=log_every, progress=progress, mirror=mirror)
        if held is not None:  # the error the actor meets when it reads a world model's object channel instead
            err = policy.estimator.estimate(held["images"], held[OBS_STATE]) - held[OBS_ENV_STATE]
            policy.cfg.estimate_noise = robust_std(err, on_table_mask(held[OBS_ENV_STATE])).tolist()
        images = {c: x[act] for c, x in frames["images"].items()}
        estimate = policy.estimator.estimate(images, frames[OBS_STATE][act])
    else:
        estimate = frames[OBS_ENV_STATE][act]
    state, frame_tasks, labels = frames[OBS_STATE][act], frames[TASK][act], frames[ACTION][act]
    if mirror_actor:
        check_mirrorable("mirror_actor", cfg.cameras, state.shape[1], estimate.shape[1], labels.shape[1])
        m_state = state * MIRROR_STATE_SIGN
        m_estimate = (policy.estimator.estimate(images, m_state, flip=True) if cfg.cameras
                      else estimate * MIRROR_ENV_STATE_SIGN)
        state, estimate = np.concatenate([state, m_state]), np.concatenate([estimate, m_estimate])
        frame_tasks = np.concatenate([frame_tasks, frame_tasks])
        labels = np.concatenate([labels, labels * MIRROR_ACTION_SIGN])
    t1 = time.time()
    mse = fit_actor(policy, state, estimate, frame_tasks, labels, actor_steps, seed=seed)
    policy.eval()
    record = {"frames": int(len(frames[OBS_STATE])), "held_out_frames": 0 if held is None else int(len(held[OBS_STATE])),
              "estimator": log, "actor_train_mse": mse, "estimator_minutes": (t1 - t0) / 60,
              "actor_minutes": (time.time() - t1) / 60, "task": names[0], "instructions": list(tasks),
              "actor_log_std": policy.log_std.tolist(), "estimate_noise": policy.cfg.estimate_noise,
              "estimator_steps": estimator_steps if cfg.cameras else 0, "estimator_batch": estimator_batch,
              "mask_off_table": bool(mask_off_table), "mirror": float(mirror), "mirror_actor": bool(mirror_actor),
              "actor_steps": actor_steps, "device": str(device)}
    return policy, record
