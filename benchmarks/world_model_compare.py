"""Two world-model benchmark runs on the same held-out windows, paired window by window: does B beat A?

`wmrl bench world-model-compare --json --options a=TAG b=TAG` with TAGs of `runs/bench-world-model/<TAG>` (the work
folders `wmrl bench world-model` trains in, e.g. `small-cpu-x4` and `small-cpu-x4-ep1200`), or paths of `wmrl demo`
run folders (their `world_model/` and `dataset/`, e.g. `a=runs/demo59 b=runs/demo60`). Both models roll out
from the same 240 held-out windows (`fixed_windows`, seed 0) under the recorded actions, at each model's default
sampling steps and at 1 step (as imagination samples). Per window: PSNR gain over copy-last at h16 (whole frame,
and masked to the arm and cubes, and the mask split into the arm's and the cubes' pixels), and B's minus A's, with a
bootstrap 95% interval and the share of windows B wins, on motion and static windows; again with whole held-out
episodes resampled (`..._ci_episodes`, `..._b_wins_episodes`: the windows come from a dozen or so episodes, so the
per-window interval is optimistic). The check of the metric, in the same run: A against itself with other sampling noise
(its difference must sit near 0 and its wins near 0.5). Both runs must hold the same held-out episodes (refused
otherwise: their episodes and actions must be equal, their frames within a mean of `MAX_FRAME_DIFF` grey levels,
reported as `heldout_frames_mean_abs_diff`). Each model's own summary says where its masked error sits: the
arm's and the cubes' gains per camera, with a mask that has object sources also decoded from the recorded [hand, cube]
points (the ceiling of an exact state channel), and the channel's hand and object errors at h16 on motion windows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wmrl.benchutil import finish, tiny_world_model, world_model_run_folders

WORK = Path(__file__).resolve().parent.parent / "runs" / "bench-world-model"
MAX_FRAME_DIFF = 0.1  # grey levels, mean over the held-out frames: above it the two runs saw other frames
SUMMARY_KEYS = ("static_psnr_gap_to_ceiling", "psnr_h16_model_motion_front", "psnr_h16_model_motion_wrist",
                "psnr_h16_model_static_front", "psnr_h16_model_static_wrist", "psnr_h16_copy_motion_front",
                "psnr_h16_copy_motion_wrist", "error_split_h16", "ee_error_cm_h16", "hand_error_cm_h16_motion",
                "object_error_cm_h16_motion", *(f"masked_psnr_gain_h16_{part}{cam}{pts}" for part in ("arm", "objects")
                                                for cam in ("", "_front", "_wrist") for pts in ("", "_recorded_points")))


def main(quick: bool = False, a: str = "", b: str = "", windows: int = 240, auroc: bool = False, pairs: int = 130,
         gate_a: str = "", gate_b: str = "", settle_a: str = "", settle_b: str = "", episodes: bool = False,
         starts: int = 60) -> dict:
    """`auroc`: also success AUROC on `pairs` seeds' success / near-success pairs (`wmrl.eval.world_model.pair_auroc`,
    matched length, 1 Euler step as imagination samples), B's minus A's with a paired bootstrap interval.
    `gate_a`, `gate_b`: the state channel's contact gate in A's or B's rollouts instead of the checkpoint's
    (`state_channel.GATES`; it changes no weight, so A and B may be the same run). `settle_a`, `settle_b`: on | off,
    cubes the hand does not hold resting at their height in A's or B's rollouts (`state_channel.settle`; empty: the
    checkpoint's; no weight changes either). `episodes`: also the state channel over whole episodes: the red cube's
    error at each held-out episode's end (`cube_error_at_episode_end`, B's minus A's over the same episodes) and the
    noisy expert closed loop in imagination from `starts` true starts (`hallucination`: imagined success against its
    true success from the same starts, and the share of imagined successes that fail when replayed)."""
    from wmrl.core.checkpoint import resolve_checkpoint
    from wmrl.benchutil import on_off, on_off_word
    from wmrl.eval.world_model import (cube_error_at_episode_end, hallucination, pair_auroc, success_pairs,
                                       true_closed_loop, window_fidelity)
    from world_models.video.evaluate import pair_auroc_difference
    from world_models.video.evaluate import paired_difference as paired
    from world_models.video.model import VideoWorldModel
    from world_models.video.state_channel import GATES
    from world_models.video.train import load_split

    gates = {"a": gate_a, "b": gate_b}
    settles = {"a": on_off(settle_a, "settle_a"), "b": on_off(settle_b, "settle_b")}
    settle_a, settle_b = on_off_word(settles["a"]), on_off_word(settles["b"])
    if any(g and g not in GATES for g in gates.values()):
        raise ValueError(f"gate_a={gate_a!r}, gate_b={gate_b!r}: expected gates in {GATES} (or none: the checkpoint's)")
    if quick:  # one tiny model as both A and B: a smoke test of the pipeline, not a result
        import tempfile

        work = tiny_world_model(Path(tempfile.mkdtemp(prefix="wmrl-bench-wm-compare-")), long=True)
        runs = {"a": (work / "model", work / "data"), "b": (work / "model", work / "data")}
        windows, pairs, starts = 8, min(pairs, 4), min(int(starts), 3)
    else:
        if not a or not b:
            raise ValueError("options a=TAG b=TAG are required (work folders under runs/bench-world-model)")
        runs = {"a": world_model_run_folders(a, WORK), "b": world_model_run_folders(b, WORK)}
    models = {k: VideoWorldModel.load(resolve_checkpoint(r[0]), device="cpu", state_gate=gates[k] or None,
                                      state_settle=settles[k]).eval()
              for k, r in runs.items()}
    _, _, held = load_split(runs["a"][1], 0.1, keep=("qpos",))
    _, _, held_b = load_split(runs["b"][1], 0.1)
    # the same episodes and actions; the frames may differ in a few pixels: two collections with the same seed
    # decode to 0.04-0.13% of values differing (mean 0.0006-0.003 grey levels; demo59 against demo60)
    frame_diff = {k: float(np.abs(held.data[k][: held.high_water].astype(np.float32)
                                  - held_b.data[k][: held_b.high_water].astype(np.float32)).mean())
                  if held.high_water == held_b.high_water else float("inf")
                  for k in ("observation.images.front", "observation.images.wrist")}
    same = (held.episodes == held_b.episodes and np.array_equal(held.data["action"][: held.high_water],
                                                                  held_b.data["action"][: held_b.high_water])
            and max(frame_diff.values()) <= MAX_FRAME_DIFF)
    if not same:
        raise ValueError(f"{runs['a'][1]} and {runs['b'][1]} hold out different episodes: their windows cannot be paired")
    out: dict = {"a": str(a or "tiny"), "b": str(b or "tiny"), "n_windows": windows,
                 "heldout_frames_mean_abs_diff": frame_diff}
    for name, steps in (("", None), ("imagination_", 1)):
        full = {k: window_fidelity(m, held, "push-red", windows, 16, seed=0, steps=steps, controllability=False)
                for k, m in models.items()}
        fid = {k: f.pop("per_window") for k, f in full.items()}
        for k, f in full.items():  # each model's own summary: the static gap, per-camera PSNR, where the error sits
            out.update({f"{name}{key}_{k}": f[key] for key in SUMMARY_KEYS if key in f})
        check = window_fidelity(models["a"], held, "push-red", windows, 16, seed=0, steps=steps, controllability=False,
                                sample_seed=1)["per_window"]
        motion = fid["a"]["motion"]
        for split, sel in (("motion", motion), ("static", ~motion)):
            for key, what in (("gain", "psnr"), ("masked_gain", "masked_psnr"), ("masked_gain_arm", "masked_psnr_arm"),
                              ("masked_gain_objects", "masked_psnr_objects")):
                if key.startswith("masked_gain") and split == "static" or key not in fid["a"]:
                    continue  # few arm or cube pixels change in a static window; an env without part masks
                p = paired(fid["a"][key], fid["b"][key], sel, groups=fid["a"]["episode"])
                c = paired(fid["a"][key], check[key], sel)
                tag = f"{name}{what}_h16_{split}"
                out[f"{tag}_a"], out[f"{tag}_b"] = float(np.nanmean(fid["a"][key][sel])), float(np.nanmean(fid["b"][key][sel]))
                out[f"{tag}_b_minus_a"], out[f"{tag}_b_minus_a_ci"], out[f"{tag}_b_wins"] = p["mean"], p["ci"], p["wins"]
                # the same with whole held-out episodes resampled (their windows are not independent)
                out[f"{tag}_b_minus_a_ci_episodes"], out[f"{tag}_b_wins_episodes"] = p["ci_groups"], p["group_wins"]
                out[f"{tag}_n_episodes"] = p["n_groups"]
                out[f"{tag}_a_vs_itself"], out[f"{tag}_a_vs_itself_wins"] = c["mean"], c["wins"]
    out["n_motion_windows"] = int(motion.sum())
    if auroc:
        eps = success_pairs("push-red", pairs)
        res = {k: pair_auroc(m, eps, steps=1) for k, m in models.items()}
        out["n_pairs"] = len(eps) // 2
        for path, key in (("frames", "frames: success head on generated latents"), ("state", "state: task rules on predicted state")):
            if not all(key in r["scores"] for r in res.values()):
                continue
            for k, r in res.items():
                out[f"imagination_success_auroc_matched_{path}_{k}"] = r[f"success_auroc_matched_{path}"]
            d = pair_auroc_difference(res["a"]["scores"][key], res["b"]["scores"][key], res["a"]["truth"])
            out[f"imagination_success_auroc_matched_{path}_b_minus_a"] = d["mean"]
            out[f"imagination_success_auroc_matched_{path}_b_minus_a_ci"] = d["ci"]
        out["success_auroc_real_frames_head_a"] = res["a"]["success_auroc_real_frames_head"]
    if episodes and all(m.state_channel is not None for m in models.values()):
        cube = {k: cube_error_at_episode_end(m, held) for k, m in models.items()}
        d = paired(cube["a"], cube["b"])
        for k, c in cube.items():
            out[f"cube_error_cm_end_{k}"], out[f"cube_error_cm_end_p90_{k}"] = float(np.median(c)), float(np.percentile(c, 90))
        out["cube_error_cm_end_b_minus_a"], out["cube_error_cm_end_b_minus_a_ci"] = d["mean"], d["ci"]
        out["cube_error_cm_end_b_larger"], out["n_episodes_end"] = d["wins"], len(cube["a"])  # share where B errs more
        seeds = list(range(70_000, 70_000 + int(starts)))  # the world-model benchmark's hallucination starts
        truth = true_closed_loop("push-red", seeds)  # the expert in the true simulator: the same for both models
        hall = {k: hallucination(m, held, "push-red", "expert", seeds, true_run=truth) for k, m in models.items()}
        out["expert_true_success"], out["hallucination_starts"] = truth["true_success"], len(seeds)
        for k, h in hall.items():
            out[f"expert_imagined_success_{k}"], out[f"hallucinated_success_expert_{k}"] = h["imagined_success"], h["hallucinated_share"]
            out[f"expert_imagined_minus_true_{k}"] = h["imagined_success"] - truth["true_success"]
        out["hallucinated_success_expert_sim_1mm"] = truth["replay_fails_after_shift"]  # the replay check's ceiling
    out["gate_a"], out["gate_b"] = (g or "the checkpoint's" for g in (gate_a, gate_b))
    out["settle_a"], out["settle_b"] = (bool(m.cfg.state_settle) for m in (models["a"], models["b"]))
    name = (f"world-model-compare-{Path(a).name}{f'-gate-{gate_a}' * bool(gate_a)}{f'-settle-{settle_a}' * bool(settle_a)}"
            f"-vs-{Path(b).name}{f'-gate-{gate_b}' * bool(gate_b)}{f'-settle-{settle_b}' * bool(settle_b)}")
    return finish(name if not quick else "world-model-compare", out, quick,
                  command=f"wmrl bench world-model-compare --json --options a={a} b={b}" + (" auroc=true" if auroc else "")
                  + f" gate_a={gate_a}" * bool(gate_a) + f" gate_b={gate_b}" * bool(gate_b)
                  + f" settle_a={settle_a}" * bool(settle_a) + f" settle_b={settle_b}" * bool(settle_b)
                  + " episodes=true" * bool(episodes) + f" starts={starts}" * (bool(episodes) and int(starts) != 60))
