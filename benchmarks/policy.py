"""The pixel VLA on push-red: what each ingredient of the training recipe buys, in true-simulator success.

One dataset of scripted-expert episodes (exploration noise on the actions, a share of perturbed episodes), then,
through `wmrl train-policy` with the same seed and step budget:
- `recorded_n4`: the old recipe: clone the *recorded* (noisy) actions of the successful episodes, execute 4 of each
  4-action chunk open-loop, no weight averaging;
- `expert_n1`: DART-style labels (the clean expert's action at every recorded state, all episodes), receding
  horizon (predict every step, execute the first action), EMA weights, warm-up + cosine learning rate;
- `expert_te`: the same checkpoint executed with ACT's temporal ensembling (m = 0.01) instead;
- `expert_aux`: `expert_n1` plus the privileged auxiliary loss (predict the cube and zone positions from the
  policy's features during training; acting never reads them);
- `dagger`: `expert_n1` resumed for `dagger_rounds` DAgger rounds (the learner's own episodes, relabelled by the
  expert, aggregated), and `expert_more`: `expert_n1` resumed for the same number of extra gradient steps on the base
  data alone, so that DAgger's gain is not a longer-training gain (both restart the cosine schedule over the
  longer total, alike).
Every policy: `episodes` true episodes (seeds 10000.., split in three evaluation seeds for per-seed values), success
with a 95% Wilson interval, and the share of episodes that ended *stalled* (failed with the hand frozen over its
last 20 steps: the policy sits at a fixed point where its mean action is ~0, the average of the expert's actions
in look-alike states). The scripted expert itself (noise-free) is the ceiling, measured on the same layouts.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish, success_over_seeds


def _evaluate(policy, episodes: int, num_envs: int, seeds: int = 3) -> dict:
    import sim

    env = sim.make_vector_env("push-red", num_envs)
    try:
        return success_over_seeds(policy, env, episodes, seeds)
    finally:
        env.close()


def _evaluate_ensembled(policy, episodes: int, num_envs: int) -> dict:
    """The same checkpoint executed with ACT's temporal ensembling (m = 0.01)."""
    from policies.vla.modeling import TemporalEnsembler

    policy.ensembler = TemporalEnsembler(0.01, policy.cfg.chunk_size)
    return _evaluate(policy, episodes, num_envs)


def _evaluate_expert(episodes: int, num_envs: int) -> dict:
    """The noise-free scripted expert on the same layouts: the ceiling."""
    import gymnasium as gym

    from policies.factory import make_policy

    return _evaluate(make_policy("scripted", gym.spaces.Box(-1, 1, (4,), np.float32)), episodes, num_envs)


def _evaluate_checkpoints(folders: list[str], episodes: int, num_envs: int, device: str, quick: bool) -> dict:
    from policies.vla import VLAPolicy

    t0 = time.time()
    res = {}
    for f in folders:
        policy = VLAPolicy.load(f, device=device).eval()
        res[Path(f).name] = _evaluate(policy, episodes, num_envs)
        if f == folders[-1]:
            res[Path(f).name + "_te"] = _evaluate_ensembled(policy, episodes, num_envs)
    res["scripted_expert"] = _evaluate_expert(episodes, num_envs)
    best = max((k for k in res if k != "scripted_expert"), key=lambda k: res[k]["success"])
    return finish("policy_checkpoints", {"results": res, "best_recipe": best, "success_bc": res[best]["success"],
                                         "success_bc_ci": res[best]["ci"], "budgets": {"episodes": episodes},
                                         "minutes": {"total": (time.time() - t0) / 60}}, quick,
                  command=f"wmrl bench policy --json --options checkpoints={','.join(folders)} episodes={episodes} "
                          f"num_envs={num_envs}")


def main(quick: bool = False, episodes: int = 300, data_episodes: int = 300, noise: float = 0.3,
         perturbed: float = 0.2, steps: int = 3000, dagger_rounds: int = 2, dagger_episodes: int = 100,
         dagger_steps: int = 1000, num_envs: int = 4, batch_size: int = 64, device: str = "cpu",
         recipes: str = "all", data: str = "", keep: str = "", checkpoints: str = "") -> dict:
    """`recipes`: comma-separated names to run (default all; `dagger` and `expert_more` need `expert_n1`).
    `data`: an existing push-red dataset to train on instead of collecting one. `keep`: a folder to keep the runs in
    (their checkpoints: RL starts, ranking populations) instead of a temporary one. `checkpoints`: comma-separated
    policy folders trained elsewhere (e.g. on a GPU with `wmrl train-policy --device cuda`) to evaluate the same way
    instead of training (the last one also with temporal ensembling)."""
    if checkpoints:
        return _evaluate_checkpoints(checkpoints.split(","), episodes, num_envs, device, quick)
    recipes_arg = str(recipes)
    from policies.vla import VLAPolicy
    from wmrl.commands.train_policy import TrainPolicyConfig, train_policy
    from wmrl.eval.record import CollectConfig, collect
    from wmrl.rl.dagger import DAggerConfig

    if quick:
        episodes, data_episodes, steps, dagger_rounds, dagger_episodes, dagger_steps, batch_size = 3, 4, 4, 1, 1, 2, 8
        num_envs = 1  # in process: spawning env workers for 3-episode evaluations costs more than they run
    extra = {"vision_width": 8, "hidden": 32, "text_dim": 8} if quick else {}
    t0 = time.time()
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="wmrl-bench-policy-"))
    work.mkdir(parents=True, exist_ok=True)
    if data:
        from wmrl.datasets import LeRobotV3Dataset

        ds = LeRobotV3Dataset(data)
        data_dir = Path(data)
        info = {"episodes": ds.num_episodes, "frames": ds.num_frames, "pc_success": None}
    else:
        data_dir = work / "data"
        info = collect(CollectConfig(task="push-red", episodes=data_episodes, out=data_dir, noise=noise,
                                     perturbed=perturbed, post_success_steps=3, num_envs=num_envs, overwrite=True),
                       progress=False)
    minutes = {"collect": (time.time() - t0) / 60}
    common = dict(data=(data_dir,), steps=steps, batch_size=batch_size, eval_episodes=0, num_envs=num_envs,
                  chunk_size=4, extra=extra, overwrite=True, device=device)
    recipes = {
        "recorded_n4": dict(labels="recorded", successful_only=True, n_action_steps=4),
        "expert_n1": dict(labels="expert", n_action_steps=1, ema=0.999, warmup=200, schedule="cosine"),
        "expert_aux": dict(labels="expert", n_action_steps=1, ema=0.999, warmup=200, schedule="cosine",
                           extra={**extra, "aux_env_state": 1.0}),
    }
    continued = {  # resumed from a copy of expert_n1's run
        "expert_more": dict(recipes["expert_n1"], steps=steps + dagger_rounds * dagger_steps),
        "dagger": dict(recipes["expert_n1"], dagger=DAggerConfig(rounds=dagger_rounds, episodes=dagger_episodes,
                                                                 steps=dagger_steps)),
    }
    chosen = {**recipes, **continued}
    if recipes_arg != "all":
        names = recipes_arg.split(",")
        if unknown := set(names) - set(chosen):
            raise ValueError(f"recipes: unknown {sorted(unknown)}; valid: {sorted(chosen)}")
        if set(names) & set(continued) and "expert_n1" not in names:
            raise ValueError("recipes: dagger and expert_more continue expert_n1's run; name expert_n1 too")
        chosen = {k: v for k, v in chosen.items() if k in names}
    out: dict = {"data": {k: info[k] for k in ("episodes", "frames", "pc_success")}, "results": {}}
    for name, recipe in chosen.items():
        t = time.time()
        if name in continued:
            shutil.copytree(work / "expert_n1", work / name)
        r = train_policy(TrainPolicyConfig(**{**common, **recipe, "out": work / name, "overwrite": name not in continued,
                                              "resume": name in continued}), progress=False)
        minutes[f"train_{name}"] = (time.time() - t) / 60
        policy = VLAPolicy.load(work / name / "checkpoints" / "last", device=device).eval()
        t = time.time()
        out["results"][name] = {**_evaluate(policy, episodes, num_envs), "steps": r["steps"],
                                "loss_last": r.get("loss_last")}
        if "dagger" in r:
            out["results"][name]["rounds"] = r["dagger"]
        if name == "expert_n1":
            out["results"]["expert_te"] = _evaluate_ensembled(policy, episodes, num_envs)
        minutes[f"eval_{name}"] = (time.time() - t) / 60
    out["results"]["scripted_expert"] = _evaluate_expert(episodes, num_envs)
    res = out["results"]
    best = max((k for k in res if k != "scripted_expert"), key=lambda k: res[k]["success"])
    out.update({
        "success_bc": res[best]["success"], "success_bc_ci": res[best]["ci"], "best_recipe": best,
        "success_old_recipe": res.get("recorded_n4", {}).get("success"),
        "ratio_best_to_old": (res[best]["success"] / max(res["recorded_n4"]["success"], 1e-9)
                              if "recorded_n4" in res else None),
        "dagger_minus_more_bc": (res["dagger"]["success"] - res["expert_more"]["success"]
                                 if {"dagger", "expert_more"} <= set(res) else None),
        "success_rl_start_candidates": {k: v["success"] for k, v in res.items() if k != "scripted_expert"},
        "budgets": {"episodes": episodes, "data_episodes": data_episodes, "noise": noise, "perturbed": perturbed,
                    "steps": steps, "dagger_rounds": dagger_rounds, "dagger_episodes": dagger_episodes,
                    "dagger_steps": dagger_steps, "batch_size": batch_size, "training_seed": 0, "device": device},
        "minutes": {**minutes, "total": (time.time() - t0) / 60}})
    return finish("policy", out, quick)
