"""The change mask on a trained world model: the same windows, the same rollouts, decoded with and without it.

`wmrl bench world-model-change-mask --json --options run=TAG` with TAG a work folder of `wmrl bench world-model`
(`runs/bench-world-model/<TAG>`, e.g. `small-cpu-s3`). The run's model is loaded, given a change mask
(`networks.ChangeMask`) fitted on its own rollouts of training windows (`change_mask.fit_change_mask`, exactly as
`wmrl train-wm` fits it after its phases; the rest of the model is not touched), and measured on the world-model
benchmark's 240 held-out windows (`fixed_windows`, seed 0) at 1 Euler step (as imagination samples) and at the
model's default steps. The mask changes only the decode, so both variants share every latent: the per-window
difference is the mask's alone (paired, bootstrap 95% interval, share of windows it wins).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path


from wmrl.benchutil import finish

WORK = Path(__file__).resolve().parent.parent / "runs" / "bench-world-model"
KEYS = ("motion_psnr_gain_h16", "motion_psnr_gain_h16_ci", "static_psnr_gain_h16", "masked_psnr_gain_h16",
        "static_psnr_gap_to_ceiling", "delta_t_psnr_h8_motion", "psnr_h16_model_static_front",
        "psnr_h16_model_static_wrist", "psnr_h16_model_motion_front", "psnr_h16_model_motion_wrist",
        "psnr_h16_copy_static_front", "psnr_h16_copy_static_wrist", "psnr_h16_copy_motion_front",
        "psnr_h16_copy_motion_wrist", "error_split_h16")


def main(quick: bool = False, run: str = "small-cpu-s3", windows: int = 240, fit_windows: int = 200,
         fit_steps: int = 800, refine: bool = False, warp: bool = False,
         unwarped: bool = False, read_pose: bool = False, static_weight: float = 1.0,
         fit_data: str = "") -> dict:
    """`run`: the work folder measured (the committed result is the seed-3 CPU model's); another run, or a fit other
    than `wmrl train-wm`'s default (`fit_windows`, `fit_steps`), writes `world-model-change-mask-RUN-wW-sS.json`.
    `refine`: the mask also corrects pixels (`ChangeMask(refine=True)`), written to `...-refine.json`; `warp`: it
    warps the start frame to each frame's commanded pose first (`change_warp`), `...-warp.json`; `unwarped` (with
    `warp`): the unwarped start frame is a third source of the blend (`change_unwarped`), `...-warp3.json`;
    `read_pose` (with `warp`): the mask reads the pose change (`change_read_pose`), `...-pose.json` appended;
    `static_weight`: the fit draws static windows' frames that many times as often (`fit_change_mask`), `-swW`;
    `fit_data`: a dataset of episodes the model never trained on (e.g. `wmrl collect` of the same recipe with another
    seed) whose windows the mask is fitted on instead of the training windows, `-fitDIRNAME`: the rollouts then carry
    the model's held-out errors, not its training ones."""
    if (unwarped or read_pose) and not warp:
        raise ValueError("unwarped=true and read_pose=true come with the warp of the start frame: pass warp=true too")
    import torch

    from wmrl.eval.world_model import window_fidelity
    from world_models.video.change_mask import fit_change_mask
    from world_models.video.evaluate import paired_difference
    from world_models.video.model import VideoWorldModel
    from world_models.video.train import load_split

    if quick:  # a tiny model on a tiny dataset: a smoke test of the pipeline, not a result
        import tempfile

        from wmrl.commands.collect import CollectConfig, collect
        from world_models.video.train import TrainWMConfig, train_world_model

        folder = Path(tempfile.mkdtemp(prefix="wmrl-bench-wm-mask-"))
        collect(CollectConfig(task="push-red", episodes=10, out=folder / "data", failures=1.0, num_envs=1), progress=False)
        train_world_model(TrainWMConfig(data=folder / "data", out=folder / "model", size="tiny", ae_steps=10, state_steps=10,
                                        dyn_steps=10, unroll_steps=0, batch_size=8, videos=0, change_mask_steps=0,
                                        head_rollout_steps=0),
                          progress=False)
        windows, fit_windows, fit_steps = 8, 4, 10
    else:
        folder = WORK / run
    t0 = time.time()
    src = VideoWorldModel.load(folder / "model/checkpoints/last").eval()
    model = VideoWorldModel(replace(src.cfg, change_mask=True, change_refine=refine, change_warp=warp,
                                        change_unwarped=unwarped, change_read_pose=read_pose))
    # the run's own mask, if it has one, is left out: this benchmark fits its own (of the kind asked for)
    missing, unexpected = model.load_state_dict({k: v for k, v in src.state_dict().items()
                                                 if not k.startswith("change_mask")}, strict=False)
    if unexpected or any(not k.startswith("change_mask") for k in missing):
        raise ValueError(f"{folder}: its weights do not fit a model with a change mask ({unexpected or missing})")
    model.eval()
    _, train, held = load_split(folder / "data", 0.1, keep=("qpos",))
    torch.manual_seed(0)
    train_fit = None
    if fit_data:  # the mask fitted on the training windows too, as train-wm does, to compare on the same latents
        train_fit = fit_change_mask(model, train, fit_windows, fit_steps, seed=0, static_weight=static_weight)
        train_mask = {k: v.clone() for k, v in model.change_mask.state_dict().items()}
        _, train, _ = load_split(Path(fit_data), 0.0, keep=("qpos",))
        torch.manual_seed(0)
    fit = fit_change_mask(model, train, fit_windows, fit_steps, seed=0, static_weight=static_weight)
    fit_mask = {k: v.clone() for k, v in model.change_mask.state_dict().items()}
    fit_minutes = (time.time() - t0) / 60
    out: dict = {"run": run if not quick else "tiny", "refine": refine, "warp": warp, "unwarped": unwarped, "read_pose": read_pose, "n_windows": windows, "fit_windows": fit_windows,
                 "fit_steps": fit_steps, "static_weight": static_weight, "fit_data": fit_data or None,
                 "fit_episodes": train.num_episodes, "fit_minutes": fit_minutes, **fit}
    if train_fit is not None:
        out.update({f"train_fit_{k}": v for k, v in train_fit.items()})
    for prefix, steps in (("imagination_", 1), ("", None)):
        res = {}
        variants = [("plain", False, fit_mask), ("masked", True, fit_mask)]
        if train_fit is not None and steps == 1:
            variants.append(("masked_train_fit", True, train_mask))
        for variant, on, weights in variants:
            model.change_mask.load_state_dict(weights)
            model.change_mask_fitted.fill_(on)
            res[variant] = window_fidelity(model, held, "push-red", windows, 16, seed=0, steps=steps,
                                           controllability=bool(steps == 1))
        model.change_mask.load_state_dict(fit_mask)
        model.change_mask_fitted.fill_(True)
        motion = res["plain"]["per_window"]["motion"]
        for variant, f in res.items():
            for k in KEYS:
                if k in f:
                    out[f"{prefix}{variant}_{k}"] = f[k]
        for split, sel in (("motion", motion), ("static", ~motion)):
            p = paired_difference(res["plain"]["per_window"]["gain"], res["masked"]["per_window"]["gain"], sel)
            out[f"{prefix}mask_psnr_change_h16_{split}"], out[f"{prefix}mask_psnr_change_h16_{split}_ci"] = p["mean"], p["ci"]
            out[f"{prefix}mask_wins_{split}"] = p["wins"]
        if "masked_train_fit" in res:  # this fit's mask minus the training windows' mask, window by window
            a, b = res["masked_train_fit"]["per_window"], res["masked"]["per_window"]
            parts = [(k[12:], k, motion) for k in b if k.startswith("masked_gain_")]  # masked_gain_arm, ..._cubes
            for name, key, sel in (("motion", "gain", motion), ("static", "gain", ~motion), ("masked", "masked_gain", motion),
                                   *parts):
                out[f"{prefix}fit_data_vs_train_fit_{name}"] = paired_difference(a[key], b[key], sel, groups=b["episode"])
    out["minutes"] = (time.time() - t0) / 60
    default = (run, fit_windows, fit_steps) == ("small-cpu-s3", 200, 800)
    name = ("world-model-change-mask" + ("" if default else f"-{run}-w{fit_windows}-s{fit_steps}")
            + ("-refine" if refine else "") + ("-warp" if warp else "") + ("3" if unwarped else "") + ("-pose" if read_pose else "") + ("" if static_weight == 1 else f"-sw{static_weight:g}")
            + (f"-fit{Path(fit_data).name}" if fit_data else ""))
    options = (f"run={run}" + ("" if (fit_windows, fit_steps) == (200, 800) else f" fit_windows={fit_windows} fit_steps={fit_steps}")
               + (" refine=true" if refine else "") + (" warp=true" if warp else "") + (" unwarped=true" if unwarped else "")
               + (" read_pose=true" if read_pose else "") + ("" if static_weight == 1 else f" static_weight={static_weight:g}")
               + (f" fit_data={fit_data}" if fit_data else ""))
    return finish(name if not quick else "world-model-change-mask", out, quick,
                  command=None if quick else f"wmrl bench world-model-change-mask --json --options {options}")


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
