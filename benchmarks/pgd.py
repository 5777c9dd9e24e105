"""Policy-guided diffusion (Jackson et al. 2024) on data made here, at CPU budgets.

Per dataset (`envs`: HalfCheetah-v5 and Hopper-v5 medium, the offline benchmark's datasets):
1. a trajectory diffusion model trained once on T-frame windows;
2. the target policy: TD3+BC trained on the real data (the seed-0 baseline run below);
3. dynamics error of generated trajectories (`wmrl.rl.pgd.true_dynamics_error`, in units of the dataset's
   per-dimension std) for unguided PGD, guided PGD at each lambda in `lambdas`, an autoregressive rollout of the
   learned Gaussian ensemble from the same start states under the target policy, and real dataset windows (the
   measurement's floor: Hopper's observations clip velocities);
4. the target policy's mean log-likelihood of the generated actions, per lambda;
5. downstream normalised return of TD3+BC and IQL with and without PGD data (`seeds` seeds each).

Work folder runs/bench-pgd/ (diffusion models and finished runs are cached, keyed by their budget).
Plots: docs/pgd_dynamics_error.png, docs/pgd_returns.png.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "runs" / "bench-pgd"
HORIZONS = (1, 4, 8, 16, 31)


def _cached(path: Path, budget: dict, fn):
    """Run fn() unless path holds a result made with the same budget."""
    key = json.dumps(budget, sort_keys=True, default=str)
    if path.exists():
        prev = json.loads(path.read_text())
        if prev.get("budget") == key:
            return prev
    res = fn()
    res["budget"] = key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, default=float))
    return res


def _dataset(work: Path, env: str, quick: bool) -> Path:
    from wmrl.rl.d4rl import MakeDatasetConfig, make_dataset

    if env == "PointEdge-v0":
        data = work / "PointEdge-v0-mixed"
        kw = dict(kind="mixed", transitions=3000, sac_steps=2500, expert_fraction=0.3, sac_hidden=32, reference_episodes=20)
    else:  # the offline benchmark's datasets, reused when it has made them
        data = REPO / "runs" / "bench-offline" / f"{env}-medium"
        kw = dict(kind="medium", transitions=50_000, sac_steps=100_000, sac_hidden=64)
    if not (data / "meta" / "make.json").exists():
        make_dataset(MakeDatasetConfig(env=env, out=data, overwrite=True, cache=data.parent / "cache", progress=False, **kw))
    return data


def _h_means(err: np.ndarray) -> dict:
    return {f"h{h}": float(np.nanmean(err[:h])) for h in HORIZONS if h <= len(err)}


def _ensemble_rollout(dynamics, policy, s0: np.ndarray, steps: int, env_id: str, seed: int) -> dict:
    """Autoregressive rollout of the learned ensemble (a random elite per step, MBPO) under the target policy."""
    import torch

    from sim.locomotion import termination_fn

    rng = np.random.default_rng(seed)
    n = len(s0)
    obs = np.zeros((n, steps + 1, s0.shape[1]), np.float32)
    act = np.zeros((n, steps + 1, policy.act_dim), np.float32)
    obs[:, 0] = s0
    length = np.full(n, steps)
    alive = np.ones(n, bool)
    term_fn = termination_fn(env_id)
    for t in range(steps):
        with torch.no_grad():
            act[:, t] = policy.act(torch.as_tensor(obs[:, t])).numpy()
        nxt, _, term, _, _ = dynamics.step(obs[:, t], act[:, t], None, rng=rng, termination=term_fn)
        obs[:, t + 1] = np.nan_to_num(nxt, posinf=1e6, neginf=-1e6)
        length[alive & term] = t + 1
        alive &= ~term
    return {"obs": obs, "act": act, "length": length}


def _downstream(data: Path, work: Path, agent: str, seed: int, use_pgd: bool, budget: dict, diffusion_dir: Path,
                guidance: float) -> dict:
    from wmrl.rl.pgd import PGDConfig, train_pgd
    from wmrl.rl.ravl import OfflineConfig, train_offline

    common = dict(epochs=budget["agent_epochs"], updates_per_epoch=budget["agent_updates"], hidden=budget["hidden"],
                  eval_every=budget["agent_epochs"], eval_episodes=budget["eval_episodes"], seed=seed, progress=False)
    run = work / f"{'pgd-' if use_pgd else ''}{agent}-s{seed}"
    if use_pgd:
        fn = lambda: train_pgd(PGDConfig(data=data, out=run, agent=agent, diffusion_dir=diffusion_dir, horizon=budget["horizon"],
                                         widths=budget["widths"], sampling_steps=budget["sampling_steps"], guidance=guidance,
                                         synthetic_windows=budget["synthetic_windows"],
                                         regenerate_every=budget["regenerate_every"], overwrite=True, **common))
    else:
        fn = lambda: train_offline(OfflineConfig(data=data, out=run, algo=agent, overwrite=True, **common))
    return _cached(run / "result.json", {**budget, "pgd": use_pgd, "guidance": guidance if use_pgd else None}, fn)


def _plot(results: dict, docs: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(results)
    fig, axes = plt.subplots(1, len(envs), figsize=(5.5 * len(envs), 4), squeeze=False)
    for ax, env in zip(axes[0], envs):
        curves = results[env]["dyn_error_curves"]
        for name, err in curves.items():
            if name != "dataset":  # the measurement's floor (~1e-12 on real windows) is given in the title
                ax.plot(np.arange(1, len(err) + 1), err, label=name, lw=2 if name.startswith("pgd") else 1.2)
        ax.set_xlabel("position in the generated trajectory (step)")
        ax.set_ylabel("one-step dynamics error (std units^2)")
        floor = float(np.nanmax(curves["dataset"]))
        ax.set_title(f"{env}: generated vs true simulator\n(real dataset windows: <= {floor:.0e})", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(docs / "pgd_dynamics_error.png", dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 3.6), squeeze=False)
    for ax, env in zip(axes[0], envs):
        ds = results[env]["downstream"]
        labels, xs = [], 0
        for agent in ("td3bc", "iql"):
            for variant in ("real", "pgd"):
                vals = ds[agent][variant]["per_seed"]
                ax.bar(xs, np.mean(vals), color="tab:orange" if variant == "pgd" else "tab:blue", alpha=0.7)
                ax.scatter([xs] * len(vals), vals, color="k", s=10, zorder=3)
                labels.append(f"{agent}\n{'+PGD' if variant == 'pgd' else 'real only'}")
                xs += 1
        ax.set_xticks(range(xs), labels, fontsize=8)
        ax.set_ylabel("normalised return")
        ax.set_title(f"{env} medium")
    fig.tight_layout()
    fig.savefig(docs / "pgd_returns.png", dpi=110)
    plt.close(fig)


def main(quick: bool = False, envs: str = "HalfCheetah,Hopper", seeds: int = 3, horizon: int = 32,
         widths: str = "32,64,128", diffusion_steps: int = 4000, diffusion_batch: int = 128, sampling_steps: int = 16,
         lambdas: str = "0.3,1,3", guidance: float = 1.0, eval_windows: int = 256, agent_epochs: int = 20,
         agent_updates: int = 500, synthetic_windows: int = 1024, regenerate_every: int = 5000, hidden: int = 64,
         eval_episodes: int = 5) -> dict:
    import torch

    from wmrl.rl.d4rl import normalized_score
    from wmrl.rl.agents import load_agent
    from wmrl.rl.pgd import PGDConfig, diffusion_model, generate, true_dynamics_error
    from wmrl.rl.ravl import OfflineConfig, load_offline_data, make_dynamics
    from wmrl.rl.sac import spaces_of

    work = Path(tempfile.mkdtemp(prefix="wmrl-bench-pgd-")) if quick else WORK
    if quick:  # the smoke test: the point task, tiny sizes
        envs, seeds, horizon, widths, diffusion_steps, diffusion_batch, sampling_steps = "point", 1, 16, "16,32", 30, 32, 4
        lambdas, eval_windows, agent_epochs, agent_updates, synthetic_windows, regenerate_every = "1", 16, 2, 20, 32, 20
        eval_episodes = 2
    budget = {"horizon": horizon, "widths": tuple(int(w) for w in widths.split(",")), "diffusion_steps": diffusion_steps,
              "diffusion_batch": diffusion_batch, "sampling_steps": sampling_steps, "sampler": "heun",
              "agent_epochs": agent_epochs, "agent_updates": agent_updates, "synthetic_windows": synthetic_windows,
              "synthetic_ratio": "240/256", "regenerate_every": regenerate_every, "hidden": hidden,
              "eval_episodes": eval_episodes}
    lams = [float(x) for x in lambdas.split(",")]
    names = {"point": "PointEdge-v0", "HalfCheetah": "HalfCheetah-v5", "Hopper": "Hopper-v5", "Walker2d": "Walker2d-v5"}
    out: dict = {"budgets": {}, "guidance_downstream": guidance}
    per_env: dict = {}
    t0 = time.time()
    for key in [k for k in names if k in envs.split(",")]:
        env = names[key]
        t_env = time.time()
        data = _dataset(work, env, quick)
        ref = json.loads((data / "meta" / "make.json").read_text())["reference_returns"]
        ew = work / env
        real = load_offline_data(data)
        spaces = spaces_of(env)
        # 1. the diffusion model (cached)
        dcfg = PGDConfig(data=data, horizon=horizon, widths=budget["widths"], diffusion_steps=diffusion_steps,
                         diffusion_batch=diffusion_batch, sampling_steps=sampling_steps, progress=not quick)
        ddir = ew / f"diffusion-T{horizon}-w{widths.replace(',', '-')}-n{diffusion_steps}-b{diffusion_batch}"
        dcfg.diffusion_dir = ddir
        model, fit = diffusion_model(dcfg, real, spaces, ew)
        # 5a. real-data baselines (seed 0's TD3+BC is also the target policy)
        down: dict = {}
        for agent in ("td3bc", "iql"):
            down[agent] = {"real": [_downstream(data, ew, agent, s, False, budget, ddir, guidance) for s in range(seeds)]}
        target = load_agent(Path(down["td3bc"]["real"][0]["run_dir"]) / "checkpoints" / "last").actor
        # 3-4. dynamics error and target likelihood
        scale = real.transitions(["observation.state"])["observation.state"].std(0) + 1e-6
        gen = torch.Generator().manual_seed(0)
        curves, logp, h_err = {}, {}, {}
        for lam in [0.0] + lams:
            ro, info = generate(model, target, eval_windows, lam, generator=gen)
            name = "pgd_unguided" if lam == 0 else f"pgd_guided_{lam:g}"
            err = true_dynamics_error(env, ro, scale)
            curves[name], logp[name], h_err[name] = err.tolist(), info["target_logprob"], _h_means(err)
            if lam == 0:
                s0 = ro["obs"][:, 0]
        shared = REPO / "runs" / "bench-offline" / ("cheetah" if key == "HalfCheetah" else key.lower()) / "dynamics-s0"
        ens, _ = make_dynamics(OfflineConfig(data=data, dynamics="learned", ensemble_max_epochs=10 if quick else 60,
                                             dynamics_dir=shared if shared.exists() and not quick else ew / "dynamics",
                                             progress=False), env, real, ew)  # the offline benchmark's, when fitted
        ro_e = _ensemble_rollout(ens, target, s0, horizon - 1, env, seed=0)
        err = true_dynamics_error(env, ro_e, scale)
        curves["ensemble"], h_err["ensemble"] = err.tolist(), _h_means(err)
        from world_models.trajectory_diffusion import gather_windows, window_starts

        starts = window_starts(real, horizon)
        w = gather_windows(real, np.random.default_rng(0).choice(starts, eval_windows), horizon)
        err = true_dynamics_error(env, {"obs": w["observation.state"], "act": w["action"],
                                        "length": np.full(eval_windows, horizon - 1)}, scale)
        curves["dataset"], h_err["dataset"] = err.tolist(), _h_means(err)
        # 5b. with PGD data
        for agent in ("td3bc", "iql"):
            down[agent]["pgd"] = [_downstream(data, ew, agent, s, True, budget, ddir, guidance) for s in range(seeds)]
        summary = {}
        for agent, variants in down.items():
            summary[agent] = {}
            for variant, rows in variants.items():
                scores = [normalized_score(r["final_return"], ref) for r in rows]
                summary[agent][variant] = {"mean": float(np.mean(scores)), "std": float(np.std(scores)), "per_seed": scores}
            d = summary[agent]
            d["pgd_minus_real"] = d["pgd"]["mean"] - d["real"]["mean"]
            d["beyond_seed_spread"] = bool(min(d["pgd"]["per_seed"]) > max(d["real"]["per_seed"])
                                           or max(d["pgd"]["per_seed"]) < min(d["real"]["per_seed"]))
        h = "h16" if horizon > 16 else f"h{max(x for x in HORIZONS if x < horizon)}"
        main_lam = f"pgd_guided_{guidance:g}" if f"pgd_guided_{guidance:g}" in h_err else f"pgd_guided_{lams[0]:g}"
        per_env[env] = {
            "dyn_error": h_err, "dyn_error_curves": curves, "target_logprob": logp, "downstream": summary,
            f"dyn_error_ensemble_{h}": h_err["ensemble"][h], f"dyn_error_pgd_unguided_{h}": h_err["pgd_unguided"][h],
            f"dyn_error_pgd_guided_{h}": h_err[main_lam][h], f"dyn_error_dataset_{h}": h_err["dataset"][h],
            "target_logprob_unguided": logp["pgd_unguided"],
            "target_logprob_guided": {k.replace("pgd_guided_", ""): v for k, v in logp.items() if k != "pgd_unguided"},
            "logprob_monotone_in_lambda": bool(np.all(np.diff([logp["pgd_unguided"]] + [logp[f"pgd_guided_{x:g}"] for x in lams]) > 0)),
            "diffusion_fit": {k: v for k, v in fit.items() if k != "losses"}, "reference_returns": ref,
            "minutes": (time.time() - t_env) / 60}
        out["budgets"][env] = {**budget, "widths": list(budget["widths"]), "lambdas": lams, "eval_windows": eval_windows,
                               "seeds": seeds, "target_policy": "TD3+BC (seed 0, real data only)",
                               "ensemble": "7 members, 5 elites, 4x200 (the offline benchmark's recipe)"}
    out.update(per_env)
    first = next(iter(per_env.values()))
    for k in [k for k in first if k.startswith(("dyn_error_", "target_logprob_")) and k not in ("dyn_error_curves",)]:
        out[k] = first[k]  # headline keys: the first dataset's
    out["seeds"] = seeds
    out["minutes"] = (time.time() - t0) / 60
    if not quick:
        _plot({e: per_env[e] for e in per_env}, REPO / "docs")
    return finish("pgd", out, quick)
