"""Ranking without rollouts where the world model is strong: a population of state-reading actors ranked on the
state channel (push-red).

The pixel populations cannot be ranked yet: every pixel policy "fails" every imagined episode on the generated
frames (README, ranking). The state channel is the world model's strong part: since it predicts every proprioceptive
dimension (the joints included), the start actor's closed-loop success in imagination matches the simulator's
(35.4% vs 37.5% on 48 shared starts, per-start agreement 0.69 against the 0.60 a second true run reaches). This
benchmark asks whether that holds across policies: it ranks actors that read `observation.environment_state` (in the
true simulator the recorded object channel, a tracked cell; in imagination the state channel's prediction) with
`wmrl.eval.rank`'s paired protocol (the same layouts and first frames, one-action chunks, a second true evaluation
on other seeds for the noise ceiling, bootstrap CI on Spearman, MMRV, success MAE).

Population (every member built here, cached under the work folder): the imagination-estimated-state benchmark's
start actor (BC, 256 x 2 units, 4000 steps) acting with its mean and with sampled actions, the same data and recipe
stopped early (300 and 1000 steps) and with the imitation-ceiling benchmark's larger learner (512 x 3 units, 10k
steps), the strongest with Gaussian action noise at several levels, any RL-in-imagination actors found in the work
folder, and the scripted (noise 0.3) and random anchors, reported apart.

    wmrl bench rank-state-population --json [--options work=DIR world_model=RUN episodes=50]

With `pixels=A,B,...` (folders of two-stage pixel policies, `estimated-state` with cameras, e.g. those the
imitation-ceiling benchmark keeps; the last the strongest) the population is those policies instead: each acting
with its mean and with sampled actions, the last with action noise at the same levels, and the same anchors. They
read their cameras in the true simulator; in imagination `acting=frames` feeds them the world model's generated
frames (the same observations in both, the issue's protocol) and `acting=objects` the state channel's predicted
objects with their estimator's held-out error as noise (as RL in imagination trains them).
"""

from __future__ import annotations

import runpy
import tempfile
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish, on_off, on_off_word, timed_stages

ROOT = Path(__file__).resolve().parent.parent
SIBLING = runpy.run_path(str(Path(__file__).with_name("imagination_estimated_state.py")), run_name="wmrl_bench_sibling")
# (hidden, layers, steps): the start actor's recipe (256, 2, 4000) stopped early, and the larger learner
ACTORS = ((256, 2, 300), (256, 2, 1000), (512, 3, 10_000))
NOISE_LEVELS = (0.3, 0.6, 1.0)


def actors(base: Path, recipes=ACTORS, stage=lambda key, fn: fn()) -> list[Path]:
    """Actors on the start actor's BC data (same seed) at other sizes and step counts, cached under
    `base / "rank-actors"` as `bc-objects-{hidden}x{layers}-{steps}`."""
    import json

    from policies.estimated_state.train import train_estimated_state

    out = []
    for hidden, layers, n in recipes:
        d = base / "rank-actors" / f"bc-objects-{hidden}x{layers}-{n}"
        if not (d / "model.safetensors").exists():
            policy, record = stage(d.name, lambda: train_estimated_state(
                [base / "bc-data"], 0, n, holdout_episodes=0, hidden=hidden, layers=layers, progress=False, cameras=()))
            policy.save(d)
            (d / "record.json").write_text(json.dumps(record, indent=1))
        out.append(d)
    return out


def rl_actors(base: Path) -> tuple[list[Path], dict]:
    """The work folder's RL-in-imagination actors that load ({folder: why} for those that do not, e.g. checkpoints
    from before the actor had its PPO critic)."""
    from policies.estimated_state import EstimatedStatePolicy

    found, refused = [], {}
    for p in sorted(base.glob("rl-objects-*/checkpoints/last")):
        try:
            EstimatedStatePolicy.load(p)
            found.append(p)
        except (ValueError, FileNotFoundError) as e:
            refused[str(p.relative_to(base))] = str(e).replace(f"{base}/", "")
    return found, refused


def population(base: Path, bc_dir: Path, trained: list[Path], levels=NOISE_LEVELS, rl: list[Path] | None = None) -> list[str]:
    """[start actor, its sampling copy, the other actors, the last (strongest) of them at each noise level, RL
    actors (default: those of `rl_actors(base)`), anchors]."""
    rl = rl_actors(base)[0] if rl is None else rl
    start, strong = f"estimated-state:{bc_dir}", f"estimated-state:{trained[-1]}"
    return ([start, f"{start}:stochastic"] + [f"estimated-state:{d}" for d in trained] + [f"{strong}:noise={x}" for x in levels]
            + [f"estimated-state:{p}" for p in rl] + ["scripted:noise=0.3", "random"])


def pixel_population(folders: list[Path], levels=NOISE_LEVELS, acting: str = "frames") -> list[str]:
    """[each pixel policy with its mean and sampled, the last (strongest) at each noise level, anchors]; with
    `acting=objects` every pixel policy reads the predicted objects in imagination (`:objects`)."""
    if acting not in ("frames", "objects"):
        raise ValueError(f"acting: expected 'frames' or 'objects', got {acting!r}")
    tail = ":objects" if acting == "objects" else ""
    specs = [f"estimated-state:{d}{s}{tail}" for d in folders for s in ("", ":stochastic")]
    return specs + [f"estimated-state:{folders[-1]}:noise={x}{tail}" for x in levels] + ["scripted:noise=0.3", "random"]


def main(quick: bool = False, work: str = "", world_model: str = "", episodes: int = 50, workers: str = "ray",
         stop_cm: float = 0.0, pixels: str = "", acting: str = "frames", seed: int | None = None,
         readout: str = "mean", gate: str = "", sampler: int = 0, settle: str = "", layer: str = "",
         tag: str = "") -> dict:
    """`work`: the imagination-estimated-state benchmark's work folder (its world-model data, BC data and start
    actor; built here if missing). `world_model`: a trained run to rank on instead of the work folder's `wm`.
    `workers`: ray (one policy per core) or local. `stop_cm`: the hallucination flag (0: off). `pixels`,
    `acting`: a population of pixel policies instead (module docstring). `seed`: the first paired layout (default
    `wmrl rank`'s fresh ones); any other is ranked even where the models learned from it (`allow_seen_layouts`).
    `readout`, `gate`: the state channel's readout (mean, member or consensus) and contact gate (default: the model's own).
    `sampler`: another draw of the imagination's noise on the same layouts (`RankConfig.sampler_seed`; 0: as before).
    `settle`: on | off, whether cubes the hand does not hold rest on the table in imagination (`RankConfig.state_settle`;
    default: the model's own).
    `layer`: blend | reproject, how the world model's frames show the objects to pixel policies acting on them
    (`RankConfig.object_layer`; default: the model's own).
    `tag`: appended to the result's name (e.g. what the population is)."""
    from wmrl.eval.rank import FRESH_LAYOUTS, RankConfig, run_rank

    seed = FRESH_LAYOUTS if seed is None else int(seed)
    state_settle = on_off(settle, "settle")
    settle = on_off_word(state_settle)

    base = Path(work) if work else (Path(tempfile.mkdtemp(prefix="wmrl-bench-rank-state-")) if quick
                                    else ROOT / "runs" / "bench-imagination-estimated-state")
    minutes, stage = timed_stages()

    t0 = time.time()
    wm_data, wm_run = SIBLING["world_model_stage"](base, 6 if quick else 300, quick, world_model, stage)
    tiny = dict(bc_episodes=6, bc_steps=20, estimator_steps=4) if quick else {}
    levels = NOISE_LEVELS[:1] if quick else NOISE_LEVELS
    rl, rl_refused = [], {}
    if pixels:
        folders = [Path(f) for f in str(pixels).split(",")]
        missing = [str(f) for f in folders if not (f / "model.safetensors").exists()]
        if missing:
            raise ValueError(f"pixels: not policy folders (no model.safetensors): {missing}")
        specs = pixel_population(folders, levels, acting)
        if quick:
            specs = [specs[0], specs[-3], "random"]
    else:
        bc_dir = SIBLING["bc_stage"](base, (), stage=stage, **tiny)
        trained = actors(base, ((32, 2, 10),) if quick else ACTORS, stage)
        rl, rl_refused = rl_actors(base)
        specs = population(base, bc_dir, trained, levels, rl)
        if quick:  # the smallest population the statistics take: two learned policies and an anchor
            specs = [specs[2], specs[3], "random"]
    prefix = f"rank-pixel-estimated-{acting}" if pixels else "rank-state-population"
    name = (prefix + (f"-wm-{Path(world_model).name}" if world_model else "")
            + (f"-stop{float(stop_cm):g}cm" if float(stop_cm) > 0 else "") + (f"-ep{int(episodes)}" if int(episodes) != 50 else "") + (f"-seed{seed}" if seed != FRESH_LAYOUTS else "")
            + (f"-{readout}" if readout != "mean" else "") + (f"-gate-{gate}" if gate else "") + (f"-sampler{int(sampler)}" if int(sampler) else "")
            + (f"-settle-{settle}" if settle else "") + (f"-layer-{layer}" if layer else "") + (f"-{tag}" if tag else ""))
    r = stage("rank", lambda: run_rank(RankConfig(
        policies=tuple(specs), world_model=wm_run, data=wm_data, task="push-red", episodes=2 if quick else int(episodes),
        num_envs=2 if quick else 10, workers="local" if quick else workers, stop_cm=float(stop_cm),
        seed=seed, allow_seen_layouts=seed != FRESH_LAYOUTS, state_readout=readout, state_gate=gate,
        sampler_seed=int(sampler), state_settle=state_settle, object_layer=layer,
        out=base / (name + ("-quick" if quick else "")), overwrite=True), progress=not quick))
    keys = ("rank_spearman", "rank_spearman_ci", "rank_spearman_progress", "rank_spearman_progress_ci",
            "rank_spearman_with_anchors", "rank_kendall", "rank_mmrv", "rank_mmrv_progress", "rank_mmrv_noise_ceiling",
            "rank_noise_ceiling", "rank_noise_ceiling_ci", "success_abs_error", "hallucinated_success", "hallucinated_success_independent",
            "n_imagined_successes",
            "n_policies", "episodes_per_policy")
    rows = [{k: p[k] for k in ("policy", "imagined_success", "imagined_ci95", "true_success", "true_ci95",
                               "true_repeat_success", "imagined_flagged") if k in p} for p in r["policies"]]
    for row, p in zip(rows, r["policies"]):  # the folder names say what each actor is; the work folder's path does not
        row["policy"] = row["policy"].replace(f"{base}/", "")
        row["imagined_progress"] = float(np.mean(p["imagined_progress"]))  # mean best dense task reward per episode
        row["true_progress"] = float(np.mean(p["true_progress"]))
    population_info = ({"pixel_policies": [str(f) for f in folders], "acting": acting} if pixels else
                       {"actors": [[256, 2, 4000], *map(list, ((32, 2, 10),) if quick else ACTORS)]})
    out = {"task": "push-red", "world_model": str(wm_run), "state_readout": readout, "sampler_seed": int(sampler),
           "state_settle": settle or "the model's own", "object_layer": layer or "the model's own", "state_gate": gate or "the model's own", "noise_levels": list(levels), **population_info,
           "first_layout_seed": seed, "seen_layouts": r["seen_layouts"],
           **{k: r[k] for k in keys if k in r},
           "population": rows, "rl_actors_not_loaded": rl_refused, "minutes": {**minutes, "total": (time.time() - t0) / 60}, "work": str(base)}
    opts = [f"work={work}"] * bool(work) + [f"world_model={world_model}"] * bool(world_model) + \
        [f"episodes={episodes}"] * (int(episodes) != 50) + [f"stop_cm={stop_cm:g}"] * (float(stop_cm) > 0) + \
        [f"pixels={pixels} acting={acting}"] * bool(pixels) + [f"seed={seed}"] * (seed != FRESH_LAYOUTS) + \
        [f"readout={readout}"] * (readout != "mean") + [f"gate={gate}"] * bool(gate) + [f"sampler={int(sampler)}"] * bool(int(sampler)) + \
        [f"settle={settle}"] * bool(settle) + [f"layer={layer}"] * bool(layer) + [f"tag={tag}"] * bool(tag)
    return finish(name, out, quick, command="wmrl bench rank-state-population --json"
                  + (" --options " + " ".join(opts) if opts else ""))
