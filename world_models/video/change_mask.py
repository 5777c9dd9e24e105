"""Fitting the world model's change mask (`networks.ChangeMask`) on its own rollouts.

A diagnostic on held-out static windows (README, world model) found that the small model's loss against copy-last
sits outside the arm and the cubes: decoded latent changes spread small errors over the whole frame, nine times
copy-last's on the fixed front camera's background. The mask is a per-pixel blend of each decoded frame with the
rollout's start frame, fitted after every other phase with the model frozen: open-loop rollouts (1 Euler step, as
imagination samples) from real context on training windows, every frame of the horizon paired with its real
frame. The loss is the mean over frames of log(MSE): minus the frames' mean PSNR up to scale, the measure the
benchmark reads. A plain MSE lets the few large-error frames of motion windows outweigh the static ones, whose
small errors cost as many decibels (on the seed-3 model's training windows: the wrist's static frames 0.6 dB
better with the refining mask). With a warp (`change_warp`) the start frame is first carried to each frame's
commanded pose by an affine warp, fitted on the same loss plus its own (the warped start frame against the real
frame, so that the warp learns even where the mask ignores it). With `focus` > 0 the loss adds, times focus, the
frames' log MSE inside windows around where the recorded objects are and were in each camera (`focus_maps`): a cube
covers ~1% of a frame, so the whole frame's loss barely sees the cube pixels that the masked benchmark, and a policy,
read (on held-out motion windows of the CPU model with object sources, the front camera's still cubes came out 4.8 dB
worse than copy-last). The windows come from the recorded state, so they shape training only. Nothing else of the
model changes."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch

from world_models.video.camera import object_moves
from world_models.video.evaluate import fixed_windows, recorded_points, rollout
from world_models.video.model import FRAMES_PER_PASS, VideoWorldModel, in_passes, pixels

HORIZON = 16
STILL_SHARE = 0.25  # the pose layer's training pairs of a frame with itself
LOG_EPS = 1e-5  # a per-frame MSE floor in the loss (a PSNR of 56 dB on [-1, 1] pixels)


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast of a fit's forward pass (weights, optimiser state and the loss stay in float32), or nothing.
    The fits' steps are convolutions on 64x64 frames, bound by arithmetic: where the hardware computes bf16 natively
    a change-mask step takes ~0.73x the time (`wmrl bench conv-layout`); elsewhere bf16 is emulated and slower."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()


def native_bf16(device: str | torch.device) -> bool:
    """Whether `device` computes bf16 natively: a CUDA device that supports it, a CPU with AVX-512 BF16 or AMX."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def frame_log_mse(x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Mean over frames (N, 3, H, W) of log(per-frame MSE + LOG_EPS): minus their mean PSNR, up to scale and shift."""
    return torch.log(((x - real) ** 2).mean((1, 2, 3)) + LOG_EPS).mean()


def focus_maps(real_moves: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """(N, k, 5) recorded object moves in one camera (`camera.object_moves` of the recorded points) -> (N, H, W) in
    [0, 1]: the largest of Gaussian windows around each object's centre now and where it was at the start (centre
    minus shift: the table it uncovered), each as wide as that object's window."""
    ys = (torch.arange(H, dtype=real_moves.dtype) + 0.5) / H * 2 - 1
    xs = (torch.arange(W, dtype=real_moves.dtype) + 0.5) / W * 2 - 1
    c, w = real_moves[..., 2:4, None, None], real_moves[..., 4, None, None]
    maps = []
    for centre in (c, c - real_moves[..., 0:2, None, None]):
        d2 = (xs - centre[..., 0, :, :]) ** 2 + (ys[:, None] - centre[..., 1, :, :]) ** 2
        maps.append(torch.exp(-d2 / (2 * w**2)))
    return torch.stack(maps, 1).flatten(1, 2).amax(1)


def focus_log_mse(x: torch.Tensor, real: torch.Tensor, focus: torch.Tensor) -> torch.Tensor:
    """Mean over frames (N, 3, H, W) of log(MSE weighted by `focus` (N, H, W) + LOG_EPS): `frame_log_mse` inside the
    objects' windows."""
    se = ((x - real) ** 2).mean(1)
    return torch.log((se * focus).sum((1, 2)) / focus.sum((1, 2)).clamp(min=1e-6) + LOG_EPS).mean()


def paste_objects(model: VideoWorldModel, frames: dict, frame0: dict, points0, points) -> dict:
    """A rigid object layer over decoded frames: in each camera, each object's patch of the start frame pasted,
    translated, where `points` (N, 1 + k, 3) put it (`camera.object_moves` from `points0`, (1 + k, 3) or (N, 1 + k, 3)):
    the change mask's own object sources, kept wherever the object's window reaches one standard deviation instead of
    blended. `frames` {camera key: uint8 (N, H, W, 3)}, `frame0` the start frame(s) {camera key: uint8 (H, W, 3) or
    (N, H, W, 3)} -> {camera key: uint8 (N, H, W, 3)}. A diagnostic of how much of a cube the blend leaves unused."""
    out = {}
    for key, f in frames.items():
        cam = key.split(".")[-1]
        q = torch.as_tensor(np.asarray(points), dtype=torch.float32)
        q0 = torch.as_tensor(np.asarray(points0), dtype=torch.float32).expand(len(q), -1, -1)
        moves = object_moves(q0, q, model.cfg.camera_geometry[cam], model.cfg.object_radius)
        f0 = torch.as_tensor(np.asarray(frame0[key])).float()
        f0 = f0.permute(*range(f0.dim() - 3), -1, -3, -2).expand(len(q), -1, -1, -1).contiguous()
        moved, win = model.change_mask[cam].object_sources(f0, moves)
        x = torch.as_tensor(np.asarray(f)).permute(0, 3, 1, 2).float()
        for j in range(moved.shape[1]):
            a = (win[:, j : j + 1] > np.exp(-0.5)).float()
            x = x * (1 - a) + moved[:, j] * a
        out[key] = x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return out


def _fit_windows(model: VideoWorldModel, replay, windows: int, seed: int) -> tuple[int, list[dict]]:
    """The horizon and the training windows (`evaluate.fixed_windows`, with their motion flags) the mask fits on."""
    longest = max(T for _, T in replay.episodes.values())
    horizon = min(HORIZON, longest - 1)
    return horizon, fixed_windows(replay, windows, horizon, model.cfg.context, seed=seed, ee_index=model.cfg.ee_index,
                                  object_xyz=model.cfg.object_xyz)


def mask_pairs(model: VideoWorldModel, replay, windows: int, seed: int = 0) -> dict:
    """Per camera key: (pred, frame0, real, pose, pose0, moves, real_moves, hands): float pixels (N * horizon, 3, H, W)
    of the model's own rollouts (unmasked decode) from `windows` windows of `replay`, each frame's start frame and real
    frame, the normalised commanded poses (N * horizon, pose_dim) of each frame and of its start frame, with object
    sources (`change_objects`) each object's move in that camera (N * horizon, k, 5), from the rollout's own state
    channel (`camera.object_moves`), where the cameras' geometry and the recorded object state are known the same moves
    of the recorded points (`focus_maps` reads them), and for a camera with a pose layer the rollout's hand at each
    frame and at its start (N * horizon, 6; `VideoWorldModel.norm_hands`); else None."""
    horizon, wins = _fit_windows(model, replay, windows, seed)
    starts = [(w["episode"], w["start"]) for w in wins]
    was = bool(model.change_mask_fitted)
    model.change_mask_fitted.fill_(False)  # the mask learns on the plain decode
    try:
        r = rollout(model, replay, starts, horizon, steps=1, seed=seed)
    finally:
        model.change_mask_fitted.fill_(was)
    with torch.no_grad():
        pose = model._norm_pose(torch.as_tensor(r["pose"], device=model.device)).reshape(-1, model.cfg.pose_dim).cpu()
        pose0 = model._norm_pose(torch.as_tensor(r["pose0"], device=model.device)).repeat_interleave(horizon, 0).cpu()
    out = {}
    for key, pred in r["pred"].items():
        f0 = np.stack([replay.data[key][replay.episodes[e][0] + t0] for e, t0 in starts])
        moves = real_moves = None
        geometry = model.cfg.camera_geometry.get(key.split(".")[-1])
        if geometry is not None and "points0" in r:
            q0 = torch.as_tensor(r["points0"]).repeat_interleave(horizon, 0)  # the recorded start frame's
            if model.cfg.change_objects:
                q = torch.as_tensor(r["points"]).reshape(-1, *r["points"].shape[2:])
                moves = object_moves(q0, q, geometry, model.cfg.object_radius)
            q = recorded_points(model, {"observation.state": r["real_state"], "observation.environment_state": r["real_env"]})
            real_moves = object_moves(q0, q.reshape(-1, *q.shape[2:]), geometry, model.cfg.object_radius)
        hands = None
        if key.split(".")[-1] in model.cfg.layer_cameras:
            q = torch.as_tensor(r["points"][:, :, 0]).reshape(-1, 3)
            with torch.no_grad():
                hands = model.norm_hands(q.to(model.device), q0[:, 0].to(model.device)).cpu()
        out[key] = (pixels(pred), pixels(np.repeat(f0[:, None], horizon, 1)), pixels(r["real"][key]), pose, pose0, moves,
                    real_moves, hands)
    return out


def fit_pose_layers(model: VideoWorldModel, replay, steps: int = 1500, batch: int = 32, lr: float = 1e-3,
                    seed: int = 0, bf16: bool = False) -> dict:
    """Train the pose layer of every camera that has one (`VideoWorldModel.layer_cameras`) on real frames of `replay`:
    a start frame, a frame 1-16 steps later in the same episode (the same frame for a quarter of the pairs) and the
    recorded hand at both, the layer's frame against the real one (MSE). Only the layers change. Returns per camera the mean squared error (pixels in [-1, 1])
    of copy-last and of the layer over the last tenth of the steps' batches."""
    cams = model.cfg.layer_cameras
    if not cams or steps <= 0:
        return {}
    gen = torch.Generator().manual_seed(seed)
    eps = [(a, T) for a, T in replay.episodes.values() if T >= 2]
    if not eps:
        raise ValueError("fit_pose_layers: no episode of 2 frames or more to train the pose layer on")
    first, length = (torch.tensor(v) for v in zip(*eps))
    ee = torch.as_tensor(np.asarray(replay.data["observation.state"][: replay.high_water])[:, list(model.cfg.ee_index)],
                         dtype=torch.float32)
    info = {}
    for cam in cams:
        net = model.change_mask[cam].layer
        frames = torch.as_tensor(np.asarray(replay.data[f"observation.images.{cam}"][: replay.high_water]))
        dev = next(net.parameters()).device
        opt = torch.optim.Adam(net.parameters(), lr)
        net.train()
        tail = {"copy": [], "layer": []}
        for step in range(steps):
            e = torch.randint(len(eps), (batch,), generator=gen)
            t0 = (torch.rand(batch, generator=gen) * (length[e] - 1)).long()
            h = torch.minimum(torch.randint(1, HORIZON + 1, (batch,), generator=gen), length[e] - 1 - t0)
            # a quarter of the pairs are a frame with itself: where the hand has not moved the layer changes nothing
            # (static windows are few in the data, and the start frame is exact there)
            h = torch.where(torch.rand(batch, generator=gen) < STILL_SHARE, 0, h)
            i0, i = first[e] + t0, first[e] + t0 + h
            f0, real = pixels(frames[i0]).to(dev), pixels(frames[i]).to(dev)
            with autocast(dev, bf16):
                x = net(model.norm_hands(ee[i].to(dev), ee[i0].to(dev)), f0)
            loss = ((x.float() - real) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step >= steps - max(1, steps // 10):
                tail["layer"].append(float(loss.detach()))
                tail["copy"].append(float(((f0 - real) ** 2).mean()))
        net.eval()
        for k, v in tail.items():
            info[f"pose_layer_mse_{k}_{cam}"] = float(np.mean(v))
    return info


def fit_change_mask(model: VideoWorldModel, replay, windows: int = 200, steps: int = 800, batch: int = 32,
                    lr: float = 2e-3, seed: int = 0, focus: float = 0.0, static_weight: float = 1.0,
                    bf16: bool = False) -> dict:
    """Fit every camera's mask on `windows` training windows' rollouts for `steps` Adam steps; mark it fitted.
    `focus`: the weight of the objects' windows' log MSE in the loss (see the module; needs the recorded object state
    and the cameras' geometry). `static_weight`: how much more often a frame of a static window (`fixed_windows`'
    flag: nothing moves over 2 cm) is drawn into a batch than a motion window's; static windows are ~5% of the
    demo's training windows, so at 1 the mask sees few frames where the start frame is right everywhere. Returns per
    camera the mean squared error (pixels in [-1, 1]) on the pairs of the plain decode, of copy-last and of the masked decode."""
    if model.change_mask is None:
        raise ValueError("this world model has no change mask (config change_mask=False)")
    if not static_weight > 0:  # NaN fails too
        raise ValueError(f"static_weight must be > 0, got {static_weight}")
    pairs = mask_pairs(model, replay, windows, seed)
    horizon, wins = _fit_windows(model, replay, windows, seed)
    static = torch.tensor([not w["motion"] for w in wins]).repeat_interleave(horizon)
    draw = torch.where(static, float(static_weight), 1.0)
    assert all(len(p[0]) == len(static) for p in pairs.values()), "the pairs are the windows' frames, window-major"
    if focus and any(p[6] is None for p in pairs.values()):
        raise ValueError("focus: the objects' windows need the recorded object state (a state channel) and the cameras' "
                         "geometry (a simulator task that gives it); pass focus 0")
    gen = torch.Generator().manual_seed(seed)
    info = {}
    for key, (pred, f0, real, pose, pose0, moves, real_moves, hands) in pairs.items():
        net = model.change_mask[key.split(".")[-1]]
        fmap = focus_maps(real_moves, *pred.shape[-2:]) if focus else None
        ins = {k: v for k, v in dict(pred=pred, frame0=f0, pose=pose, pose0=pose0, objects=moves, hands=hands).items()
               if v is not None}
        dev = next(net.parameters()).device
        if net.layer is not None and "hands" in ins:
            # the pose layer renders the recorded hand (`fit_pose_layers`): it stays as trained while the mask learns
            # how far to trust it under the channel's predicted hand. Frozen, it draws the same frame for a pair at
            # every step, so each pair's frame is drawn once here (no forward or backward pass through it in the loop)
            hands = ins.pop("hands")
            with torch.no_grad():
                ins["rendered"] = in_passes(lambda j: net.layer(hands[j].to(dev), f0[j].to(dev)).cpu(), torch.arange(len(f0)))
        net.train()
        opt = torch.optim.Adam([q for n, q in net.named_parameters() if not n.startswith("layer.")], lr)
        for _ in range(steps):
            i = (torch.randint(len(pred), (batch,), generator=gen) if static_weight == 1
                 else torch.multinomial(draw, batch, replacement=True, generator=gen))
            args = {k: t[i].to(dev) for k, t in ins.items()}
            with autocast(dev, bf16):
                x = net(**args).float()
            loss = frame_log_mse(x, real[i].to(dev))
            if focus:
                loss = loss + focus * focus_log_mse(x, real[i].to(dev), fmap[i].to(dev))
            if net.warp is not None:  # the warp on its own carries the start frame as close to the real one as it can
                warped = net.warp_frame(args["frame0"], args["pose"], args["pose0"])
                loss = loss + frame_log_mse(warped, real[i].to(dev))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            chunks = [dict(zip(ins, ts)) for ts in zip(*(t.split(FRAMES_PER_PASS) for t in ins.values()))]
            masked = torch.cat([net(**{k: t.to(dev) for k, t in c.items()}).cpu() for c in chunks])
            if net.warp is not None:
                warped = torch.cat([net.warp_frame(c["frame0"].to(dev), c["pose"].to(dev), c["pose0"].to(dev)).cpu()
                                    for c in chunks])
        cam = key.split(".")[-1]
        info[f"change_mask_mse_plain_{cam}"] = float(((pred - real) ** 2).mean())
        info[f"change_mask_mse_copy_{cam}"] = float(((f0 - real) ** 2).mean())
        info[f"change_mask_mse_masked_{cam}"] = float(((masked - real) ** 2).mean())
        if net.warp is not None:
            info[f"change_mask_mse_warped_copy_{cam}"] = float(((warped - real) ** 2).mean())
    info["change_mask_static_share"] = float(static.float().mean())
    model.change_mask_fitted.fill_(True)
    return info
