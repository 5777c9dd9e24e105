"""`wmrl demo`: the whole loop on the embedded default task, on a laptop CPU.

collect (scripted expert with near-success failures) -> train the video world model -> behaviour-clone the VLA
policy on the successful episodes -> RL in imagination (GRPO, zero true-simulator steps) -> one co-evolution round
(true rollouts of the evolved policy, world-model fine-tune, hallucinated-success rate before and after, more GRPO in
the fine-tuned model) ->
evaluation in the true simulator -> ranking of a policy population in the world model against the true simulator.
Everything lands in one run folder with an HTML report. `--quick` runs the same loop at toy sizes (a smoke test).
Each finished stage is cached (stages/NAME.json), so `--resume` continues an interrupted demo.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from policies.vla import VLAPolicy
from wmrl.core.checkpoint import resolve_checkpoint
from wmrl.core.io import write_json
from wmrl.core.report import metrics_table, plot_curves, write_report
from wmrl.core.run import Tracker, start_run
from wmrl.datasets import LeRobotV3Dataset
from wmrl.eval import evaluate_on_tasks
from wmrl.eval.rank import FRESH_LAYOUTS, WORKERS, RankConfig, run_rank
from wmrl.eval.world_model import auroc_plot, gain_plot, pair_auroc, success_pairs, window_fidelity
from wmrl.rl.coevolve import evolve_world_model, hallucination_rate
from wmrl.rl.imagine import ImagineConfig, imagine
from world_models.video.model import VideoWorldModel
from world_models.video.train import TrainWMConfig, load_split, train_world_model


@dataclass
class DemoConfig:
    task: str = "push-red"
    out: Path = Path("runs/demo")
    quick: bool = False
    """Toy sizes everywhere: finishes in a few minutes (tests)."""
    episodes: int = 150
    """Episodes of expert data to collect."""
    failures: float = 0.3
    noise: float = 0.1
    perturbed: float = 0.2
    """Share of perturbed-expert episodes (what learning policies visit) in the world model's data."""
    calibration_episodes: int = 150
    """More episodes of the same recipe (other layouts) that the world model never trains on: its change mask and
    frame heads are fitted on their rollouts (`train-wm --calibration-data`), which carry the errors the model makes
    on new episodes (README, the fits on unseen episodes); 0: fitted on the training episodes."""
    wm_size: str = "small"
    wm_ae_steps: int = 1000
    wm_dyn_steps: int = 2000
    wm_mirror: Optional[bool] = None
    """Train the world model on every episode and its reflection (`train-wm --mirror`): None, on where the data can be
    reflected (the tabletop's). It costs the demo about 1.3 minutes and lifts the masked gain (README, reflections by
    default); the pixel-policy ranking did not gain from it (README, ranking)."""
    wm_eval_windows: int = 200
    """Fixed held-out windows for the world model's per-window PSNR gain over copy-last."""
    wm_eval_pairs: int = 100
    """Success / near-success seed pairs for the world model's success AUROC."""
    bc_steps: int = 1500
    rl_iterations: int = 15
    rl_groups: int = 4
    rl_group_size: int = 8
    coevo_budget: int = 20
    """True-simulator rollouts of the evolved policy for the world-model fine-tune."""
    coevo_steps: int = 400
    coevo_rl_iterations: int = 8
    """RL iterations in the fine-tuned world model after the co-evolution round."""
    hallucination_episodes: int = 30
    eval_episodes: int = 50
    rank_episodes: int = 20
    rank_workers: str = "ray"
    """Where the ranking scores its policies: `ray`, one worker process per core (the `dist` extra; the same outcomes
    as `local`; 2.3 instead of 3.7 min on 2 cores, README session 52: a policy's true-simulator episodes use one
    core), or `local`.
    Without Ray installed the demo says so and ranks locally."""
    rank_max_steps: Optional[int] = None
    """The ranking's episode length in both worlds (None: the task's own; `--quick`: 20 steps, a smoke run)."""
    num_envs: int = 2
    seed: int = 0
    overwrite: bool = False
    resume: bool = False


CALIBRATION_SEEDS = 500_000  # the calibration episodes' first reset seed (the training episodes' start at --seed)
QUICK = dict(episodes=10, calibration_episodes=3, wm_size="tiny", wm_ae_steps=40, wm_dyn_steps=40, bc_steps=40, rl_iterations=2, rl_groups=2,
             rl_group_size=2, coevo_budget=2, coevo_steps=6, coevo_rl_iterations=1, hallucination_episodes=3, eval_episodes=4, rank_episodes=2,
             wm_eval_windows=12, wm_eval_pairs=3, rank_workers="local", rank_max_steps=20)


class Stages:
    """Runs each stage once; its JSON result is cached under stages/ so that --resume skips finished stages."""

    def __init__(self, run: Path, tracker, say):
        self.run, self.tracker, self.say = run, tracker, say
        self.minutes: dict[str, float] = {}

    def __call__(self, name: str, fn, *args, **kw) -> dict:
        path = self.run / "stages" / f"{name}.json"
        if path.exists():
            rec = json.loads(path.read_text())
            self.say(f"[{name}] done before (cached)")
        else:
            self.say(f"[{name}] ...")
            t = time.time()
            rec = {"result": fn(*args, **kw), "minutes": (time.time() - t) / 60}

            write_json(path, rec)
            self.tracker.log({"stage": name, "minutes": rec["minutes"]})
        self.minutes[name] = rec["minutes"]
        return rec["result"]


def run_demo(cfg: DemoConfig, progress: bool = True) -> dict:
    from wmrl.commands.collect import CollectConfig, collect
    from wmrl.commands.train_policy import TrainPolicyConfig, train_policy

    if cfg.quick:
        cfg = replace(cfg, **QUICK)
    if cfg.calibration_episodes < 0:
        raise ValueError(f"--calibration-episodes must be >= 0, got {cfg.calibration_episodes}")
    if cfg.rank_workers not in WORKERS:
        raise ValueError(f"--rank-workers: expected one of {WORKERS}, got {cfg.rank_workers!r}")
    t0 = time.time()
    run = start_run(cfg)
    tracker = Tracker(run)
    say = print if progress else (lambda *a, **k: None)
    stage = Stages(run, tracker, say)
    tiny = {"vision_width": 8, "hidden": 64, "text_dim": 16} if cfg.quick else {}

    def collect_data() -> dict:
        recipe = dict(task=cfg.task, noise=cfg.noise, failures=cfg.failures, perturbed=cfg.perturbed, num_envs=cfg.num_envs,
                      post_success_steps=3, overwrite=True)
        out = collect(CollectConfig(episodes=cfg.episodes, out=run / "dataset", seed=cfg.seed, **recipe), progress=progress)
        if cfg.calibration_episodes:  # reset seeds far from the training episodes': other layouts
            out["calibration"] = collect(CollectConfig(episodes=cfg.calibration_episodes, out=run / "calibration",
                                                       seed=CALIBRATION_SEEDS + cfg.seed, **recipe), progress=progress)
        return out

    data = stage("collect", collect_data)
    wm = stage("world_model", lambda: {k: v for k, v in train_world_model(TrainWMConfig(
        data=run / "dataset", out=run / "world_model", size=cfg.wm_size, ae_steps=cfg.wm_ae_steps,
        dyn_steps=cfg.wm_dyn_steps, unroll_steps=max(2, cfg.wm_dyn_steps // 4),
        state_steps=max(10, cfg.wm_dyn_steps // 2), batch_size=8 if cfg.quick else 32,
        change_mask_steps=10 if cfg.quick else 800, change_mask_windows=4 if cfg.quick else 200,
        **({"head_rollout_steps": 20} if cfg.quick else {}),
        holdout=0.1, videos=2, overwrite=True, seed=cfg.seed, mirror=cfg.wm_mirror,
        calibration_data=run / "calibration" if cfg.calibration_episodes else None), progress=progress).items()
        if k != "videos"})
    wm_eval = stage("world_model_eval", lambda: evaluate_world_model(run, cfg))
    keep = max(1, cfg.bc_steps // 3)
    bc = stage("bc", lambda: train_policy(TrainPolicyConfig(
        data=(run / "dataset",), out=run / "policy_bc", steps=cfg.bc_steps, keep_every=keep, eval_episodes=0,
        batch_size=8 if cfg.quick else 64, successful_only=True, extra=tiny, overwrite=True, seed=cfg.seed),
        progress=progress))
    rl = stage("rl", lambda: imagine(ImagineConfig(
        policy=run / "policy_bc", world_model=run / "world_model", out=run / "policy_rl", iterations=cfg.rl_iterations,
        groups=cfg.rl_groups, group_size=cfg.rl_group_size, minibatch_rollouts=max(2, cfg.rl_groups * cfg.rl_group_size // 2),
        overwrite=True, seed=cfg.seed), progress=progress))

    def coevolution() -> dict:
        policy = VLAPolicy.load(resolve_checkpoint(run / "policy_rl")).eval()
        before = hallucination_rate(policy, VideoWorldModel.load(resolve_checkpoint(run / "world_model")), cfg.task,
                                    cfg.hallucination_episodes)
        evolved = evolve_world_model(run / "world_model", run / "policy_rl", cfg.task, cfg.coevo_budget, run / "coevolution",
                                     steps=cfg.coevo_steps, progress=progress)
        after = hallucination_rate(policy, VideoWorldModel.load(resolve_checkpoint(evolved)), cfg.task,
                                   cfg.hallucination_episodes)
        return {"before": before, "after": after, "true_rollouts": cfg.coevo_budget}

    coevo = stage("coevolution", coevolution)
    rl2 = stage("rl_after_coevolution", lambda: imagine(ImagineConfig(
        policy=run / "policy_rl", world_model=run / "coevolution" / "world_model", data=run / "dataset",
        out=run / "policy_coevo", iterations=cfg.coevo_rl_iterations, groups=cfg.rl_groups, group_size=cfg.rl_group_size,
        minibatch_rollouts=max(2, cfg.rl_groups * cfg.rl_group_size // 2), overwrite=True, seed=cfg.seed + 1),
        progress=progress))

    def true_eval() -> dict:
        out = {}
        for name in ("policy_bc", "policy_rl", "policy_coevo"):
            policy = VLAPolicy.load(resolve_checkpoint(run / name)).eval()
            out[name] = evaluate_on_tasks(policy, [data_task(run)], cfg.eval_episodes, run / f"eval_{name}",
                                          seed=90_000 + cfg.seed, num_envs=cfg.num_envs, progress=progress)[cfg.task]
        return out

    evals = stage("evaluation", true_eval)
    stages_bc = sorted((run / "policy_bc" / "checkpoints").glob("step_*"))
    population = [str(p) for p in stages_bc] + [f"{resolve_checkpoint(run / 'policy_bc')}:stochastic",
                                                 str(resolve_checkpoint(run / "policy_rl")),
                                                 str(resolve_checkpoint(run / "policy_coevo")), "scripted:noise=0.3",
                                                 "scripted:failure_prob=0.5", "scripted:noise=1.0", "random"]
    workers = cfg.rank_workers
    if workers == "ray" and importlib.util.find_spec("ray") is None:
        say("[ranking] Ray is not installed (pip install 'wmrl[dist]'): the policies are scored one after another")
        workers = "local"
    rank = stage("ranking", lambda: run_rank(RankConfig(
        policies=tuple(population), world_model=run / "coevolution" / "world_model", task=cfg.task,
        episodes=cfg.rank_episodes, num_envs=min(10, cfg.rank_episodes), out=run / "ranking", overwrite=True,
        seed=FRESH_LAYOUTS + cfg.seed, workers=workers, num_workers=min(len(population), os.cpu_count() or 1),
        max_steps=cfg.rank_max_steps),
        progress=progress))  # layouts the demo's data was not recorded on

    summary = {
        "run_dir": str(run), "minutes": (time.time() - t0) / 60, "stage_minutes": stage.minutes,
        "success_bc": evals["policy_bc"]["pc_success"] / 100, "success_rl": evals["policy_rl"]["pc_success"] / 100,
        "success_bc_ci95": [evals["policy_bc"]["success_ci95_low"] / 100, evals["policy_bc"]["success_ci95_high"] / 100],
        "success_rl_ci95": [evals["policy_rl"]["success_ci95_low"] / 100, evals["policy_rl"]["success_ci95_high"] / 100],
        "success_after_coevolution": evals["policy_coevo"]["pc_success"] / 100,
        "true_env_steps_during_rl": rl["true_env_steps_during_rl"] + rl2["true_env_steps_during_rl"],
        "hallucinated_success_before": coevo["before"]["hallucinated_success"],
        "hallucinated_success_after": coevo["after"]["hallucinated_success"],
        "hallucination_imagined_successes": [coevo[k]["n_imagined_success"] for k in ("before", "after")],
        "rank_spearman": rank["rank_spearman"], "rank_kendall": rank["rank_kendall"],
        "success_abs_error": rank["success_abs_error"], "n_policies": rank["n_policies"],
        **{k: rank[k] for k in ("rank_spearman_ci", "rank_spearman_with_anchors", "rank_mmrv", "rank_mmrv_noise_ceiling",
                                "rank_noise_ceiling", "episodes_per_policy") if k in rank},
        "dataset_frames": data["frames"], "wm_train_minutes": wm["train_minutes"], "bc_loss_last": bc["loss_last"],
        **{f"wm_{k}": wm_eval[k] for k in ("motion_psnr_gain_h16", "masked_psnr_gain_h16", "success_auroc_matched_state",
                                           "success_auroc_matched_frames") if k in wm_eval},
    }
    report = write_demo_report(run, cfg, summary, evals, coevo, rank, wm_eval)
    summary["report"] = str(report)

    write_json(run / "summary.json", summary)
    tracker.log({"stage": "done", **{k: v for k, v in summary.items() if not isinstance(v, (dict, list))}})
    tracker.close()
    say(f"done in {summary['minutes']:.1f} min: true success BC {summary['success_bc']:.0%} -> after RL in imagination "
        f"{summary['success_rl']:.0%} ({summary['true_env_steps_during_rl']} true steps during RL); ranking Spearman "
        f"{summary['rank_spearman']:.2f}; report at {report}")
    return summary


def evaluate_world_model(run: Path, cfg: DemoConfig) -> dict:
    """Per-window PSNR gain over copy-last on fixed held-out windows and the success AUROC on prefix-sharing pairs
    (`wmrl.eval.world_model`, as in `wmrl bench world-model`), with their plots in world_model_eval/."""
    model = VideoWorldModel.load(resolve_checkpoint(run / "world_model")).eval()
    _, _, held = load_split(run / "dataset", 0.1, keep=("qpos",))
    horizon = 16 if min(T for _, T in held.episodes.values()) > 16 or not cfg.quick else 4
    out_dir = run / "world_model_eval"
    out_dir.mkdir(exist_ok=True)
    # both sampled as the demo's RL and ranking sample (1 Euler step, ImagineConfig.sampling_steps): the frame head's
    # success reads differently at the model's default 3 steps (README, the headline benchmark with the change mask)
    fid = window_fidelity(model, held, cfg.task, cfg.wm_eval_windows, horizon, steps=1)
    pw = fid.pop("per_window")
    gain_plot(out_dir / "psnr_gain.png", pw["gain"], pw["motion"], pw["masked_gain"], horizon)
    pa = pair_auroc(model, success_pairs(cfg.task, cfg.wm_eval_pairs, seed0=60_000 + cfg.seed), steps=1)
    auroc_plot(out_dir / "auroc_pairs.png", pa.pop("scores"), pa.pop("truth"))
    return {**fid, **pa, "horizon": horizon, "success_source": model.success_source}


def data_task(run: Path) -> str:
    """An instruction of the demo's dataset (evaluation resolves the task from it)."""
    return LeRobotV3Dataset(run / "dataset").tasks[0]


def write_demo_report(run: Path, cfg: DemoConfig, s: dict, evals: dict, coevo: dict, rank: dict, wm_eval: dict) -> Path:
    plot_curves(run / "policy_bc" / "metrics.jsonl", run / "bc_curve.png", ["bc_loss"], title="behaviour cloning")
    rows = [{"policy": "BC", **evals["policy_bc"]}, {"policy": "BC + GRPO in imagination", **evals["policy_rl"]},
            {"policy": "+ co-evolution round and more GRPO", **evals["policy_coevo"]}]
    h = [{"world model": k, **{m: coevo[k][m] for m in ("hallucinated_success", "imagined_success", "replayed_true_success",
                                                          "n_imagined_success")}} for k in ("before", "after")]
    pol = [{"policy": Path(p["policy"]).name if "/" in p["policy"] else p["policy"], "imagined": p["imagined_success"],
            "true": p["true_success"]} for p in rank["policies"]]
    t, hz = cfg.task, wm_eval["horizon"]
    sections = [
        ("Success in the true simulator, before and after RL in imagination", metrics_table(
            rows, ["policy", "pc_success", "success_ci95_low", "success_ci95_high", "avg_episode_length", "n_episodes"])
         + f"<p>True-simulator steps during RL: <b>{s['true_env_steps_during_rl']}</b>. Whole demo: "
           f"{s['minutes']:.1f} min; stages (min): " + ", ".join(f"{k} {v:.1f}" for k, v in s["stage_minutes"].items())
         + "</p>"),
        ("Learning curves", "<img src='bc_curve.png'><br><img src='policy_rl/learning_curves.png'>"),
        ("World model: real | imagined, held-out episodes, same actions (front above, wrist below)",
         "<img src='world_model/videos/real_vs_imagined.gif' width='900'>"),
        ("World model: per-window gain over copy-last and success AUROC on prefix-sharing pairs",
         metrics_table([wm_eval], [k for k in (f"motion_psnr_gain_h{hz}", f"static_psnr_gain_h{hz}", f"masked_psnr_gain_h{hz}",
                                               "static_psnr_gap_to_ceiling", "delta_t_psnr_h8_motion", "ee_error_cm_h4",
                                               f"ee_error_cm_h{hz}") if k in wm_eval])
         + metrics_table([wm_eval], [k for k in wm_eval if "auroc" in k] + ["n_pairs"])
         + f"<p>{wm_eval['n_windows']} fixed held-out windows ({wm_eval['n_motion_windows']} with motion), horizon {hz}; "
           f"success from the {wm_eval['success_source']} path; rollouts at 1 Euler step per chunk, as RL and ranking "
           "sample. A random scorer's matched AUROC is reported beside the model's.</p><img src='world_model_eval/psnr_gain.png'><br><img src='world_model_eval/auroc_pairs.png'>"),
        ("Policies in the true simulator (green border = success)",
         f"BC<br><img src='eval_policy_bc/{t}/videos/grid.gif' width='900'><br>after RL in imagination<br>"
         f"<img src='eval_policy_rl/{t}/videos/grid.gif' width='900'>"),
        ("Co-evolution: hallucinated successes before and after the world-model fine-tune", metrics_table(
            h, list(h[0])) + f"<p>{coevo['true_rollouts']} true rollouts of the evolved policy; the world model after "
                             "the fine-tune: <img src='coevolution/world_model/videos/real_vs_imagined.gif' width='600'></p>"),
        ("Policy ranking: world model vs true simulator",
         f"<p>Spearman {s['rank_spearman']:.2f}, Kendall {s['rank_kendall']:.2f}, mean absolute success error "
         f"{s['success_abs_error']:.2f} over {s['n_policies']} policies.</p><img src='ranking/ranking.png'>"
         + metrics_table(pol, ["policy", "imagined", "true"])),
    ]
    if cfg.quick:
        sections.insert(0, ("Quick mode", "<p>Toy sizes: a smoke test of the loop, not a result.</p>"))
    return write_report(run / "report.html", f"wmrl demo: {cfg.task}", sections)
