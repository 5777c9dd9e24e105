"""Policy evaluation without physical rollouts (Ctrl-World, WorldEval): score a population of policies in the world
model and in the true simulator with the same evaluation loop, then measure how well the imagined ranking and
success rates agree with the true ones (Spearman rho, Kendall tau, mean absolute success-rate error, a scatter plot).

    wmrl rank --policies RUN_A RUN_B scripted scripted:noise=0.6 random --world-model WM_RUN [--workers ray]

A policy spec is a VLA run or checkpoint folder (`FOLDER:stochastic` samples its actions: BC with action noise), `scripted[:noise=X,failure_prob=Y]` or `random`. Scripted experts
act on privileged simulator state; in imagination they act on the state channel's predicted object state.
Evaluations of many policies run in parallel on Ray workers with `--workers ray` (the `dist` extra).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

import sim
from policies.factory import PolicyConfig
from wmrl.core.io import atomic_path, write_json
from wmrl.core.run import Tracker, start_run
from world_models.env import make_imagination_env
from world_models.factory import make_world_model
from world_models.video.train import check_world_model_task, world_model_data


WORKERS = ("local", "ray")


@dataclass
class RankConfig:
    policies: tuple[str, ...] = ("scripted", "scripted:noise=0.5", "scripted:failure_prob=0.5", "random")
    """Policy specs: VLA run folders, scripted[:noise=X,failure_prob=Y], random."""
    world_model: Path = Path("runs/wm")
    data: Optional[Path] = None
    """Real episodes for the imagined starts; default: the world model's training dataset."""
    task: str = "push-red"
    episodes: int = 30
    """Episodes per policy, in each of the two environments."""
    num_envs: int = 10
    """Imagined episodes run as one batch."""
    seed: int = 0
    workers: str = "local"
    num_workers: int = 2
    out: Path = Path("runs/rank")
    overwrite: bool = False
    resume: bool = False


def parse_policy_spec(spec: str):
    """'scripted:noise=0.3,failure_prob=0.5' | 'random' | FOLDER | FOLDER:stochastic -> PolicyConfig."""
    name, _, args = spec.partition(":")
    if name in ("scripted", "random"):
        kw = {}
        for item in filter(None, args.split(",")):
            k, _, v = item.partition("=")
            if k not in ("noise", "failure_prob"):
                raise ValueError(f"policy spec {spec!r}: unknown option {k!r}; valid: noise, failure_prob")
            kw[k] = float(v)
        return PolicyConfig(type=name, **kw)
    path, stochastic = (name, True) if args == "stochastic" else (spec, False)  # FOLDER:stochastic samples actions
    if not Path(path).exists():
        raise ValueError(f"policy spec {spec!r}: not scripted[:...], random, or an existing policy folder[:stochastic]")
    return PolicyConfig(type="vla", path=Path(path), stochastic=stochastic)


def rank_statistics(imagined: list[float], true: list[float]) -> dict:
    """Agreement of imagined and true success rates (fractions) over a population."""
    from scipy import stats

    a, b = np.asarray(imagined, float), np.asarray(true, float)
    if a.shape != b.shape or len(a) < 2:
        raise ValueError(f"need two equally long lists of at least 2 scores, got {len(a)} and {len(b)}")
    rho = stats.spearmanr(a, b).statistic if a.std() > 0 and b.std() > 0 else float("nan")
    tau = stats.kendalltau(a, b).statistic if a.std() > 0 and b.std() > 0 else float("nan")
    return {"rank_spearman": float(rho), "rank_kendall": float(tau), "success_abs_error": float(np.abs(a - b).mean()),
            "n_policies": int(len(a))}


def score_policy(spec: str, world_model: str, data: str, task: str, episodes: int, num_envs: int, seed: int,
                 threads: int | None = None) -> dict:
    """Success of one policy in the world model and in the true simulator (same loop, same seeds). Runs in-process
    or inside a Ray worker (everything is rebuilt from paths, nothing is pickled but strings)."""
    import torch

    from wmrl.eval import evaluate

    if threads:
        torch.set_num_threads(threads)
    pcfg = parse_policy_spec(spec)
    model = make_world_model("video", world_model)
    max_steps = sim.make_env(task).unwrapped.max_episode_steps
    wm_env = make_imagination_env(model, Path(data), num_envs, max_steps, sampling_steps=1)
    true_env = sim.make_vector_env(task, 1, asynchronous=False)
    out = {"policy": spec}
    try:
        for name, env in (("imagined", wm_env), ("true", true_env)):
            policy = pcfg.build(env, seed=seed)
            t = time.perf_counter()
            r = evaluate(policy, env, episodes, seed=seed, progress=False)
            out[f"{name}_success"] = r.pc_success / 100
            out[f"{name}_ci95"] = [r.success_ci95[0] / 100, r.success_ci95[1] / 100]
            out[f"{name}_seconds"] = time.perf_counter() - t
    finally:
        true_env.close()
    return out


def score_population(specs: list[str], world_model: str, data: str, task: str, episodes: int, num_envs: int,
                     seed: int, workers: str = "local", num_workers: int = 2, progress: bool = True) -> list[dict]:
    if workers not in WORKERS:
        raise ValueError(f"workers: expected one of {WORKERS}, got {workers!r}")
    for s in specs:  # fail before any work on a bad spec
        parse_policy_spec(s)
    args = (world_model, data, task, episodes, num_envs, seed)
    if workers == "local":
        from tqdm.auto import tqdm

        return [score_policy(s, *args) for s in tqdm(specs, desc="policies", disable=not progress)]
    try:
        import ray
    except ImportError as e:
        raise ValueError("--workers ray needs Ray: pip install 'wmrl[dist]'") from e
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=num_workers, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1)(score_policy)
        return ray.get([remote.remote(s, *args, threads=1) for s in specs])
    finally:
        if started:
            ray.shutdown()


def plot_scatter(rows: list[dict], path: Path, stats: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    fig, ax = plt.subplots(figsize=(4.6, 4.4))
    x = [r["true_success"] for r in rows]
    y = [r["imagined_success"] for r in rows]
    ax.plot([0, 1], [0, 1], color="0.7", lw=1, ls="--")
    ax.scatter(x, y, color="tab:blue")
    for r in rows:
        ax.annotate(Path(r["policy"]).name if "/" in r["policy"] else r["policy"], (r["true_success"], r["imagined_success"]),
                    fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set(xlim=(-0.05, 1.05), ylim=(-0.05, 1.05), xlabel="true-simulator success", ylabel="world-model success",
           title=f"Spearman {stats['rank_spearman']:.2f}, MAE {stats['success_abs_error']:.2f}")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return path


def run_rank(cfg: RankConfig, progress: bool = True) -> dict:
    data = cfg.data or world_model_data(cfg.world_model)
    check_world_model_task(cfg.world_model, data, [cfg.task], f"--task {cfg.task}")
    run = start_run(cfg)
    t0 = time.time()
    rows = score_population(list(cfg.policies), str(cfg.world_model), str(data), cfg.task, cfg.episodes, cfg.num_envs,
                            cfg.seed, cfg.workers, cfg.num_workers, progress)
    stats = rank_statistics([r["imagined_success"] for r in rows], [r["true_success"] for r in rows])
    plot_scatter(rows, run / "ranking.png", stats)
    result = {**stats, "policies": rows, "minutes": (time.time() - t0) / 60, "run_dir": str(run)}
    write_json(run / "ranking.json", result)
    tracker = Tracker(run)
    tracker.log({k: v for k, v in result.items() if k != "policies"})
    tracker.close()
    return result
