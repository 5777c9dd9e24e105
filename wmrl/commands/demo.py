"""`wmrl demo`: the main job on the embedded default task, end to end on a laptop CPU in a few minutes.

Now: collect scripted-expert data (with near-success failures) into a LeRobot v3 dataset, load it into the common
replay, evaluate the scripted expert and a random policy through the one evaluation loop, and write a run folder
with videos, plots and an HTML report. Later stages (world model, imagination RL) extend this job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class DemoConfig:
    task: str = "push-red"
    out: Path = Path("runs/demo")
    episodes: int = 16
    """Episodes of expert data to collect."""
    failures: float = 0.25
    noise: float = 0.05
    eval_episodes: int = 12
    wm_steps: int = 400
    """Training steps for each world-model phase (autoencoder, dynamics); 0 skips the world model."""
    wm_size: str = "tiny"
    num_envs: int = 2
    seed: int = 0
    overwrite: bool = False
    resume: bool = False


def run_demo(cfg: DemoConfig, progress: bool = True) -> dict:
    from wmrl.commands.collect import CollectConfig, collect
    from wmrl.commands.evaluate import EvalConfig, PolicyConfig, run_eval
    from wmrl.replay import EpisodeReplay
    from wmrl.report import metrics_table, write_report
    from wmrl.run import Tracker, prepare_run_dir, save_config

    t0 = time.time()
    run_dir = prepare_run_dir(cfg.out, cfg.overwrite, cfg.resume)
    save_config(run_dir, cfg)
    tracker = Tracker(run_dir)
    say = print if progress else (lambda *a, **k: None)

    say(f"[1/5] collecting {cfg.episodes} expert episodes on {cfg.task} ({cfg.failures:.0%} near-success failures)")
    data = collect(CollectConfig(task=cfg.task, episodes=cfg.episodes, out=run_dir / "dataset", noise=cfg.noise,
                                 failures=cfg.failures, seed=cfg.seed, num_envs=cfg.num_envs, overwrite=True),
                   progress=progress)
    tracker.log({"stage": "collect", **data})

    say("[2/5] loading the dataset into the replay buffer")
    replay = EpisodeReplay.from_lerobot(run_dir / "dataset")
    windows = replay.sample_windows(32, 16)
    batch = replay.sample(256)
    replay_info = {"frames": len(replay), "episodes": replay.num_episodes,
                   "window_valid_fraction": float(windows["mask"].mean()),
                   "transition_terminal_fraction": float(batch["next.terminated"].mean())}
    tracker.log({"stage": "replay", **replay_info})

    rows = []
    for i, policy in enumerate(("scripted", "random")):
        say(f"[{3 + i}/5] evaluating the {policy} policy on {cfg.eval_episodes} episodes")
        m = run_eval(EvalConfig(policy=PolicyConfig(type=policy), task=cfg.task, episodes=cfg.eval_episodes, seed=1000 + cfg.seed,
                                num_envs=cfg.num_envs, out=run_dir / f"eval_{policy}", videos=4, overwrite=True),
                     progress=progress)
        tracker.log({"stage": f"eval_{policy}", **{k: v for k, v in m.items() if k != "videos"}})
        rows.append(m)

    wm_section = []
    if cfg.wm_steps > 0:
        from world_models.video.train import TrainWMConfig, train_world_model

        say(f"[5/5] training a {cfg.wm_size} video world model ({cfg.wm_steps} steps per phase) on the dataset")
        wm = train_world_model(TrainWMConfig(data=run_dir / "dataset", out=run_dir / "world_model", size=cfg.wm_size,
                                             ae_steps=cfg.wm_steps, dyn_steps=cfg.wm_steps, cls_steps=cfg.wm_steps // 4,
                                             batch_size=16, holdout=0.2, videos=2, overwrite=True), progress=progress)
        tracker.log({"stage": "world_model", **{k: v for k, v in wm.items() if k != "videos"}})
        wm_section = [("World model: real | imagined, held-out episodes, same actions (front above, wrist below)",
                       "<img src='world_model/videos/real_vs_imagined.gif' width='900'>"
                       f"<p>{cfg.wm_size} model, {cfg.wm_steps} steps per phase, {wm['train_minutes']:.1f} min on this "
                       "machine: a smoke-sized model; see the README's world-model table for the default size.</p>")]

    sections = [
        ("Evaluation (true simulator)", metrics_table(
            rows, ["policy", "task", "pc_success", "success_ci95_low", "success_ci95_high", "avg_sum_reward",
                   "avg_max_reward", "avg_episode_length", "n_episodes"])),
        ("Scripted expert rollouts (front | wrist; green border = success)",
         "<img src='eval_scripted/videos/grid.gif' width='900'><br><img src='eval_scripted/episodes.png'>"),
        ("Random policy rollouts", "<img src='eval_random/videos/grid.gif' width='900'>"),
        ("Collected dataset (LeRobot v3)", metrics_table(
            [data], ["dataset", "episodes", "frames", "pc_success"]) +
         "<p>Near-success failures are recorded on purpose: world models need them to learn what failure looks like.</p>"),
        ("Replay buffer", metrics_table([replay_info], list(replay_info))),
        *wm_section,
    ]
    report = write_report(run_dir / "report.html", f"wmrl demo: {cfg.task}", sections)
    summary = {"run_dir": str(run_dir), "report": str(report), "minutes": (time.time() - t0) / 60,
               "expert_pc_success": rows[0]["pc_success"], "random_pc_success": rows[1]["pc_success"],
               "dataset_frames": data["frames"], **{f"replay_{k}": v for k, v in replay_info.items()}}
    tracker.log({"stage": "done", **summary})
    tracker.close()
    say(f"done in {summary['minutes']:.1f} min: expert {rows[0]['pc_success']:.0f}% vs random "
        f"{rows[1]['pc_success']:.0f}% success; report at {report}")
    return summary

