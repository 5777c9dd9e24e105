"""Stored rankings re-scored with today's statistics: nothing is simulated or imagined again.

A ranking run (`wmrl rank`, `wmrl bench rank-state-population`, the demo's ranking) keeps every policy's per-episode
outcomes in its `ranking.json` (imagined and true success on paired layouts, the second true evaluation on other
layouts, the imagined progress score). This benchmark recomputes `wmrl.eval.rank.ranking_report` from those outcomes
for each run folder given, so runs made before a statistic existed (e.g. MMRV's true-vs-true noise ceiling) are
compared on the same statistics, side by side, with the world model and first layout each run used.

    wmrl bench rank-report --json --options runs=RUN_A,RUN_B tag=reflections

The per-run rows carry the run's own stored statistics too (`stored`), and the recomputed Spearman must equal the
stored one (the same outcomes, the same formula): a run whose stored and recomputed Spearman differ is refused,
since its outcomes are not the ones its statistics were computed from.

Runs that ranked the same policies on the same true episodes (the same layouts: their true outcomes are equal) and
differ only in the world model are compared pairwise (`paired`): the later run minus the earlier, for Spearman, MMRV
and the progress score's Spearman, with a bootstrap interval that resamples each policy's episodes once for both
models and the true side, so the layouts' own noise, shared by both, does not widen it.

Pools (`pools=A+B+C,D+E`): rankings of the same policies on the same layouts by several world models (training
seeds) or by one model under several sampler seeds (`wmrl rank --sampler-seed`) ranked as one
(`wmrl.eval.rank.pool_imagined`: each episode's imagined outcome the members' mean). Each pool's row carries its
members' Spearman, MMRV and MAE and what pooling buys over their mean (`*_pool_minus_members`, bootstrap interval);
pools of the same episodes are compared pairwise like runs, so a pool of models meets a pool of samples of one.

    wmrl bench rank-report --json --options pools=SEED0+SEED1+SEED2,SEED0+SEED0_SAMPLER1+SEED0_SAMPLER2 tag=pools
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import yaml

from wmrl.benchutil import finish

STORED = ("rank_spearman", "rank_mmrv", "rank_noise_ceiling", "rank_spearman_progress")


def report(run: Path, n_boot: int = 2000) -> dict:
    """`ranking_report` recomputed from `run`/ranking.json's per-policy outcomes, with the run's world model and
    first layout from its config.yaml, and the per-policy rows it read (`policies`)."""
    from wmrl.eval.rank import ranking_report

    path = run / "ranking.json"
    if not path.is_file():
        raise ValueError(f"{run}: no ranking.json (not a ranking run folder)")
    stored = json.loads(path.read_text())
    rows = stored.get("policies")
    if not rows or any("imagined_outcomes" not in r or "true_outcomes" not in r for r in rows):
        raise ValueError(f"{path}: its policies carry no per-episode outcomes (imagined_outcomes, true_outcomes)")
    out = {k: v for k, v in ranking_report(rows, n_boot=n_boot).items() if k != "anchors"}
    old = {k: stored[k] for k in STORED if k in stored}
    if not np.isclose(out["rank_spearman"], old.get("rank_spearman", out["rank_spearman"]), equal_nan=True):
        raise ValueError(f"{path}: recomputed Spearman {out['rank_spearman']:.4f} differs from the stored "
                         f"{old['rank_spearman']:.4f}")
    cfg = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").is_file() else {}
    return {"run": run.name, "world_model": str(cfg.get("world_model", "")), "first_layout_seed": stored.get("first_layout_seed"),
            **out, "stored": old, "policies": rows}


def learned_outcomes(rows: list[dict], key: str) -> list[np.ndarray]:
    """`key`'s per-episode outcomes of the learned policies (anchors left out, as in the headline)."""
    from wmrl.eval.rank import is_anchor

    return [np.asarray(r[key], float) for r in rows if not is_anchor(r["policy"])]


def episode_bootstrap(true: list[np.ndarray], stats, n_boot: int, seed: int) -> tuple[np.ndarray, list]:
    """`stats(ix)` (a vector; `ix`: one index array per policy) at the observed episodes and its 95% percentile
    intervals over draws that resample each policy's episodes, one draw of indices shared by everything `stats`
    reads (models, pools and the true outcomes), so the layouts' own noise, common to all, does not widen them."""
    point = stats([np.arange(len(x)) for x in true])
    rng = np.random.default_rng(seed)
    boot = np.array([stats([rng.integers(0, len(x), len(x)) for x in true]) for _ in range(n_boot)])
    with warnings.catch_warnings():  # a statistic NaN in every draw (no imagined success) has a NaN interval
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = [[float(np.nanpercentile(boot[:, j], 2.5)), float(np.nanpercentile(boot[:, j], 97.5))]
              for j in range(len(point))]
    return point, ci


def paired_difference(a: list[dict], b: list[dict], n_boot: int = 2000, seed: int = 0) -> dict:
    """B minus A over the learned policies (anchors left out, as in the headline) on the same true episodes: Spearman
    and MMRV of imagined success against true success, the success MAE, the progress score's Spearman and the paired
    hallucinated success (`wmrl.eval.rank.paired_hallucination`), with 95% bootstrap intervals over episodes resampled per policy,
    the same indices for A, B and the true outcomes."""
    from wmrl.eval.rank import mmrv, paired_hallucination, spearman

    true, ia, ib = learned_outcomes(a, "true_outcomes"), learned_outcomes(a, "imagined_outcomes"), learned_outcomes(b, "imagined_outcomes")
    progress = all("imagined_progress" in r for r in a + b)
    pa, pb = (learned_outcomes(a, "imagined_progress"), learned_outcomes(b, "imagined_progress")) if progress else (ia, ib)

    def hallucinated(imagined, ix) -> float:
        return paired_hallucination([{"imagined_outcomes": x[i], "true_outcomes": y[i]}
                                     for x, y, i in zip(imagined, true, ix)])["hallucinated_success"]

    def stats(ix) -> np.ndarray:
        m = lambda xs: np.array([x[i].mean() for x, i in zip(xs, ix)])  # noqa: E731
        t = m(true)
        mae = lambda r: np.abs(r - t).mean()  # noqa: E731
        return np.array([spearman(m(ib), t) - spearman(m(ia), t), mmrv(m(ib), t) - mmrv(m(ia), t),
                         hallucinated(ib, ix) - hallucinated(ia, ix), mae(m(ib)) - mae(m(ia)),
                         spearman(m(pb), t) - spearman(m(pa), t)])

    point, ci = episode_bootstrap(true, stats, n_boot, seed)
    names = ["spearman", "mmrv", "hallucinated", "success_abs_error"] + ["spearman_progress"] * progress
    return {**{f"{n}_b_minus_a": float(point[j]) for j, n in enumerate(names)},
            **{f"{n}_b_minus_a_ci": ci[j] for j, n in enumerate(names)}, "n_policies": len(true)}


def pool_gain(members: list[list[dict]], n_boot: int = 2000, seed: int = 0) -> dict:
    """What pooling buys over its members (`wmrl.eval.rank.pool_imagined`): the pool's Spearman, MMRV and success MAE
    minus the mean of its members' (a typical single model's, not the best one's, which only hindsight picks), with
    95% bootstrap intervals over episodes resampled per policy, one draw for the members, the pool and the truth."""
    from wmrl.eval.rank import mmrv, spearman

    true = learned_outcomes(members[0], "true_outcomes")
    each = [learned_outcomes(m, "imagined_outcomes") for m in members]

    def stats(ix) -> np.ndarray:
        m = lambda xs: np.array([x[i].mean() for x, i in zip(xs, ix)])  # noqa: E731
        t = m(true)
        rates = [m(xs) for xs in each]
        one = lambda r: np.array([spearman(r, t), mmrv(r, t), np.abs(r - t).mean()])  # noqa: E731
        return one(np.mean(rates, 0)) - np.mean([one(r) for r in rates], 0)

    point, ci = episode_bootstrap(true, stats, n_boot, seed)
    names = ("spearman", "mmrv", "success_abs_error")
    return {**{f"{n}_pool_minus_members": float(point[j]) for j, n in enumerate(names)},
            **{f"{n}_pool_minus_members_ci": ci[j] for j, n in enumerate(names)}}


def same_true_episodes(a: list[dict], b: list[dict]) -> bool:
    """The same policies, in the same order, with the same true outcomes episode for episode."""
    return len(a) == len(b) and all(x["policy"] == y["policy"] and x["true_outcomes"] == y["true_outcomes"]
                                    for x, y in zip(a, b))


def main(quick: bool = False, runs: str = "", pools: str = "", tag: str = "") -> dict:
    """`runs`: comma-separated ranking run folders. `pools`: comma-separated groups of '+'-joined run folders, each
    group ranked as one pool (`wmrl.eval.rank.pool_imagined`) beside its members. `tag`: the result's name
    (rank-report-TAG)."""
    from wmrl.eval.rank import pool_imagined, ranking_report

    folders = [Path(r) for r in str(runs).split(",") if r]
    groups = [[Path(r) for r in g.split("+") if r] for g in str(pools).split(",") if g]
    if not folders and not groups:
        raise ValueError("runs, pools: give at least one ranking run folder (runs=DIR1,DIR2) or pool (pools=DIR1+DIR2)")
    if short := [g for g in groups if len(g) < 2]:
        raise ValueError(f"pools: each pool joins 2 or more run folders with '+', got {[str(g[0]) for g in short]}")
    n_boot = 200 if quick else 2000
    rows = [report(f, n_boot=n_boot) for f in folders]
    policies = [r.pop("policies") for r in rows]  # read once, by `report`
    for group in groups:
        members = [report(f, n_boot=n_boot) for f in group]
        member_rows = [m.pop("policies") for m in members]
        pool = pool_imagined(member_rows)  # refuses rankings of other policies, layouts or true episodes
        rows.append({"run": "pool(" + "+".join(m["run"] for m in members) + ")", "members": [str(f) for f in group],
                     "world_models": [m["world_model"] for m in members],
                     "first_layout_seed": members[0]["first_layout_seed"],
                     **{k: v for k, v in ranking_report(pool, n_boot=n_boot).items() if k != "anchors"},
                     "members_stats": [{k: m[k] for k in ("rank_spearman", "rank_mmrv", "success_abs_error")}
                                       for m in members],
                     **pool_gain(member_rows, n_boot)})
        policies.append(pool)
    paired = [{"a": rows[i]["run"], "b": rows[j]["run"], **paired_difference(policies[i], policies[j], n_boot)}
              for i in range(len(rows)) for j in range(i + 1, len(rows)) if same_true_episodes(policies[i], policies[j])]
    opts = f"runs={runs}" * bool(runs) + " " * bool(runs and pools) + f"pools={pools}" * bool(pools)
    return finish("rank-report" + (f"-{tag}" if tag else ""), {"rows": rows, "paired": paired}, quick,
                  command=f"wmrl bench rank-report --json --options {opts}" + (f" tag={tag}" if tag else ""))
