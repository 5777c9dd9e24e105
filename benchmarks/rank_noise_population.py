"""Ranking without rollouts over a population that spreads over true success: one strong pixel policy degraded by
Gaussian action noise at several levels (`FOLDER:noise=X`), beside the run's other learned policies.

Issue 16's protocol asks for >= 8 pixel policies spread over 5-90% true success; the imagination benchmark's own
population cannot give that where BC saturates (Meta-World push: every learned checkpoint at 75-100%). This
benchmark reuses a finished `wmrl bench imagination` work folder (its co-evolved world model, BC, RL and co-evolved
policies) and ranks: the final BC policy at noise 0 / 0.3 / 0.6 / 1.0 / 1.5 / 2.0, the BC checkpoints along
training, RL and co-evolution, plus the scripted and random anchors (reported apart). Paired starts, chunk-wise
world-model stepping, bootstrap CI on Spearman, MMRV, success MAE and the true-vs-true noise ceiling in the same run
(`wmrl.eval.rank`).

    wmrl bench rank-noise-population --json --options task=metaworld-push episodes=20
"""

from __future__ import annotations

import time
from pathlib import Path

from wmrl.benchutil import finish

LEVELS = (0.3, 0.6, 1.0, 1.5, 2.0)


def population(run: Path, levels=LEVELS) -> list[str]:
    from wmrl.core.checkpoint import resolve_checkpoint

    bc = str(resolve_checkpoint(run / "policy_bc"))
    steps = [str(p) for p in sorted((run / "policy_bc" / "checkpoints").glob("step_*"))]
    return ([bc] + [f"{bc}:noise={x}" for x in levels] + steps + [str(resolve_checkpoint(run / "policy_rl")),
            str(resolve_checkpoint(run / "policy_coevo")), "scripted:noise=0.3", "random"])


def main(quick: bool = False, task: str = "metaworld-push", episodes: int = 20, work: str | None = None) -> dict:
    """`work`: a finished `wmrl demo` run folder (default: the imagination benchmark's for `task`)."""
    from wmrl.eval.rank import RankConfig, run_rank

    work_root = Path(__file__).resolve().parents[1] / "runs" / "bench-imagination"
    run = Path(work) if work else work_root / ("demo" if task == "push-red" else task)  # the imagination benchmark's
    if not (run / "coevolution" / "world_model").exists():
        raise FileNotFoundError(f"{run}: no finished imagination run (run `wmrl bench imagination --options task={task}` first)")
    t0 = time.time()
    levels = LEVELS[:1] if quick else LEVELS
    specs = population(run, levels)
    if quick:
        specs = specs[:2] + ["random"]
    r = run_rank(RankConfig(policies=tuple(specs), world_model=run / "coevolution" / "world_model", task=task,
                            episodes=2 if quick else int(episodes), num_envs=2 if quick else 10,
                            out=run / ("rank_noise_quick" if quick else "rank_noise"), overwrite=True),
                 progress=not quick)
    keys = ("rank_spearman", "rank_spearman_ci", "rank_spearman_with_anchors", "rank_mmrv", "rank_mmrv_noise_ceiling",
            "rank_noise_ceiling", "rank_noise_ceiling_ci", "success_abs_error", "n_policies", "episodes_per_policy")
    out = {"task": task, "noise_levels": list(levels), **{k: r[k] for k in keys if k in r},
           "population": [{k: p[k] for k in ("policy", "imagined_success", "imagined_ci95", "true_success", "true_ci95",
                                             "true_repeat_success") if k in p} for p in r["policies"]],
           "minutes": (time.time() - t0) / 60}
    return finish(f"rank-noise-population-{task}", out, quick,
                  command=f"wmrl bench rank-noise-population --json --options task={task} episodes={episodes}")
