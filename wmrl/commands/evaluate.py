"""`wmrl eval`: run a policy on a task for N episodes; metrics, videos and plots into a run folder."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import sim
from policies.factory import PolicyConfig
from wmrl.core.run import Tracker, start_run
from wmrl.eval import evaluate


@dataclass
class EvalConfig:
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    task: str = "push-red"
    episodes: int = 50
    seed: int = 1000
    num_envs: int = 2
    out: Optional[Path] = None
    """Run folder; default runs/eval/<policy>-<task>-<date>-<time>."""
    videos: int = 8
    """Episodes to save as mp4 (plus a grid GIF); 0 for none."""
    wandb: bool = False
    """Mirror metrics to wandb in offline mode (no account or network needed)."""
    overwrite: bool = False
    resume: bool = False


def plot_episodes(per_episode: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3))
    colours = ["tab:green" if r["success"] else "tab:red" for r in per_episode]
    ax[0].bar(range(len(per_episode)), [r["sum_reward"] for r in per_episode], color=colours)
    ax[0].set(xlabel="episode", ylabel="sum reward", title="return (green = success)")
    ax[1].hist([r["length"] for r in per_episode], bins=20, color="tab:blue")
    ax[1].set(xlabel="episode length (steps)", ylabel="episodes", title="lengths")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run_eval(cfg: EvalConfig, progress: bool = True) -> dict:
    pol = cfg.policy.type
    out = cfg.out or Path("runs/eval") / f"{pol}-{cfg.task}-{time.strftime('%Y%m%d-%H%M%S')}"
    sim.resolve_task(cfg.task)  # fail on a bad name before creating anything
    run_dir = start_run(cfg, out)
    env = sim.make_vector_env(cfg.task, cfg.num_envs)
    try:
        policy = cfg.policy.build(env, seed=cfg.seed)
        result = evaluate(policy, env, cfg.episodes, seed=cfg.seed, policy_id=pol, progress=progress,
                          video_dir=run_dir / "videos" if cfg.videos else None, max_videos=cfg.videos)
    finally:
        env.close()
    tracker = Tracker(run_dir, wandb=cfg.wandb, config=cfg)
    metrics = {"task": cfg.task, "policy": pol, **result.metrics()}
    tracker.log(metrics)
    tracker.close()
    plot_episodes(result.per_episode, run_dir / "episodes.png", f"{pol} on {cfg.task}")
    return {**metrics, "run_dir": str(run_dir), "videos": result.video_paths}
