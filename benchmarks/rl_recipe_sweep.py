"""Which RL recipe moves the estimated-state actor's true success when the world model is perfect?

The imagination benchmark (`benchmarks/imagination_estimated_state.py`) found that GRPO and PPO leave push-red's true
success where it started even with the true simulator in place of the world model (its `ceiling` runs). This
benchmark runs many recipe variants side by side from the same starting actor (that benchmark's BC stage, cached in
its work folder), each in its own process on one thread, with the true simulator as a perfect model
(`TrueGroupEnv`), under the same wall-clock budget, then evaluates each on the same 300 layouts and reports the paired
gain over the start, for the actor's mean and for its sampled (stochastic) actions.

Variants (`VARIANTS`): GRPO and PPO (`wmrl.rl.imagine.update`, as `wmrl imagine` runs them) with a binary or a
potential-shaped reward, a separate critic learning rate and critic warm-up (actor frozen for the first iterations), a residual actor on
the frozen behaviour-cloned one (ResiP, Ankile et al., 2024: `EstimatedStatePolicy.add_residual`),
a floor or a fixed value for sigma, approx-KL early stopping (`target_kl`), more epochs; success-filtered BC
(expert iteration / reward-weighted regression with a 0/1 reward: sample, keep the successful episodes, regress the
actor's mean onto their actions); and rollout policy improvement (`wmrl.rl.rollout_improvement`: perturbed actions
tried at the states of failed episodes, the simulator restored there, the actor regressed onto those that succeed).

    wmrl bench rl-recipe-sweep --json --options budget_s=380 workers=16
"""

from __future__ import annotations

import copy
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish, success_in_task

ROOT = Path(__file__).resolve().parent.parent
# the imagination benchmark's perfect-model env, BC stage and paired gain (benchmarks are scripts, not a package)
SIBLING = runpy.run_path(str(Path(__file__).with_name("imagination_estimated_state.py")), run_name="wmrl_bench_sibling")

# name -> options of `run_variant` (the defaults: PPO, lr 1e-4, binary reward, 2 epochs, critic lr = actor lr)
VARIANTS: dict[str, dict] = {
    "ppo": {},
    "ppo-critic-warmup": dict(critic_lr=1e-3, warmup=5),
    "ppo-shaped": dict(critic_lr=1e-3, warmup=5, reward="shaped"),
    "ppo-shaped-lr3e-5": dict(critic_lr=1e-3, warmup=5, reward="shaped", lr=3e-5),
    "ppo-shaped-minstd0.05": dict(critic_lr=1e-3, warmup=5, reward="shaped", min_std=0.05),
    "ppo-shaped-minstd0.05-tkl": dict(critic_lr=1e-3, warmup=5, reward="shaped", min_std=0.05, target_kl=0.02),
    "ppo-shaped-lr3e-4-tkl-ep5": dict(critic_lr=1e-3, warmup=5, reward="shaped", lr=3e-4, min_std=0.05, target_kl=0.02,
                                      epochs=5),
    "ppo-minstd0.05-tkl": dict(critic_lr=1e-3, warmup=5, min_std=0.05, target_kl=0.02),
    "ppo-shaped-std0.1-tkl": dict(critic_lr=1e-3, warmup=5, reward="shaped", fix_std=0.1, target_kl=0.02),
    "grpo": dict(algo="grpo"),
    "grpo-lr3e-5-minstd0.05": dict(algo="grpo", lr=3e-5, min_std=0.05),
    "grpo-minstd0.05-tkl": dict(algo="grpo", min_std=0.05, target_kl=0.02),
    "grpo-lr1e-5-ep4": dict(algo="grpo", lr=1e-5, min_std=0.05, epochs=4),
    "ppo-residual": dict(residual=256, lr=3e-4),
    "ppo-residual-lr1e-3": dict(residual=256, lr=1e-3),
    "ppo-residual-lr1e-3-critic-warmup": dict(residual=256, lr=1e-3, critic_lr=1e-3, warmup=5),
    "rollout-pi": dict(algo="rollout-pi"),
    "rollout-pi-light": dict(algo="rollout-pi", rpi=dict(anchor_share=0.9, steps=100)),
    "rollout-pi-noisy": dict(algo="rollout-pi", rpi=dict(starts=12, candidates=3, stride=16, continuations=4,
                                                         continuation_noise=0.1, margin=2, anchor_share=0.9, steps=100)),
    "filtered-bc": dict(algo="filtered-bc", steps=300),
    "filtered-bc-lr3e-4-refit": dict(algo="filtered-bc", lr=3e-4, steps=500, refit_std=True),
}


def filtered_bc_round(policy, opt, ro, memory: list, steps: int, batch: int = 256, refit_std: bool = False,
                      seed: int = 0) -> dict:
    """One round of success-filtered BC: the (actor input, sampled action) pairs of the rollouts that succeeded join
    `memory` (every round's), and the actor's mean regresses onto them for `steps` Adam steps (with `refit_std`,
    sigma is set to the residual's RMS per dimension, as at BC)."""
    import torch

    ok = ro.success.numpy()
    for t in range(len(ro.actions)):
        m = torch.as_tensor(ro.valid[t].numpy() & ok)
        if m.any():
            memory.append((policy.features(ro.obs[t])[m], ro.actions[t][m, 0]))
    if not memory:
        return {"frames": 0}
    X, Y = torch.cat([x for x, _ in memory]), torch.cat([y for _, y in memory])
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = torch.randint(0, len(X), (batch,), generator=g)
        loss = ((policy.actor.mu(X[i]) - Y[i]) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if refit_std:
        with torch.no_grad():
            res = ((policy.actor.mu(X) - Y) ** 2).mean(0)
            policy.log_std.copy_((0.5 * res.log()).clamp(policy.cfg.log_std_min, policy.cfg.log_std_max))
    return {"frames": len(X), "loss": float(loss)}


def run_variant(start: str, budget_s: float, iterations: int = 1000, algo: str = "ppo", lr: float = 1e-4,
                critic_lr: float = 0.0, warmup: int = 0, reward: str = "success", epochs: int = 2, min_std: float = 0.0,
                fix_std: float = 0.0, target_kl: float | None = None, steps: int = 300, refit_std: bool = False,
                groups: int = 16, group_size: int = 8, seed: int = 0, residual: int = 0,
                residual_scale: float = 0.1, rpi: dict | None = None) -> tuple:
    """Train one variant from the actor at `start` until `iterations` or `budget_s` seconds; returns the trained
    policy and the per-iteration record."""
    import torch

    from policies.estimated_state import EstimatedStatePolicy
    from wmrl.rl.imagine import ImagineConfig, update
    from wmrl.rl.rollouts import collect_rollouts

    policy = EstimatedStatePolicy.load(start)
    if algo == "rollout-pi":
        return rollout_pi_variant(policy, budget_s, iterations, lr, seed, rpi or {})
    if residual:  # ResiP: the behaviour-cloned actor frozen, a zero-initialised residual learns
        policy.add_residual(residual, residual_scale)
    with torch.no_grad():
        if min_std:
            policy.cfg.log_std_min = float(np.log(min_std))
            policy.log_std.clamp_(min=float(np.log(min_std)))
        if fix_std:
            policy.log_std.fill_(float(np.log(fix_std)))
    cfg = ImagineConfig(groups=groups, group_size=group_size, lr=lr, minibatch_rollouts=group_size * 2, seed=seed,
                        algo="ppo" if algo == "filtered-bc" else algo, epochs=epochs, target_kl=target_kl)
    actor = [p for n, p in policy.named_parameters() if not n.startswith("critic.") and p.requires_grad]
    opt = (torch.optim.Adam(policy.actor.parameters(), lr) if algo == "filtered-bc" else
           torch.optim.AdamW([{"params": actor, "lr": lr}, {"params": policy.critic.parameters(), "lr": critic_lr or lr}],
                             weight_decay=0.0))
    env = SIBLING["TrueGroupEnv"]("push-red", groups * group_size, reward=reward, gamma=cfg.gamma)
    torch.manual_seed(seed)
    curve, memory, t0 = [], [], time.time()
    for it in range(warmup + iterations):
        if time.time() - t0 > budget_s:
            break
        warm = it < warmup  # the critic learns; the actor's learning rate is 0
        if algo != "filtered-bc":
            opt.param_groups[0]["lr"] = 0.0 if warm else lr
        policy.eval()
        ro = collect_rollouts(policy, env, group_size if algo == "grpo" else 1, seed=seed * 100_003 + it)
        policy.train()
        info = (filtered_bc_round(policy, opt, ro, memory, steps, refit_std=refit_std, seed=it) if algo == "filtered-bc"
                else update(policy, opt, ro, cfg, seed=seed * 100_003 + it))
        policy.eval()
        curve.append({"iteration": it + 1, "critic_warmup": warm, "success": float(ro.success.float().mean()),
                      "seconds": time.time() - t0, **{k: info.get(k) for k in ("approx_kl", "clip_frac", "kl_stopped",
                                                                               "updates", "frames")}})
    env.close()
    return policy, curve


def rollout_pi_variant(policy, budget_s: float, iterations: int, lr: float, seed: int, rpi: dict) -> tuple:
    """Rollout policy improvement (`wmrl.rl.rollout_improvement`) with the true simulator restored at the probed
    states: rounds of probing and regression until `iterations` or `budget_s`."""
    import torch

    import sim
    from wmrl.rl.rollout_improvement import RolloutImprovementConfig, improved_labels, merge, regress

    cfg = RolloutImprovementConfig(**rpi)
    envs = [sim.make_env("push-red", cameras=()).unwrapped for _ in range(1 + cfg.probe_envs)]
    opt = torch.optim.Adam(policy.actor.parameters(), lr)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    memory, curve, t0 = None, [], time.time()
    try:
        for it in range(iterations):
            if time.time() - t0 > budget_s:
                break
            policy.eval()
            new = improved_labels(policy, envs, [500_000 + seed * 100_000 + it * cfg.starts + i for i in range(cfg.starts)],
                                  cfg, rng)
            memory = merge(memory, new)
            loss = regress(policy, opt, memory, cfg, gen)
            curve.append({"iteration": it + 1, "success": new["success"], "probed": new["probed"],
                          "improved": new["improved"], "labels": len(memory["x"]), "anchors": len(memory["x_anchor"]),
                          "loss": loss, "seconds": time.time() - t0})
    finally:
        for e in envs:
            e.close()
    return policy.eval(), curve


def evaluate_both(policy, episodes: int) -> dict:
    """True success of the actor's mean and of its sampled actions (seeded) on the evaluation's layouts."""
    import torch

    out = {}
    for mode in ("mean", "sample"):
        p = copy.deepcopy(policy).eval()
        p.stochastic = mode == "sample"
        p.generator = torch.Generator().manual_seed(123) if p.stochastic else None
        r = success_in_task(p, "push-red", episodes, ())
        out[mode] = {"success": r["success"], "ci": r["ci"], "stalled": r["stalled"], "outcomes": r["outcomes"]}
    return out


def per_layout_success(start: str, layouts: int, group_size: int = 8, seed: int = 777) -> dict:
    """Where the sampled actor's outcomes vary: `group_size` sampled rollouts on each of `layouts` layouts (perfect
    model). Per-layout success rates, their histogram, and the share of their variance that lies between layouts:
    (observed variance - the binomial variance if every layout had the pooled rate) / observed variance (0: layouts
    do not matter, only the per-step noise does; 1 - 1/G: the layout decides)."""
    from policies.estimated_state import EstimatedStatePolicy
    from wmrl.rl.rollouts import collect_rollouts

    policy = EstimatedStatePolicy.load(start).eval()
    env = SIBLING["TrueGroupEnv"]("push-red", layouts * group_size)
    try:
        ok = collect_rollouts(policy, env, group_size, seed=seed).success.numpy().reshape(layouts, group_size)
    finally:
        env.close()
    p = ok.mean(1)
    edges = [0.0, 1e-9, 0.25, 0.5, 0.75, 1 - 1e-9, 1.0 + 1e-9]
    return {"layouts": layouts, "group_size": group_size, "pooled_success": float(p.mean()), "per_layout": p.tolist(),
            "never": int((p == 0).sum()), "always": int((p == 1).sum()), "mixed": int(((p > 0) & (p < 1)).sum()),
            "histogram_edges": ["0", "(0, .25)", "[.25, .5)", "[.5, .75)", "[.75, 1)", "1"],
            "histogram": np.histogram(p, bins=edges)[0].tolist(),
            "between_layout_variance_share": between_layout_share(ok)}


def between_layout_share(ok: np.ndarray) -> float | None:
    """Outcomes (layouts, G) -> the share of the per-layout rates' variance beyond the binomial variance that a
    pooled rate alone would give: about 0 when every layout has the same rate, 1 - 1/G when each layout's outcome is
    fixed."""
    p = ok.mean(1)
    observed, pooled = float(p.var()), float(p.mean())
    return (observed - pooled * (1 - pooled) / ok.shape[1]) / observed if observed > 0 else None


def _worker(job: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    if job["name"] == "layouts":
        return per_layout_success(job["start"], job["layouts"])
    if job["name"] == "start":
        from policies.estimated_state import EstimatedStatePolicy

        return {"eval": evaluate_both(EstimatedStatePolicy.load(job["start"]), job["episodes"])}
    policy, curve = run_variant(job["start"], job["budget_s"], **job["options"])
    return {"options": job["options"], "curve": curve, "eval": evaluate_both(policy, job["episodes"])}


def run_jobs(jobs: list[dict], workers: int) -> dict:
    """Each job in its own process (this file with --worker), one torch thread each, `workers` at a time."""
    tmp = Path(tempfile.mkdtemp(prefix="wmrl-rl-sweep-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    pending, running, done = list(jobs), [], {}
    while pending or running:
        while pending and len(running) < workers:
            job = pending.pop(0)
            (tmp / f"{job['name']}.job.json").write_text(json.dumps(job))
            log = open(tmp / f"{job['name']}.log", "w")
            running.append((job["name"], log, subprocess.Popen(
                # -c, not the file as a script: the benchmarks folder must not shadow `sim` or `metaworld`
                [sys.executable, "-c", "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
                 __file__, "--worker", str(tmp / f"{job['name']}.job.json")], env=env, stdout=log,
                stderr=subprocess.STDOUT, cwd=ROOT)))
        time.sleep(1.0)
        for item in [r for r in running if r[2].poll() is not None]:
            name, log, proc = item
            running.remove(item)
            log.close()
            if proc.returncode:
                raise RuntimeError(f"variant {name} failed; its log: {tmp / f'{name}.log'}")
            done[name] = json.loads((tmp / f"{name}.json").read_text())
    return done


def main(quick: bool = False, variants: str = "all", budget_s: float = 380.0, eval_episodes: int = 300,
         workers: int = 2, work: str = "", layouts: int = 48, tag: str = "") -> dict:
    """`variants`: comma-separated names of `VARIANTS`, all, or none (the start and the layout diagnostic only,
    written to rl-recipe-sweep-layouts.json); `work`: the imagination benchmark's work folder (its `bc-objects`
    stage is the starting actor); `layouts`: layouts of `per_layout_success` (0: off); `tag`: a suffix of the result
    file's name, so a sweep of a few variants does not replace the committed one."""
    bc_stage, paired_gain = SIBLING["bc_stage"], SIBLING["paired_gain"]
    names = list(VARIANTS) if variants == "all" else [] if variants == "none" else [v for v in str(variants).split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise ValueError(f"variants: unknown {unknown}; known: {list(VARIANTS)}")
    budget_s, eval_episodes, workers = float(budget_s), int(eval_episodes), int(workers)
    base = Path(work) if work else ROOT / "runs" / "bench-imagination-estimated-state"
    if quick:
        names, budget_s, eval_episodes, layouts = ["ppo-shaped-minstd0.05-tkl", "grpo", "filtered-bc"], 1.0, 3, 2
        base = Path(tempfile.mkdtemp(prefix="wmrl-bench-rl-sweep-"))
    start = bc_stage(base, (), **(dict(bc_episodes=6, bc_steps=20) if quick else {}))  # cached in its work folder
    small = dict(groups=2, group_size=2, iterations=1) if quick else {}
    jobs = [{"name": n, "start": str(start), "budget_s": budget_s, "episodes": eval_episodes,
             "options": {**VARIANTS[n], **small} if n in VARIANTS else {}, "layouts": int(layouts)}
            for n in ["start"] + ["layouts"] * (int(layouts) > 0) + names]
    t0 = time.time()
    done = run_jobs(jobs, workers)
    before = done.pop("start")["eval"]
    out = {"task": "push-red", "start": {m: {k: v for k, v in r.items() if k != "outcomes"} for m, r in before.items()},
           "start_per_layout": done.get("layouts"), "budget_s_per_variant": budget_s,
           "episodes_per_evaluation": eval_episodes, "variants": {}}
    for n in names:
        r = done[n]
        out["variants"][n] = {
            "options": r["options"], "iterations": len(r["curve"]),
            "rollout_success_first3": float(np.mean([c["success"] for c in r["curve"][:3]])) if r["curve"] else None,
            "rollout_success_last3": float(np.mean([c["success"] for c in r["curve"][-3:]])) if r["curve"] else None,
            **{m: {"success": r["eval"][m]["success"], "ci": r["eval"][m]["ci"], "stalled": r["eval"][m]["stalled"],
                   "paired": paired_gain(before[m]["outcomes"], r["eval"][m]["outcomes"])} for m in ("mean", "sample")},
            "curve": r["curve"]}
    out["best_paired_gain_mean"] = max(((v["mean"]["paired"]["gain"], n) for n, v in out["variants"].items()), default=None)
    out["minutes"] = (time.time() - t0) / 60
    opts = ([f"budget_s={budget_s:g}", f"workers={workers}"] + [f"variants={variants}"] * (variants != "all")
            + [f"work={work}"] * bool(work) + [f"layouts={layouts}"] * (int(layouts) != 48) + [f"tag={tag}"] * bool(tag))
    return finish("rl-recipe-sweep" + "-layouts" * (not names) + f"-{tag}" * bool(tag), out, quick, command="wmrl bench rl-recipe-sweep --json" + (" --quick" if quick else "")
                  + " --options " + " ".join(opts))


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":  # one job, from run_jobs
    job_file = Path(sys.argv[2])
    result = _worker(json.loads(job_file.read_text()))
    job_file.with_name(job_file.name.replace(".job.json", ".json")).write_text(json.dumps(result))
