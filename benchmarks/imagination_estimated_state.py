"""GRPO in imagination that is measured in the true simulator: the estimated-state actor on the world model's state
channel (push-red).

The demo's RL (`benchmarks/imagination.py`) trains a pixel VLA on generated frames and has not moved its true success
(7% -> 7%): the frames are the weak part of the world model, and a 7% policy rarely succeeds anywhere. The world
model's state channel is its strong part (success AUROC 0.97 on matched pairs). Here the policy that learns is the
`estimated-state` actor (`policies/estimated_state`): in imagination it reads the state channel's predicted object
channel (with the perception's measured error added by the env when the policy has cameras), so GRPO improves the
control and leaves the perception as trained; evaluated, it acts as deployed.

Stages (each cached under the work folder, so a rerun measures again without retraining what exists):

1. world-model data: push-red, the world-model benchmark's mix (300 episodes: 30% near-success failures, 25%
   perturbed, noise 0.05), and `wmrl train-wm` with its defaults (the world-model benchmark's recipe);
2. BC data: `bc_episodes` clean expert episodes (noise 0.1, DART labels) on other layouts; the actor (256 x 2,
   `bc_steps` steps): a starting point in the issue's 25-45% range; `cameras=none` reads the simulator's object
   channel (a tracked cell), `cameras=front,wrist` puts the estimator in front (the pixel policy);
3. GRPO in imagination (`wmrl imagine --policy-type estimated-state`): `groups` starts x `group_size` per
   iteration, binary success within the task's 80 steps, zero true-simulator steps (counted by the simulator);
4. true evaluation before and after on the same 3 x 100 layouts (the policy benchmarks' seeds): Wilson intervals,
   per seed, and the paired difference with a bootstrap interval over layouts;
5. closed-loop fidelity (`fidelity=48`): the start actor with sampled actions from the same true starts, closed loop
   in the simulator and in the world model; per start, where both, only the simulator or only imagination succeed
   (what RL in imagination can learn from is bounded by this agreement);
6. the perfect-model ceiling (`ceiling=true`): the same GRPO, same starting policy, iterations and batch, with the
   true simulator in place of the world model (`TrueGroupEnv`; its steps are counted and reported, this is not RL in
   imagination). If GRPO cannot move true success with a perfect model, the recipe is the limit, not the model.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish, success_in_task, timed_stages

ROOT = Path(__file__).resolve().parent.parent


class TrueGroupEnv:
    """The true simulator behind the interface `wmrl.rl.rollouts.collect_rollouts` uses for imagination: N envs in
    one process, `reset(seed, options={"group_size": G})` gives each group of G one layout (seeded; training seeds
    start at 500,000, away from the evaluation's 10,000 + 100,000 k), one-action chunks (N, 1, A).

    `reward`: "success" (1 at the step that succeeds, as the imagination env's state path gives) or "shaped": that
    plus potential-based shaping (Ng et al., 1999) with the task's dense reward as the potential,
    coef * (gamma * phi(s') - phi(s)), which leaves the optimal policy unchanged."""

    def __init__(self, task: str, num_envs: int, reward: str = "success", gamma: float = 0.99, coef: float = 1.0,
                 workers: int = 0):
        import sim

        if reward not in ("success", "shaped"):
            raise ValueError(f"reward: expected success or shaped, got {reward!r}")
        self.venv = sim.make_vector_env(task, num_envs, asynchronous=False, cameras=(), workers=workers)
        self.num_envs, self.max_episode_steps = num_envs, sim.episode_horizon(task)
        self.reward, self.gamma, self.coef = reward, gamma, coef
        self._phi: np.ndarray | None = None

    def reset(self, seed: int, options: dict | None = None):
        G = (options or {}).get("group_size", 1)
        seeds = [500_000 + seed * 1000 + i // G for i in range(self.num_envs)]
        self._phi = None
        return self.venv.reset(seed=seeds)

    def step(self, actions):
        obs, dense, term, trunc, info = self.venv.step(np.asarray(actions, np.float32)[:, 0])
        success = np.asarray(info.get("success", np.zeros(self.num_envs)), bool)
        reward = success.astype(np.float64)
        if self.reward == "shaped":  # the first step's potential difference is taken as zero
            phi = np.asarray(dense, np.float64)
            reward = reward + self.coef * (self.gamma * phi - (phi if self._phi is None else self._phi))
            self._phi = phi
        return obs, reward, term, trunc, {"success": success}

    def true_steps_taken(self) -> int:
        """Simulator steps taken by these envs' processes (this one, or the workers)."""
        import sim

        return self.venv.true_steps_taken() if hasattr(self.venv, "true_steps_taken") else sim.true_steps_taken()

    def close(self) -> None:
        self.venv.close()


def ppo_minibatch(groups: int, group_size: int) -> int:
    """Rollouts per minibatch: an iteration in 8 minibatches of at least 2 groups, so a larger batch takes larger,
    not more, steps (the imagination run and its perfect-model ceiling use the same)."""
    return max(group_size * 2, groups * group_size // 8)


def rl_in_true_simulator(policy, iterations: int, groups: int, group_size: int, lr: float, algo: str = "grpo",
                         seed: int = 0, out: Path | None = None, workers: int = 0) -> list:
    """GRPO (or PPO) exactly as `wmrl imagine` runs it (`collect_rollouts`, `update`), in the true simulator.
    `workers` > 1 steps the envs in that many processes (`sim.batched`). With `out`, the policy is checkpointed
    there (every quarter of the run, all kept) with the per-iteration record in `curve.json`, and a rerun resumes
    from the last checkpoint (its weights loaded into `policy`, which is trained in place). Returns the per-iteration
    record."""
    import torch

    from wmrl.core.checkpoint import commit_checkpoint, load_state, load_train_state, resume_checkpoint, save_train_state
    from wmrl.core.io import write_json
    from wmrl.rl.imagine import ImagineConfig, update
    from wmrl.rl.rollouts import collect_rollouts

    cfg = ImagineConfig(groups=groups, group_size=group_size, lr=lr, minibatch_rollouts=ppo_minibatch(groups, group_size),
                        seed=seed, algo=algo)
    opt = torch.optim.AdamW(policy.parameters(), lr, weight_decay=0.0)
    torch.manual_seed(seed)
    start, curve = 0, []
    ck = resume_checkpoint(out / "checkpoints")[0] if out is not None else None
    if ck is not None:
        load_state(policy, ck)
        start = load_train_state(ck, {"policy": opt})["step"]
        curve = json.loads((out / "curve.json").read_text())[:start]
    env = TrueGroupEnv("push-red", groups * group_size, workers=workers)
    steps0 = env.true_steps_taken() - (curve[-1]["true_env_steps"] if curve else 0)
    every = max(1, iterations // 4)
    try:
        for it in range(start, iterations):
            policy.eval()
            ro = collect_rollouts(policy, env, group_size if algo == "grpo" else 1, seed=seed * 100_003 + it)
            policy.train()
            info = update(policy, opt, ro, cfg, seed=seed * 100_003 + it)
            policy.eval()
            curve.append({"iteration": it + 1, "success": float(ro.success.float().mean()),
                          "true_env_steps": env.true_steps_taken() - steps0, **info})
            if out is not None:
                write_json(out / "curve.json", curve)  # atomic: a kill leaves the last whole record
                if (it + 1) % every == 0 or it + 1 == iterations:
                    commit_checkpoint(out / "checkpoints", it + 1, lambda d: (policy.save(d), save_train_state(d, it + 1, {"policy": opt})),
                                      keep=iterations)
    finally:
        env.close()
    return curve


def paired_gain(before: list[bool], after: list[bool], n_boot: int = 2000, seed: int = 0) -> dict:
    """Mean of after - before over the same layouts, with a 95% bootstrap interval over layouts."""
    d = np.asarray(after, float) - np.asarray(before, float)
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, len(d), (n_boot, len(d)))].mean(1)
    return {"gain": float(d.mean()), "ci": [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))],
            "layouts_won": int((d > 0).sum()), "layouts_lost": int((d < 0).sum())}


def outcome_string(outcomes: list[bool]) -> str:
    """Per-layout successes as "0"/"1", layout by layout (the evaluation's fixed order): two results on the same
    layouts can then be paired with each other, not only with their own start."""
    return "".join("1" if o else "0" for o in outcomes)


def closed_loop_fidelity(policy, model_run: Path, n: int = 48, seed0: int = 60_000, max_steps: int = 80,
                         state_gate: str | None = None, state_settle: bool | None = None) -> dict:
    """Does imagination see the world the actor acts in? The actor with sampled actions (as RL runs it), from the
    same n true-simulator starts: closed loop in the true simulator and closed loop in the world model (reading
    what the model predicts, as in RL). Per start: success in both, in the simulator only, in imagination only; and
    the agreement of two true runs under different action noise (what a perfect model would reach)."""
    import torch

    import sim
    from wmrl.eval import evaluate
    from wmrl.rl.coevolve import _true_starts, imagine_from
    from world_models.video.model import VideoWorldModel

    seeds = [seed0 + i for i in range(n)]
    policy.eval()
    policy.stochastic = True

    def true_run(noise_seed: int) -> list[bool]:
        out = []
        env = sim.make_env("push-red", cameras=(), max_episode_steps=max_steps)
        try:
            for s in seeds:  # one start at a time: each start's action noise seeded by the start
                policy.generator = torch.Generator().manual_seed(s + noise_seed)
                out.append(evaluate(policy, env, 1, seed=s, progress=False).per_episode[0]["success"])
        finally:
            env.close()
        return out

    # the ceiling of per-start agreement: a second true run with other action noise (a perfect model's agreement)
    true, again = true_run(0), true_run(1_000_003)
    model = VideoWorldModel.load(Path(model_run) / "checkpoints" / "last", state_gate=state_gate, state_settle=state_settle)
    policy.read_object_channel = True  # in imagination: the state channel's predicted objects
    policy.generator = torch.Generator().manual_seed(seed0)
    policy.reset()
    imagined = imagine_from(policy, model, _true_starts("push-red", seeds)[0], max_steps, seed=seed0)["success"]
    policy.stochastic = False
    t, i, t2 = np.asarray(true), np.asarray(imagined, bool), np.asarray(again)
    return {"episodes": n, "true_success": float(t.mean()), "imagined_success": float(i.mean()),
            "both": int((t & i).sum()), "true_only": int((t & ~i).sum()), "imagined_only": int((~t & i).sum()),
            "agreement": float((t == i).mean()), "true_success_rerun": float(t2.mean()),
            "agreement_true_rerun": float((t == t2).mean()), "state_rest": bool(model.cfg.state_rest),
            "state_gate": model.cfg.state_gate, "state_settle": bool(model.cfg.state_settle)}


def start_actor(bc_dir: Path, residual: int = 0):
    """The behaviour-cloned start, with a zero-initialised residual actor of width `residual` on top (0: none)."""
    from policies.estimated_state import EstimatedStatePolicy

    policy = EstimatedStatePolicy.load(bc_dir)
    return policy.add_residual(residual) if residual else policy


def bc_stage(base: Path, cams: tuple[str, ...], bc_episodes: int = 200, bc_steps: int = 4000, estimator_steps: int = 3000,
             min_std: float = 0.0, stage=lambda key, fn: fn(), actor_state_dims: tuple[int, ...] = ()) -> Path:
    """Stage 2 (cached under `base`): the BC data and the starting actor; returns the actor's folder."""
    from policies.estimated_state.train import train_estimated_state
    from wmrl.commands.collect import CollectConfig, collect

    bc_data, bc_dir = base / "bc-data", base / ("bc-" + ("-".join(cams) or "objects") + (f"-minstd{min_std:g}" if min_std else "")
                                                + ("-state" + "".join(map(str, actor_state_dims)) if actor_state_dims else ""))
    if (bc_dir / "model.safetensors").exists():
        return bc_dir
    if not (bc_data / "meta" / "info.json").exists():
        stage("collect_bc", lambda: collect(CollectConfig(task="push-red", episodes=bc_episodes, out=bc_data, noise=0.1,
                                                          seed=1, overwrite=True), progress=False))
    policy, record = stage("bc", lambda: train_estimated_state([bc_data], estimator_steps, bc_steps,
                                                                holdout_episodes=max(1, bc_episodes // 10) if cams else 0,
                                                                hidden=256, layers=2, progress=False, cameras=cams,
                                                                min_std=min_std, actor_state_dims=actor_state_dims))
    policy.save(bc_dir)
    (bc_dir / "record.json").write_text(json.dumps(record, indent=1))
    return bc_dir


def world_model_stage(base: Path, wm_episodes: int = 300, quick: bool = False, world_model: str = "",
                      stage=lambda key, fn: fn()) -> tuple[Path, Path]:
    """Stage 1 (cached under `base`): the world-model data and the world model (or `world_model`, a trained run used
    instead, with the dataset it was trained on where that is still there); returns (data, run)."""
    from wmrl.commands.collect import CollectConfig, collect
    from world_models.video.train import TrainWMConfig, train_world_model, world_model_data

    wm_data, wm_run = base / "wm-data", (Path(world_model) if world_model else base / "wm")
    if world_model and not (wm_run / "checkpoints" / "last" / "model.safetensors").exists():
        raise FileNotFoundError(f"world_model={world_model}: no checkpoints/last/model.safetensors there")
    if world_model and (wm_run / "config.yaml").exists() and (world_model_data(wm_run) / "meta" / "info.json").exists():
        return world_model_data(wm_run), wm_run  # its own data: its imagined starts, and the layouts it has seen
    if not (wm_data / "meta" / "info.json").exists():
        stage("collect_wm", lambda: collect(CollectConfig(task="push-red", episodes=wm_episodes, out=wm_data, failures=0.3,
                                                          perturbed=0.25, noise=0.05, seed=0, overwrite=True), progress=False))
    if not (wm_run / "checkpoints" / "last" / "model.safetensors").exists():
        tiny = dict(size="tiny", ae_steps=30, state_steps=20, dyn_steps=30, unroll_steps=6, batch_size=8, videos=0,
                    change_mask_steps=5, change_mask_windows=2, head_rollout_steps=0) if quick else {}
        cfg = TrainWMConfig(data=wm_data, out=wm_run, overwrite=True, **tiny)
        stage("world_model", lambda: train_world_model(cfg, progress=False))
    return wm_data, wm_run


def main(quick: bool = False, cameras: str = "none", wm_episodes: int = 300, bc_episodes: int = 200,
         bc_steps: int = 4000, estimator_steps: int = 3000, iterations: int = 30, groups: int = 16,
         group_size: int = 8, lr: float = 3e-5, eval_episodes: int = 300, work: str = "", ceiling: str = "false",
         min_std: float = 0.0, threads: int = 2, algo: str = "grpo", actor_state_dims: str = "",
         world_model: str = "", fidelity: int = 48, seed: int = 0, readout: str = "mean", workers: int = 0,
         train_only: str = "false", gate: str = "", checkpoints: str = "false", residual: int = 0,
         settle: str = "") -> dict:
    """`ceiling`: false, true (also the perfect-model run) or only (the perfect-model run alone). `min_std`: a floor
    on the actor's sigma (0: the residual's RMS as fitted). `actor_state_dims`: e.g. 4,5,6,7 (the proprioception the
    world model's state channel predicts; default: all of observation.state). `world_model`: a trained world-model
    run to use instead of the work folder's `wm` (named in the result). `fidelity`: true starts on which the start
    actor's closed-loop success in imagination is compared with the simulator's (0: skip). `seed`: the RL run's
    seed (rollout noise, minibatches; the start actor and the evaluation layouts stay the same). `readout`: the state
    channel's readout in imagination (`world_models.video.state_channel.READOUTS`: mean, member, consensus). `gate`:
    the state channel's contact gate in imagination (`state_channel.GATES`; empty: the model's own). `checkpoints`:
    also evaluate every kept checkpoint of the RL run before its last on the same layouts (where imagination starts
    to be exploited: true success along the run, paired with the start). A PPO iteration's rollouts
    are split into 8 minibatches (at least 2 x group_size rollouts each), so a larger batch takes larger, not more,
    steps. `workers`: processes that step the perfect-model ceiling's true envs (0: this one). `train_only`: train
    (the ceiling's RL with `ceiling=only`, checkpointed and resumable under the work folder) and measure nothing, for
    a lent device; the same command without it evaluates what was trained. `residual`: RL trains a residual actor of
    this width on the frozen start (ResiP; 0: the whole actor), in imagination and in the ceiling alike. `settle`: on |
    off, cubes the hand does not hold resting at their height in imagination (`state_channel.settle`; empty: the
    model's own)."""
    import torch

    from policies.estimated_state import EstimatedStatePolicy
    from wmrl.benchutil import on_off, on_off_word
    from wmrl.rl.imagine import ImagineConfig, imagine, in_true_world

    dims = tuple(int(d) for d in str(actor_state_dims).split(",") if str(d).strip())
    cams = () if cameras == "none" else tuple(c for c in str(cameras).split(",") if c)
    wm_episodes, bc_episodes, bc_steps = int(wm_episodes), int(bc_episodes), int(bc_steps)
    iterations, groups, group_size, eval_episodes = int(iterations), int(groups), int(group_size), int(eval_episodes)
    estimator_steps, lr = int(estimator_steps), float(lr)
    ceiling, train_only = str(ceiling).lower(), str(train_only).lower() == "true"
    checkpoints = str(checkpoints).lower() == "true"
    state_settle = on_off(settle, "settle")
    settle = on_off_word(state_settle)
    if ceiling not in ("false", "true", "only"):
        raise ValueError(f"ceiling: expected false, true or only, got {ceiling!r}")
    if train_only and ceiling != "only":
        raise ValueError("train_only=true trains the perfect-model ceiling's RL (ceiling=only); RL in imagination "
                         "trains with `wmrl imagine`")
    min_std = float(min_std)
    from world_models.video.state_channel import GATES, READOUTS

    if readout not in READOUTS or (gate and gate not in GATES):
        raise ValueError(f"readout={readout!r}, gate={gate!r}: expected a readout in {READOUTS} and a gate in {GATES} (or none)")
    if quick:
        wm_episodes, bc_episodes, bc_steps, estimator_steps = 6, 6, 20, 4
        iterations, groups, group_size, eval_episodes = 1, 2, 2, 3
        fidelity = 2 if readout == "mean" else 0
    if int(fidelity) and readout != "mean":
        raise ValueError(f"the closed-loop fidelity stage runs the mean readout; pass fidelity=0 with readout={readout!r}")
    if not quick:  # quick (the tests): the process's own threads (one per xdist worker; two would oversubscribe)
        torch.set_num_threads(int(threads))
    # the default run is the committed result; any other is written beside it, named by what differs
    suffix = "".join([f"-{'-'.join(cams)}"] * bool(cams) + [f"-{algo}"] * (algo != "grpo") + [f"-lr{lr:g}"] * (lr != 3e-5)
                     + [f"-minstd{min_std:g}"] * (min_std > 0) + [f"-it{iterations}"] * (iterations != 30)
                     + [f"-state{''.join(map(str, dims))}"] * bool(dims)
                     + [f"-wm-{Path(world_model).name}"] * bool(world_model) + [f"-seed{seed}"] * (int(seed) != 0)
                     + [f"-g{groups}x{group_size}"] * ((groups, group_size) != (16, 8)) + [f"-{readout}"] * (readout != "mean")
                     + [f"-gate-{gate}"] * bool(gate) + [f"-residual{int(residual)}"] * bool(int(residual))
                     + [f"-settle-{settle}"] * bool(settle) + ["-ceiling"] * (ceiling == "only"))
    name = "imagination-estimated-state" + suffix
    base = Path(work) if work else (Path(tempfile.mkdtemp(prefix="wmrl-bench-ies-")) if quick
                                    else ROOT / "runs" / "bench-imagination-estimated-state")
    minutes, stage = timed_stages()

    wm_data, wm_run = world_model_stage(base, wm_episodes, quick, world_model, stage) if ceiling != "only" else (None, None)
    bc_dir = bc_stage(base, cams, bc_episodes, bc_steps, estimator_steps, min_std, stage, dims)
    ceiling_dir = base / (f"ceiling-{bc_dir.name[3:]}-it{iterations}-g{groups}x{group_size}-lr{lr:g}" + ("" if algo == "grpo" else f"-{algo}")
                          + (f"-seed{seed}" if int(seed) else "") + (f"-residual{int(residual)}" if int(residual) else ""))
    if train_only:
        curve = stage("ceiling_rl", lambda: rl_in_true_simulator(start_actor(bc_dir, int(residual)), iterations, groups,
                                                                 group_size, lr, algo, int(seed), ceiling_dir, int(workers)))
        return {"trained": str(ceiling_dir), "iterations_done": len(curve), "minutes": minutes}
    record = json.loads((bc_dir / "record.json").read_text())
    start = in_true_world(EstimatedStatePolicy.load(bc_dir))
    before = stage("eval_before", lambda: success_in_task(start, "push-red", eval_episodes, cams))
    rl_dir = base / (f"rl-{bc_dir.name[3:]}-it{iterations}-g{groups}x{group_size}-lr{lr:g}" + ("" if algo == "grpo" else f"-{algo}")
                     + (f"-wm-{wm_run.name}" if world_model else "") + (f"-seed{seed}" if int(seed) else "")
                     + (f"-{readout}" if readout != "mean" else "") + (f"-gate-{gate}" if gate else "")
                     + (f"-residual{int(residual)}" if int(residual) else "") + (f"-settle-{settle}" if settle else ""))
    out = {"task": "push-red", "cameras": list(cams) or "none (the object channel)",
           "success_rl_start": before["success"], "success_rl_start_ci": before["ci"],
           "success_rl_start_per_seed": before["per_seed"], "stalled_before": before["stalled"],
           "outcomes_start": outcome_string(before["outcomes"]),
           "episodes_per_evaluation": before["episodes"],
           "bc": {k: record.get(k) for k in ("frames", "actor_train_mse", "actor_log_std", "estimate_noise")},
           "budgets": {"wm_episodes": wm_episodes, "bc_episodes": bc_episodes, "bc_steps": bc_steps, "min_std": min_std,
                       "estimator_steps": estimator_steps if cams else 0, "iterations": iterations, "groups": groups,
                       "group_size": group_size, "lr": lr, "algo": algo, "training_seeds": 1,
                       "actor_state_dims": list(dims) or "all", "rl_seed": int(seed), "readout": readout,
                       "gate": gate or "the model's own", "residual": int(residual),
                       "settle": settle or "the model's own"},
           "world_model": str(wm_run) if wm_run else None}
    if int(fidelity) and ceiling != "only":
        out["closed_loop_fidelity"] = stage("fidelity", lambda: closed_loop_fidelity(
            EstimatedStatePolicy.load(bc_dir), wm_run, int(fidelity), state_gate=gate or None, state_settle=state_settle))
    if ceiling != "only":
        if (rl_dir / "result.json").exists():  # finished before: measured again, not retrained
            rl = json.loads((rl_dir / "result.json").read_text())
        else:
            rl = stage("rl", lambda: imagine(ImagineConfig(
                policy=bc_dir, policy_type="estimated-state", world_model=wm_run, data=wm_data, out=rl_dir,
                iterations=iterations, groups=groups, group_size=group_size, lr=lr, algo=algo, state_readout=readout, state_gate=gate,
                state_settle=state_settle,
                minibatch_rollouts=ppo_minibatch(groups, group_size), residual_hidden=int(residual),
                ckpt_every=max(1, iterations // 3), seed=int(seed), overwrite=True), progress=False))
            (rl_dir / "result.json").write_text(json.dumps(rl))
        trained = in_true_world(EstimatedStatePolicy.load(rl_dir / "checkpoints" / "last"))
        after = stage("eval_after", lambda: success_in_task(trained, "push-red", eval_episodes, cams))
        if checkpoints:  # the kept checkpoints before the last, oldest first
            kept = sorted(c for c in (rl_dir / "checkpoints").glob("ckpt-*") if c.resolve() != (rl_dir / "checkpoints" / "last").resolve())
            along = []
            for c in kept:
                r = stage(f"eval_{c.name}", lambda c=c: success_in_task(in_true_world(EstimatedStatePolicy.load(c)), "push-red",
                                                                        eval_episodes, cams))
                along.append({"iteration": int(c.name.split("-")[1]), "success": r["success"], "ci": r["ci"],
                              "outcomes": outcome_string(r["outcomes"]),
                              "per_seed": r["per_seed"], "stalled": r["stalled"],
                              "paired": paired_gain(before["outcomes"], r["outcomes"])})
            out["true_along_the_run"] = along
        curve = [json.loads(l) for l in (rl_dir / "metrics.jsonl").read_text().splitlines()]
        curve = [{k: r.get(k) for k in ("iteration", "imagined_success", "kept_groups", "approx_kl", "clip_frac",
                                        "log_std", "true_env_steps", "skipped_nonfinite")} for r in curve if "iteration" in r]
        out.update({
            "success_rl": after["success"], "success_rl_ci": after["ci"], "success_rl_per_seed": after["per_seed"],
            "outcomes_rl": outcome_string(after["outcomes"]),
            "success_gain_points": 100 * (after["success"] - before["success"]),
            "paired": paired_gain(before["outcomes"], after["outcomes"]),
            "cis_overlap": not (after["ci"][0] > before["ci"][1] or before["ci"][0] > after["ci"][1]),
            "stalled_after": after["stalled"], "true_env_steps_during_rl": rl["true_env_steps_during_rl"],
            "imagined_success_first_iteration": curve[0]["imagined_success"] if curve else None,
            "imagined_success_last_iteration": curve[-1]["imagined_success"] if curve else None, "curve": curve})
    if ceiling != "false":  # the same GRPO from the same start, the true simulator as a perfect model
        if cams:
            raise ValueError("the perfect-model ceiling is measured for cameras=none (the actor on the object channel)")
        perfect = start_actor(bc_dir, int(residual))  # no cameras: it reads the object channel; resumed if trained before
        true_curve = stage("ceiling_rl", lambda: rl_in_true_simulator(perfect, iterations, groups, group_size, lr, algo,
                                                                      int(seed), ceiling_dir, int(workers)))
        r = stage("ceiling_eval", lambda: success_in_task(in_true_world(perfect), "push-red", eval_episodes, cams))
        out.update({"ceiling_success_rl": r["success"], "ceiling_success_rl_ci": r["ci"], "ceiling_per_seed": r["per_seed"],
                    "ceiling_stalled": r["stalled"], "ceiling_paired": paired_gain(before["outcomes"], r["outcomes"]),
                    "ceiling_true_env_steps": true_curve[-1]["true_env_steps"] if true_curve else 0,
                    "ceiling_curve": [{k: c.get(k) for k in ("iteration", "success", "kept_groups", "approx_kl", "clip_frac")}
                                      for c in true_curve]})
    out.update({"minutes": minutes, "work": str(base)})
    opts = ([f"cameras={cameras}"] * bool(cams) + [f"lr={lr:g}"] * (lr != 3e-5) + [f"min_std={min_std:g}"] * (min_std > 0)
            + [f"ceiling={ceiling}"] * (ceiling != "false") + [f"algo={algo}"] * (algo != "grpo")
            + [f"iterations={iterations}"] * (iterations != 30) + [f"actor_state_dims={actor_state_dims}"] * bool(dims)
            + [f"world_model={world_model}"] * bool(world_model) + [f"seed={seed}"] * (int(seed) != 0)
            + [f"groups={groups}"] * (groups != 16) + [f"group_size={group_size}"] * (group_size != 8)
            + [f"readout={readout}"] * (readout != "mean") + [f"gate={gate}"] * bool(gate) + [f"work={work}"] * bool(work) + [f"threads={threads}"] * (int(threads) != 2)
            + [f"fidelity={fidelity}"] * (int(fidelity) != 48) + [f"workers={workers}"] * bool(int(workers))
            + ["checkpoints=true"] * checkpoints + [f"residual={residual}"] * bool(int(residual))
            + [f"settle={settle}"] * bool(settle))
    return finish(name, out, quick, command="wmrl bench imagination-estimated-state --json" + (" --quick" if quick else "")
                  + (" --options " + " ".join(opts) if opts else ""))
