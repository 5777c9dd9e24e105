"""Training of the video world model from a LeRobot v3 dataset: autoencoder, then dynamics + heads jointly, then the
pixel success classifier. One global step counter across the three phases; checkpoints (safetensors + JSON) every
`ckpt_every` steps and at the end; `--resume` continues from the last checkpoint with the same data order."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from world_models.video.classifier import SuccessClassifier
from world_models.video.model import VideoWorldModel, WorldModelConfig
from world_models.video.networks import TaskEncoder

STATE, ACTION, SUCC, REW, TERM = "observation.state", "action", "next.success", "next.reward", "next.terminated"
ENV_STATE = "observation.environment_state"


@dataclass
class TrainWMConfig:
    data: Path = Path("data/push-red")
    """LeRobot v3 dataset (e.g. from `wmrl collect ... --failures 0.3`)."""
    out: Path = Path("runs/wm")
    size: str = "small"
    """U-Net widths: tiny, small, base, large."""
    ae_steps: int = 1500
    dyn_steps: int = 4000
    cls_steps: int = 600
    batch_size: int = 32
    lr: float = 3e-4
    context: int = 2
    chunk: int = 4
    sampling_steps: int = 3
    deterministic: bool = False
    """Train the no-diffusion baseline (same backbone, direct regression)."""
    extra_data: tuple[Path, ...] = ()
    """More datasets to train on (all episodes to training), e.g. true rollouts of an evolved policy (co-evolution)."""
    init_from: Optional[Path] = None
    """Start from another run's checkpoint: all weights if its config matches (fine-tuning), else the autoencoder and
    latent statistics only (e.g. a deterministic baseline on the same latents); use with --ae-steps 0."""
    fg_weight: float = 3.0
    """Extra autoencoder-loss weight on pixels that differ from the batch's mean frame of their camera (arm, cubes):
    plain MSE spends the latent on the static background."""
    holdout: float = 0.1
    """Share of episodes (the last ones) held out for evaluation and videos."""
    ckpt_every: int = 500
    log_every: int = 50
    videos: int = 3
    seed: int = 0
    device: str = "cpu"
    threads: Optional[int] = None
    overwrite: bool = False
    resume: bool = False


def load_split(data: Path, holdout: float, seed: int = 0, extra: tuple[Path, ...] = ()):
    """The dataset as two replays: train episodes and held-out episodes (the last `holdout` share of `data`).
    Episodes of the `extra` datasets (e.g. rollouts of an evolved policy) all go to training."""
    from wmrl.datasets import LeRobotV3Dataset
    from wmrl.replay import EpisodeReplay

    dss = [LeRobotV3Dataset(p) for p in (data, *extra)]
    needed = [STATE, ACTION, SUCC, REW, TERM, "observation.images.front", "observation.images.wrist"]
    for d in dss:
        missing = [k for k in needed if k not in d.features]
        if missing:
            raise ValueError(f"{d.root}: dataset lacks {missing}; it has {sorted(d.features)}")
    ds = dss[0]
    n_hold = max(1, int(round(ds.num_episodes * holdout))) if holdout > 0 else 0
    if ds.num_episodes - n_hold < 2:
        raise ValueError(f"{data}: {ds.num_episodes} episodes are too few to train a world model")
    skip = {"timestamp", "frame_index", "episode_index", "index", "task_index", "qpos", "qvel"}
    total = sum(d.num_frames for d in dss)
    train = EpisodeReplay(total, seed=seed)
    held = EpisodeReplay(ds.num_frames, seed=seed + 1)
    for j, d in enumerate(dss):
        for i, ep in enumerate(d.iter_episodes()):
            dest = held if j == 0 and i >= ds.num_episodes - n_hold else train
            dest.add_episode({k: v for k, v in ep.items() if k not in skip})
    return ds, train, held


def model_config(cfg: TrainWMConfig, ds) -> WorldModelConfig:
    vocab = sorted({w for t in ds.tasks for w in TaskEncoder.words(t)})
    return WorldModelConfig(context=cfg.context, chunk=cfg.chunk, size=cfg.size, sampling_steps=cfg.sampling_steps,
                            deterministic=cfg.deterministic, task_vocab=vocab,
                            action_dim=int(ds.features[ACTION]["shape"][0]), state_dim=int(ds.features[STATE]["shape"][0]),
                            env_state_dim=int(ds.features[ENV_STATE]["shape"][0]) if ENV_STATE in ds.features else 0)


def ae_weights(x: torch.Tensor, n_cameras: int, fg_weight: float) -> torch.Tensor:
    """Per-pixel loss weights (N, 1, H, W), mean 1, for a batch x (N, 3, H, W) made of n_cameras equal blocks:
    1 + fg_weight where a pixel is far (> 0.1) from its camera's batch-mean frame."""
    xc = x.reshape(n_cameras, -1, *x.shape[1:])
    fg = ((xc - xc.mean(dim=1, keepdim=True)).abs().mean(dim=2, keepdim=True) > 0.1).float()
    w = (1 + fg_weight * fg).reshape(-1, 1, *x.shape[2:])
    return w / w.mean()


@torch.no_grad()
def encode_all(model: VideoWorldModel, replay, batch: int = 256) -> np.ndarray:
    """Latents of every stored frame, aligned with the replay's slots (standardised with the model's stats)."""
    hw = replay.high_water
    out = np.zeros((hw, model.cfg.frame_channels, model.cfg.latent_size, model.cfg.latent_size), np.float32)
    for i in range(0, hw, batch):
        j = min(i + batch, hw)
        imgs = {f"observation.images.{c}": replay.data[f"observation.images.{c}"][i:j] for c in model.cfg.cameras}
        out[i:j] = model.encode_frames(imgs).cpu().numpy()
    return out


def dynamics_batch(replay, lat: np.ndarray, B: int, K: int, H: int, device, rng: np.random.Generator) -> dict:
    env = [ENV_STATE] if ENV_STATE in replay.data else []
    w = replay.sample_windows(B, K + H, keys=[STATE, ACTION, SUCC, REW, TERM, "task", *env])
    z = torch.from_numpy(lat[w["index"]]).to(device)
    ctx = z[:, :K].clone()
    dup = rng.random(B) < 0.1  # emulate a reset: the start frame repeated as context
    ctx[torch.from_numpy(dup), : K - 1] = ctx[torch.from_numpy(dup), K - 1 : K]
    t = lambda x: torch.as_tensor(x, device=device)
    tasks = replay.decode_strings("task", w["task"][:, 0]).tolist()
    return {
        "ctx": ctx, "future": z[:, K:], "actions": t(w[ACTION][:, K - 1 : K + H - 1]).float(),
        "proprio": t(w[STATE][:, K - 1]).float(), "mask": t(w["mask"][:, K:]).float(), "tasks": tasks,
        "labels": {"state": t(w[STATE][:, K:]).float(), "success": t(w[SUCC][:, K - 1 : K + H - 1]).float(),
                   "reward": t(w[REW][:, K - 1 : K + H - 1]).float(), "done": t(w[TERM][:, K - 1 : K + H - 1]).float(),
                   **({"env_state": t(w[ENV_STATE][:, K:]).float()} if env else {})},
    }


def _save_checkpoint(run: Path, step: int, model, clf, opts: dict, replay, extra: dict) -> None:
    from safetensors.torch import save_file

    from wmrl.core.checkpoint import save_train_state
    from wmrl.core.io import atomic_path

    ck = run / "checkpoints" / "last"
    model.save(ck)
    with atomic_path(ck / "classifier.safetensors") as tmp:
        save_file({k: v.contiguous() for k, v in clf.state_dict().items()}, str(tmp))
    save_train_state(ck, step, opts, replay_rng=replay.rng.bit_generator.state, **extra)


def train_world_model(cfg: TrainWMConfig, progress: bool = True) -> dict:
    from safetensors.torch import load_file

    from wmrl.core.checkpoint import load_train_state, resolve_checkpoint
    from wmrl.run import Tracker, prepare_run_dir, save_config

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run = prepare_run_dir(cfg.out, cfg.overwrite, cfg.resume)
    save_config(run, cfg)
    torch.manual_seed(cfg.seed)
    ds, train, held = load_split(cfg.data, cfg.holdout, cfg.seed, cfg.extra_data)
    mcfg = model_config(cfg, ds)
    ck = run / "checkpoints" / "last"
    resuming = cfg.resume and (ck / "train_state.json").exists()
    model = VideoWorldModel.load(ck, expect=mcfg, device=cfg.device) if resuming else VideoWorldModel(mcfg).to(cfg.device)
    clf = SuccessClassifier(mcfg.cameras, mcfg.task_vocab).to(cfg.device)
    ae_ids = {id(p) for p in model.ae.parameters()}
    opts = {"ae": torch.optim.AdamW(model.ae.parameters(), cfg.lr * 3),
            "dyn": torch.optim.AdamW([p for p in model.parameters() if id(p) not in ae_ids], cfg.lr),
            "cls": torch.optim.AdamW(clf.parameters(), cfg.lr * 3)}
    step, extra = 0, {}
    if resuming:
        state = load_train_state(ck, opts, cfg.device)
        clf.load_state_dict(load_file(str(ck / "classifier.safetensors"), device=cfg.device))
        train.rng.bit_generator.state = state["replay_rng"]
        step = state["step"]
        extra = {k: v for k, v in state.items() if k not in ("step", "replay_rng")}
    elif cfg.init_from is not None:
        src_ck = resolve_checkpoint(cfg.init_from)
        src = VideoWorldModel.load(src_ck, device=cfg.device)
        if src.cfg == mcfg:  # the same model: fine-tune every weight (the classifier too)
            model.load_state_dict(src.state_dict())
            clf.load_state_dict(load_file(str(src_ck / "classifier.safetensors"), device=cfg.device))
        model.ae.load_state_dict(src.ae.state_dict())
        model.lat_mean.copy_(src.lat_mean)
        model.lat_std.copy_(src.lat_std)
        extra["lat_mean"] = True  # keep the source's latent statistics
    tracker = Tracker(run)
    K, H, B = cfg.context, cfg.chunk, cfg.batch_size
    total = cfg.ae_steps + cfg.dyn_steps + cfg.cls_steps
    n_pos = sum(int(train.data[SUCC][lo : lo + T].sum()) for lo, T in train.episodes.values())
    pos_weight = torch.tensor(min(20.0, max(1.0, (len(train) - n_pos) / max(n_pos, 1))), device=cfg.device)
    lat = None
    bar = tqdm(total=total, initial=step, desc="train-wm", disable=not progress)
    t0 = time.time() - extra.get("seconds", 0.0)
    last = {}
    while step < total:
        if step < cfg.ae_steps:
            b = train.sample(B, keys=[f"observation.images.{c}" for c in mcfg.cameras])
            x = torch.cat([torch.as_tensor(b[f"observation.images.{c}"], device=cfg.device) for c in mcfg.cameras])
            x = x.permute(0, 3, 1, 2).float() / 127.5 - 1.0
            z = model.ae.encode(x)
            loss = (ae_weights(x, len(mcfg.cameras), cfg.fg_weight) * (model.ae.decode(z) - x) ** 2).mean() + 1e-4 * (z**2).mean()
            opt, info = opts["ae"], {"ae_loss": loss.item()}
        elif step < cfg.ae_steps + cfg.dyn_steps:
            if lat is None:
                if "lat_mean" not in extra:  # latent statistics, fixed once after the autoencoder phase
                    with torch.no_grad():
                        raw = np.concatenate([encode_all_raw(model, train, i) for i in range(0, train.high_water, 512)])
                    model.lat_mean.copy_(torch.from_numpy(raw.mean(axis=(0, 2, 3))).reshape(-1, 1, 1))
                    model.lat_std.copy_(torch.from_numpy(raw.std(axis=(0, 2, 3)) + 1e-6).reshape(-1, 1, 1))
                    extra["lat_mean"] = True
                lat = encode_all(model, train)
            d = dynamics_batch(train, lat, B, K, H, cfg.device, np.random.default_rng((cfg.seed, step)))
            l_dyn = model.dynamics_loss(d["ctx"], d["future"], d["actions"], d["proprio"], d["mask"])
            l_heads, hinfo = model.heads_loss(d["future"].flatten(0, 1), [t for t in d["tasks"] for _ in range(H)],
                                              {k: v.flatten(0, 1) for k, v in d["labels"].items()}, d["mask"].flatten(0, 1),
                                              pos_weight=pos_weight)
            loss = l_dyn + l_heads
            opt, info = opts["dyn"], {"dyn_loss": l_dyn.item(), **{f"head_{k}": v for k, v in hinfo.items()}}
        else:
            w = train.sample_windows(B, 2, keys=[f"observation.images.{c}" for c in mcfg.cameras] + [SUCC, "task"])
            imgs = {k: w[k][:, 1] for k in w if k.startswith("observation.images.")}
            tasks = train.decode_strings("task", w["task"][:, 1]).tolist()
            label = torch.as_tensor(w[SUCC][:, 0], device=cfg.device).float()
            m = torch.as_tensor(w["mask"][:, 1], device=cfg.device).float()
            logits = clf(imgs, tasks)
            loss = (F.binary_cross_entropy_with_logits(logits, label, pos_weight=pos_weight, reduction="none") * m).sum() / m.sum().clamp(min=1)
            opt, info = opts["cls"], {"cls_loss": loss.item()}
        if not torch.isfinite(loss):
            raise RuntimeError(f"loss became {loss.item()} at step {step}; the last good checkpoint is in {ck}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
        opt.step()
        step += 1
        last = info
        bar.update(1)
        if step % cfg.log_every == 0 or step == total:
            tracker.log(info, step=step)
            bar.set_postfix({k: f"{v:.3f}" for k, v in list(info.items())[:2]})
        if step % cfg.ckpt_every == 0 or step == total or step == cfg.ae_steps:
            _save_checkpoint(run, step, model, clf, opts, train, {**extra, "seconds": time.time() - t0})
    bar.close()
    minutes = (time.time() - t0) / 60
    result = {"run_dir": str(run), "steps": step, "train_minutes": minutes, **last}
    if cfg.videos:
        from world_models.video.evaluate import write_side_by_side

        result["videos"] = write_side_by_side(model, held, run / "videos", n=cfg.videos)
    tracker.log({"stage": "done", **{k: v for k, v in result.items() if k != "videos"}})
    tracker.close()
    return result


@torch.no_grad()
def encode_all_raw(model: VideoWorldModel, replay, start: int, batch: int = 512) -> np.ndarray:
    """Unstandardised AE latents of slots [start, start + batch) (for the latent statistics)."""
    sl = slice(start, min(start + batch, replay.high_water))
    live = replay.frame_episode[sl] >= 0
    zs = [model.ae.encode(torch.as_tensor(replay.data[f"observation.images.{c}"][sl][live], device=model.device)
                          .permute(0, 3, 1, 2).float() / 127.5 - 1.0) for c in model.cfg.cameras]
    return torch.cat(zs, dim=1).cpu().numpy()

