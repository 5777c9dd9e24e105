"""Video world model v2 on held-out push-red episodes, measured the way a policy would lean on it.

- Fidelity on a fixed, stored set of held-out windows (>= 200, chosen by seed), split into motion and static:
  per-window PSNR gain over copy-last-frame at h16 (paired, bootstrap 95% CI), the same on pixels of the arm and
  cubes only (MuJoCo segmentation renders of the real frames), the gap to the autoencoder's ceiling on static
  windows, and Genie's Delta-t PSNR (true vs shuffled actions) at h8 on motion windows. Per camera too (the wrist
  view moves with the hand). Measured at the model's `sampling_steps` (3), again as imagination samples
  (`imagination_*`: 1 step, the conditional-mean path), and for a deterministic baseline (`deterministic_*`).
- State: end-effector error at h4/h16 and target-cube error at the end of whole held-out episodes, in cm.
- Success: AUROC over success / near-success pairs that share a start (same seed), each scored on the *same*
  number of steps (a random scorer gives 0.5 there, checked in the same run); the 80-step AUROC as RL sees it
  (each episode scored to its own end; its random-scorer value is reported too); the ceiling on real data; the
  matched AUROCs again as imagination samples (`imagination_*`, 1 Euler step), with bootstrap intervals over pairs.
- Hallucinated success: imagined rollouts of a noisy scripted expert and of a random policy from true-simulator
  starts, every imagined success's actions replayed open-loop in the true simulator from the same start.

Work folder: runs/bench-world-model/full/ (dataset and model). A finished training is reused (resume), so
re-running only re-measures; delete the folder to retrain from scratch.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from wmrl.benchutil import device_name, finish

WORK = Path(__file__).resolve().parent.parent / "runs" / "bench-world-model"
ROOT = WORK.parent.parent
H16 = 16
# fidelity keys repeated for the other sampling settings and the deterministic baseline
IMAGINATION_KEYS = ("motion_psnr_gain_h16", "motion_psnr_gain_h16_ci", "static_psnr_gain_h16", "masked_psnr_gain_h16",
                    "static_psnr_gap_to_ceiling", "delta_t_psnr_h8_motion", "motion_psnr_gain_h1", "motion_psnr_gain_h4",
                    "psnr_h16_model_motion_wrist", "psnr_h16_model_static_wrist", "psnr_h16_model_motion_front",
                    "psnr_h16_model_static_front", "static_psnr_gap_to_identity_ceiling", "latent_error_h1_model_static",
                    "latent_error_h1_model_motion", "error_split_h16")


def _recorded_mirror(run: Path) -> bool:
    """Whether a world-model run trained on reflections too (a config from before the option: it did not)."""
    import yaml

    from world_models.video.train import recorded_recipe

    return bool(recorded_recipe(yaml.safe_load((run / "config.yaml").read_text()))["mirror"])


def _trained(cfg) -> bool:
    """Whether `cfg.out`'s last checkpoint already reached the step budget of `cfg` (then nothing is trained, so a
    run trained on a lent device is measured on any machine without loading it there)."""
    state = cfg.out / "checkpoints/last/train_state.json"
    if not state.exists():
        return False
    # a work folder trained before the reflections became the default is never measured as one trained with them
    saved = _recorded_mirror(cfg.out)
    if cfg.mirror is not None and saved != cfg.mirror:
        raise ValueError(f"{cfg.out} was trained with mirror={saved}, this run asks for mirror={cfg.mirror}: "
                         "remove the folder to retrain")
    budget = cfg.ae_steps + (cfg.state_steps if cfg.state_channel else 0) + cfg.dyn_steps + cfg.unroll_steps
    return json.loads(state.read_text())["step"] >= budget


def main(quick: bool = False, size: str = "small", device: str = "cpu", steps_scale: float = 1.0,
         batch_size: int = 32, amp: bool = False, compile: str | None = None, train_only: bool = False,
         deterministic: bool = True, motion_weight: float = 3.0, episodes: int = 300, extra_envs: int = 2,
         eval_every: int = 500, seed: int = 0, state_unroll: int = 12, state_arm_rest: bool = False,
         state_detach_hand: bool = False, unroll: bool = True, mirror: bool = True,
         state_settle_unroll: bool = False) -> dict:
    """The defaults are the committed CPU numbers. Anything else (e.g. `--size base --device cuda --steps-scale 5`)
    trains in its own work folder and writes `world-model-SIZE-DEVICE.json`, never the CPU result.

    `train_only`: collect and train, measure nothing (on a lent device, whose time is short); copy the work folder
    back and run the same options without it to measure here (finished trainings are not touched).
    `deterministic=false` skips the deterministic baseline (its `deterministic_*` keys are then absent): on a lent
    device its training costs a third of the budget that the diffusion model could use instead.
    `motion_weight`: the dynamics loss's weight on changing latents (`TrainWMConfig.motion_weight`); another value
    trains in its own work folder (`...-mwW`).
    `episodes`: training data in all. The 300-episode dataset (seeds 0..299, its last 30 held out) stays, so every
    run is measured on the same held-out windows; the rest are recorded with the same mix from seed 300 on and all
    go to training (`...-epN`). `extra_envs`: simulator processes recording them (the expert's noise is one stream
    across the processes, so another value records other, equally distributed episodes; on a lent device's 16 cores,
    16 records 900 episodes in well under a minute). `eval_every`: training's fixed-window held-out/training losses
    (`TrainWMConfig.eval_every`; 0 = only the final model's, measured here; training is the same either way).
    `state_unroll`: the state channel's training unroll (`TrainWMConfig.state_unroll`); another value trains in its
    own work folder (`...-suN`). `state_arm_rest`, `state_detach_hand`: the channel's options of those names
    (`TrainWMConfig`), each in its own work folder (`...-ar`, `...-dh`); `state_settle_unroll` likewise (`...-sru`: the
    channel's unrolled loss applies the settling rule, `TrainWMConfig.state_settle_unroll`). `unroll=false`: no final unrolled phase
    (`unroll_steps` 0; `...-nounroll`). With a constant learning rate and per-step randomness, that model is the
    full recipe's checkpoint at the end of its denoiser phase, so a device run cut there is measured as this.
    `seed`: the training seed (`TrainWMConfig.seed`; the data stay the same), for a second model of one recipe
    (`...-sN`). `mirror` (on): every training episode also trained on as its reflection through the cell's plane of
    symmetry (`TrainWMConfig.mirror`, on for this data by default; the held-out episodes are not reflected);
    `mirror=false` trains without (`...-nomirror`; the results before 2026-12-06 were, and their `-mirror` files
    with). The committed CPU result is the default with its deterministic baseline; `deterministic=false` alone writes
    `world-model-small-cpu.json` instead."""
    from wmrl.commands.collect import CollectConfig, collect
    from wmrl.eval.world_model import (auroc_plot, cube_error_at_episode_end, cube_error_in_true_sim, gain_plot,
                                       hallucination, pair_auroc, success_pairs, window_fidelity)
    from world_models.video.model import VideoWorldModel
    from world_models.video.evaluate import write_side_by_side
    from world_models.video.train import (TrainWMConfig, WindowSampler, encode_all, fixed_window_losses, load_split,
                                          train_world_model)

    if episodes < 300:
        raise ValueError(f"episodes must be >= 300 (the dataset with the held-out episodes), got {episodes}")
    n_eps, n_extra = (16, 0) if quick else (300, episodes - 300)
    default = (size, device, steps_scale, batch_size, float(motion_weight), episodes, seed, deterministic,
               int(state_unroll), state_arm_rest, state_detach_hand, unroll, mirror, state_settle_unroll) == (
        "small", "cpu", 1.0, 32, 3.0, 300, 0, True, 12, False, False, True, True, False)
    tag = "full" if default else (f"{size}-{device.split(':')[0]}" + (f"-x{steps_scale:g}" if steps_scale != 1 else "")
                                  + (f"-mw{float(motion_weight):g}" if float(motion_weight) != 3.0 else "")
                                  + (f"-ep{episodes}" if episodes != 300 else "") + (f"-s{seed}" if seed else "")
                                  + (f"-su{int(state_unroll)}" if int(state_unroll) != 12 else "")
                                  + ("-ar" if state_arm_rest else "") + ("-dh" if state_detach_hand else "")
                                  + ("-sru" if state_settle_unroll else "")
                                  + ("" if unroll else "-nounroll") + ("" if mirror else "-nomirror"))
    work = Path(tempfile.mkdtemp(prefix="wmrl-bench-wm-")) if quick else WORK / tag  # quick: always fresh
    mix = dict(failures=0.3, noise=0.05, perturbed=0.25)
    base = TrainWMConfig(data=Path("."), out=Path("."))
    steps = dict(ae_steps=20, state_steps=20, dyn_steps=20, unroll_steps=10, size="tiny", batch_size=8, change_mask_steps=10,
                 change_mask_windows=4, head_rollout_steps=20) if quick else dict(
        size=size, device=device, batch_size=batch_size, amp=amp, compile=compile, motion_weight=float(motion_weight),
        eval_every=int(eval_every), seed=int(seed), state_unroll=int(state_unroll), state_arm_rest=state_arm_rest,
        state_detach_hand=state_detach_hand, mirror=mirror, state_settle_unroll=state_settle_unroll,
        **{k: int(getattr(base, k) * steps_scale) for k in ("ae_steps", "state_steps", "dyn_steps", "unroll_steps")})
    if not unroll:
        steps["unroll_steps"] = 0
    data, extra = work / "data", work / "extra-data"
    for out_dir, n, first_seed, envs in ((data, n_eps, 0, 2), (extra, n_extra, n_eps, int(extra_envs))):
        if n and not (out_dir / "meta/info.json").exists():
            collect(CollectConfig(task="push-red", episodes=n, out=out_dir, overwrite=True, post_success_steps=3, seed=first_seed,
                                  num_envs=envs, **mix), progress=not quick)
    run = work / "model"
    resume = (run / "checkpoints/last/train_state.json").exists()
    tcfg = TrainWMConfig(data=data, out=run, videos=1 if quick else 3, resume=resume, overwrite=not resume,
                         extra_data=(extra,) if n_extra else (), **steps)
    if not _trained(tcfg):
        train_world_model(tcfg, progress=not quick)
    # the deterministic baseline: the same backbone regressing the change (the conditional mean), on the same latents
    det_run = work / "deterministic"
    det_resume = (det_run / "checkpoints/last/train_state.json").exists()
    dcfg = TrainWMConfig(data=data, out=det_run, deterministic=True, init_from=run, state_channel=False, videos=0,
                         resume=det_resume, overwrite=not det_resume, extra_data=tcfg.extra_data,
                         **{**steps, "ae_steps": 0, "state_steps": 0, **({"head_rollout_steps": 0} if quick else {})})
    if deterministic and not _trained(dcfg):
        train_world_model(dcfg, progress=not quick)
    if train_only:
        where = device_name(device)
        (work / "trained_on.json").write_text(json.dumps({"train_device": where}) + "\n")
        return {"trained": str(work), "train_device": where}
    ts = json.loads((run / "checkpoints/last/train_state.json").read_text())
    # the contact gate the recipe now runs with (it changes no weight, so a run trained before it was chosen is measured
    # as the same recipe trained today would be)
    model = VideoWorldModel.load(run / "checkpoints/last", device="cpu", state_gate=tcfg.state_gate).eval()
    _, train, held = load_split(data, 0.1, keep=("qpos",), extra=tcfg.extra_data)
    out: dict = {"dataset_episodes": n_eps + n_extra, "extra_envs": int(extra_envs) if n_extra else None, "data_mix": mix, "heldout_episodes": held.num_episodes,
                 "train_episodes": train.num_episodes, "mirror": _recorded_mirror(run), "success_source": model.success_source,
                 "state_gate": model.cfg.state_gate if model.state_channel is not None else None}

    # ---- fidelity on the fixed window set, state errors
    fid = window_fidelity(model, held, "push-red", 12 if quick else 240, H16, seed=0)
    pw = fid.pop("per_window")
    out.update(fid)
    # the same windows sampled as imagination, ranking and GRPO sample (1 Euler step: the conditional-mean path)
    ifid = window_fidelity(model, held, "push-red", 12 if quick else 240, H16, seed=0, steps=1)
    for k in IMAGINATION_KEYS:
        out[f"imagination_{k}"] = ifid[k]
    # generalisation: each phase's loss on fixed windows and noise of held-out (val_*) and training (fit_*) episodes,
    # as training logs it, for the final model; then the same fidelity on windows of training episodes (fit_*)
    samplers = {"val": WindowSampler(held, "cpu", model.cfg, encode_all(model, held)),
                "fit": WindowSampler(train, "cpu", model.cfg, encode_all(model, train))}
    for phase in (0, 1, 2) if model.state_channel is not None else (0, 2):
        out.update(fixed_window_losses(model, samplers, phase, tcfg))
    for name, st in (("", None), ("imagination_", 1)):
        f = window_fidelity(model, train, "push-red", 12 if quick else 240, H16, seed=0, steps=st, controllability=False)
        for k in ("motion_psnr_gain_h16", "static_psnr_gain_h16", "masked_psnr_gain_h16"):
            out[f"fit_{name}{k}"] = f[k]
        out[f"{name}generalisation_gap_motion_h16"] = f["motion_psnr_gain_h16"] - out[f"{name}motion_psnr_gain_h16"]
    det = VideoWorldModel.load(det_run / "checkpoints/last", device="cpu").eval() if deterministic else None
    if det is not None:
        dfid = window_fidelity(det, held, "push-red", 12 if quick else 240, H16, seed=0)
        for k in IMAGINATION_KEYS:
            out[f"deterministic_{k}"] = dfid[k]
        if "joint_error_rad_h16" in dfid:  # the baseline has no state channel: its joint angles are its frame heads'
            out["joint_error_rad_h16_frame_heads"] = dfid["joint_error_rad_h16"]
    if model.state_channel is not None:
        cube = cube_error_at_episode_end(model, held)
        out["cube_error_cm_end"], out["cube_error_cm_end_p90"] = float(np.median(cube)), float(np.percentile(cube, 90))
        # the measurement's own checks: the true simulator from the recorded start (0: must reproduce the data) and
        # from a start 1 mm off (the ceiling of any model exact up to 1 mm: pushing is chaotic)
        for name, shift in (("sim_exact", 0.0), ("sim_1mm", 1e-3)):
            c = cube_error_in_true_sim(held, "push-red", shift)
            out[f"cube_error_cm_end_{name}"], out[f"cube_error_cm_end_{name}_p90"] = float(np.median(c)), float(np.percentile(c, 90))

    # ---- success AUROC on prefix-sharing pairs
    pairs = success_pairs("push-red", 6 if quick else 130)
    pa = pair_auroc(model, pairs)
    scores, truth = pa.pop("scores"), pa.pop("truth")
    out.update(pa)
    # the same pairs rolled out as imagination, ranking and RL sample (1 Euler step): the frame head reads these
    ipa = pair_auroc(model, pairs, steps=1)
    for k in ("success_auroc_matched_frames", "success_auroc_matched_frames_ci", "success_auroc_matched_state",
              "success_auroc_matched_state_ci"):
        if k in ipa:
            out[f"imagination_{k}"] = ipa[k]

    # ---- hallucinated success (closed loop in imagination, replayed in the true simulator)
    if model.state_channel is not None:
        seeds = list(range(70_000, 70_000 + (4 if quick else 60)))
        ex = hallucination(model, held, "push-red", "expert", seeds)
        rd = hallucination(model, held, "push-red", "random", seeds)
        out["hallucinated_success_expert"] = ex["hallucinated_share"]
        out["hallucinated_success_expert_flagged"] = ex["hallucinated_share_flagged"]
        out["expert_imagined_success_flagged"] = ex["imagined_success_flagged"]
        out["random_policy_imagined_success_flagged"] = rd["imagined_success_flagged"]
        out["disagreement_flag_cm"] = ex["flag_cm"]
        out["expert_imagined_success"], out["expert_imagined_successes"] = ex["imagined_success"], ex["imagined_successes"]
        out["expert_median_disagreement_cm"], out["random_median_disagreement_cm"] = ex["median_disagreement_cm"], rd["median_disagreement_cm"]
        out["random_policy_imagined_success"], out["random_policy_true_success"] = rd["imagined_success"], rd["true_success"]
        out["random_policy_imagined_minus_true"] = rd["imagined_success"] - rd["true_success"]
        out["expert_true_success"] = ex["true_success"]
        out["expert_imagined_minus_true"] = ex["imagined_success"] - ex["true_success"]
        out["hallucinated_success_expert_sim_1mm"] = ex["replay_fails_after_shift"]  # the replay check's ceiling
        out["hallucination_episodes"] = len(seeds)

    out["train_minutes"] = ts["seconds"] / 60
    out["train_steps"] = ts["step"]
    out["train_steps_per_s"] = ts["step"] / ts["seconds"]
    out["config"] = {"size": model.cfg.size, "context": model.cfg.context, "chunk": model.cfg.chunk,
                     "latent": [model.cfg.frame_channels, model.cfg.latent_size, model.cfg.latent_size],
                     "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "device": device, "amp": amp, "compile": compile,
                     "motion_weight": model.cfg.motion_weight,
                     **(json.loads((work / "trained_on.json").read_text()) if (work / "trained_on.json").exists() else {}),
                     **{k: getattr(tcfg, k) for k in ("ae_steps", "state_steps", "dyn_steps", "unroll_steps", "batch_size")}}
    if not quick:
        docs = ROOT / "docs"
        gain_plot(run / "psnr_gain_h16.png", pw["gain"], pw["motion"], pw["masked_gain"])
        auroc_plot(run / "auroc_pairs.png", scores, truth)
        if not (run / "videos" / "real_vs_imagined.gif").exists():  # training cut before its videos (a device lease)
            write_side_by_side(model, held, run / "videos", n=3)
        if det is not None:
            write_side_by_side(det, held, det_run / "videos", n=3)
        if default:
            import shutil

            import imageio.v3 as iio

            shutil.copy(run / "psnr_gain_h16.png", docs / "wm_psnr_gain_h16.png")
            shutil.copy(run / "auroc_pairs.png", docs / "wm_auroc_pairs.png")
            for src, name in ((run, "wm_real_vs_imagined.gif"), (det_run, "wm_real_vs_imagined_deterministic.gif")):
                gif = iio.imread(src / "videos" / "real_vs_imagined.gif", index=None)
                iio.imwrite(docs / name, gif[:, ::2, ::2], duration=100, loop=0)  # half size for the README
        out["plots"] = [str((run / p).relative_to(ROOT)) for p in ("psnr_gain_h16.png", "auroc_pairs.png")]
        out["videos"] = str((run / "videos").relative_to(ROOT))
    if default:
        return finish("world-model", out, quick)
    opts = (f"size={size} device={device} steps_scale={steps_scale} batch_size={batch_size}" + (" amp=true" if amp else "")
            + (f" compile={compile}" if compile else "") + ("" if deterministic else " deterministic=false")
            + (f" motion_weight={float(motion_weight):g}" if float(motion_weight) != 3.0 else "")
            + (f" episodes={episodes}" if episodes != 300 else "") + (f" extra_envs={extra_envs}" if n_extra and extra_envs != 2 else "")
            + (f" seed={seed}" if seed else "")
            + (f" state_unroll={int(state_unroll)}" if int(state_unroll) != 12 else "")
            + (" state_arm_rest=true" if state_arm_rest else "") + (" state_detach_hand=true" if state_detach_hand else "")
            + (" state_settle_unroll=true" if state_settle_unroll else "")
            + ("" if unroll else " unroll=false") + ("" if mirror else " mirror=false"))
    return finish(f"world-model-{tag}", out, quick, command=f"wmrl bench world-model --json --options {opts}")
