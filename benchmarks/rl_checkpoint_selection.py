"""Which checkpoint of an RL-in-imagination run to keep, without true rollouts: its checkpoints ranked in the world
model it was trained in and in a held-out world model, against the true simulator (push-red, the object actor).

Run long enough, RL in imagination learns the model's errors: the README's 1,024-rollout PPO run gains +7.7 points of
true success at 60 iterations and +3.7 at 120 while its imagined success keeps rising (50% -> 63%). The training
model cannot tell when to stop; a second model trained on the same data with another seed (here another state-channel
seed) shares what the data teaches but not the first model's particular errors, so success measured in it may follow
the true curve (holding out a model for policy selection, as offline model-based RL validates on models the policy
was not optimised against). This benchmark measures that: every checkpoint (and the start actor) ranked with
`wmrl.eval.rank`'s paired protocol in each model (the same layouts, a second true evaluation for the noise ceiling),
Spearman over checkpoints between imagined and true success for each model, and the true success of the checkpoint
each model would pick.

    wmrl bench rl-checkpoint-selection --json --options work=runs/s6 runs=RL_RUN[,RL_RUN...] heldout=WM_RUN [episodes=200]

`runs`: RL runs of one recipe and seed (their checkpoints are pooled by iteration; the first run's wins a tie);
their `config.yaml` names the training world model and the start actor.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish, timed_stages
from wmrl.eval.rank import FRESH_LAYOUTS


def checkpoints(runs: list[Path]) -> tuple[dict[int, Path], Path, Path]:
    """({iteration: checkpoint} pooled over `runs`, the training world model, the start actor) from the runs'
    `config.yaml`; runs trained from another start or in another model are refused."""
    import yaml

    found, cfgs = {}, []
    for run in runs:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        cfgs.append((str(cfg["world_model"]), str(cfg["policy"])))
        for ck in sorted(run.glob("checkpoints/ckpt-*")):
            found.setdefault(int(ck.name.split("-")[1].split(".")[0]), ck)
    if len(set(cfgs)) != 1:
        raise ValueError(f"runs: expected one training world model and start actor, got {sorted(set(cfgs))}")
    if not found:
        raise ValueError(f"runs: no checkpoints in {[str(r) for r in runs]}")
    return dict(sorted(found.items())), Path(cfgs[0][0]), Path(cfgs[0][1])


def picked(imagined: list[float], true: list[float], iterations: list[int]) -> dict:
    """The checkpoint with the highest imagined success (the last such on ties: later is what a run would keep),
    its true success, and how far below the truly best it is."""
    i = len(imagined) - 1 - int(np.argmax(imagined[::-1]))
    return {"iteration": iterations[i], "true_success": true[i], "true_regret": float(max(true) - true[i])}


def main(quick: bool = False, work: str = "", runs: str = "", heldout: str = "", episodes: int = 200,
         workers: str = "ray", seed: int = FRESH_LAYOUTS) -> dict:
    """`seed`: the first layout's reset seed (the noise ceiling's repeat starts 1,000,003 later). The default,
    `wmrl rank`'s, keeps clear of every training set: ranked on the layouts the actor's BC data and the world model's
    data were recorded on (seed=0, with allow_seen_layouts), the start actor succeeds 58% against 30% on fresh ones."""
    from scipy.stats import spearmanr

    from wmrl.eval.rank import RankConfig, run_rank

    if not runs or not heldout:
        raise ValueError("options runs=RL_RUN[,RL_RUN...] and heldout=WM_RUN are required")
    base = Path(work) if work else Path(tempfile.mkdtemp(prefix="wmrl-bench-ckpt-select-"))
    minutes, stage = timed_stages()
    t0 = time.time()
    cks, trained_in, start = checkpoints([Path(r) for r in str(runs).split(",") if r])
    iterations = [0, *cks]
    # ':objects': in imagination the actor reads the state channel's objects (state-only imagination, no frames)
    specs = tuple(f"estimated-state:{p}:objects" for p in [start, *cks.values()])
    data = None  # each model's own training data gives the imagined starts' first frames; layouts are paired by seed
    results = {}
    for label, model in (("training", trained_in), ("heldout", Path(heldout))):
        results[label] = stage(f"rank_{label}", lambda: run_rank(RankConfig(
            policies=specs, world_model=model, data=data, task="push-red", episodes=2 if quick else int(episodes),
            num_envs=2 if quick else 50, workers="local" if quick else workers, noise_ceiling=label == "training", seed=int(seed),
            allow_seen_layouts=int(seed) != FRESH_LAYOUTS,
            out=base / f"ckpt-select-{label}-{Path(model).name}" / ("quick" if quick else "run"), overwrite=True),
            progress=not quick))
    true = [p["true_success"] for p in results["training"]["policies"]]
    rows = []
    for it, spec, pt, ph in zip(iterations, specs, results["training"]["policies"], results["heldout"]["policies"]):
        rows.append({"iteration": it, "policy": spec.removeprefix("estimated-state:").removesuffix(":objects"), "true_success": pt["true_success"],
                     "true_ci95": pt["true_ci95"], "true_repeat_success": pt.get("true_repeat_success"),
                     "true_success_heldout_run": ph["true_success"],
                     "imagined_training_model": pt["imagined_success"], "imagined_heldout_model": ph["imagined_success"]})
    rho = lambda a, b: float(spearmanr(a, b).statistic) if len(set(a)) > 1 and len(set(b)) > 1 else float("nan")
    imag_t = [r["imagined_training_model"] for r in rows]
    imag_h = [r["imagined_heldout_model"] for r in rows]
    repeat = [r["true_repeat_success"] for r in rows]
    out = {"task": "push-red", "training_world_model": str(trained_in), "heldout_world_model": str(heldout), "first_layout_seed": int(seed),
           "start_actor": str(start), "episodes_per_policy": 2 if quick else int(episodes), "checkpoints": rows,
           "spearman_training_model_vs_true": rho(imag_t, true), "spearman_heldout_model_vs_true": rho(imag_h, true),
           "spearman_true_vs_true_repeat": rho(repeat, true) if None not in repeat else None,
           "picked_by_training_model": picked(imag_t, true, iterations),
           "picked_by_heldout_model": picked(imag_h, true, iterations),
           "picked_by_true_repeat": picked(repeat, true, iterations) if None not in repeat else None,
           "true_best": {"iteration": iterations[int(np.argmax(true))], "true_success": max(true)},
           "minutes": {**minutes, "total": (time.time() - t0) / 60}}
    opts = ([f"work={work}"] * bool(work) + [f"runs={runs}", f"heldout={heldout}"] + [f"episodes={episodes}"] * (int(episodes) != 200)
            + [f"seed={seed}"] * (int(seed) != FRESH_LAYOUTS))
    name = "rl-checkpoint-selection" + (f"-seed{int(seed)}" if int(seed) != FRESH_LAYOUTS else "")
    return finish(name, out, quick, command="wmrl bench rl-checkpoint-selection --json --options " + " ".join(opts))
