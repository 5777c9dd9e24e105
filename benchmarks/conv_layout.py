"""Channels-last (pixel-major) inputs for the 64x64 convolutions of the video world model, on this CPU.

The autoencoder and the change mask convolve full-resolution frames; oneDNN has faster kernels for pixel-major
tensors (`networks.channels_last`). This times one training step (forward, backward, Adam) of each as the demo's
world model trains them, with the layout on and off (`networks.CHANNELS_LAST`), alternating the two on the same
modules and inputs so that both see the same machine load: the autoencoder on the AE phase's batch (32 frames per
camera, 2 cameras), the change mask of the demo's kind (three sources, reading the pose, 3 object sources,
correcting pixels) on `fit_change_mask`'s batch of 32, and the pose layer (`networks.PoseLayer`) rendering 64 frames
and in a training step. Medians over `reps` steps, at 1 thread and at all threads. Beside the layouts, in the same
run: the change mask's step with a pose layer frozen (no backward pass through it) against backpropagated, and with
the frozen layer's frame drawn beforehand (`fit_change_mask` draws each pair's frame once) against drawn at the step;
the mask's step (layer drawn before) and the layer's training step with their forward passes in float32 against bf16
autocast (`TrainWMConfig.change_bf16`; `bf16_native`: whether this CPU computes bf16 natively, else it is emulated);
and at all threads, over a rollout's frames (100 windows x 16 frames, `pass_reps` times): encoding frames, decoding
latents and the change mask (with the layer) in one pass against passes of `model.FRAMES_PER_PASS` frames.
The outputs of the two layouts are the same (`tests/world_models/test_video_world_model.py`). The plain baseline
is what a caller with contiguous (N, C, H, W) inputs paid: the autoencoder's training frames were pixel-major already
(gathered from (N, H, W, 3) arrays and permuted), so its training phase does not change; decoding latents and the
change mask do. The 16x16 U-Net and
the policy's strided encoder gain nothing here (within +-10% in ad-hoc timings, not timed by this benchmark) and are left alone.
"""

from __future__ import annotations

import time

from wmrl.benchutil import finish


def _set_layout(flag: bool) -> None:
    from world_models.video import networks

    networks.CHANNELS_LAST = flag


def _steps(step, reps: int, toggle=_set_layout, names=("plain", "channels_last")) -> dict[str, float]:
    """Median seconds per call of `step()` with `toggle(False)` and `toggle(True)`, alternating, after 2 warm-ups
    each; `toggle(True)` is left set (the default layout)."""
    import numpy as np

    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * reps + 4):
        flag = bool(i % 2)
        toggle(flag)
        t = time.perf_counter()
        step()
        if i >= 4:
            times[flag].append(time.perf_counter() - t)
    toggle(True)
    off, on = float(np.median(times[False])), float(np.median(times[True]))
    return {f"seconds_{names[0]}": off, f"seconds_{names[1]}": on, "speedup": off / on}


def main(quick: bool = False, reps: int = 20, pass_reps: int = 3) -> dict:
    import torch

    from types import SimpleNamespace

    from world_models.video.change_mask import autocast, frame_log_mse, native_bf16
    from world_models.video.networks import ChangeMask, FrameAutoencoder
    from world_models.video.train import ae_loss

    from world_models.video import model as model_module

    reps, pass_reps = (2, 1) if quick else (reps, pass_reps)
    torch.manual_seed(0)
    ae = FrameAutoencoder(latent_channels=8, width=16)  # the small model's
    frames = torch.rand(64, 3, 64, 64) * 2 - 1
    ae_opt = torch.optim.Adam(ae.parameters(), 3e-4)

    holder = SimpleNamespace(ae=ae, cfg=SimpleNamespace(cameras=("front", "wrist")))  # what `ae_loss` reads of a model

    def ae_step():
        loss = ae_loss(holder, frames, 3.0)
        ae_opt.zero_grad(set_to_none=True)
        loss.backward()
        ae_opt.step()

    P, k, B = 5, 3, 32
    mask = ChangeMask(refine=True, warp_pose_dim=P, keep_unwarped=True, read_pose=True, n_objects=k)
    pred, f0, real = (torch.rand(B, 3, 64, 64) * 2 - 1 for _ in range(3))
    pose, pose0 = torch.rand(B, P), torch.rand(B, P)
    objects = torch.cat([torch.rand(B, k, 4) * 0.4 - 0.2, torch.full((B, k, 1), 0.2)], -1)
    mask_opt = torch.optim.Adam(mask.parameters(), 2e-3)

    def mask_step():
        x = mask(pred, f0, pose, pose0, objects)
        loss = frame_log_mse(x, real) + frame_log_mse(mask.warp_frame(f0, pose, pose0), real)  # `fit_change_mask`'s
        mask_opt.zero_grad(set_to_none=True)
        loss.backward()
        mask_opt.step()

    # the pose layer (`networks.PoseLayer`): rendering a rollout's 64 frames, and a step of its training
    # (`fit_pose_layers`' batch of 32)
    layered = ChangeMask(refine=True, warp_pose_dim=P, keep_unwarped=True, read_pose=True, n_objects=k, coords=True,
                         pose_layer=True)
    hands64, f64 = torch.rand(64, 6) * 2 - 1, torch.rand(64, 3, 64, 64) * 2 - 1
    hands = torch.rand(B, 6) * 2 - 1
    layer_opt = torch.optim.Adam(layered.layer.parameters(), 1e-3)

    def layer_render():
        with torch.no_grad():
            layered.layer(hands64, f64)

    def layer_step():
        loss = ((layered.layer(hands, f0) - real) ** 2).mean()
        layer_opt.zero_grad(set_to_none=True)
        loss.backward()
        layer_opt.step()

    # the change mask's fit with a pose layer: the layer trained apart, then frozen (no backward pass through it)
    # against left in the graph and only kept out of the optimiser (`fit_change_mask` before 2026-12-05)
    layered_opt = torch.optim.Adam([q for n, q in layered.named_parameters() if not n.startswith("layer.")], 2e-3)

    def freeze(flag: bool) -> None:
        for q in layered.layer.parameters():
            q.requires_grad_(not flag)

    def layered_mask_step():
        x = layered(pred, f0, pose, pose0, objects, hands)
        loss = frame_log_mse(x, real) + frame_log_mse(layered.warp_frame(f0, pose, pose0), real)
        layered_opt.zero_grad(set_to_none=True)
        loss.backward()
        layered_opt.step()

    def layered_mask_step_drawn():  # the same step, the frozen layer's frame for this batch drawn beforehand
        x = layered(pred, f0, pose, pose0, objects, rendered=drawn)
        loss = frame_log_mse(x, real) + frame_log_mse(layered.warp_frame(f0, pose, pose0), real)
        layered_opt.zero_grad(set_to_none=True)
        loss.backward()
        layered_opt.step()

    with torch.no_grad():
        drawn = layered.layer(hands, f0)
    pick = {False: layered_mask_step, True: layered_mask_step_drawn}
    chosen = {"step": layered_mask_step}

    def draw_once(flag: bool) -> None:
        freeze(True)
        chosen["step"] = pick[flag]

    # the fits' forward passes in bf16 (`change_mask.autocast`, `TrainWMConfig.change_bf16`): the mask's step as the
    # fit runs it (the frozen layer's frame drawn before) and the layer's training step
    amp = {"on": False}
    cpu = torch.device("cpu")

    def bf16(flag: bool, frozen: bool = True) -> None:  # the mask's fit freezes the layer; the layer's own does not
        freeze(frozen)
        amp["on"] = flag

    def mask_step_amp():
        with autocast(cpu, amp["on"]):
            x = layered(pred, f0, pose, pose0, objects, rendered=drawn).float()
        loss = frame_log_mse(x, real) + frame_log_mse(layered.warp_frame(f0, pose, pose0), real)
        layered_opt.zero_grad(set_to_none=True)
        loss.backward()
        layered_opt.step()

    def layer_step_amp():
        with autocast(cpu, amp["on"]):
            x = layered.layer(hands, f0).float()
        loss = ((x - real) ** 2).mean()
        layer_opt.zero_grad(set_to_none=True)
        loss.backward()
        layer_opt.step()

    # a rollout's frames (100 windows x 16) through the autoencoder and the change mask, in one pass or in passes
    N = 64 if quick else 1600
    roll_frames, roll_latents = torch.rand(N, 3, 64, 64) * 2 - 1, torch.randn(N, 8, 16, 16)
    roll = dict(pred=torch.rand(N, 3, 64, 64) * 2 - 1, frame0=torch.rand(N, 3, 64, 64) * 2 - 1, pose=torch.rand(N, P),
                pose0=torch.rand(N, P), objects=torch.cat([torch.rand(N, k, 4) * 0.4 - 0.2, torch.full((N, k, 1), 0.2)], -1),
                hands=torch.rand(N, 6) * 2 - 1)
    per_pass = model_module.FRAMES_PER_PASS

    def passes(flag: bool) -> None:
        model_module.FRAMES_PER_PASS = per_pass if flag else 10**9

    def rollout_pass(f):
        def run():
            with torch.no_grad():
                model_module.in_passes(f, torch.arange(N))
        return run

    rollout_steps = {"encode": rollout_pass(lambda i: ae.encode(roll_frames[i])),
                     "decode": rollout_pass(lambda i: ae.decode(roll_latents[i])),
                     "change_mask_pose_layer": rollout_pass(lambda i: layered(**{n: t[i] for n, t in roll.items()}))}

    threads0 = torch.get_num_threads()
    out: dict = {"reps": reps, "threads": {}}
    for threads in sorted({1, threads0}):
        torch.set_num_threads(threads)
        out["threads"][str(threads)] = {"autoencoder_step": _steps(ae_step, reps), "change_mask_step": _steps(mask_step, reps),
                                        "pose_layer_render_64": _steps(layer_render, reps),
                                        "pose_layer_step": _steps(layer_step, reps)}
        _set_layout(True)
        out["threads"][str(threads)]["change_mask_step_pose_layer"] = _steps(layered_mask_step, reps, freeze,
                                                                             ("backpropagated", "frozen"))
        out["threads"][str(threads)]["change_mask_step_pose_layer_drawn"] = _steps(lambda: chosen["step"](), reps, draw_once,
                                                                                   ("drawn_at_step", "drawn_before"))
        out["threads"][str(threads)]["change_mask_step_bf16"] = _steps(mask_step_amp, reps, bf16, ("float32", "bf16"))
        out["threads"][str(threads)]["pose_layer_step_bf16"] = _steps(layer_step_amp, reps, lambda f: bf16(f, frozen=False),
                                                                      ("float32", "bf16"))
        freeze(False)
    torch.set_num_threads(threads0)
    out["rollout_frames"], out["frames_per_pass"] = N, per_pass
    out["rollout_passes"] = {name: _steps(f, pass_reps, passes, ("one_pass", "passes")) for name, f in rollout_steps.items()}
    top = out["threads"][str(threads0)]
    out["ae_speedup"], out["change_mask_speedup"] = top["autoencoder_step"]["speedup"], top["change_mask_step"]["speedup"]
    out["pose_layer_render_speedup"] = top["pose_layer_render_64"]["speedup"]
    out["pose_layer_step_speedup"] = top["pose_layer_step"]["speedup"]
    out["frozen_layer_mask_step_speedup"] = top["change_mask_step_pose_layer"]["speedup"]
    out["drawn_layer_mask_step_speedup"] = top["change_mask_step_pose_layer_drawn"]["speedup"]
    out["bf16_native"] = native_bf16("cpu")
    out["bf16_mask_step_speedup"] = top["change_mask_step_bf16"]["speedup"]
    out["bf16_layer_step_speedup"] = top["pose_layer_step_bf16"]["speedup"]
    out.update({f"passes_{name}_speedup": v["speedup"] for name, v in out["rollout_passes"].items()})
    return finish("conv-layout", out, quick, command=None if quick else "wmrl bench conv-layout --json")


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
