"""Post-training a video world model on its own long rollouts: Persistent Robot World Models (PersistWorld) with
the DiffusionNFT objective (Zheng et al. 2025, "DiffusionNFT: Online Diffusion Reinforcement with Forward Process").

The model is trained to predict one chunk from real context, yet imagination chains 10-40 chunks on its own
outputs. Post-training closes that gap with reinforcement learning on the model itself:

1. From W shared real histories (train split), G candidate autoregressive rollouts each, of one length L per
   iteration (drawn from [min_horizon, horizon]), under the recorded actions, sampled as imagination samples them
   (`sampling_steps`, the context noise it is told).
2. Reward per rollout: image fidelity against the real future of the same window, decoded as policies see the
   frames (the pixel identity path on the real start frame): mean over frames and cameras of PSNR / 10 dB + SSIM,
   plus, with `moving_weight`, the PSNR on the pixels that move in the real future (where the recorded frame differs
   from the start frame): on these 64 px views the background dominates the whole-frame score, and candidates of
   one history differ little there. LPIPS needs downloaded weights and is not used. The state channel is
   deterministic given the actions, so all G candidates share its error: it cannot rank them and is left out.
3. Optimality r in [0, 1] per rollout from its advantage within its group (GRPO-style standardisation):
   r = 0.5 + 0.5 clip(A / 2, -1, 1).
4. DiffusionNFT's loss on every generated chunk x0 (the model's own sample, standardised change), no backprop
   through the sampler: with D the EDM denoiser, D_old the model that generated the samples (frozen per iteration)
   and strength b,
       D+ = D_old + b (D - D_old),   D- = D_old - b (D - D_old)
       L  = lambda(sigma) [ r ||D+(x0 + sigma n) - x0||^2 + (1 - r) ||D-(x0 + sigma n) - x0||^2 ]
   so the better rollouts pull the model toward themselves and the worse push it away (an implicit guidance
   direction, DiffusionNFT eq. 5-7 written for EDM's x0-prediction instead of a flow's velocity).
5. A trust region: `ref_coef` lambda(sigma) ||D - D_ref||^2 to the frozen base model on the same inputs, so that
   one-chunk prediction does not degrade.
6. The old model: by default a snapshot of the trained model at each iteration's start (it also samples the
   rollouts); with `old_ema` eta, DiffusionNFT's soft update instead: the old model samples and gives the targets,
   and after each iteration theta_old <- eta theta_old + (1 - eta) theta (kept in the checkpoint, so a run resumes
   exactly).

With `objective="forcing"` the same loop post-trains by supervision instead (the autoregressive self-forcing of
video diffusion, e.g. Huang et al. 2025, "Self Forcing"; here with the real future as the target): each history is
rolled out once as imagination samples it, and every chunk's ordinary denoising loss (`VideoWorldModel.dynamics_loss`,
the training objective) is taken on the *real* future chunk with the model's *own* earlier chunks as its context, so
the model learns to steer back from its own drift. Why a second objective: on this simulator the generation is
nearly deterministic given its conditioning (one history's candidates differ 35x less than histories do; README,
long-horizon post-training), so DiffusionNFT's group advantages have little to rank, while the real future is
always there to regress on. The first chunk of every rollout has real context, so one-chunk prediction keeps being
trained (there is no separate trust-region term). Training itself unrolls 2 chunks (`train.unrolled_batch`);
imagination chains 10-40.

Only the denoiser is trained (U-Net and conditioning); the autoencoder, heads and state channel stay as they are.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from wmrl.core.checkpoint import (commit_checkpoint, load_train_state, resolve_checkpoint, resume_checkpoint,
                                  save_train_state)
from wmrl.core.run import Tracker, start_run
from world_models.edm import edm_loss_weight
from world_models.video.evaluate import psnr, ssim
from world_models.video.model import VideoWorldModel
from world_models.video.train import WindowSampler, _pose0, encode_all, load_split, world_model_data


@dataclass
class PostTrainWMConfig:
    world_model: Path = Path("runs/wm")
    """A `wmrl train-wm` run (or checkpoint): the base model, also the frozen reference of the trust region."""
    data: Optional[Path] = None
    """Real episodes for histories and futures; default: the dataset the world model was trained on."""
    out: Path = Path("runs/wm-post")
    iterations: int = 40
    windows: int = 8
    """Shared real histories per iteration."""
    candidates: int = 4
    """Rollouts per history (one group for the advantages; nft only: forcing rolls each history out once)."""
    objective: str = "nft"
    """"nft": DiffusionNFT on candidates ranked by fidelity; "forcing": the denoising loss on the real future with
    the model's own rollout as context (see the module's docstring)."""
    horizon: int = 32
    """Control steps of the longest rollout (a multiple of the model's chunk)."""
    min_horizon: int = 8
    """Rollout lengths are drawn per iteration from the chunk multiples in [min_horizon, horizon]."""
    sampling_steps: int = 1
    """Euler steps per generated chunk, as imagination samples (`wmrl imagine`, `wmrl rank`)."""
    beta: float = 1.0
    """DiffusionNFT's guidance strength b (nft only)."""
    ref_coef: Optional[float] = None
    """Weight of the trust region to the frozen base model (nft only; default 1.0)."""
    lr: float = 3e-5
    moving_weight: float = 0.0
    """Weight of the moving pixels' PSNR / 10 dB in the reward (0: the whole frames only; see `fidelity`)."""
    moving_threshold: int = 12
    """A pixel moves at a frame where a channel of the recorded frame differs from the start frame by more than this
    (of 255)."""
    old_ema: float = 0.0
    """0: the old model is the trained model's snapshot at each iteration. In (0, 1): an EMA of it with this decay
    (DiffusionNFT's soft update), which also samples the rollouts."""
    minibatch: int = 32
    """Generated chunks per gradient step (each iteration takes one pass over all of them)."""
    holdout: float = 0.1
    """The same held-out share as `wmrl train-wm`: histories come from the training episodes only."""
    ckpt_every: int = 10
    seed: int = 0
    device: str = "cpu"
    threads: Optional[int] = None
    overwrite: bool = False
    resume: bool = False


OBJECTIVES = ("nft", "forcing")


def nft_targets(d: torch.Tensor, d_old: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DiffusionNFT's implicit positive and negative models: D+ = D_old + b (D - D_old), D- = D_old - b (D - D_old)."""
    step = beta * (d - d_old)
    return d_old + step, d_old - step


def nft_loss(d: torch.Tensor, d_old: torch.Tensor, x0: torch.Tensor, r: torch.Tensor, weight: torch.Tensor,
             beta: float) -> torch.Tensor:
    """Per-sample loss (B,): weight [r ||D+ - x0||^2 + (1 - r) ||D- - x0||^2], means over the sample's entries."""
    pos, neg = nft_targets(d, d_old, beta)
    e_pos = ((pos - x0) ** 2).flatten(1).mean(1)
    e_neg = ((neg - x0) ** 2).flatten(1).mean(1)
    return weight * (r * e_pos + (1 - r) * e_neg)


def optimality(rewards: np.ndarray, group: int) -> np.ndarray:
    """Rewards (N,) in consecutive groups -> r in [0, 1]: 0.5 + 0.5 clip(A / 2, -1, 1), A standardised within the
    group; a group whose rewards are all equal gives 0.5 everywhere (no direction)."""
    x = np.asarray(rewards, np.float64)
    if x.ndim != 1 or len(x) % group:
        raise ValueError(f"rewards: expected (N,) with N a multiple of {group}, got {x.shape}")
    g = x.reshape(-1, group)
    a = (g - g.mean(1, keepdims=True)) / (g.std(1, keepdims=True) + 1e-8)
    return (0.5 + 0.5 * np.clip(a / 2, -1, 1)).reshape(-1)


def moving_mask(real: np.ndarray, start: np.ndarray, threshold: int = 12) -> np.ndarray:
    """Pixels that move in the real future: where a channel of a real frame (..., H, W, 3) differs from its start
    frame (broadcast against it) by more than `threshold` (uint8 levels). Boolean (..., H, W)."""
    return (np.abs(real.astype(np.int16) - start.astype(np.int16)) > threshold).any(-1)


def fidelity(pred: dict[str, np.ndarray], real: dict[str, np.ndarray], start: dict[str, np.ndarray] | None = None,
             moving_weight: float = 0.0, threshold: int = 12) -> np.ndarray:
    """Rollout reward (N,): the mean over frames and cameras of PSNR / 10 dB + SSIM (1 dB weighs as 0.1 SSIM);
    frames per camera uint8 (N, L, H, W, 3). With `moving_weight` w and the start frames `start` (per camera
    (N, H, W, 3)), plus w times the PSNR / 10 dB on the pixels that move: where a channel of the real frame differs
    from the start frame by more than `threshold`, averaged over the frames and cameras that have such pixels (0 for
    a rollout in which nothing moves, the same for every candidate of its history)."""
    per_cam = [psnr(pred[c], real[c]) / 10.0 + ssim(pred[c], real[c]) for c in real]
    score = np.mean(per_cam, axis=0).mean(axis=1)
    if moving_weight:
        if start is None:
            raise ValueError("fidelity: the moving pixels' PSNR needs the start frames")
        moved = []
        for c in real:
            moved.append(psnr(pred[c], real[c], moving_mask(real[c], start[c][:, None], threshold)) / 10.0)  # NaN where a frame has no moving pixel
        moved = np.stack(moved, -1).reshape(len(score), -1)
        seen = np.isfinite(moved)
        n = seen.sum(1)
        score = score + moving_weight * np.where(n > 0, np.where(seen, moved, 0.0).sum(1) / np.maximum(n, 1), 0.0)
    return score


def denoiser_parameters(model: VideoWorldModel) -> list[torch.nn.Parameter]:
    mods = (model.noise_emb, model.ctx_noise_emb, model.pose_emb, model.frame_state_emb, model.cond, model.unet)
    return [p for m in mods if m is not None for p in m.parameters()]


@torch.no_grad()
def own_rollouts(model: VideoWorldModel, d: dict, G: int, L: int, steps: int, gen: torch.Generator,
                 mean: bool | None = False) -> tuple[list[dict], torch.Tensor]:
    """G autoregressive rollouts of L control steps from each window of `d` (`WindowSampler.sample` with L future
    frames) under the recorded actions, every chunk after the first conditioned on the model's own earlier chunks.
    `mean`: as `sample_future` (False: candidates that differ; None: as imagination samples). Returns per chunk the
    denoiser's inputs, its sample `x0` (the standardised change) and the recorded future chunk (`future`, `mask`),
    rollouts along the batch (window-major); and the generated latents (W*G, L, C, S, S)."""
    K, H = model.cfg.context, model.cfg.chunk
    rep = lambda t: t.repeat_interleave(G, 0)
    ctx, anchor, pose0, poses = rep(d["ctx"]), rep(d["anchor"]), rep(_pose0(model, d)), rep(d["poses"])
    future, mask = rep(d["future"]), rep(d["mask"])
    states = rep(d["states"]) if "states" in d else None  # frame_state: the recorded states, like the actions
    chunks, lats = [], []
    for c in range(L // H):
        p, j = poses[:, c * H : (c + 1) * H], slice(c * H, (c + 1) * H)
        st = None if states is None else states[:, c * H : (c + 1) * H + 1]
        fut = model.sample_future(ctx, anchor, pose0, p, steps=steps, generator=gen, mean=mean, states=st)
        chunks.append({"ctx": ctx, "anchor": anchor, "pose0": pose0, "poses": p, "x0": model.to_residual(fut, ctx[:, -1]),
                       "future": future[:, j], "mask": mask[:, j], **({} if st is None else {"states": st})})
        lats.append(fut)
        ctx, pose0 = torch.cat([ctx, fut], 1)[:, -K:], p[:, -1]
    return chunks, torch.cat(lats, 1)


@torch.no_grad()
def rollouts(model: VideoWorldModel, sampler: WindowSampler, W: int, G: int, L: int, steps: int,
             gen: torch.Generator, moving_weight: float = 0.0, threshold: int = 12) -> tuple[list[dict], np.ndarray]:
    """G autoregressive rollouts of L control steps from each of W real histories under the recorded actions
    (`own_rollouts`, candidates that differ). Returns the generated chunks and the rewards (W*G,), `fidelity` with
    `moving_weight` and `threshold`."""
    d = sampler.sample(W, model.cfg.context, L, gen, min_future=L, reset_prob=0.0)
    chunks, lat = own_rollouts(model, d, G, L, steps, gen)
    rep = lambda t: t.repeat_interleave(G, 0)
    z0, start_pose, poses = rep(d["ctx"][:, -1]), rep(_pose0(model, d)), rep(d["poses"])
    i, fut = d["i"], d["fut_idx"]
    images = {f"observation.images.{c}": sampler.images[c] for c in model.cfg.cameras}  # uint8, on the device
    frames0 = {k: v[i].repeat_interleave(G, 0).cpu().numpy() for k, v in images.items()}
    pts = None
    if "points" in d:  # object sources of the change mask: the recorded [hand, objects], like the actions
        q = rep(d["points"])
        pts = (q[:, 0], q[:, 1 : lat.shape[1] + 1].flatten(0, 1))
    pred = model.decode_frames(lat.flatten(0, 1), (z0, frames0), poses=(start_pose, poses[:, : lat.shape[1]].flatten(0, 1)),
                               points=pts)
    N = W * G
    pred = {k: v.reshape(N, L, *v.shape[1:]).cpu().numpy() for k, v in pred.items()}
    real = {k: v[fut].repeat_interleave(G, 0).cpu().numpy() for k, v in images.items()}
    return chunks, fidelity(pred, real, frames0, moving_weight, threshold)


def nft_step(model, old, ref, batch: dict, r: torch.Tensor, cfg: PostTrainWMConfig, gen: torch.Generator) -> tuple[torch.Tensor, dict]:
    """The loss of one minibatch of generated chunks (NFT + trust region), noise drawn from `gen`."""
    mc = model.cfg
    x0 = batch["x0"]
    B = x0.shape[0]
    sigma = torch.exp(mc.p_mean + mc.p_std * torch.randn(B, generator=gen, device=x0.device))
    x = x0 + sigma.reshape(B, 1, 1, 1) * torch.randn(x0.shape, generator=gen, device=x0.device)
    s = mc.context_noise_sample  # the context as sampling saw it: noised at the level the model is told
    ctx_sigma = torch.full((B,), s, device=x0.device)
    ctx = batch["ctx"] + s * torch.randn(batch["ctx"].shape, generator=gen, device=x0.device) if s > 0 else batch["ctx"]
    args = (x, sigma, ctx, ctx_sigma, batch["anchor"], batch["pose0"], batch["poses"], batch.get("states"))
    with torch.no_grad():
        d_old, d_ref = old.denoise(*args), ref.denoise(*args)
    d = model.denoise(*args)
    w = edm_loss_weight(sigma, mc.sigma_data)
    l_nft = nft_loss(d, d_old, x0, r, w, cfg.beta).mean()
    l_ref = (w * ((d - d_ref) ** 2).flatten(1).mean(1)).mean()
    ref_coef = 1.0 if cfg.ref_coef is None else cfg.ref_coef
    return l_nft + ref_coef * l_ref, {"nft_loss": float(l_nft.detach()), "ref_loss": float(l_ref.detach())}


def forcing_step(model: VideoWorldModel, batch: dict) -> tuple[torch.Tensor, dict]:
    """The loss of one minibatch of chunks (`own_rollouts`): the training objective (`dynamics_loss`, its noise from
    torch's global generator) on the recorded future chunk, with the rollout's own earlier chunks as context."""
    loss = model.dynamics_loss(batch["ctx"], batch["anchor"], batch["future"], batch["pose0"], batch["poses"],
                               batch["mask"], batch.get("states"))
    return loss, {"forcing_loss": float(loss.detach())}


def post_train_world_model(cfg: PostTrainWMConfig, progress: bool = True) -> dict:
    for name in ("iterations", "windows", "minibatch"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}")
    if cfg.objective not in OBJECTIVES:
        raise ValueError(f"--objective: expected one of {OBJECTIVES}, got {cfg.objective!r}")
    nft = cfg.objective == "nft"
    if nft and cfg.candidates < 2:
        raise ValueError(f"--candidates must be >= 2 (advantages are relative within a group), got {cfg.candidates}")
    if not nft and (cfg.ref_coef is not None or cfg.old_ema or cfg.moving_weight):
        raise ValueError("--objective forcing regresses on the real future: --ref-coef, --old-ema and --moving-weight "
                         "belong to nft (its real-context chunks keep one-chunk prediction trained)")
    if not 0 < cfg.min_horizon <= cfg.horizon:
        raise ValueError(f"need 0 < --min-horizon <= --horizon, got {cfg.min_horizon} and {cfg.horizon}")
    if cfg.beta <= 0 or (cfg.ref_coef or 0) < 0 or cfg.lr <= 0:
        raise ValueError(f"need --beta > 0, --ref-coef >= 0, --lr > 0; got {cfg.beta}, {cfg.ref_coef}, {cfg.lr}")
    if not 0 <= cfg.old_ema < 1 or cfg.moving_weight < 0 or not 0 <= cfg.moving_threshold < 255:
        raise ValueError(f"need 0 <= --old-ema < 1, --moving-weight >= 0, 0 <= --moving-threshold < 255; got "
                         f"{cfg.old_ema}, {cfg.moving_weight}, {cfg.moving_threshold}")
    base_ck = resolve_checkpoint(cfg.world_model)
    ref = VideoWorldModel.load(base_ck, device=cfg.device).eval()
    H = ref.cfg.chunk
    if nft and ref.cfg.deterministic:
        raise ValueError(f"{cfg.world_model} is the deterministic variant: post-training ranks a diffusion model's "
                         "own samples, and a deterministic model has one per history")
    if cfg.horizon % H or cfg.min_horizon % H:
        raise ValueError(f"--horizon and --min-horizon must be multiples of the model's chunk ({H}); got "
                         f"{cfg.horizon} and {cfg.min_horizon}")
    data = cfg.data or world_model_data(cfg.world_model)
    run = start_run(cfg)
    _, train, _ = load_split(data, cfg.holdout, cfg.seed)
    ck, _ = resume_checkpoint(run / "checkpoints") if cfg.resume else (None, 0)
    model = VideoWorldModel.load(ck or base_ck, expect=ref.cfg, device=cfg.device)
    for p in ref.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(denoiser_parameters(model), cfg.lr, weight_decay=0.0)
    start = load_train_state(ck, {"denoiser": opt}, cfg.device)["step"] if ck is not None else 0
    ema = None  # DiffusionNFT's soft-updated old model (resumed from the checkpoint, which keeps it)
    if cfg.old_ema:
        ema = (VideoWorldModel.load(ck / "old", expect=ref.cfg, device=cfg.device) if ck is not None
               else copy.deepcopy(model)).eval()
        for p in ema.parameters():
            p.requires_grad_(False)
    sampler = WindowSampler(train, cfg.device, model.cfg, lat=encode_all(model, train))
    lengths = np.arange(cfg.min_horizon, cfg.horizon + 1, H)
    tracker = Tracker(run)
    t0 = time.time()
    log: dict = {}

    def save(path: Path, step: int) -> None:
        model.save(path)
        save_train_state(path, step, {"denoiser": opt})
        if ema is not None:
            ema.save(path / "old")

    for it in tqdm(range(start, cfg.iterations), initial=start, total=cfg.iterations, desc="post-train-wm",
                   disable=not progress):
        gen = torch.Generator(device=cfg.device).manual_seed(cfg.seed * 1_000_003 + it)  # resumes exactly
        L = int(lengths[torch.randint(len(lengths), (1,), generator=gen, device=cfg.device).item()])
        model.eval()
        if nft:
            old = ema if ema is not None else copy.deepcopy(model).eval()  # the model that generates these samples
            chunks, reward = rollouts(old, sampler, cfg.windows, cfg.candidates, L, cfg.sampling_steps, gen,
                                      cfg.moving_weight, cfg.moving_threshold)
            r = torch.as_tensor(optimality(reward, cfg.candidates), dtype=torch.float32, device=cfg.device)
            stats = {"reward_mean": float(reward.mean()),
                     "reward_group_std": float(reward.reshape(-1, cfg.candidates).std(1).mean())}
        else:  # one rollout per history, as imagination samples; every chunk's target is the recorded one
            d = sampler.sample(cfg.windows, model.cfg.context, L, gen, min_future=L, reset_prob=0.0)
            chunks, _ = own_rollouts(model, d, 1, L, cfg.sampling_steps, gen, mean=None)
            stats = {}
            torch.manual_seed(cfg.seed * 1_000_003 + it)  # dynamics_loss draws from the global generator
        batch = {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
        if nft:
            rr = r.repeat(len(chunks))  # every chunk of a rollout carries its rollout's optimality
        perm = torch.randperm(len(batch["x0"]), generator=gen, device=cfg.device)
        model.train()
        losses = []
        for j in range(0, len(perm), cfg.minibatch):
            ids = perm[j : j + cfg.minibatch]
            mb = {k: v[ids] for k, v in batch.items()}
            loss, info = nft_step(model, old, ref, mb, rr[ids], cfg, gen) if nft else forcing_step(model, mb)
            if not torch.isfinite(loss):
                raise RuntimeError(f"post-training loss became non-finite at iteration {it + 1}; the last good "
                                   f"checkpoint is in {run / 'checkpoints' / 'last'}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(denoiser_parameters(model), 1.0)
            opt.step()
            losses.append({"loss": loss.item(), **info})
        if ema is not None:
            with torch.no_grad():
                for po, p in zip(denoiser_parameters(ema), denoiser_parameters(model)):
                    po.lerp_(p, 1.0 - cfg.old_ema)
        log = {"iteration": it + 1, "horizon": L, **stats,
               **{k: float(np.mean([x[k] for x in losses])) for k in losses[0]}, "seconds": time.time() - t0}
        tracker.log(log, step=it + 1)
        if (it + 1) % cfg.ckpt_every == 0 or it + 1 == cfg.iterations:
            commit_checkpoint(run / "checkpoints", it + 1, lambda p, s=it + 1: save(p, s))
    tracker.close()
    return {"run_dir": str(run), "iterations": cfg.iterations, "post_train_minutes": (time.time() - t0) / 60, **log}
