"""The pose layer's and the change mask's fits in float32 and under bf16 autocast, on a finished run's world model.

`wmrl bench mask-fit-precision --json --options run=runs/demo52` refits both (`change_mask.fit_pose_layers`,
`fit_change_mask`) on the run's own data and steps from the same fresh start the run's training began them at (the
run's seed; the run's own masked gain is reported beside them as `run_masked_psnr_gain_h16`, from the demo's
world-model evaluation when the run has one), once with float32 forward passes and once with bf16 autocast
(`TrainWMConfig.change_bf16`), and times each fit. Both models roll out from the same held-out windows
(`fixed_windows`, seed 0, 1 Euler step as imagination samples). Per window: PSNR gain over copy-last at h16, whole
frame and masked to the arm and cubes; bf16's minus float32's with a bootstrap 95% interval over windows and over
whole held-out episodes. The checks, in the same run: the refit in the run's own precision repeats the run's fit
(`*_max_weight_diff_to_run` 0: the same start, data and steps), and the float32 model against itself with other
sampling noise (its difference must sit near 0). The layer trains for the run's steps in both; with `layer_steps_b`
also a float32 refit with that many layer steps, against float32 at the run's. `task`: the run's task (the masked
PSNR renders its segmentation).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish, tiny_world_model


def _refit(model, cfg: dict, train, calib, layer_steps: int, bf16: bool) -> dict:
    """Reset the change mask (and its pose layer) to the run's initial weights, then fit both; seconds of each fit."""
    import torch

    from world_models.video.change_mask import fit_change_mask, fit_pose_layers
    from world_models.video.model import VideoWorldModel

    torch.manual_seed(cfg["seed"])  # the run built its model, the mask's weights among them, after this seed
    model.change_mask.load_state_dict(VideoWorldModel(model.cfg).change_mask.state_dict())
    model.change_mask_fitted.fill_(False)
    t = time.perf_counter()
    fit_pose_layers(model, train, layer_steps, seed=cfg["seed"], bf16=bf16)
    layer_s = time.perf_counter() - t
    t = time.perf_counter()
    fit_change_mask(model, calib, cfg["change_mask_windows"], cfg["change_mask_steps"], seed=cfg["seed"],
                    focus=cfg.get("change_mask_focus", 0.0), static_weight=cfg.get("change_mask_static_weight", 1.0),
                    bf16=bf16)
    return {"layer_seconds": layer_s, "mask_seconds": time.perf_counter() - t}


def main(quick: bool = False, run: str = "runs/demo", task: str = "push-red", windows: int = 200,
         layer_steps_b: int = 0) -> dict:
    import json

    import yaml

    from wmrl.core.checkpoint import resolve_checkpoint
    from wmrl.eval.world_model import window_fidelity
    from world_models.video.change_mask import native_bf16
    from world_models.video.evaluate import paired_difference as paired
    from world_models.video.model import VideoWorldModel
    from world_models.video.train import load_split, recorded_recipe

    if quick:  # a tiny model on a tiny dataset: a smoke test of the pipeline, not a result
        import tempfile

        wm = tiny_world_model(Path(tempfile.mkdtemp(prefix="wmrl-bench-precision-"))) / "model"
        windows, layer_steps_b, horizon = 6, layer_steps_b or 2, 4  # the tiny data's held-out episode is short
    else:
        wm, horizon = Path(run) / "world_model", 16
        if not (wm / "config.yaml").exists():
            raise ValueError(f"run={run}: no world_model/config.yaml there (a `wmrl demo` run folder is expected)")
    cfg = yaml.safe_load((wm / "config.yaml").read_text())
    if not cfg.get("change_mask_steps"):
        raise ValueError(f"{wm}: its world model has no change mask to refit (change_mask_steps 0)")
    layer_steps = cfg.get("change_layer_steps") or 2 * cfg["change_mask_steps"]
    extra = tuple(Path(p) for p in cfg.get("extra_data") or ())
    _, train, _ = load_split(Path(cfg["data"]), cfg["holdout"], cfg["seed"], extra,  # as the run's training split it
                             mirror=recorded_recipe(cfg)["mirror"])
    _, _, held = load_split(Path(cfg["data"]), cfg["holdout"], keep=("qpos",))  # as the demo's evaluation does
    calib = train if not cfg.get("calibration_data") else load_split(Path(cfg["calibration_data"]), 0.0, cfg["seed"])[1]
    variants = {"float32": (layer_steps, False), "bf16": (layer_steps, True)}
    if layer_steps_b:
        variants["float32_layer_b"] = (layer_steps_b, False)
    out: dict = {"run": str(run if not quick else "tiny"), "n_windows": windows, "horizon": horizon, "layer_steps": layer_steps,
                 "mask_steps": cfg["change_mask_steps"], "bf16_native": native_bf16("cpu")}
    fid = {}
    for name, (steps, bf16) in variants.items():
        model = VideoWorldModel.load(resolve_checkpoint(wm), device="cpu").eval()
        fitted = {k: v.clone() for k, v in model.change_mask.state_dict().items()}
        out[f"{name}_fit"] = _refit(model, cfg, train, calib, steps, bf16)
        # 0 for the variant the run's own fit used: the refit starts where the run's did and repeats it exactly
        out[f"{name}_max_weight_diff_to_run"] = max(float((v - fitted[k]).abs().max())
                                                    for k, v in model.change_mask.state_dict().items())
        model.eval()
        f = window_fidelity(model, held, task, windows, horizon, seed=0, steps=1, controllability=False)
        fid[name] = f.pop("per_window")
        for key in (f"masked_psnr_gain_h{horizon}", f"motion_psnr_gain_h{horizon}"):
            out[f"{name}_{key}"] = f[key]
        out[f"{name}_static_psnr_gap_to_ceiling"] = f["static_psnr_gap_to_ceiling"]
        if name == "float32":  # the metric's check: the same model, other sampling noise
            check = window_fidelity(model, held, task, windows, horizon, seed=0, steps=1, controllability=False,
                                    sample_seed=1)["per_window"]
    motion = fid["float32"]["motion"]
    for b in [v for v in variants if v != "float32"]:
        for split, sel in (("motion", motion), ("static", ~motion), ("all", np.ones_like(motion))):
            for key, what in (("gain", "psnr"), ("masked_gain", "masked_psnr")):
                p = paired(fid["float32"][key], fid[b][key], sel, groups=fid["float32"]["episode"])
                tag = f"{b}_minus_float32_{what}_h{horizon}_{split}"
                out[tag], out[f"{tag}_ci"], out[f"{tag}_ci_episodes"] = p["mean"], p["ci"], p["ci_groups"]
                if b == "bf16":
                    out[f"float32_vs_itself_{what}_h{horizon}_{split}"] = paired(fid["float32"][key], check[key], sel)["mean"]
        out[f"{b}_mask_fit_time_ratio"] = out[f"{b}_fit"]["mask_seconds"] / out["float32_fit"]["mask_seconds"]
        out[f"{b}_layer_fit_time_ratio"] = (out[f"{b}_fit"]["layer_seconds"] / out["float32_fit"]["layer_seconds"]
                                            if out["float32_fit"]["layer_seconds"] > 0.01 else float("nan"))
    evaluation = Path(run) / "stages" / "world_model_eval.json"
    if not quick and evaluation.exists():  # the run's own fit, which the float32 refit should reproduce
        out["run_masked_psnr_gain_h16"] = json.loads(evaluation.read_text())["result"]["masked_psnr_gain_h16"]
    return finish("mask-fit-precision", out, quick,
                  command=f"wmrl bench mask-fit-precision --json --options run={run}"
                  + f" layer_steps_b={layer_steps_b}" * bool(layer_steps_b))
