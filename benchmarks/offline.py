"""Offline model-based RL: the edge-of-reach claims (Sims et al. 2024) on data made here, at CPU budgets.

Part 1, `point` (the didactic 2-D task, `sim/point.py`): random-policy data near the origin, goal outside it.
MBPO-style SAC (no penalty) and RAVL, both with k-step rollouts in the *true* dynamics, `seeds` seeds. Records the
return and the mean Q at dataset states and at the states rollouts end in (edge-of-reach candidates), per epoch,
and plots Q over the plane for both methods.

Also on the point task: WSRL against naive fine-tuning from the RAVL agents, and trajectory weighting (uniform
against return-weighted TD3+BC) on a mixed dataset.

Part 2, `HalfCheetah-v5` medium (and `Hopper`, `Walker2d` when `envs` names them): MBPO, MOPO and RAVL with the learned ensemble and with
the true-dynamics oracle, plus the online-SAC reference. Budgets are arguments and are recorded beside the numbers.

Work folder runs/bench-offline/ (datasets and SAC runs are cached). Plots go to docs/offline_*.png.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "runs" / "bench-offline"


def _runs(data: Path, work: Path, algos, dynamics, seeds, finished_only: bool = False, **kw) -> dict:
    """Every (algo, dynamics, seed) run, each reused when it finished with this budget and continued when it stopped
    part way. `finished_only`: report the finished ones and train nothing (a method with none is left out)."""
    from wmrl.core.run import resume_differences
    from wmrl.rl.ravl import PRESETS, OfflineConfig, train_offline

    out = {}
    for algo in algos:
        for dyn in dynamics if PRESETS[algo].model_data else ("",):  # model-free: one run, no dynamics
            rows = []
            for seed in range(seeds):
                run = work / (f"{algo}-{dyn}-s{seed}" if dyn else f"{algo}-s{seed}")
                done = run / "result.json"
                budget = json.dumps(kw, sort_keys=True, default=str)
                if done.exists():
                    prev = json.loads(done.read_text())
                    if prev.get("budget") == budget:  # finished with the same budget: reuse it
                        rows.append(prev)
                        continue
                if finished_only:
                    continue
                cfg = OfflineConfig(data=data, out=run, algo=algo, dynamics=dyn or "learned", seed=seed,
                                    dynamics_dir=work / f"dynamics-s{seed}", progress=False, **kw)
                # a run stopped part way, or finished at fewer epochs of the same budget, continues where it stopped
                # (exactly: tested); any other difference in its config.yaml starts it over
                resume = (run / "checkpoints" / "last").exists() and not resume_differences(run, cfg)
                res = train_offline(dataclasses.replace(cfg, resume=resume, overwrite=not resume))
                res["budget"] = budget
                done.write_text(json.dumps(res, default=float))
                rows.append(res)
            if rows:
                out[f"{algo}_{dyn}" if dyn else algo] = rows
    return out


def _summary(rows: list[dict], reference: dict) -> dict:
    from wmrl.rl.d4rl import normalized_score

    final = [normalized_score(r["final_return"], reference) for r in rows]
    q_end = [r["curve"][-1].get("q_dataset", float("nan")) for r in rows]
    q_edge = [r["curve"][-1].get("q_rollout_end", float("nan")) for r in rows]
    q_max = [max(abs(c.get("q_dataset", 0.0)) for c in r["curve"]) for r in rows]
    return {"normalized_return_mean": float(np.mean(final)), "normalized_return_per_seed": final,
            "q_dataset_final_mean": float(np.mean(q_end)), "q_rollout_end_final_mean": float(np.mean(q_edge)),
            "q_abs_max_mean": float(np.mean(q_max)), "minutes_mean": float(np.mean([r["minutes"] for r in rows]))}


def _plot_curves(results: dict, path: Path, title: str, updates_per_epoch: int | None = None,
                 reference: dict | None = None) -> None:
    """Per method: mean Q at dataset (s, a), mean Q at the states rollouts end in (the edge-of-reach candidates) and
    the return (normalised when `reference` is given) over training; lines are seed means, bands span the seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wmrl.rl.d4rl import normalized_score

    scale = updates_per_epoch or 1
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    for i, (name, rows) in enumerate(results.items()):
        color = f"C{i}"
        n = min(len(r["curve"]) for r in rows)
        ep = np.array([c["epoch"] for c in rows[0]["curve"][:n]]) * scale
        for ax, key in zip(axes, ("q_dataset", "q_rollout_end")):
            vals = np.array([[c.get(key, np.nan) for c in r["curve"][:n]] for r in rows])
            ax.plot(ep, np.nanmean(vals, 0), color=color, label=name)
            if len(rows) > 1:
                ax.fill_between(ep, np.nanmin(vals, 0), np.nanmax(vals, 0), color=color, alpha=0.15, lw=0)
        ev = np.array([c["epoch"] for c in rows[0]["curve"][:n] if "return" in c]) * scale
        rets = np.array([[c["return"] for c in r["curve"][:n] if "return" in c] for r in rows])
        if reference is not None:
            rets = np.vectorize(lambda x: normalized_score(x, reference))(rets)
        axes[2].plot(ev, rets.mean(0), marker="o", ms=3, color=color, label=name)
        if len(rows) > 1:
            axes[2].fill_between(ev, rets.min(0), rets.max(0), color=color, alpha=0.15, lw=0)
    ret_title = "normalised return (online SAC = 100)" if reference is not None else "return"
    for ax, t in zip(axes, ("mean Q at dataset (s, a)", "mean Q at rollout end states (edge of reach)", ret_title)):
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("agent updates" if updates_per_epoch else "epoch")
        ax.grid(alpha=0.3)
    axes[0].set_yscale("symlog")
    axes[1].set_yscale("symlog")
    axes[2].legend(fontsize=8)
    fig.suptitle(title + ("; bands: min to max over seeds" if any(len(r) > 1 for r in results.values()) else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_point_q(data: Path, work: Path, path: Path) -> dict:
    """Q(s, pi(s)) over the plane for each method's final agent, with the dataset's states: the edge-of-reach ring."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from wmrl.replay import EpisodeReplay
    from wmrl.rl.agents import load_agent

    torch.manual_seed(0)  # pi(s) is sampled: a fixed seed makes the map reproducible
    real = EpisodeReplay.from_lerobot(data)
    pts = real.transitions(["observation.state"])["observation.state"]
    g = np.linspace(-6, 6, 61)
    X, Y = np.meshgrid(g, g)
    grid = torch.as_tensor(np.stack([X.ravel(), Y.ravel()], 1), dtype=torch.float32)
    radius = np.linalg.norm(pts, axis=1).max()
    names = ["mbpo-true-s0", "ravl-true-s0"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    out = {}
    for ax, name in zip(axes, names):
        agent = load_agent(work / name)
        with torch.no_grad():
            q = agent.q_values(grid, agent.actor.sample(grid)[0]).min(0).values.numpy().reshape(X.shape)
        r = np.linalg.norm(np.stack([X, Y], -1), axis=-1)
        inside, ring = r <= radius, (r > radius) & (r <= radius + 2.5)  # 2.5 = k=5 steps of 0.5
        out[name.split("-")[0]] = {"q_in_data": float(q[inside].mean()), "q_edge_ring": float(q[ring].mean())}
        im = ax.imshow(q, origin="lower", extent=(-6, 6, -6, 6), cmap="viridis")
        ax.scatter(pts[::5, 0], pts[::5, 1], s=1, c="white", alpha=0.4)
        ax.add_patch(plt.Circle((0, 0), radius, fill=False, color="red", lw=1))
        ax.set_title(f"{name.split('-')[0].upper()}: min_i Q(s, pi(s))", fontsize=10)
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return out


def _weighting(work: Path, seeds: int, quick: bool, hidden: int) -> dict:
    """Trajectory weighting (Hong et al. 2023) on a mixed point dataset: 95% random + 5% SAC transitions, TD3+BC with
    uniform against return-weighted sampling."""
    from wmrl.rl.d4rl import MakeDatasetConfig, make_dataset

    data = work / "PointEdge-v0-mixed"
    if not (data / "meta" / "make.json").exists():
        make_dataset(MakeDatasetConfig(env="PointEdge-v0", kind="mixed", expert_fraction=0.05, out=data, overwrite=True,
                                       transitions=600 if quick else 6000, sac_steps=500 if quick else 5000,
                                       sac_hidden=64, cache=work / "cache", progress=False, reference_episodes=20))
    ref = json.loads((data / "meta" / "make.json").read_text())["reference_returns"]
    out = {}
    for weighting in ("none", "return"):
        res = _runs(data, work / f"weighting-{weighting}", ("td3bc",), ("learned",), seeds, weighting=weighting,
                    epochs=2 if quick else 20, updates_per_epoch=20 if quick else 250, hidden=hidden,
                    eval_every=2 if quick else 20, eval_episodes=20)
        out[weighting] = _summary(res["td3bc"], ref)["normalized_return_mean"]
    return {"uniform": out["none"], "return_weighted": out["return"], "weighted_vs_uniform": out["return"] - out["none"]}


def _finetuning(work: Path, seeds: int, quick: bool, steps: int) -> dict:
    """WSRL against naive fine-tuning (with and without the offline data) from the RAVL agents of part 1."""
    from wmrl.rl.d4rl import normalized_score
    from wmrl.rl.wsrl import FinetuneConfig, finetune

    data = work / "PointEdge-v0-random"
    ref = json.loads((data / "meta" / "make.json").read_text())["reference_returns"]
    steps = 300 if quick else steps
    out, curves = {}, {}
    for algo in ("wsrl", "naive", "naive-retain"):
        finals, cs = [], []
        for seed in range(seeds):
            run = work / "finetune" / f"{algo}-s{seed}"
            done = run / "result.json"
            res = json.loads(done.read_text()) if done.exists() else finetune(FinetuneConfig(
                agent=work / "point" / f"ravl-true-s{seed}", env="PointEdge-v0", algo=algo, data=data, out=run,
                steps=steps, warmup=min(1000, steps // 3), eval_every=max(steps // 10, 1), eval_episodes=10, seed=seed,
                overwrite=True, progress=False))
            finals.append(normalized_score(res["final_return"], ref))
            cs.append([(c["env_step"], normalized_score(c["return"], ref)) for c in res["curve"]])
        out[algo] = float(np.mean(finals))
        curves[algo] = cs
    return {"final": out, "curves": curves, "online_steps": steps}


def _plot_finetuning(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for algo, cs in curves.items():
        x = [p[0] for p in cs[0]]
        y = np.mean([[p[1] for p in c] for c in cs], 0)
        ax.plot(x, y, marker="o", label=algo)
    ax.set_xlabel("online env steps")
    ax.set_ylabel("normalised return")
    ax.set_title("offline-to-online from RAVL (2-D point task)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(quick: bool = False, envs: str = "point,HalfCheetah", seeds: int = 3, point_epochs: int = 30, point_updates: int = 200,
         cheetah_epochs: int = 20, cheetah_updates: int = 400, cheetah_rollouts: int = 1000, cheetah_model_epochs: int = 60,
         cheetah_transitions: int = 50_000, cheetah_sac_steps: int = 100_000, hidden: int = 64,
         finetune_steps: int = 3000, cheetah_seeds: int = 1, algos: str = "mbpo,mopo,ravl",
         dynamics: str = "true,learned", eval_every: int = 0, tag: str = "", finished_only: bool = False) -> dict:
    """`algos`, `dynamics`: which locomotion runs (two processes can run disjoint sets side by side; a last
    invocation naming all of them reads their cached results). `eval_every`: epochs between evaluations and
    checkpoints (default a fifth of the run; fix it when a run is to be continued at a larger `cheetah_epochs`).
    `tag`: the result goes to `offline-<tag>.json` and its plots to `docs/offline_<tag>_*.png`, and its runs to their
    own work folder, so runs at another budget leave the committed ones alone. `finished_only`: report the locomotion
    runs that finished with this budget and train none (a long campaign's results so far)."""
    from wmrl.rl.d4rl import MakeDatasetConfig, make_dataset

    work = Path(tempfile.mkdtemp(prefix="wmrl-bench-offline-")) if quick else WORK
    runs_work = work / tag if tag else work  # datasets and the SAC cache are shared across tags
    result_name = f"offline-{tag}" if tag else "offline"
    docs = REPO / "docs"
    out: dict = {"budgets": {}}
    t0 = time.time()
    if quick:  # the smoke test never trains on HalfCheetah
        envs = "point"
    if "point" in envs:
        if quick:
            seeds, point_epochs, point_updates = 1, 2, 20
        data = work / "PointEdge-v0-random"
        if not (data / "meta" / "make.json").exists():
            make_dataset(MakeDatasetConfig(env="PointEdge-v0", kind="random", out=data, overwrite=True,
                                           transitions=600 if quick else 3000, sac_steps=500 if quick else 5000,
                                           sac_hidden=64, cache=work / "cache", progress=False, reference_episodes=20))
        made = json.loads((data / "meta" / "make.json").read_text())
        ref = made["reference_returns"]
        res = _runs(data, work / "point", ("mbpo", "ravl"), ("true",), seeds, epochs=point_epochs,
                    updates_per_epoch=point_updates, rollout_batch=1000, rollout_length=5, hidden=hidden,
                    eval_every=max(point_epochs // 4, 1), eval_episodes=20)
        out["point"] = {k: _summary(v, ref) for k, v in res.items()}
        out["point"]["reference_returns"] = ref
        out["budgets"]["point"] = {"dataset": "random policy, 3000 transitions", "epochs": point_epochs,
                                   "updates_per_epoch": point_updates, "rollout_batch": 1000, "k": 5,
                                   "real_ratio": 0.05, "hidden": hidden, "seeds": seeds}
        if not quick:
            _plot_curves(res, docs / "offline_point_curves.png", "2-D point task, true dynamics, k=5 rollouts")
            out["point"]["q_map"] = _plot_point_q(data, work / "point", docs / "offline_point_q.png")
        ft = _finetuning(work, seeds, quick, finetune_steps)
        out["point"]["finetune"] = ft["final"]
        out["wsrl_final"], out["naive_finetune_final"] = ft["final"]["wsrl"], ft["final"]["naive"]
        out["naive_retain_finetune_final"] = ft["final"]["naive-retain"]
        out["budgets"]["finetune"] = {"online_steps": ft["online_steps"], "warmup": min(1000, ft["online_steps"] // 3),
                                      "utd": 4, "from": "the RAVL agents above"}
        if not quick:
            _plot_finetuning(ft["curves"], docs / "offline_point_finetune.png")
        w = _weighting(work, seeds, quick, hidden)
        out["point"]["weighting"] = w
        out["weighted_vs_uniform"] = w["weighted_vs_uniform"]
        out["budgets"]["weighting"] = {"dataset": "PointEdge mixed: 95% random + 5% SAC, 6000 transitions",
                                       "agent": "td3bc", "epochs": 20, "updates_per_epoch": 250}
    for env in [e for e in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5") if e.split("-")[0] in envs]:
        name = "cheetah" if env == "HalfCheetah-v5" else env.split("-")[0].lower()  # work folder
        data = work / f"{env}-medium"
        if not (data / "meta" / "make.json").exists():
            make_dataset(MakeDatasetConfig(env=env, kind="medium", out=data, overwrite=True,
                                           transitions=cheetah_transitions, sac_steps=cheetah_sac_steps,
                                           sac_hidden=hidden, cache=work / "cache", progress=False))
        made = json.loads((data / "meta" / "make.json").read_text())
        ref = made["reference_returns"]
        # (`--options dynamics=true` arrives as YAML's True: str().lower() turns it back into the name)
        res = _runs(data, runs_work / name, str(algos).split(","), str(dynamics).lower().split(","), cheetah_seeds, epochs=cheetah_epochs,
                    updates_per_epoch=cheetah_updates, rollout_batch=cheetah_rollouts, hidden=hidden,
                    eval_every=eval_every or max(cheetah_epochs // 5, 1), eval_episodes=3,
                    ensemble_max_epochs=cheetah_model_epochs, finished_only=finished_only)
        out[env] = {k: _summary(v, ref) for k, v in res.items()}
        out[env]["reference_returns"] = ref
        out[env]["dataset_normalized_score"] = made["normalized_score_mean"]
        out["budgets"][env] = {"sac_steps": cheetah_sac_steps, "dataset_transitions": cheetah_transitions,
                               "epochs": cheetah_epochs, "updates_per_epoch": cheetah_updates,
                               "rollout_batch": cheetah_rollouts, "k": 5, "real_ratio": 0.05, "hidden": hidden,
                               "ensemble": "7 members, 5 elites, 4x200, at most %d epochs" % cheetah_model_epochs,
                               "seeds": cheetah_seeds}
        out["updates_per_run"] = cheetah_epochs * cheetah_updates
        if env == "HalfCheetah-v5":  # the headline keys of the result file
            for k in ("ravl_true", "ravl_learned", "mbpo_true", "mbpo_learned", "mopo_true", "mopo_learned"):
                if k in out[env]:
                    out[k] = out[env][k]["normalized_return_mean"]
            out["online_sac_reference"] = 100.0  # the expert reference *is* our online SAC's return
        if not quick:
            _plot_curves(res, docs / f"offline_{tag + '_' if tag else ''}{name}_curves.png".replace("cheetah", "halfcheetah"),
                         f"{env} medium, {cheetah_updates * cheetah_epochs:,} updates per run", cheetah_updates,
                         ref)
    out["seeds"] = {part: n for part, n in (("point", seeds), ("HalfCheetah", cheetah_seeds), ("Hopper", cheetah_seeds),
                                            ("Walker2d", cheetah_seeds)) if part in envs}
    out["minutes"] = (time.time() - t0) / 60
    prev_path = REPO / "benchmarks" / "results" / f"{result_name}.json"
    if not quick and prev_path.exists():  # parts run separately (`--options envs=...`) add up in one result file
        prev = json.loads(prev_path.read_text())
        for k in ("benchmark", "machine", "command", "date"):
            prev.pop(k, None)
        prev_seeds = prev.get("seeds") if isinstance(prev.get("seeds"), dict) else {}
        # a part's methods add to those already in the file (`--options algos=mopo dynamics=learned` keeps the
        # true-dynamics rows of the same environment); each method's row lists its own seeds
        merged = {k: {**prev[k], **v} for k, v in out.items() if k.endswith("-v5") and isinstance(prev.get(k), dict)}
        out = {**prev, **out, **merged, "budgets": {**prev.get("budgets", {}), **out["budgets"]},
               "seeds": {**prev_seeds, **out["seeds"]},
               "minutes_by_part": {**prev.get("minutes_by_part", {}), f"{envs}:{algos}:{dynamics}": out["minutes"]}}
    import inspect

    params, loc = inspect.signature(main).parameters, dict(locals())  # (a comprehension has its own locals())
    given = {k: loc[k] for k in params if k != "quick" and loc[k] != params[k].default}
    command = f"wmrl bench offline --json" + (" --options " + " ".join(f"{k}={v}" for k, v in given.items()) if given else "")
    return finish(result_name, out, quick, command)
