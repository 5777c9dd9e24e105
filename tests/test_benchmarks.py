"""Benchmarks are not tests, but their scripts must keep running and keep printing the keys the README and other
tools rely on. Quick mode: tiny sizes, and the committed results are left alone."""

import json
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch

from wmrl.eval.rank import is_anchor, rank_statistics

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


# the benchmarks whose quick mode trains `benchutil.tiny_world_model`: on one xdist worker, which builds it once
TINY_WORLD_MODEL = pytest.mark.xdist_group("tiny_world_model")
# the benchmarks whose quick mode needs 80-step held-out episodes share the long tiny recipe (built once per worker)
TINY_LONG_WORLD_MODEL = pytest.mark.xdist_group("tiny_world_model_long")


def _run(name, **options):
    return runpy.run_path(str(BENCH / f"{name}.py"), run_name="bench")["main"](quick=True, **options)


def test_replay_benchmark_keys_and_memory():
    r = _run("replay")
    for k in ("sample_ratio_vs_torchrl", "window_sample_ratio_vs_torchrl", "bytes_per_frame_ratio", "machine", "command", "date"):
        assert k in r
    assert r["bytes_per_frame_ratio"] < 1.1  # frames stored once
    assert r["torchrl_bytes_per_frame_ratio"] > 1.9  # torchrl's transitions keep a copy of the next observation


@pytest.mark.timing  # compares two wall-clock rates: a busy neighbour worker can slow either one
def test_sim_benchmark_rendering_costs_more_than_physics():
    r = _run("sim")
    assert r["steps_per_s_physics"] > r["steps_per_s_render_2cam_64"] > 0  # two camera renders per step are not free


def test_dataset_benchmark_reads_every_frame_back_and_stores_frames_as_video():
    r = _run("dataset")  # the script itself checks that every written frame is read back
    assert r["frames"] == 3 * 21
    assert r["bytes_per_frame_on_disk"] < 0.25 * 2 * 64 * 64 * 3  # two 64x64 cameras, raw 24 KiB: the codec compresses


def test_world_model_benchmark_reports_every_result_key():
    r = _run("world_model")
    for k in ("motion_psnr_gain_h16", "masked_psnr_gain_h16", "static_psnr_gap_to_ceiling", "delta_t_psnr_h8_motion",
              "cube_error_cm_end", "ee_error_cm_h16", "success_auroc_matched_state", "success_auroc_matched_frames",
              "success_auroc_80step", "success_auroc_real_ceiling", "hallucinated_success_expert",
              "random_policy_imagined_minus_true", "train_minutes", "train_steps_per_s", "n_windows", "n_pairs",
              "joint_error_rad_h16", "static_psnr_gap_to_identity_ceiling", "latent_error_h1_model_static",
              "latent_error_h1_copy_static", "latent_error_h16_model_motion", "masked_psnr_gain_h16_arm",
              "masked_psnr_gain_h16_objects", "hand_error_cm_h16_motion"):
        assert k in r and r[k] == r[k], k  # present and not NaN
    assert r["joint_source"] == "state channel"  # no proprioception read back from generated frames
    lo, hi = r["motion_psnr_gain_h16_ci"]
    assert lo <= r["motion_psnr_gain_h16"] <= hi
    assert len(r["windows"]) == r["n_windows"] and r["success_auroc_real_ceiling"] > 0.9
    # the cube-error measurement checked on the true simulator: the recorded start reproduces the data exactly
    assert r["cube_error_cm_end_sim_exact"] < 1e-3 and r["cube_error_cm_end_sim_exact_p90"] < 1e-3
    assert r["expert_true_success"] >= 0.5  # the noisy expert succeeds in the true simulator from these starts
    # per camera, the same windows: the cameras' mean is the headline number
    for split in ("motion", "static"):
        cams = [r[f"psnr_h16_model_{split}_{c}"] for c in ("front", "wrist")]
        assert np.mean(cams) == pytest.approx(r[f"psnr_h16_model_{split}"], abs=1e-6)
    # the setting imagination samples with is measured beside the model's default and the deterministic baseline
    for k in ("motion_psnr_gain_h16", "static_psnr_gap_to_ceiling", "psnr_h16_model_static_wrist"):
        assert r[f"imagination_{k}"] == r[f"imagination_{k}"] and r[f"deterministic_{k}"] == r[f"deterministic_{k}"]
    # generalisation: the same measurement on training windows, and the gap is their difference
    for name in ("", "imagination_"):
        assert r[f"{name}generalisation_gap_motion_h16"] == pytest.approx(
            r[f"fit_{name}motion_psnr_gain_h16"] - r[f"{name}motion_psnr_gain_h16"])
    # success pairs again at the imagination setting, an interval over pairs beside each AUROC. Not asserted to
    # contain it: with the quick run's few pairs, a resample repeats pairs and so weighs the within-pair comparisons
    # more than the AUROC does, and a percentile interval can miss the estimate (pair_auroc_ci's own tests use
    # enough pairs)
    for k in ("success_auroc_matched_frames", "imagination_success_auroc_matched_frames", "success_auroc_matched_state",
              "imagination_success_auroc_matched_state"):
        lo, hi = r[f"{k}_ci"]
        assert 0.0 <= lo <= hi <= 1.0 and 0.0 <= r[k] <= 1.0, k
    # where the error is made: copy-last's split does not depend on how the model samples
    for cam in ("front", "wrist"):
        a, b = r["error_split_h16"][cam]["motion"], r["imagination_error_split_h16"][cam]["motion"]
        assert a["copy_outside"] == b["copy_outside"] > 0 and 0 < a["inside_share"] < 1
    assert r["train_episodes"] + r["heldout_episodes"] == r["dataset_episodes"]
    for k in ("ae_loss", "state_loss", "dyn_loss"):
        assert r[f"val_{k}"] > 0 and r[f"fit_{k}"] > 0


def test_world_model_benchmark_leaves_a_finished_training_alone(tmp_path):
    """Trained on a lent device (`train_only`), measured elsewhere: a run at its step budget is not trained again."""
    from world_models.video.train import TrainWMConfig

    trained = runpy.run_path(str(BENCH / "world_model.py"), run_name="bench")["_trained"]
    cfg = TrainWMConfig(data=tmp_path, out=tmp_path / "run", ae_steps=2, state_steps=3, dyn_steps=4, unroll_steps=1)
    assert not trained(cfg)  # nothing saved yet
    (tmp_path / "run/checkpoints/last").mkdir(parents=True)
    (tmp_path / "run/checkpoints/last/train_state.json").write_text('{"step": 9}')
    (tmp_path / "run/config.yaml").write_text("size: tiny\n")  # recorded before mirror existed: trained without
    assert not trained(cfg)  # 9 of 10 steps
    assert trained(TrainWMConfig(data=tmp_path, out=tmp_path / "run", ae_steps=2, state_steps=3, dyn_steps=4,
                                 unroll_steps=1, state_channel=False))  # 7 steps without the state channel: done
    (tmp_path / "run/checkpoints/last/train_state.json").write_text('{"step": 10}')
    assert trained(cfg)
    # a run trained without reflections is never measured as one trained with them (the default since 2026-12-06)
    with pytest.raises(ValueError, match="trained with mirror=False, this run asks for mirror=True"):
        trained(TrainWMConfig(data=tmp_path, out=tmp_path / "run", ae_steps=2, state_steps=3, dyn_steps=4,
                              unroll_steps=1, mirror=True))


@TINY_WORLD_MODEL
def test_world_model_posttrain_benchmark_compares_base_and_post_on_the_same_windows():
    r = _run("world_model_posttrain", moving_weight=1.0, old_ema=0.5)  # the reward's moving pixels, the soft-updated old model
    he = f"h{r['horizon']}"
    assert r["moving_weight"] == 1.0 and r["old_ema"] == 0.5
    mlo, mhi = r[f"moving_psnr_gain_{he}_motion_ci"]  # on the pixels that moved: paired like the whole frame
    assert mlo <= r[f"moving_psnr_gain_{he}_motion"] <= mhi  # the tiny data's motion windows have moving pixels
    for k in (f"paired_wins_{he}", f"paired_wins_{he}_motion", f"psnr_gain_{he}_motion", "one_chunk_psnr_change",
              f"ssim_change_{he}", f"check_base_vs_itself_wins_{he}", f"base_over_copy_{he}_motion", "post_train_minutes",
              f"ceiling_over_base_{he}_motion", "ceiling_over_base_h4_motion", f"state_oracle_over_base_{he}_motion"):
        assert k in r and r[k] == r[k], k
    lo, hi = r[f"state_oracle_over_base_{he}_motion_ci"]
    assert lo <= r[f"state_oracle_over_base_{he}_motion"] <= hi
    lo, hi = r[f"psnr_gain_{he}_motion_ci"]
    assert lo <= r[f"psnr_gain_{he}_motion"] <= hi
    assert r[f"psnr_gain_{he}_all"] == pytest.approx(r[f"psnr_{he}_post"] - r[f"psnr_{he}_base"])  # paired, same windows
    assert len(r[f"psnr_gain_{he}_motion_per_seed"]) == r["sampling_seeds"]
    s = _run("world_model_posttrain", spread="1,2")  # the candidates' spread per Euler-step count, no post-training
    assert [row["euler_steps"] for row in s["rows"]] == [1, 2]
    assert s["rows"][0]["reward_mean"] != s["rows"][1]["reward_mean"]  # other steps, other samples


def test_world_model_posttrain_downstream_pairs_two_rankings_of_its_base_and_post_trained_model(tmp_path):
    """The downstream keys come from two stored rankings (nothing is imagined again): the base's and the post-trained
    model's, the same policies on the same true episodes; a ranking on another model or other episodes is refused."""
    from wmrl.eval.rank import ranking_report

    downstream = runpy.run_path(str(BENCH / "world_model_posttrain.py"), run_name="bench")["downstream"]
    true = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]]
    base_imagined = [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]  # a and b swapped; 2 of 7 hallucinated
    post_imagined = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]]  # every episode right
    models = {"base": tmp_path / "wm", "post": tmp_path / "post-train" / "post"}

    def ranking(name, imagined, model, true=true):
        rows = [{"policy": p, "imagined_outcomes": i, "true_outcomes": t}
                for p, i, t in zip(("runs/a", "runs/b", "runs/c", "random"), imagined, true)]
        run = tmp_path / name
        run.mkdir(exist_ok=True)
        (run / "ranking.json").write_text(json.dumps({**ranking_report(rows, n_boot=20), "policies": rows,
                                                      "first_layout_seed": 9}))
        (run / "config.yaml").write_text(f"world_model: {model}\n")
        return run

    a, b = ranking("rank-base", base_imagined, models["base"]), ranking("rank-post", post_imagined, models["post"] / "checkpoints" / "last")
    r = downstream(f"{a},{b}", models["base"], models["post"])
    assert r["rank_spearman_base"] == pytest.approx(0.5) and r["rank_spearman_post"] == pytest.approx(1.0)
    assert r["hallucinated_base"] == pytest.approx(2 / 7) and r["hallucinated_post"] == 0.0  # the anchor left out
    assert r["rank_paired"]["hallucinated_b_minus_a"] == pytest.approx(-2 / 7)
    assert r["rank_paired"]["spearman_b_minus_a"] == pytest.approx(0.5) and r["rank_n_policies"] == 3
    assert r["rank_first_layout_seed"] == 9 and r["rank_episodes_per_policy"] == 4
    with pytest.raises(ValueError, match="not the post-trained model"):
        downstream(f"{a},{a}", models["base"], models["post"])
    other = ranking("rank-post-other", post_imagined, models["post"], true=[[1, 1, 1, 1]] + true[1:])
    with pytest.raises(ValueError, match="same true episodes"):
        downstream(f"{a},{other}", models["base"], models["post"])
    with pytest.raises(ValueError, match="two ranking run folders"):
        downstream(str(a), models["base"], models["post"])


@TINY_WORLD_MODEL
def test_world_model_frame_head_benchmark_scores_every_refit_on_the_same_rollouts():
    r = _run("world_model_frame_head")
    assert set(r["variants"]) == {"trained", "refit_again", "pos_weight_1", "horizon_80", "fresh"}
    frames = [v["frames"] for v in r["variants"].values()]
    assert r["spread"] == pytest.approx(max(frames) - min(frames))
    for v in r["variants"].values():
        lo, hi = v["frames_ci"]
        assert lo <= v["frames"] <= hi
    assert r["variants"]["trained"]["frames"] == pytest.approx(r["check_rollout_head_frames"])  # latents kept in step
    assert r["n_pairs"] >= 1 and r["random_scorer_auroc_matched"] == r["random_scorer_auroc_matched"]
    for v in r["variants"].values():  # hold 1 is the peak readout itself; the best hold is one of those measured
        assert v["holds"]["1"]["frames"] == pytest.approx(v["frames"]) and v["holds"]["1"]["real"] == pytest.approx(v["real"])
    for name, k in r["best_hold_frames"].items():
        assert all(r["variants"][name]["holds"][str(k)]["frames"] >= h["frames"] for h in r["variants"][name]["holds"].values())
    trained = r["variants"]["trained"]["holds"]
    for k in ("2", "3"):
        assert r["hold_gain"][k]["mean"] == pytest.approx(trained[k]["frames"] - trained["1"]["frames"])
    # the pixel classifier scores the same pairs, real and decoded generated frames, against the trained head
    px = r["pixels"]
    assert px["steps"] == 20 and 0 < px["positives"] < px["train_frames"]
    assert px["frames_ci"][0] <= px["frames"] <= px["frames_ci"][1] and px["real_ci"][0] <= px["real"] <= px["real_ci"][1]
    assert r["pixels_minus_trained"]["mean"] == pytest.approx(px["frames"] - r["variants"]["trained"]["frames"])
    # the ladder's ends are the pixel classifier's own real and generated scores; each step is a paired difference
    lad = r["pixel_ladder"]
    assert lad["real"]["auroc"] == pytest.approx(px["real"]) and lad["generated"]["auroc"] == pytest.approx(px["frames"])
    assert lad["generated_minus_generated_exact_points"]["mean"] == pytest.approx(
        lad["generated"]["auroc"] - lad["generated_exact_points"]["auroc"])
    assert lad["reconstructed_minus_real"]["mean"] == pytest.approx(lad["reconstructed"]["auroc"] - lad["real"]["auroc"])
    # the rigid object layer at the recorded points, compared with the generated frames on the same pairs
    assert lad["rigid_objects_exact_points_minus_generated"]["mean"] == pytest.approx(
        lad["rigid_objects_exact_points"]["auroc"] - lad["generated"]["auroc"])
    assert "rigid_objects" in lad
    # the classifier fitted on the model's own rollouts of the training episodes: as many frames as the real ones
    on = r["pixels_trained_on_rollouts"]
    assert on["rollouts"]["train_frames"] == px["train_frames"] and on["rollouts_and_real"]["train_frames"] == 2 * px["train_frames"]
    assert on["rollouts"]["frames_minus_real_trained"]["mean"] == pytest.approx(on["rollouts"]["frames"] - px["frames"])


def test_rigid_object_layer_pastes_the_start_frames_patch_where_the_object_now_is():
    """`paste_objects` on a camera looking straight down from 1 m (f = 1): an object moved 0.2 m along x shows its start
    frame's patch 0.2 image units (6.4 px) further right; pixels away from it keep the decoded frame."""
    from types import SimpleNamespace

    from world_models.video.networks import ChangeMask

    from world_models.video.change_mask import paste_objects as paste
    g = {"mount": "world", "R": np.eye(3).tolist(), "t": [0.0, 0.0, 1.0], "f": 1.0}
    model = SimpleNamespace(cfg=SimpleNamespace(camera_geometry={"front": g}, object_radius=0.05),
                            change_mask={"front": ChangeMask(warp_pose_dim=4, keep_unwarped=True, n_objects=1)})
    f0 = np.zeros((64, 64, 3), np.uint8)
    f0[29:35, 29:35] = 200  # the object at the image's centre at the start
    frames = {"observation.images.front": np.full((2, 64, 64, 3), 7, np.uint8)}
    p0 = torch.tensor([[0.3, 0.3, 0.5], [0.0, 0.0, 0.0]])  # [hand, object]
    points = torch.stack([p0, torch.tensor([[0.3, 0.3, 0.5], [0.2, 0.0, 0.0]])])  # still, then moved 0.2 m in x
    out = paste(model, frames, {"observation.images.front": f0}, p0, points)["observation.images.front"]
    assert out[0, 32, 32].tolist() == [200] * 3 and out[0, 32, 39].tolist() == [7] * 3
    assert out[1, 32, 38].tolist() == [200] * 3 and out[1, 32, 31].tolist() == [7] * 3
    assert (out[:, :20] == 7).all() and (out[:, :, :20] == 7).all()


def test_world_model_speed_rates_are_per_phase_medians_without_warm_up():
    rates = runpy.run_path(str(BENCH / "world_model_speed.py"), run_name="bench")["phase_rates"]
    # ae: intervals of 10 steps in 1 s (warm-up, left out), 0.1 s, 0.2 s, 0.1 s; dyn: 1 s (left out), 0.5, 0.5
    t = np.cumsum([0, 1, 0.1, 0.2, 0.1, 1, 1, 0.5, 0.5])
    rows = [{"time": float(x), "step": 10 * (i + 1), ("ae_loss" if i < 5 else "dyn_loss"): 1.0} for i, x in enumerate(t)]
    r = rates(rows)
    assert r["ae"] == pytest.approx(100.0) and r["dyn"] == pytest.approx(20.0) and set(r) == {"ae", "dyn"}


def test_world_model_speed_benchmark_times_every_phase():
    r = runpy.run_path(str(BENCH / "world_model_speed.py"), run_name="bench")["main"](quick=True, modes="eager", big_batch=0)
    run = r["runs"]["eager"]
    assert set(run["steps_per_s"]) == {"ae", "state", "dyn", "unroll"}  # the tiny data has a state channel
    # the whole budget's rate is a weighted harmonic mean of the phases' rates: between the slowest and the fastest
    assert min(run["steps_per_s"].values()) <= run["default_budget_steps_per_s"] <= max(run["steps_per_s"].values())


def test_conv_layout_benchmark_times_both_layouts_alternately_and_restores_the_fast_one(monkeypatch):
    from world_models.video import change_mask, networks

    seen, amp = [], []
    real, real_amp = networks.channels_last, change_mask.autocast
    monkeypatch.setattr(networks, "channels_last", lambda x: (seen.append(networks.CHANNELS_LAST), real(x))[1])
    monkeypatch.setattr(change_mask, "autocast", lambda device, on: (amp.append(on), real_amp(device, on))[1])
    r = _run("conv_layout")
    assert networks.CHANNELS_LAST is True  # the default layout is back after the benchmark
    # both layouts timed (the frozen-layer comparison runs in the default layout only)
    assert 0 < seen.count(False) < seen.count(True)
    for step in ("autoencoder_step", "change_mask_step", "pose_layer_render_64", "pose_layer_step"):
        t = r["threads"]["1"][step]
        assert t["speedup"] == pytest.approx(t["seconds_plain"] / t["seconds_channels_last"])
    t = r["threads"]["1"]["change_mask_step_pose_layer"]
    assert t["speedup"] == pytest.approx(t["seconds_backpropagated"] / t["seconds_frozen"])
    # the fits' steps timed in float32 and under bf16 autocast, alternately
    assert amp.count(True) == amp.count(False) > 0
    for step in ("change_mask_step_bf16", "pose_layer_step_bf16"):
        t = r["threads"]["1"][step]
        assert t["speedup"] == pytest.approx(t["seconds_float32"] / t["seconds_bf16"])
    assert isinstance(r["bf16_native"], bool)


@TINY_WORLD_MODEL
def test_mask_fit_precision_benchmark_repeats_the_runs_fit_and_pairs_both_precisions(tmp_path):
    """The refit starts where the run's training started its change mask: in the run's own precision (bf16 where this
    CPU computes it natively, the default) it repeats the run's fit weight for weight; both precisions' gains are
    paired on the same windows; a folder without a world model is refused."""
    from world_models.video.change_mask import native_bf16

    r = _run("mask_fit_precision")
    own = "bf16" if native_bf16("cpu") else "float32"
    assert r[f"{own}_max_weight_diff_to_run"] == 0.0
    for b in ("bf16", "float32_layer_b"):
        for split in ("motion", "all"):
            key = f"{b}_minus_float32_psnr_h{r['horizon']}_{split}"
            assert np.isfinite(r[key]) and r[f"{key}_ci"][0] <= r[key] <= r[f"{key}_ci"][1]
    assert r["bf16_mask_fit_time_ratio"] == pytest.approx(r["bf16_fit"]["mask_seconds"] / r["float32_fit"]["mask_seconds"])
    with pytest.raises(ValueError, match="no world_model/config.yaml"):
        runpy.run_path(str(BENCH / "mask_fit_precision.py"), run_name="bench")["main"](run=str(tmp_path))


def test_imagination_benchmark_reports_every_result_key(quick_demo):
    bench = runpy.run_path(str(BENCH / "imagination.py"), run_name="bench")
    r = bench["main"](quick=True, work=str(quick_demo.parent))  # resumes the shared quick demo
    for name in ("bc", "rl"):  # a success rate is the mean of its per-seed rates, each a count over the episodes
        per_seed = r[f"success_{name}_per_seed"]
        assert len(per_seed) == r["eval_seeds"] and r[f"success_{name}"] == pytest.approx(np.mean(per_seed))
        assert all(abs(x * r["episodes_per_seed"] - round(x * r["episodes_per_seed"])) < 1e-9 for x in per_seed)
    lo, hi = r["success_rl_ci95"]
    assert lo <= r["success_rl"] <= hi
    learned = [p for p in r["population"] if not is_anchor(p["policy"])]  # the headline leaves the anchors out
    assert r["true_env_steps_during_rl"] == 0 and len(r["population"]) >= 8 and r["n_policies"] == len(learned)
    # the reported agreement is computed from the learned policies' rows, and the true-simulator side of the ranking
    # separates the scripted expert from a random policy (else no world model could be judged against it)
    rows = {p["policy"]: p for p in r["population"]}
    recomputed = rank_statistics([p["imagined_success"] for p in learned], [p["true_success"] for p in learned])
    assert r["success_abs_error"] == pytest.approx(recomputed["success_abs_error"])
    assert r["rank_mmrv"] == pytest.approx(recomputed["rank_mmrv"]) and r["episodes_per_policy"] == 2
    assert "rank_noise_ceiling" in r and len(r["rank_spearman_ci"]) == 2
    scripted = [p for k, p in rows.items() if k.startswith("scripted")]  # 2 episodes each: the best of three experts
    assert max(p["true_success"] for p in scripted) > rows["random"]["true_success"]
    if r["imagined_sft"]["steps"] == 0:  # nothing was imagined successfully: the policy is unchanged
        assert r["success_after_imagined_sft"] == r["success_bc"]


def test_offline_benchmark_reports_point_results_and_budgets():
    r = _run("offline")
    for algo in ("mbpo_true", "ravl_true"):
        s = r["point"][algo]
        assert s["normalized_return_mean"] == s["normalized_return_mean"]  # a number, not NaN
        assert s["q_rollout_end_final_mean"] == s["q_rollout_end_final_mean"]
    assert r["budgets"]["point"]["k"] == 5 and r["seeds"] == {"point": 1}
    for k in ("wsrl_final", "naive_finetune_final", "naive_retain_finetune_final", "weighted_vs_uniform"):
        assert r[k] == r[k], k


def test_pgd_benchmark_reports_dynamics_error_likelihood_and_returns():
    r = _run("pgd")
    res = r["PointEdge-v0"]
    assert set(res["dyn_error"]) == {"pgd_unguided", "pgd_guided_1", "ensemble", "dataset"}
    assert res["dyn_error"]["dataset"]["h8"] < 1e-8  # the measurement itself: real windows obey the simulator
    for k in ("dyn_error_ensemble_h8", "dyn_error_pgd_unguided_h8", "dyn_error_pgd_guided_h8", "target_logprob_unguided"):
        assert r[k] == r[k], k  # numbers, not NaN
    for agent in ("td3bc", "iql"):
        assert len(res["downstream"][agent]["pgd"]["per_seed"]) == r["seeds"] == 1


@pytest.mark.timing
def test_deploy_benchmark_reports_timing_and_a_clean_fuzz():
    r = _run("deploy")
    assert r["unsafe_commands_sent"] == 0 and r["changes_without_trip"] == 0  # the safety layer's two promises
    assert r["stale_commands_that_moved"] == 0 and r["stale_commands"] > 0
    assert r["deadline_miss_rate"]["sync_20hz"] > r["deadline_miss_rate"]["aligned_20hz"]  # sync blocks on inference
    assert r["boundary_jerk_ratio_aligned_vs_replace"] < 1.0
    # the robot server, attacked directly: nothing unsafe at the arm, no crash, no stranger served
    assert r["server_unsafe_commands_applied"] == 0 and r["server_trips_recorded"] > r["direct_commands"] // 4
    assert r["server_crashes"] == 0 and r["unauthenticated_accepted"] == 0 and r["allowed_client_served"]


def test_twin_benchmark_reports_parameter_recovery():
    r = _run("twin")
    assert set(r["param_rel_error"]) == {"arm_damping", "arm_kp", "latency_s", "camera_fovy", "light_intensity",
                                         "cube_mass", "cube_friction"}
    for stage in ("traj_error", "image_error", "push_traj_error"):  # never worse than the starting twin
        assert r[f"{stage}_after"] <= r[f"{stage}_before"], stage
    assert r["reprojection_px_before"] > 0 and r["camera_position_error_mm"] >= 0
    assert [c["real_steps"] for c in r["twinrl_curves"]["guided"][0]][0] == 0
    assert set(r["twinrl_curves"]) == {"guided", "uniform", "corrections"}
    # the guided run's reported final success is the last point of its curves (the sim-to-real table's source)
    assert r["real_success_twin_guided"] == pytest.approx(np.mean([c[-1]["real_success"] for c in r["twinrl_curves"]["guided"]]))


def test_policy_benchmark_compares_every_recipe_on_the_same_layouts():
    r = _run("policy")
    res = r["results"]
    assert set(res) == {"recorded_n4", "expert_n1", "expert_te", "expert_aux", "expert_more", "dagger",
                        "scripted_expert"}
    for v in res.values():  # the pooled rate is the count over every evaluation seed, inside its Wilson interval
        assert v["episodes"] == 3 and v["ci"][0] - 1e-9 <= v["success"] <= v["ci"][1] + 1e-9
        assert v["success"] == pytest.approx(np.mean(v["per_seed"])) and 0 <= v["stalled"] <= 1 - v["success"]
    assert res["scripted_expert"]["success"] >= 0.5  # the ceiling: the clean expert on the same layouts
    assert res["dagger"]["steps"] == res["expert_more"]["steps"] == res["expert_n1"]["steps"] + 2
    assert [d["round"] for d in res["dagger"]["rounds"]] == [0]
    assert r["success_bc"] == max(v["success"] for k, v in res.items() if k != "scripted_expert")


def test_imitation_ceiling_benchmark_shares_data_and_fits_its_labels():
    r = _run("imitation_ceiling")
    res = r["results"]
    assert set(res) == {"reach_small", "push_small", "push_large", "push_large_noisy", "push_large_5x_layouts",
                        "scripted_expert_reach-red", "scripted_expert_push-red"}
    for v in res.values():
        assert v["episodes"] == 3 and v["success"] == pytest.approx(np.mean(v["per_seed"]))
    # variants on the same collection train on the same frames; the noisy collection is another one
    assert res["push_small"]["data_frames"] == res["push_large"]["data_frames"]
    assert res["push_large_noisy"]["noise"] == 0.3 and res["push_large"]["noise"] == 0.1
    assert res["push_large_5x_layouts"]["data_episodes"] == 5 * res["push_large"]["data_episodes"]
    assert res["push_large_5x_layouts"]["data_frames"] > res["push_large"]["data_frames"]
    assert res["scripted_expert_push-red"]["success"] >= 0.5 and res["scripted_expert_reach-red"]["success"] >= 0.5


def test_imitation_ceiling_dagger_aggregates_the_learners_states():
    r = runpy.run_path(str(BENCH / "imitation_ceiling.py"), run_name="bench")["main"](
        quick=True, variants="push_large_dagger,push_large_more_steps")
    res = r["results"]
    rounds = res["push_large_dagger"]["dagger"]
    assert [d["round"] for d in rounds] == [1, 2, 3]
    frames = [res["push_large_dagger"]["data_frames"]] + [d["frames"] for d in rounds]
    assert all(b > a for a, b in zip(frames, frames[1:]))  # each round adds the learner's visited states
    assert res["push_large_dagger"]["total_steps"] == res["push_large_more_steps"]["steps"]
    assert "imitation-ceiling" in r["command"] and "variants=push_large_dagger" in r["command"]


def test_imitation_ceiling_trims_episodes_where_the_cube_left_reach():
    mod = runpy.run_path(str(BENCH / "imitation_ceiling.py"), run_name="bench")
    from sim.tabletop.model import WORKSPACE_HIGH

    env = np.zeros((6, 13), np.float32)
    env[:, 0:3] = [0.4, 0.0, 0.02]  # the red cube on the table, inside the box
    ep = {"observation.environment_state": env.copy(), "action": np.zeros((6, 4), np.float32)}
    assert mod["_reachable_frames"](ep, "push-red") == 6
    env[4:, 0] = WORKSPACE_HIGH[0] + 0.01  # pushed beyond the arm's box at frame 4
    assert mod["_reachable_frames"]({**ep, "observation.environment_state": env}, "push-red") == 4
    env[2:, 2] = -1.0  # fell off the table at frame 2
    assert mod["_reachable_frames"]({**ep, "observation.environment_state": env}, "push-red") == 2
    env[:, 3:6] = 9.0  # another cube's whereabouts do not matter
    env[:, 0:3] = [0.4, 0.0, 0.02]
    assert mod["_reachable_frames"]({**ep, "observation.environment_state": env}, "push-red") == 6


def test_privileged_state_policy_learns_a_smooth_controller():
    """The probe's learner and training loop fit a known function of its inputs (a check that a low imitation
    ceiling is the expert's, not a broken learner's)."""
    mod = runpy.run_path(str(BENCH / "imitation_ceiling.py"), run_name="bench")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 6)).astype(np.float32) * 3 + 1
    W = rng.normal(size=(6, 4)).astype(np.float32)
    Y = np.tanh((X - 1) / 3 @ W / 2).astype(np.float32)
    policy = mod["PrivilegedStatePolicy"](6, 64, 2)
    assert mod["_mse"](policy, X, Y) > 0.05
    assert mod["_train"](policy, X, Y, steps=600) < 0.005
    obs = {"observation.state": X[:3, :4], "observation.environment_state": X[:3, 4:]}
    np.testing.assert_allclose(policy.select_action(obs), policy.actor.mu(torch.as_tensor(X[:3])).detach().numpy(), atol=1e-6)


def test_privileged_state_flow_head_keeps_two_modes_apart_where_the_regressor_averages():
    """Two expert actions for the same state (+0.8 or -0.8): regression learns their mean, flow matching samples
    both (the averaging the imitation-ceiling benchmark tests as a cause of stalls)."""
    mod = runpy.run_path(str(BENCH / "imitation_ceiling.py"), run_name="bench")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3)).astype(np.float32)
    Y = np.repeat(np.where(rng.random((2000, 1)) < 0.5, 0.8, -0.8), 4, 1).astype(np.float32)
    out = {}
    for head in ("mse", "flow"):
        policy = mod["PrivilegedStatePolicy"](3, 64, 2, head=head)
        mod["_train"](policy, X, Y, steps=1500)
        with torch.no_grad():
            out[head] = policy.act(torch.as_tensor(X[:400]))[:, 0].numpy()
    assert np.abs(out["mse"]).mean() < 0.2  # the mean of the two modes
    assert np.mean(np.abs(np.abs(out["flow"]) - 0.8) < 0.2) > 0.8  # samples land on a mode
    assert 0.3 < np.mean(out["flow"] > 0) < 0.7  # and on both
    with pytest.raises(ValueError, match="head"):
        mod["PrivilegedStatePolicy"](3, 8, 1, head="diffusion")


def test_contact_predictability_benchmark_checks_its_metric():
    r = _run("contact_predictability")
    assert r["mean_baseline"]["r2_moving"] <= 0.0  # the training mean explains nothing on held-out moving steps
    assert r["mean_baseline"]["length_ratio_moving"] < 0.1
    for name in ("state_channel", "+ee_velocity", "+yaw_joint_velocity", "+cube_velocity"):
        assert set(r[name]) >= {"r2_moving", "length_ratio_moving", "length_ratio_kicks", "cosine_moving", "n_features"}
    assert r["state_channel"]["n_features"] < r["+cube_velocity"]["n_features"]
    assert 0.0 < r["true_sim_moving_steps_finger_far_share"] < 1.0 and r["test_moving_rows"] > 0


def test_metaworld_benchmark_checks_its_metric():
    import sim.metaworld

    if not sim.metaworld.available():
        pytest.skip("Meta-World not installed (pip install 'wmrl[metaworld]')")
    r = _run("metaworld")
    reach = r["tasks"]["reach"]
    assert reach["random"]["success"] == 0.0 and reach["expert"]["success"] == 1.0  # the baseline and the ceiling
    assert reach["expert_failure_mode"]["success"] == 0.0
    assert 5.0 < reach["expert_failure_mode"]["median_final_goal_distance_cm"] < 12.0  # a near miss, not a random one
    assert reach["random"]["median_final_goal_distance_cm"] > reach["expert_failure_mode"]["median_final_goal_distance_cm"]
    assert r["random_success_max"] == 0.0
    assert reach["steps_per_s_state_only"] > reach["steps_per_s_two_cameras_64px"] > 0


@pytest.mark.timing
def test_offline_speed_counts_the_work_of_each_update():
    r = _run("offline_speed")
    assert r["flop_counter_check"]["counted"] == r["flop_counter_check"]["expected"]
    a = r["agents"]
    # EDAC's diversity term (a double backward) and 5x the critics each add work
    assert a["ravl"]["gflop_per_update"] > a["sac-n"]["gflop_per_update"] > a["mbpo_sac"]["gflop_per_update"]
    # one forward for the TD loss and EDAC's gradients, no critic weight gradients in the actor's step: less product
    # work than the previous update, which the benchmark times beside it
    assert a["ravl"]["gflop_per_update"] < 0.8 * a["ravl_previous"]["gflop_per_update"]
    assert r["ravl_speedup_vs_previous"] == pytest.approx(a["ravl"]["updates_per_s"] / a["ravl_previous"]["updates_per_s"])
    assert all(0 < x["share_of_peak"] < 1 for x in a.values())  # nothing runs above the machine's product rate
    for name in ("iql", "td3bc"):  # the peer ran on the same batch (asserted inside) and the ratio is ours / theirs
        assert r[f"speedup_vs_torchrl_{name}"] == pytest.approx(r[f"{name}_updates_per_s"] / r[f"torchrl_{name}_updates_per_s"])


def test_published_results_name_no_machine_paths_and_are_strict_json(tmp_path):
    import json

    from wmrl.benchutil import RESULTS, portable

    root = str(RESULTS.parent.parent)
    out = portable({"policy": f"{root}/runs/demo/policy_bc/checkpoints/last:stochastic", "other": "/elsewhere/x",
                    "rate": float("nan"), "curve": [1.0, float("inf")], "n": 3}, roots=(root + "/",))
    assert out == {"policy": "runs/demo/policy_bc/checkpoints/last:stochastic", "other": "/elsewhere/x", "rate": None,
                   "curve": [1.0, None], "n": 3}
    for f in RESULTS.glob("*.json"):  # what is committed obeys the same rule
        text = f.read_text()
        json.loads(text, parse_constant=lambda c: pytest.fail(f"{f.name}: {c} is not strict JSON"))
        assert root not in text, f.name


@TINY_LONG_WORLD_MODEL
def test_world_model_mean_path_benchmark_measures_both_variants_on_the_same_windows():
    r = _run("world_model_mean_path")
    for v in ("pure", "mean"):
        for s in (1, 3):
            assert r[f"{v}_steps{s}_motion_psnr_gain_h16"] == r[f"{v}_steps{s}_motion_psnr_gain_h16"], (v, s)
    # the paired difference is the difference of the two variants' means on the same motion windows
    d = r["pure_steps1_motion_psnr_gain_h16"] + r["mean_minus_pure_steps1_motion_gain"]
    assert d == pytest.approx(r["mean_steps1_motion_psnr_gain_h16"], abs=1e-6)


def test_so101_benchmark_checks_its_metric():
    import sim.so101

    if not sim.so101.available():
        pytest.skip("the SO-101 model is not installed (pip install 'wmrl[so101]')")
    r = _run("so101")
    assert r["kinematics"]["fk_max_error_m"] < 1e-9 and r["kinematics"]["ik_error_mm_max"] < 0.5
    assert r["task"]["expert"]["success"] == 1.0 and r["task"]["random"]["success"] == 0.0  # ceiling and baseline
    assert r["deployment"]["success"] == 1.0 and not r["deployment"]["estopped"]
    fuzz = r["safety_fuzz"]
    assert fuzz["max_joint_excursion_past_limits_rad"] == 0.0 and fuzz["min_tip_height_m"] > 0.0
    assert fuzz["trips"]["invalid_command"] >= 1 and fuzz["trips"]["joint_limit"] > 0  # the fuzz reached the limits
    assert r["rendering"]["mesh_faces_full_cad"] > 20 * r["rendering"]["mesh_faces_simplified"]


def test_rank_noise_population_degrades_one_policy_and_ranks_the_levels(quick_demo):
    """The noise-level population on the shared quick demo: the BC policy and the same policy with action noise are
    both ranked (paired, learned rows only in the headline), and the levels are reported."""
    bench = runpy.run_path(str(BENCH / "rank_noise_population.py"), run_name="bench")
    r = bench["main"](quick=True, task="push-red", work=str(quick_demo))
    specs = [p["policy"] for p in r["population"]]
    assert any(s.endswith(":noise=0.3") for s in specs) and "random" in specs and r["noise_levels"] == [0.3]
    assert r["n_policies"] == 2 and "rank_noise_ceiling" in r


def test_state_noise_perturbs_only_the_object_channel_as_a_bias_or_a_jitter():
    mod = runpy.run_path(str(BENCH / "imitation_ceiling.py"), run_name="bench")

    class Echo:  # returns the object channel it was given
        resets = 0

        def reset(self):
            Echo.resets += 1

        def select_action(self, obs):
            assert np.all(obs["observation.state"] == 1.0)  # proprioception untouched
            return np.array(obs["observation.environment_state"], copy=True)

    obs = {"observation.state": np.ones((1, 8), np.float32), "observation.environment_state": np.zeros((1, 13), np.float32)}
    bias = mod["StateNoise"](Echo(), 0.01, per_episode=True)
    bias.reset()
    a, b = bias.select_action(obs), bias.select_action(obs)
    np.testing.assert_array_equal(a, b)  # the same offset all episode
    assert 0.003 < np.std(a) < 0.03
    bias.reset()
    assert not np.array_equal(bias.select_action(obs), a) and Echo.resets == 2  # a new one per episode
    jitter = mod["StateNoise"](Echo(), 0.01, per_episode=False)
    jitter.reset()
    assert not np.array_equal(jitter.select_action(obs), jitter.select_action(obs))
    np.testing.assert_array_equal(mod["StateNoise"](Echo(), 0.0, per_episode=False).select_action(obs), 0.0)
    with pytest.raises(ValueError, match="sigma"):
        mod["StateNoise"](Echo(), float("nan"), per_episode=True)
    r = runpy.run_path(str(BENCH / "imitation_ceiling.py"), run_name="bench")["main"](
        quick=True, variants="push_5x_state_noise,push_pixels_estimated")
    rows = r["results"]["push_5x_state_noise"]["state_noise"]
    assert [(x["sigma_m"], x["mode"]) for x in rows] == [(s, m) for s in (0.0025, 0.005, 0.01, 0.02) for m in ("offset", "jitter")]
    pixels = r["results"]["push_pixels_estimated"]
    assert pixels["cameras"] == ["front", "wrist"] and [x["step"] for x in pixels["estimator"]] == [2, 4]
    assert pixels["true_state"]["episodes"] == pixels["episodes"]  # the state reference on the same layouts


def test_imitation_ceiling_trains_pixel_policies_once_and_measures_them_elsewhere(tmp_path):
    """`train_only` (a lent device) writes each pixel policy with its record and measures nothing; the same options
    without it load those policies instead of training again."""
    main = runpy.run_path(str(BENCH / "imitation_ceiling.py"), run_name="bench")["main"]
    with pytest.raises(ValueError, match="pixel variants only"):
        main(quick=True, variants="push_small", train_only=True, policies=str(tmp_path))
    with pytest.raises(ValueError, match="policies"):
        main(quick=True, variants="push_pixels_estimated_short", train_only=True)
    trained = main(quick=True, variants="push_pixels_estimated_short", train_only=True, policies=str(tmp_path), num_envs=2)
    folder = tmp_path / "push_pixels_estimated_short"
    assert trained["trained"]["push_pixels_estimated_short"]["trained"] == str(folder)
    assert "success" not in trained["trained"]["push_pixels_estimated_short"]
    weights = (folder / "model.safetensors").read_bytes()
    record = json.loads((folder / "record.json").read_text())
    measured = main(quick=True, variants="push_pixels_estimated_short", policies=str(tmp_path))
    row = measured["results"]["push_pixels_estimated_short"]
    assert row["estimator"] == record["estimator"] and row["trained_on"] == "cpu"
    assert (folder / "model.safetensors").read_bytes() == weights  # loaded, not retrained
    assert row["episodes"] == 3 and "policies=" in measured["command"]
    (folder / "record.json").unlink()  # a policy the benchmark did not write is never overwritten
    with pytest.raises(FileNotFoundError, match="not overwritten"):
        main(quick=True, variants="push_pixels_estimated_short", policies=str(tmp_path))
    assert (folder / "model.safetensors").read_bytes() == weights



def test_privileged_learner_reads_which_zone_the_instruction_names():
    """The object channel lists both zones in a fixed order; only the instruction says which one a push goes to. A
    cube fallen off the table reads at the table's edge."""
    mod = runpy.run_path(str(BENCH / "imitation_ceiling.py"), run_name="bench")
    vocab = mod["task_vocab"]("push-red")
    assert {"purple", "yellow", "red"} <= set(vocab)
    obs = {"observation.state": np.zeros((2, 8), np.float32), "observation.environment_state": np.zeros((2, 13), np.float32),
           "task": ["push the red cube to the yellow zone", "push the red cube to the purple zone"]}
    obs["observation.environment_state"][0, :3] = [0.2, 3.0, -5.0]  # the red cube fell off the table's side
    x = mod["state_features"](obs, vocab)
    assert x.shape == (2, 21 + len(vocab))
    from wmrl.core.arm import OFF_TABLE_Z, TABLE_HIGH

    np.testing.assert_allclose(x[0, 8:11], [0.2, TABLE_HIGH[1], OFF_TABLE_Z])  # read at the edge, as the actors do
    assert x[0, 21 + vocab.index("yellow")] == 1 and x[0, 21 + vocab.index("purple")] == 0
    assert x[1, 21 + vocab.index("purple")] == 1 and x[1, 21 + vocab.index("yellow")] == 0


@pytest.fixture(scope="module")
def ies_quick(tmp_path_factory):
    """The imagination-estimated-state benchmark's quick run in a kept work folder (its tiny world model, BC data,
    start actor and RL actor), shared with the state-population ranking's test. Returns (result, work folder)."""
    work = tmp_path_factory.mktemp("ies") / "w"
    r = runpy.run_path(str(BENCH / "imagination_estimated_state.py"), run_name="bench")["main"](quick=True, work=str(work))
    return r, work


def test_imagination_estimated_state_benchmark_pairs_its_evaluations(ies_quick):
    import runpy as _runpy

    mod = _runpy.run_path(str(BENCH / "imagination_estimated_state.py"), run_name="bench")
    # the paired gain on a hand example: 3 layouts won, 1 lost, 6 unchanged
    g = mod["paired_gain"]([0, 0, 0, 1, 1, 0, 0, 0, 1, 1], [1, 1, 1, 0, 1, 0, 0, 0, 1, 1])
    assert g["gain"] == pytest.approx(0.2) and (g["layouts_won"], g["layouts_lost"]) == (3, 1)
    assert g["ci"][0] <= 0.2 <= g["ci"][1]
    r = ies_quick[0]
    assert r["true_env_steps_during_rl"] == 0 and r["episodes_per_evaluation"] == 3
    assert r["success_gain_points"] == pytest.approx(100 * (r["success_rl"] - r["success_rl_start"]))
    assert r["paired"]["gain"] == pytest.approx(r["success_rl"] - r["success_rl_start"])  # the same layouts
    for key, rate in (("outcomes_start", "success_rl_start"), ("outcomes_rl", "success_rl")):  # layout by layout
        assert len(r[key]) == 3 and set(r[key]) <= {"0", "1"} and r[key].count("1") / 3 == pytest.approx(r[rate])
    assert mod["outcome_string"]([True, False, True]) == "101"
    assert [c["iteration"] for c in r["curve"]] == [1] and r["cameras"].startswith("none")
    f = r["closed_loop_fidelity"]  # the counts are a partition of the same starts
    n = f["episodes"]
    assert f["both"] + f["true_only"] == round(f["true_success"] * n) and f["both"] + f["imagined_only"] == round(f["imagined_success"] * n)
    assert f["agreement"] == pytest.approx(1 - (f["true_only"] + f["imagined_only"]) / n) and f["state_rest"]


def test_imagination_estimated_state_benchmark_passes_its_readout_gate_and_settle_to_the_rl_run(ies_quick, tmp_path):
    """`readout=`, `gate=` and `settle=` reach the RL run in imagination (its config), name its folder and result,
    and an unknown one is refused before anything runs."""
    import shutil

    import yaml

    mod = runpy.run_path(str(BENCH / "imagination_estimated_state.py"), run_name="bench")
    work = tmp_path / "w"  # a copy: the shared work folder's RL runs are the population other tests rank
    shutil.copytree(ies_quick[1], work, symlinks=True)
    with pytest.raises(ValueError, match="expected a readout in"):
        mod["main"](quick=True, work=str(work), readout="median")
    with pytest.raises(ValueError, match="gate in"):
        mod["main"](quick=True, work=str(work), gate="always")
    with pytest.raises(ValueError, match="settle: expected on or off"):
        mod["main"](quick=True, work=str(work), settle="sometimes")
    r = mod["main"](quick=True, work=str(work), readout="consensus", gate="shared", checkpoints="true", settle="off")
    assert r["budgets"]["readout"] == "consensus" and r["budgets"]["gate"] == "shared" and r["budgets"]["settle"] == "off"
    assert r["true_along_the_run"] == []  # one iteration: its only checkpoint is the last, evaluated as the result
    assert r["command"].endswith("settle=off")
    run = next(work.glob("rl-objects-*-consensus-gate-shared-settle-off"))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert (cfg["state_readout"], cfg["state_gate"], cfg["state_settle"]) == ("consensus", "shared", False)


def test_perfect_model_ceiling_steps_in_workers_checkpoints_and_resumes(ies_quick, tmp_path):
    """The perfect-model ceiling's RL with its envs in two worker processes: the workers' simulator steps are counted
    (80 per rollout at most), it uses the imagination run's minibatch rule, and a rerun from the first checkpoint
    (the second removed, as a kill would leave it) reproduces the second iteration's record exactly."""
    import os

    from policies.estimated_state import EstimatedStatePolicy

    mod = runpy.run_path(str(BENCH / "imagination_estimated_state.py"), run_name="bench")
    assert mod["ppo_minibatch"](16, 8) == 16 and mod["ppo_minibatch"](128, 8) == 128
    bc = ies_quick[1] / "bc-objects"
    out = tmp_path / "ceiling"
    run = lambda: mod["rl_in_true_simulator"](EstimatedStatePolicy.load(bc), 2, 2, 2, 1e-4, "ppo", 0, out, workers=2)
    first = run()
    assert [c["iteration"] for c in first] == [1, 2]
    assert 0 < first[0]["true_env_steps"] <= 4 * 80 and first[1]["true_env_steps"] > first[0]["true_env_steps"]
    ck = out / "checkpoints"
    assert sorted(p.name for p in ck.glob("ckpt-*")) == ["ckpt-000000001", "ckpt-000000002"]
    import shutil

    shutil.rmtree(ck / "ckpt-000000002")
    (ck / ".l").symlink_to("ckpt-000000001")
    os.replace(ck / ".l", ck / "last")
    again = run()
    assert again[1] == first[1]


def test_rl_checkpoint_selection_pools_checkpoints_and_reports_each_models_pick(ies_quick, tmp_path):
    """The checkpoint-selection benchmark on the quick work folder's RL run: the start actor and the run's checkpoint
    are ranked in the training model and a held-out one (the same tiny model here) on paired layouts; the deterministic
    actors' true outcomes agree between the two rankings; the pick rule on a hand example; runs from another start
    are refused."""
    import shutil

    import yaml

    mod = runpy.run_path(str(BENCH / "rl_checkpoint_selection.py"), run_name="bench")
    p = mod["picked"]([0.3, 0.5, 0.5, 0.4], [0.27, 0.35, 0.31, 0.30], [0, 20, 40, 60])
    assert p == {"iteration": 40, "true_success": 0.31, "true_regret": pytest.approx(0.04)}  # the later of a tie
    work = ies_quick[1]
    rl = next(work.glob("rl-objects-*"))
    r = mod["main"](quick=True, work=str(tmp_path), runs=str(rl), heldout=str(work / "wm"))
    its = [c["iteration"] for c in r["checkpoints"]]
    assert its[0] == 0 and its[1:] == sorted(int(c.name[5:14]) for c in rl.glob("checkpoints/ckpt-*"))
    assert all(c["true_success"] == c["true_success_heldout_run"] for c in r["checkpoints"])
    other = tmp_path / "other"
    shutil.copytree(rl, other, symlinks=True)
    cfg = yaml.safe_load((other / "config.yaml").read_text())
    (other / "config.yaml").write_text(yaml.safe_dump({**cfg, "policy": "elsewhere"}))
    with pytest.raises(ValueError, match="one training world model and start actor"):
        mod["checkpoints"]([rl, other])


def test_rank_state_population_ranks_actors_trained_and_degraded_here(ies_quick):
    """The state-actor population on the imagination-estimated-state benchmark's quick work folder: the start actor
    and its sampling copy, an actor trained here and its noisy copy, the RL actor found there, paired and ranked
    with the anchors apart; rows name actors by their folders inside the work folder."""
    work = ies_quick[1]
    bench = runpy.run_path(str(BENCH / "rank_state_population.py"), run_name="bench")
    r = bench["main"](quick=True, work=str(work))  # ranks the trained actor, its noisy copy and the random anchor
    specs = [p["policy"] for p in r["population"]]
    assert specs == ["estimated-state:rank-actors/bc-objects-32x2-10",
                     "estimated-state:rank-actors/bc-objects-32x2-10:noise=0.3", "random"]
    assert r["n_policies"] == 2 and r["episodes_per_policy"] == 2 and "rank_noise_ceiling" in r
    from wmrl.eval.rank import FRESH_LAYOUTS
    assert r["first_layout_seed"] == FRESH_LAYOUTS and r["seen_layouts"] == 0  # none the models learned from
    # an episode's best dense reward is 1 where it succeeds: progress is at least the success rate, on both sides
    assert "rank_spearman_progress" in r
    assert all(p[f"{k}_progress"] >= p[f"{k}_success"] for p in r["population"] for k in ("imagined", "true"))
    trained = work / "rank-actors" / "bc-objects-32x2-10"
    assert (trained / "model.safetensors").exists()
    # the whole population: the start actor and its sampling copy, the actors trained here, the strongest degraded,
    # the RL actor found in the work folder, the anchors
    full = bench["population"](work, work / "bc-objects", [trained], (0.3, 0.6))
    rl = next(work.glob("rl-objects-*/checkpoints/last"))
    assert full == [f"estimated-state:{work / 'bc-objects'}", f"estimated-state:{work / 'bc-objects'}:stochastic",
                    f"estimated-state:{trained}", f"estimated-state:{trained}:noise=0.3", f"estimated-state:{trained}:noise=0.6",
                    f"estimated-state:{rl}", "scripted:noise=0.3", "random"]


def test_rank_state_population_ranks_pixel_policies_on_frames_or_objects(ies_quick, tmp_path):
    """`pixels=`: two-stage pixel policies instead of state actors; `acting=objects` makes each read the predicted
    objects in imagination."""
    from policies.estimated_state.train import train_estimated_state

    work = ies_quick[1]
    bench = runpy.run_path(str(BENCH / "rank_state_population.py"), run_name="bench")
    a, b = tmp_path / "a", tmp_path / "b"
    assert bench["pixel_population"]([a, b], (0.3,), "objects") == [
        f"estimated-state:{a}:objects", f"estimated-state:{a}:stochastic:objects", f"estimated-state:{b}:objects",
        f"estimated-state:{b}:stochastic:objects", f"estimated-state:{b}:noise=0.3:objects", "scripted:noise=0.3", "random"]
    with pytest.raises(ValueError, match="acting"):
        bench["pixel_population"]([a], (0.3,), "pixels")
    with pytest.raises(ValueError, match="no model.safetensors"):
        bench["main"](quick=True, work=str(work), pixels=str(a))
    policy, _ = train_estimated_state([work / "bc-data"], estimator_steps=2, actor_steps=10, holdout_episodes=2, width=8,
                                      hidden=16, layers=1, progress=False)
    assert policy.cfg.cameras and policy.cfg.estimate_noise
    policy.save(a)
    r = bench["main"](quick=True, work=str(work), pixels=str(a), acting="objects")
    assert [p["policy"] for p in r["population"]] == [f"estimated-state:{a}:objects",
                                                      f"estimated-state:{a}:noise=0.3:objects", "random"]
    assert r["acting"] == "objects" and r["pixel_policies"] == [str(a)] and r["n_policies"] == 2
    assert "pixels=" in r["command"] and "acting=objects" in r["command"]


def test_estimator_on_generated_frames_compares_each_step_with_the_models_own_objects(ies_quick, tmp_path):
    """Step 0 is the real start frame, so the estimate's error against the world model's objects there equals its
    error against the true simulator's objects at the same start."""
    from policies.estimated_state.train import train_estimated_state

    work = ies_quick[1]
    bench = runpy.run_path(str(BENCH / "estimator_on_generated_frames.py"), run_name="bench")
    est = np.zeros((2, 13), np.float32)
    objects = est.copy()
    objects[0, 0:2] = [0.03, 0.04]  # the first cube 5 cm off in xy: a third of it over the three cubes
    np.testing.assert_allclose(bench["cube_xy_error_cm"](est, objects), [5 / 3, 0.0], rtol=1e-5)
    policy, _ = train_estimated_state([work / "bc-data"], estimator_steps=2, actor_steps=10, holdout_episodes=2, width=8,
                                      hidden=16, layers=1, progress=False)
    policy.save(tmp_path / "pix")
    r = bench["main"](quick=True, policy=str(tmp_path / "pix"), world_model=str(work / "wm"), data=str(work / "wm-data"),
                      windows=4)
    assert r["steps"] == [0, 1, 2] and r["live_episodes_generated"][0] == r["episodes"] == 2
    assert r["generated_vs_model_cm"][0] == pytest.approx(r["real_vs_true_cm"][0], rel=1e-4)
    # the open-loop split: each camera's frame generated alone, and its real frame with only the cubes' pixels
    # generated or all but them
    h1 = r["open_loop"]["h1"]
    assert set(h1) == {"real", "generated", "state_channel_vs_true"} | {
        f"{kind}" for c in ("front", "wrist") for kind in (f"generated_{c}_only", f"real_{c}_generated_cubes",
                                                           f"generated_{c}_real_cubes")}
    assert all(np.isfinite(v) for row in h1.values() for v in row.values())
    assert r["object_layer"] == "blend"  # the tiny model's own
    with pytest.raises(ValueError, match="object_layer"):
        bench["main"](quick=True, policy=str(tmp_path / "pix"), world_model=str(work / "wm"), layer="glued")
    with pytest.raises(ValueError, match="required"):
        bench["main"](quick=True, policy=str(tmp_path / "pix"))


def test_perfect_model_shaping_is_potential_based_and_telescopes():
    """TrueGroupEnv's shaped reward = success + (phi(s') - phi(s)) with the task's dense reward as phi (gamma 1): over
    an episode the shaping sums to phi(last) - phi(first), so it cannot change which policy is optimal."""
    import runpy as _runpy

    import sim

    env = _runpy.run_path(str(BENCH / "imagination_estimated_state.py"), run_name="bench")["TrueGroupEnv"]
    shaped, plain = env("push-red", 2, reward="shaped", gamma=1.0), env("push-red", 2)
    raw = sim.make_vector_env("push-red", 2, asynchronous=False, cameras=())
    try:
        shaped.reset(seed=3)
        plain.reset(seed=3)
        raw.reset(seed=[500_000 + 3000, 500_000 + 3001])
        rng = np.random.default_rng(0)
        dense, diff = [], []
        for _ in range(6):
            a = rng.uniform(-1, 1, (2, 1, 4)).astype(np.float32)
            r_s = shaped.step(a)[1]
            r_p = plain.step(a)[1]
            dense.append(raw.step(a[:, 0])[1])
            diff.append(r_s - r_p)
        assert np.allclose(np.sum(diff, 0), dense[-1] - dense[0]) and not np.allclose(dense[-1], dense[0])
        with pytest.raises(ValueError, match="reward"):
            env("push-red", 1, reward="dense")
    finally:
        for e in (shaped, plain, raw):
            e.close()


def test_rl_recipe_sweep_pairs_every_variant_with_the_start():
    r = _run("rl_recipe_sweep")
    assert set(r["variants"]) == {"ppo-shaped-minstd0.05-tkl", "grpo", "filtered-bc"}
    for v in r["variants"].values():
        for m in ("mean", "sample"):  # the same 3 layouts as the start: the paired gain is the difference of rates
            assert v[m]["paired"]["gain"] == pytest.approx(v[m]["success"] - r["start"][m]["success"])
    assert r["variants"]["ppo-shaped-minstd0.05-tkl"]["curve"][0]["critic_warmup"] is True
    assert r["variants"]["filtered-bc"]["curve"][0]["approx_kl"] is None
    assert r["start_per_layout"]["layouts"] == 2 and len(r["start_per_layout"]["per_layout"]) == 2


def test_between_layout_share_separates_layout_from_noise():
    share = runpy.run_path(str(BENCH / "rl_recipe_sweep.py"), run_name="bench")["between_layout_share"]
    rng = np.random.default_rng(0)
    assert abs(share(rng.random((4000, 8)) < 0.4)) < 0.05  # one rate everywhere: only noise
    fixed = np.repeat(rng.random((4000, 1)) < 0.4, 8, axis=1)  # each layout always or never
    assert share(fixed) == pytest.approx(1 - 1 / 8, abs=1e-9)
    assert share(np.ones((5, 8), bool)) is None


def test_state_channel_closed_loop_pairs_imagination_and_the_simulator_on_the_same_layouts(trained, tmp_path):
    """Both readouts see the same layouts, so the expert's true success is the same number in every row; a run's
    DAgger rounds are read back from its metrics."""
    bench = runpy.run_path(str(BENCH / "state_channel_closed_loop.py"), run_name="bench")
    r = bench["main"](quick=True, world_models=str(trained))
    assert [row["readout"] for row in r["rows"]] == ["mean", "member"] and r["starts"] == 4
    assert r["rows"][0]["true_success"] == r["rows"][1]["true_success"]
    for row in r["rows"]:
        assert row["imagined_minus_true"] == pytest.approx(row["imagined_success"] - row["true_success"])
        lo, hi = row["true_ci95"]
        assert lo <= row["true_success"] <= hi
        assert row["paired_vs_first"]["gain"] == 0.0  # one model: each row is paired with itself
    assert r["state_only_speed"]["max_state_difference_m"] < 1e-5  # skipping frames leaves the states as they were
    pg = bench["paired_gain"]([0, 0, 1, 1], [1, 0, 1, 0])
    assert pg["gain"] == 0.0 and pg["layouts_won"] == 1 and pg["layouts_lost"] == 1
    agree = bench["outcome_agreement"]([True, True, False, False], [True, True, True, True])  # always succeeds
    assert agree == {"agreement": 0.5, "true_failures_failed": 0.0, "true_successes_succeeded": 1.0}
    assert set(r["true_vs_true"]) == set(agree) and set(agree) <= set(r["rows"][0])
    two = bench["main"](quick=True, world_models=str(trained), readouts="member", gate="hard,sample")
    assert [row["gate"] for row in two["rows"]] == ["hard", "sample"]
    assert two["rows"][0]["paired_vs_first_gate"]["gain"] == 0.0  # the first gate against itself
    assert set(two["pooled_vs_first_gate"]) == {"sample_vs_hard_member"}
    # noise levels: each row's true run is the expert at that level (the imagined side gets the same policy)
    from wmrl.eval.world_model import true_closed_loop

    lv = bench["main"](quick=True, world_models=str(trained), readouts="mean", noises="0.1,1.0")
    assert [row["noise"] for row in lv["rows"]] == [0.1, 1.0]
    assert lv["rows"][0]["true_per_start"] == r["rows"][0]["true_per_start"]
    assert lv["rows"][1]["true_per_start"] == true_closed_loop("push-red", list(range(70_000, 70_004)), noise=1.0)["true_per_start"]
    with pytest.raises(ValueError, match="noises"):
        bench["main"](quick=True, world_models=str(trained), noises="-1")
    (tmp_path / "metrics.jsonl").write_text('{"step": 3, "state_loss": 1.0}\n'
                                           '{"step": 5, "dagger_round": 0, "dagger_imagined_success": 0.4, "dagger_episodes": 9}\n')
    assert bench["dagger_log"](tmp_path) == [{"dagger_round": 0, "dagger_imagined_success": 0.4, "dagger_episodes": 9}]
    with pytest.raises(ValueError, match="required"):
        bench["main"](quick=True)


@TINY_LONG_WORLD_MODEL
def test_world_model_compare_pairs_windows_so_a_model_against_itself_differs_by_nothing(tmp_path):
    # quick: one tiny model as both A and B, same sampling noise; both without the settling rule (its flags reach the load)
    r = _run("world_model_compare", auroc=True, episodes=True, settle_a="off", settle_b="off")
    assert (r["settle_a"], r["settle_b"]) == (False, False) and r["command"].endswith("settle_a=off settle_b=off episodes=true starts=3")
    # whole episodes: the same cube error at every held-out episode's end, the same imagined expert
    assert r["n_episodes_end"] >= 1 and r["cube_error_cm_end_b_minus_a"] == 0.0 and r["cube_error_cm_end_a"] == r["cube_error_cm_end_b"]
    assert r["hallucination_starts"] == 3 and r["expert_imagined_success_a"] == r["expert_imagined_success_b"]
    assert r["expert_imagined_minus_true_a"] == pytest.approx(r["expert_imagined_success_a"] - r["expert_true_success"])
    for name in ("", "imagination_"):
        assert r[f"{name}psnr_h16_motion_b_minus_a"] == 0.0 and r[f"{name}psnr_h16_motion_b_wins"] == 0.5
        assert r[f"{name}psnr_h16_motion_a"] == r[f"{name}psnr_h16_motion_b"]
        assert np.isfinite(r[f"{name}psnr_h16_motion_a_vs_itself"])  # the same model with other sampling noise
        # episodes resampled: a difference of exactly 0 in every draw, counted per held-out episode
        assert r[f"{name}psnr_h16_motion_b_minus_a_ci_episodes"] == [0.0, 0.0]
        assert r[f"{name}psnr_h16_motion_b_wins_episodes"] == 0.5 and r[f"{name}psnr_h16_motion_n_episodes"] >= 1
    # the same model on the same pairs and noise: the same AUROC, a difference of exactly 0
    assert r["n_pairs"] >= 1 and r["imagination_success_auroc_matched_state_b_minus_a"] == 0.0
    assert r["imagination_success_auroc_matched_frames_a"] == r["imagination_success_auroc_matched_frames_b"]
    with pytest.raises(ValueError, match="gate_b='pushy'"):  # refused before anything is trained or loaded
        _run("world_model_compare", gate_b="pushy")
    with pytest.raises(ValueError, match="settle_b: expected on or off"):
        _run("world_model_compare", settle_b="sometimes")
    compare = runpy.run_path(str(BENCH / "world_model_compare.py"), run_name="bench")["main"]
    with pytest.raises(ValueError, match="neither a folder of runs/bench-world-model"):  # a tag or a demo run folder
        compare(a=str(tmp_path), b=str(tmp_path))


def test_state_channel_visited_error_scores_models_on_the_same_continuations(trained):
    """Two copies of one model are scored on the same pooled continuations (their paired difference is exactly 0);
    a channel that predicts no change scores exactly the hold-every-cube-still baseline; recorded windows never hold
    a cube that left the table."""
    import copy

    import torch

    from world_models.factory import make_world_model
    from wmrl.core.arm import OFF_TABLE_Z
    from world_models.video.train import load_split, world_model_data

    bench = runpy.run_path(str(BENCH / "state_channel_visited_error.py"), run_name="bench")
    r = bench["main"](quick=True, world_models=f"{trained},{trained}")
    assert r["visited_continuations"] > 0 and r["recorded_windows"] > 0
    for name in ("visited", "recorded"):
        rows = [row for row in r["rows"] if row["set"] == name]
        assert rows[0] == rows[1] and rows[2]["world_model"].startswith("still")
        paired = rows[1]["paired_vs_first_cube_end_cm"]
        assert paired["mean"] == 0.0 and paired["share_better"] == paired["share_worse"] == 0.0

    model = make_world_model("video", trained)
    still = copy.deepcopy(model)
    with torch.no_grad():
        for head in (still.state_channel.arm, still.state_channel.cube):
            for p in head.out.parameters():
                p.zero_()  # no change, gate logit 0: every contact gate closed
    _, _, held = load_split(world_model_data(trained), 0.1)
    windows = bench["episodes_from_replay"](held, 4, 2)
    assert windows and all((w["observation.environment_state"][:, 2:9:3] > OFF_TABLE_Z).all() for w in windows)
    err = bench["unroll_errors"](still, windows, 4)
    assert np.allclose(err["cube_end"], err["cube_end_still"]) and err["dragged"].sum() == 0
    assert len(err["travel_ratio"]) and np.allclose(err["travel_ratio"], 0, atol=1e-4)  # a moved cube left where it was travelled none of its way
    with torch.no_grad():  # every gate open, every cube pushed 5 cm in x per step: all still cubes are dragged
        still.state_channel.cube.out.bias[..., 0] = 5.0  # cm
        still.state_channel.cube.out.bias[..., 3] = 10.0  # gate logit
    pushed = bench["unroll_errors"](still, windows, 4)
    cubes = np.stack([w["observation.environment_state"][:, :9].reshape(-1, 3, 3) for w in windows])
    truly_still = (np.linalg.norm(cubes[:, -1] - cubes[:, 0], axis=-1) < 0.005).sum(-1)
    assert (pushed["dragged"] == truly_still).all() and pushed["missed"].sum() == 0 and truly_still.sum() > 0
    with pytest.raises(ValueError, match="required"):
        bench["main"](quick=True)


def test_imagination_divergence_is_zero_between_two_runs_of_one_world_and_reads_the_departure_steps(trained):
    """The measure's check: the scripted expert run twice in the true simulator from the same layouts gives paired
    differences of exactly 0. A hand-made episode's steps: the hand within 1 cm above the cube's top at step 2, the
    cube 1 cm away at step 3. On the tiny model: both worlds' episodes, the lockstep's errors per state dimension."""
    import sim

    from wmrl.eval.rank import parse_policy_spec

    bench = runpy.run_path(str(BENCH / "imagination_divergence.py"), run_name="bench")
    env = sim.make_vector_env("push-red", 2, asynchronous=False, max_episode_steps=12)
    runs = []
    for _ in range(2):
        obs, _ = env.reset(seed=5)
        eps = bench["closed_loop"](parse_policy_spec("scripted").build(env, seed=5), env, obs, 12, [5, 6, 7], 4)
        runs.append([bench["episode_summary"](e) for e in eps])
    env.close()
    assert runs[0] == runs[1] and all(e["descent_step"] > 0 for e in runs[0])
    d = bench["paired_steps"](runs[0], runs[1], "descent_step")
    assert d["imagined_minus_true_mean"] == 0.0 and d["pairs"] == 2 and d["reached_true"] == d["reached_imagined"] == 1.0

    zone = np.array([0.5, 0.0])
    cubes = [np.array([0.4, 0.0, 0.02])] * 3 + [np.array([0.41, 0.0, 0.02])]
    ees = [np.array([0.38, 0.0, z]) for z in (0.2, 0.1, 0.045, 0.03)]
    ep = {"scene": [(c, zone, e) for c, e in zip(cubes, ees)], "actions": [np.zeros(4)] * 4, "success": False}
    s = bench["episode_summary"](ep)
    assert (s["descent_step"], s["first_move_step"], s["steps"]) == (2, 3, 4)
    assert s["cube_travel_cm"] == pytest.approx(1.0) and s["zone_gap_start_cm"] == pytest.approx(10.0)
    assert s["zone_gap_end_cm"] == pytest.approx(9.0)

    r = _run("imagination_divergence", world_model=str(trained), policy="scripted", episodes=2)
    assert r["episodes"] == 2 and len(r["per_episode"]["imagined"]) == 2 and r["acting"] == "frames"
    assert r["lockstep"]["step1"]["n"] == 2 and len(r["lockstep"]["step1"]["state_abs_error_median"]) == 8
    assert r["lockstep"]["step20"]["n"] == 0  # the quick episodes end at 8 steps
    with pytest.raises(ValueError, match="policy=SPEC"):
        _run("imagination_divergence", world_model=str(trained))


def test_state_channel_failure_trace_continues_exactly_the_imagined_failures(trained):
    """Step 0 places every imagined failure's start (and every true episode's start for the reference); a refused
    placement is counted, never scored; bad options are refused with the reason."""
    bench = runpy.run_path(str(BENCH / "state_channel_failure_trace.py"), run_name="bench")
    r = bench["main"](quick=True, world_models=str(trained))
    row = r["rows"][0]
    assert row["imagined_failures"] == round((1 - row["imagined_success"]) * r["starts"])
    assert row["recoverable"]["0"]["scenes"] == row["imagined_failures"]
    assert r["true_recoverable"]["0"]["scenes"] == r["starts"] == 4
    for rows in (row["recoverable"], r["true_recoverable"]):
        assert [int(t) for t in rows] == list(bench["STEPS"])
        for t, v in rows.items():
            assert v["refused"] <= v["scenes"] and (v["recoverable"] is None) == (v["scenes"] == v["refused"])
            assert v["scenes"] <= rows["0"]["scenes"]  # later steps hold only episodes still running
            assert v["finishable"]["n"] + v["unfinishable"]["n"] == v["scenes"] - v["refused"]
    from sim.tabletop.env import ENV_STATE_NAMES, STATE_NAMES

    state, env_state = np.zeros(len(STATE_NAMES), np.float32), np.zeros(len(ENV_STATE_NAMES), np.float32)
    c, z, hand = ENV_STATE_NAMES.index("red_x"), ENV_STATE_NAMES.index("zone_yellow_x"), STATE_NAMES.index("ee_z")
    env_state[z : z + 2] = (0.40, 0.0)
    start = env_state.copy()
    start[c : c + 2] = (0.35, 0.0)
    env_state[c : c + 2], state[hand] = (0.21, 0.0), 0.10  # 1 cm from the workspace's near edge, further, hand high
    assert bench["scene_kind"](state, env_state, start, (c, z)) == {"edge": True, "high": True, "further": True}
    env_state[c : c + 2], state[hand] = (0.38, 0.0), 0.02
    assert bench["scene_kind"](state, env_state, start, (c, z)) == {"edge": False, "high": False, "further": False}
    with pytest.raises(ValueError, match="readout"):
        bench["main"](quick=True, world_models=str(trained), readout="median")
    with pytest.raises(ValueError, match="required"):
        bench["main"](quick=True)


def test_state_channel_push_phases_labels_steps_with_the_experts_own_phases(trained):
    """Every true step is counted once, in the phase the expert acted in; a cube that follows the hand's sideways
    sweep has a positive lateral-with-hand displacement equal to its own move; the one-step check scores every
    recorded transition once."""
    from sim.tabletop.env import ENV_STATE_NAMES, STATE_NAMES

    bench = runpy.run_path(str(BENCH / "state_channel_push_phases.py"), run_name="bench")
    r = bench["main"](quick=True, world_models=str(trained))
    steps = sum(len(ep) for ep in bench["true_episodes"]("push-red", list(range(70_000, 70_004)), 80)["scenes"])
    assert sum(p["steps_per_episode"] for p in r["true"]["phases"].values()) * r["starts"] == pytest.approx(steps)
    row = r["rows"][0]
    assert sum(v["steps"] for v in row["one_step"].values()) == steps
    assert row["failures"] == round((1 - row["imagined_success"]) * r["starts"])
    assert sum(row["edge_reached_in"].values()) == row["failures_reaching_edge"] <= row["failures"]
    # another noise level reaches both sides: the true episodes are the noisier expert's
    noisy = bench["main"](quick=True, world_models=str(trained), noise=1.0, readout="consensus")
    steps1 = sum(len(ep) for ep in bench["true_episodes"]("push-red", list(range(70_000, 70_004)), 80, noise=1.0)["scenes"])
    assert sum(p["steps_per_episode"] for p in noisy["true"]["phases"].values()) * noisy["starts"] == pytest.approx(steps1)
    assert noisy["policy"] == "scripted expert, noise 1.0" and noisy["readout"] == "consensus"

    # a hand-made realign step: the hand low behind the cube moves 2 cm across, the cube follows it by 1 cm
    c, z, e = ENV_STATE_NAMES.index("red_x"), ENV_STATE_NAMES.index("zone_yellow_x"), STATE_NAMES.index("ee_x")
    state, env_state = np.zeros(len(STATE_NAMES)), np.zeros(len(ENV_STATE_NAMES))
    env_state[z : z + 2], env_state[c : c + 3] = (0.50, 0.0), (0.35, 0.0, 0.02)  # push direction +x
    state[e : e + 3] = (0.30, 0.03, 0.03)  # 5 cm behind, 3 cm off the line
    nxt, nxt_env = state.copy(), env_state.copy()
    nxt[e + 1] -= 0.02
    nxt_env[c + 1] -= 0.01
    phase, along, across = bench["step_motion"](state, env_state, nxt, nxt_env, (c, z))
    assert phase == "realign" and along == pytest.approx(0.0) and across == pytest.approx(1.0)
    nxt_env[c + 1] += 0.02  # the cube goes the other way across
    assert bench["step_motion"](state, env_state, nxt, nxt_env, (c, z))[2] == pytest.approx(-1.0)
    # a hand-made push of 1, 1, 1 and 7 cm along (a kick): mean 2.5, median 1, p90 5.2
    seq, x = [], 0.30
    for dx in (0.0, 0.01, 0.01, 0.01, 0.07):
        x += dx
        s, en = np.zeros(len(STATE_NAMES)), np.zeros(len(ENV_STATE_NAMES))
        en[z : z + 2], en[c : c + 3], s[e : e + 3] = (0.60, 0.0), (x, 0.0, 0.02), (x - 0.03, 0.0, 0.02)
        seq.append((s, en))
    push = bench["phase_table"]([seq[:-1]], [seq[-1]], np.array([False]), [(c, z)])["phases"]["push"]
    assert push["steps_per_episode"] == 4 and push["along_cm"] == pytest.approx(2.5)
    assert push["along_median_cm"] == pytest.approx(1.0) and push["along_p90_cm"] == pytest.approx(5.2)
    with pytest.raises(ValueError, match="readout"):
        bench["main"](quick=True, world_models=str(trained), readout="median")
    # the settling rule both ways on one run: a row each; under a gate that draws nothing, the row of the run's own
    # setting is exactly what the run gives without the option (the option reaches the rollouts, not just the label)
    both = bench["main"](quick=True, world_models=str(trained), settle="off,on", gate="hard")
    assert [r["settle"] for r in both["rows"]] == [False, True] and both["command"].endswith("settle=off,on")
    own = bench["main"](quick=True, world_models=str(trained), gate="hard")["rows"][0]
    same = both["rows"][[False, True].index(own["settle"])]
    assert {k: v for k, v in same.items() if k != "one_step"} == {k: v for k, v in own.items() if k != "one_step"}
    assert same["one_step"] == own["one_step"]
    with pytest.raises(ValueError, match="settle"):
        bench["main"](quick=True, world_models=str(trained), settle="off,sometimes")


def test_state_channel_open_loop_scores_every_run_and_readout_on_the_same_pairs(trained):
    """Two copies of one run score exactly alike under every readout (same pairs, same episodes, same draws); the
    members are each scored; a missing run list is refused."""
    bench = runpy.run_path(str(BENCH / "state_channel_open_loop.py"), run_name="bench")
    r = bench["main"](quick=True, world_models=f"{trained},{trained}", gate="sample")
    a, b = r["rows"]
    assert a["mean"] == b["mean"] and a["members"] == b["members"] and a["gate"] == "sample"
    assert a["consensus"] == b["consensus"] and set(a["consensus"]) == set(a["mean"])
    from world_models.factory import make_world_model

    assert len(a["member_aurocs"]) == make_world_model("video", trained).cfg.state_members and r["n_pairs"] >= 1
    assert set(a["mean"]) == {"success_auroc_matched_state", "cube_error_cm_end", "cube_error_cm_end_p90",
                              "ee_error_cm_h4", "ee_error_cm_h16"}
    with pytest.raises(ValueError, match="world_models"):
        bench["main"](quick=True, world_models="")


def test_state_channel_heldout_error_scores_every_run_on_the_same_windows(trained):
    """Two copies of one run score exactly alike (the same windows), and the compounding error grows with the
    horizon; bad options are refused."""
    bench = runpy.run_path(str(BENCH / "state_channel_heldout_error.py"), run_name="bench")
    r = bench["main"](quick=True, world_models=f"{trained},{trained}", horizons="1,6", split_horizon=4)
    a, b = (row["error_cm_by_horizon"] for row in r["rows"])
    assert a == b and a["6"] > a["1"] > 0
    ea, eb = (row["ee_error_cm_by_horizon"] for row in r["rows"])  # per part: the hand's error, same windows
    assert ea == eb and ea["6"] > ea["1"] > 0 and r["rows"][0]["cube_error_cm_by_horizon"] == r["rows"][1]["cube_error_cm_by_horizon"]
    sa, sb = (row["windows_h4"] for row in r["rows"])  # the video benchmark's windows, rolled as imagination rolls
    assert sa == sb and sa["static"]["windows"] + sa["motion"]["windows"] == sa["all"]["windows"] == 8
    assert sa["all"]["hand_error_cm_p90"] >= sa["all"]["hand_error_cm_median"] > 0
    with pytest.raises(ValueError, match="horizons"):
        bench["main"](quick=True, world_models=str(trained), horizons="0,4")


def test_rl_seeds_pooled_averages_seeds_per_layout_and_refuses_other_starts():
    r = _run("rl_seeds_pooled")  # hand example: start 001100; recipe a: 101100 and 111000; b: 111111
    a, b = r["recipes"]["a"], r["recipes"]["b"]
    assert a["success_per_rl_seed"] == [50.0, 50.0] and r["success_start"] == pytest.approx(100 / 3)
    assert a["pooled_gain"]["mean"] == pytest.approx(100 / 6)  # per layout (1, .5, 0, -.5, 0, 0)
    assert b["pooled_gain"]["mean"] == pytest.approx(200 / 3) and "rl_seed_difference" not in b
    assert a["rl_seed_difference"]["mean"] == 0.0  # layouts 2 and 4 swap: the seeds differ on 2 of 6, not on average
    assert r["differences"]["b minus a"]["mean"] == pytest.approx(50.0)
    lo, hi = r["differences"]["b minus a"]["ci"]
    assert 0 < lo < 50 < hi <= 100
    pool = runpy.run_path(str(BENCH / "rl_seeds_pooled.py"), run_name="bench")["pool"]
    with pytest.raises(ValueError, match="outcomes_start differ"):
        pool({"a": [{"outcomes_start": "01", "outcomes_rl": "11"}], "b": [{"outcomes_start": "10", "outcomes_rl": "11"}]})


def test_change_mask_benchmark_pairs_the_masked_and_plain_decodes_of_the_same_rollouts():
    r = _run("world_model_change_mask")
    for prefix in ("imagination_", ""):
        for split in ("motion", "static"):
            lo, hi = r[f"{prefix}mask_psnr_change_h16_{split}_ci"]
            d = r[f"{prefix}mask_psnr_change_h16_{split}"]
            assert d != d or lo <= d <= hi  # (a split with no window is NaN)
        # same windows, same latents: copy-last's PSNR cannot depend on the decode
        for cam in ("front", "wrist"):
            assert r[f"{prefix}masked_psnr_h16_copy_motion_{cam}"] == r[f"{prefix}plain_psnr_h16_copy_motion_{cam}"]
            split = {v: r[f"{prefix}{v}_error_split_h16"][cam]["motion"] for v in ("plain", "masked")}
            assert split["plain"]["copy_outside"] == split["masked"]["copy_outside"] > 0
    for cam in ("front", "wrist"):
        assert r[f"change_mask_mse_masked_{cam}"] > 0 and r[f"change_mask_mse_plain_{cam}"] > 0
    assert "imagination_masked_delta_t_psnr_h8_motion" in r  # controllability at the setting imagination samples with


def test_rank_report_rescores_stored_outcomes_and_refuses_runs_that_do_not_match_their_statistics(tmp_path):
    """The stored rankings' outcomes give today's statistics (here MMRV's noise ceiling, absent when they were run);
    a ranking.json whose stored Spearman its outcomes do not give is refused, as is a folder without one."""
    from wmrl.eval.rank import ranking_report

    def row(policy, imagined, true, repeat):
        return {"policy": policy, "imagined_outcomes": [1] * imagined + [0] * (10 - imagined),
                "true_outcomes": [1] * true + [0] * (10 - true), "true_repeat_outcomes": [1] * repeat + [0] * (10 - repeat),
                "imagined_progress": [imagined / 10] * 10}

    rows = [row("runs/a", 2, 1, 2), row("runs/b", 5, 4, 9), row("runs/c", 8, 7, 8), row("random", 0, 0, 0)]
    stored = {k: v for k, v in ranking_report(rows, n_boot=20).items() if k not in ("rank_mmrv_noise_ceiling", "anchors")}
    run = tmp_path / "rank-old"
    run.mkdir()
    (run / "ranking.json").write_text(json.dumps({**stored, "policies": rows, "first_layout_seed": 7}))
    (run / "config.yaml").write_text("world_model: runs/wm\n")
    r = _run("rank_report", runs=str(run))["rows"][0]
    assert r["rank_mmrv_noise_ceiling"] == pytest.approx((0 + 0.3 + 0.3) / 3)  # the repeat puts b above c
    assert r["world_model"] == "runs/wm" and r["first_layout_seed"] == 7 and r["stored"]["rank_spearman"] == 1.0
    # a second run on the same true episodes whose world model swaps b and c: paired, B minus A
    swapped = [dict(r) for r in rows]
    swapped[1]["imagined_outcomes"], swapped[2]["imagined_outcomes"] = rows[2]["imagined_outcomes"], rows[1]["imagined_outcomes"]
    other = tmp_path / "rank-new"
    other.mkdir()
    (other / "ranking.json").write_text(json.dumps({**ranking_report(swapped, n_boot=20), "policies": swapped}))
    r = _run("rank_report", runs=f"{run},{other}")
    (d,) = r["paired"]
    assert (d["a"], d["b"]) == ("rank-old", "rank-new") and d["n_policies"] == 3  # the anchor left out
    assert d["spearman_b_minus_a"] == pytest.approx(r["rows"][1]["rank_spearman"] - 1.0) == -0.5  # 1 - 6*2/(3*8)
    assert d["mmrv_b_minus_a"] == pytest.approx(r["rows"][1]["rank_mmrv"]) and r["rows"][1]["rank_mmrv"] == pytest.approx(0.2)  # b, c: 0.3 each
    assert d["spearman_progress_b_minus_a"] == 0.0  # the progress scores were not swapped
    assert d["success_abs_error_b_minus_a"] == pytest.approx((0.1 + 0.4 + 0.2) / 3 - 0.1)  # a, b, c off by 0.1 in A
    # imagined successes whose true episode failed: A 1 of 2, 1 of 5, 1 of 8; B (b's 8 on b's 4 true, c's 5 within
    # c's 7) 1 of 2, 4 of 8, 0 of 5
    assert r["rows"][0]["hallucinated_success"] == pytest.approx(3 / 15) and r["rows"][1]["hallucinated_success"] == pytest.approx(5 / 15)
    assert d["hallucinated_b_minus_a"] == pytest.approx(2 / 15)
    lo, hi = d["spearman_b_minus_a_ci"]
    assert lo <= d["spearman_b_minus_a"] <= hi
    swapped[0]["true_outcomes"] = [1] * 10  # other true episodes: not paired
    (other / "ranking.json").write_text(json.dumps({**ranking_report(swapped, n_boot=20), "policies": swapped}))
    assert _run("rank_report", runs=f"{run},{other}")["paired"] == []
    (run / "ranking.json").write_text(json.dumps({**stored, "rank_spearman": 0.5, "policies": rows}))
    with pytest.raises(ValueError, match="differs from the stored"):
        _run("rank_report", runs=str(run))
    with pytest.raises(ValueError, match="no ranking.json"):
        _run("rank_report", runs=str(tmp_path))


def test_rank_report_pools_rankings_of_the_same_episodes_and_reports_the_gain_over_their_mean(tmp_path):
    """Two world models rank a, b, c (true 1, 4, 7 of 10) on the same episodes, one in order, one with b and c
    swapped: the pool (each episode's imagined outcome their mean) ties b and c, between the two members."""
    from wmrl.eval.rank import ranking_report

    def row(policy, imagined, true):
        return {"policy": policy, "imagined_outcomes": [1] * imagined + [0] * (10 - imagined),
                "true_outcomes": [1] * true + [0] * (10 - true), "imagined_seeds": list(range(10))}

    def ranking(name, counts, true=(1, 4, 7, 0)):
        rows = [row(p, i, t) for p, i, t in zip(("runs/a", "runs/b", "runs/c", "random"), counts, true)]
        d = tmp_path / name
        d.mkdir()
        (d / "ranking.json").write_text(json.dumps({**ranking_report(rows, n_boot=20), "policies": rows}))
        (d / "config.yaml").write_text(f"world_model: runs/{name}\n")
        return d

    good, swapped = ranking("wm0", (2, 5, 8, 0)), ranking("wm1", (2, 8, 5, 0))
    r = _run("rank_report", runs=str(good), pools=f"{good}+{swapped}")
    pool = r["rows"][1]
    assert pool["run"] == "pool(wm0+wm1)" and pool["world_models"] == ["runs/wm0", "runs/wm1"]
    assert [m["rank_spearman"] for m in pool["members_stats"]] == pytest.approx([1.0, 0.5])
    # pooled rates 0.2, 0.65, 0.65: ranks (1, 2.5, 2.5) against (1, 2, 3)
    assert pool["rank_spearman"] == pytest.approx(np.sqrt(0.75))
    assert pool["spearman_pool_minus_members"] == pytest.approx(np.sqrt(0.75) - 0.75)
    # MMRV: members 0 and (0.3 + 0.3) / 3, the pool's tie costs b the gap to c: 0.3 / 3
    assert pool["rank_mmrv"] == pytest.approx(0.1) and pool["mmrv_pool_minus_members"] == pytest.approx(0.0)
    # MAE: members 0.1 and 0.7 / 3, the pool 0.4 / 3
    assert pool["success_abs_error_pool_minus_members"] == pytest.approx(0.4 / 3 - (0.1 + 0.7 / 3) / 2)
    lo, hi = pool["spearman_pool_minus_members_ci"]
    assert lo <= pool["spearman_pool_minus_members"] <= hi
    (d,) = r["paired"]  # the pool meets the run on the same episodes
    assert (d["a"], d["b"]) == ("wm0", "pool(wm0+wm1)")
    assert d["spearman_b_minus_a"] == pytest.approx(np.sqrt(0.75) - 1.0)
    with pytest.raises(ValueError, match="2 or more"):
        _run("rank_report", pools=str(good))
    other = ranking("wm2", (2, 5, 8, 0), true=(2, 4, 7, 0))  # another true evaluation: not one pool
    with pytest.raises(ValueError, match="other layouts or true episodes"):
        _run("rank_report", pools=f"{good}+{other}")


def test_imagination_hybrid_mixes_the_worlds_as_named(trained):
    """The sim variant is the true simulator (twice the same), `flat` keeps every cube at its start height (the task
    cube's height above its start after 10 steps exactly 0), `channel` is the state channel's own rollout; a policy
    that reads frames and unknown variants are refused with the reason."""
    from wmrl.eval.rank import paired_worlds

    bench = runpy.run_path(str(BENCH / "imagination_hybrid.py"), run_name="bench")
    from world_models.video.train import world_model_data

    pcfg, true_env, wm_env, objects = paired_worlds("scripted", str(trained), str(world_model_data(trained)), "push-red",
                                                    2, max_steps=12)
    try:
        run = lambda v: bench["run_variant"](v, pcfg, true_env, wm_env, objects, 5, 12)  # noqa: E731
        a, b = run("sim"), run("sim")
        assert (a["success"] == b["success"]).all() and np.array_equal(a["height10_cm"], b["height10_cm"])
        assert np.abs(a["height10_cm"]).max() < 0.5  # cubes on the table in the simulator
        assert (run("flat")["height10_cm"] == 0).all()
        ch = run("channel")
        assert np.isfinite(ch["height10_cm"]).all()
    finally:
        true_env.close()
    r = _run("imagination_hybrid", world_model=str(trained), policy="scripted", episodes=2, variants="sim,channel")
    assert r["episodes"] == 2 and set(r["variants"]) == {"sim", "channel"}
    assert r["variants"]["sim"]["minus_channel"]["mean"] == pytest.approx(
        r["variants"]["sim"]["success"] - r["variants"]["channel"]["success"])
    with pytest.raises(ValueError, match="variants"):
        _run("imagination_hybrid", world_model=str(trained), policy="scripted", variants="sim,moon")
    with pytest.raises(ValueError, match="reads state"):
        _run("imagination_hybrid", world_model=str(trained), policy="estimated-state:some/folder")
