"""Policy evaluation without physical rollouts (Ctrl-World, WorldEval): score a population of policies in the world
model and in the true simulator with the same evaluation loop, then measure how well the imagined ranking and
success rates agree with the true ones (Spearman rho with a bootstrap interval, Kendall tau, SIMPLER's MMRV, mean
absolute success-rate error, the true-vs-true noise ceiling, a scatter plot with intervals).

Protocol: paired starts (each imagined episode starts from the true simulator's reset with the same seed), the
world model stepped by the chunks the policy executes open-loop, random and scripted anchors reported apart from
the headline rho.

    wmrl rank --policies RUN_A RUN_B scripted scripted:noise=0.6 random --world-model WM_RUN [--workers ray]

A policy spec is a VLA run or checkpoint folder (`FOLDER:stochastic` samples its actions; `FOLDER:noise=X` adds
Gaussian action noise of std X: one strong policy degraded to several levels), `estimated-state:FOLDER`,
`estimated-state:FOLDER:objects` (its actor reads the world model's predicted objects in imagination, see
`acts_on_objects`), `act:FOLDER`, `diffusion:FOLDER`, `scripted[:noise=X,failure_prob=Y]` or `random`. Scripted experts
act on privileged simulator state; in imagination they act on the state channel's predicted object state.
Evaluations of many policies run in parallel on Ray workers with `--workers ray` (the `dist` extra).
"""

from __future__ import annotations

import os
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
from world_models.video.model import OBJECT_LAYERS
from world_models.video.state_channel import GATES, READOUTS
from world_models.video.train import TrainWMConfig, check_world_model_task, world_model_data


WORKERS = ("local", "ray")


# The default first ranking layout: clear of every range this project's own data generation uses (`wmrl collect`
# numbers episodes from --seed; a policy's DAgger round i records from seed + 1,000,000 (i + 1); a world model's
# state-DAgger rounds imagine from 1,000,000 + 10,000 round + ...). It was 1,000,000 until those were found to overlap.
FRESH_LAYOUTS = 1_000_000_000
REPEAT_OFFSET = 1_000_003  # the noise ceiling's second true evaluation runs on layouts this far from the paired ones
# config.yaml keys that name what a run learned from (datasets, or runs followed in turn)
INPUT_KEYS = ("data", "extra_data", "init_from", "policy", "world_model")


@dataclass
class RankConfig:
    policies: tuple[str, ...] = ("scripted", "scripted:noise=0.5", "scripted:failure_prob=0.5", "random")
    """Policy specs: VLA run folders, scripted[:noise=X,failure_prob=Y], random."""
    world_model: Path = Path("runs/wm")
    data: Optional[Path] = None
    """Real episodes for the imagined starts; default: the world model's training dataset."""
    task: str = "push-red"
    episodes: int = 30
    """Episodes per policy, in each of the two environments (paired: the same layouts)."""
    num_envs: int = 10
    """Imagined episodes run as one batch."""
    seed: int = FRESH_LAYOUTS
    """The first paired layout's reset seed (episode k: seed + k; the noise ceiling's repeat: 1,000,003 later). The
    default is clear of every range this project's data generation uses (`FRESH_LAYOUTS`); a ranking on layouts the
    world model or a learned policy learned from (`learned_layouts`) is refused (`allow_seen_layouts`)."""
    allow_seen_layouts: bool = False
    """Rank even where the paired layouts include ones the world model or a policy learned from (a model and a BC
    policy score better on their training layouts: on push-red the same actor succeeds 58% there, 30% on fresh ones)."""
    workers: str = "local"
    num_workers: int = 2
    noise_ceiling: bool = True
    """Also evaluate every policy a second time in the true simulator on other seeds: the true-vs-true Spearman is
    the ceiling no world model can be expected to beat at this number of episodes."""
    bootstrap: int = 2000
    """Bootstrap resamples of the episodes for the Spearman interval."""
    stop_cm: float = 0.0
    """The world model's hallucination flag: an imagined episode whose state-channel members disagree by more than
    this (cm) ends there as a failure (0: off). Each policy's share of flagged episodes is reported."""
    state_readout: str = "mean"
    """What imagined episodes read of the state channel's ensemble: `mean`, one `member` per episode, or `consensus`
    (the members stepped from their mean; `WorldModelEnv`)."""
    state_gate: str = ""
    """How the state channel's rollouts apply the contact gate (hard | soft | sample | shared); default: the model's own."""
    state_settle: Optional[bool] = None
    """Whether objects the hand does not hold rest at their starting height in imagination (`state_channel.settle`);
    default: the model's own (on for models of tabletop data trained since it exists, off for older checkpoints)."""
    object_layer: str = ""
    """How the world model's frames show the objects to policies acting on them: blend (the change mask's) |
    reproject (every pixel whose ray meets a cube drawn from the start frame where the state channel carries it, not
    under the arm or the wrist camera's fingers; `model.OBJECT_LAYERS`); default: the model's own."""
    max_steps: Optional[int] = None
    """The episodes' length in both worlds (default: the task's own); shorter episodes make a quick smoke run."""
    sampler_seed: int = 0
    """Another draw of the imagination's noise on the same paired layouts (0: the layouts' own seeds). Rankings of
    one model with different sampler seeds, pooled (`pool_imagined`), are the control for a pool of world models."""
    out: Path = Path("runs/rank")
    overwrite: bool = False
    resume: bool = False


def _acting_suffix(spec: str, folder_spec: str) -> tuple[Path, bool, float, bool]:
    """FOLDER[:stochastic][:noise=X][:objects], suffixes in any order -> (folder, stochastic, noise, objects). A
    folder whose own name contains a suffix is read as a folder."""
    path, stochastic, noise, objects = folder_spec, False, 0.0, False
    while not Path(path).exists():
        name, _, arg = path.rpartition(":")
        if not name:
            break
        if arg == "stochastic":
            stochastic = True
        elif arg == "objects":
            objects = True
        elif arg.startswith("noise="):
            try:
                noise = float(arg.removeprefix("noise="))
            except ValueError:
                raise ValueError(f"policy spec {spec!r}: noise must be a number") from None
            if not noise >= 0:
                raise ValueError(f"policy spec {spec!r}: noise must be >= 0")
        else:
            break
        path = name
    return Path(path), stochastic, noise, objects


def acts_on_objects(spec: str) -> bool:
    """`estimated-state:FOLDER:objects`: in imagination the policy's actor reads the world model's predicted object
    channel with its estimator's held-out error added as noise (as RL in imagination trains it), instead of
    estimating the objects from generated frames; in the true simulator it reads its cameras either way."""
    kind, _, rest = spec.partition(":")
    return kind == "estimated-state" and bool(rest) and _acting_suffix(spec, rest)[3]


def parse_policy_spec(spec: str):
    """'scripted:noise=0.3,failure_prob=0.5' | 'random' | FOLDER | FOLDER:stochastic | FOLDER:noise=0.5 (the VLA
    with Gaussian action noise: one strong policy at several levels) | act:FOLDER | diffusion:FOLDER (LeRobot
    checkpoints) | estimated-state:FOLDER[:stochastic | :noise=X] (the two-stage pixel policy, or its actor alone
    when trained without cameras) -> PolicyConfig."""
    name, _, args = spec.partition(":")
    if name == "estimated-state" and args:
        path, stochastic, noise, _ = _acting_suffix(spec, args)
        if not path.exists():
            raise ValueError(f"policy spec {spec!r}: {path} does not exist")
        return PolicyConfig(type=name, path=path, stochastic=stochastic, noise=noise)
    if name in ("act", "diffusion") and args:
        if not (Path(args) / "config.json").is_file():
            raise ValueError(f"policy spec {spec!r}: {args} is not a LeRobot checkpoint folder (no config.json)")
        return PolicyConfig(type=name, path=Path(args))
    if name in ("scripted", "random"):
        kw = {}
        for item in filter(None, args.split(",")):
            k, _, v = item.partition("=")
            if k not in ("noise", "failure_prob"):
                raise ValueError(f"policy spec {spec!r}: unknown option {k!r}; valid: noise, failure_prob")
            kw[k] = float(v)
        return PolicyConfig(type=name, **kw)
    path, stochastic, noise, objects = _acting_suffix(spec, spec)
    if objects:
        raise ValueError(f"policy spec {spec!r}: ':objects' is for estimated-state policies (their actor reads objects)")
    if not path.exists():
        raise ValueError(f"policy spec {spec!r}: not scripted[:...], random, or an existing policy folder"
                         "[:stochastic | :noise=X]")
    return PolicyConfig(type="vla", path=path, stochastic=stochastic, noise=noise)


ANCHORS = ("scripted", "random")


def is_anchor(spec: str) -> bool:
    """Random and scripted policies pin the ends of the scale; they are reported apart from the headline rho (the
    issue's protocol: a ranking of learned policies must not be carried by two easy extremes)."""
    return spec.partition(":")[0] in ANCHORS


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho of two score arrays; NaN where either is constant (no order to compare)."""
    from scipy import stats

    return float(stats.spearmanr(a, b).statistic) if a.std() > 0 and b.std() > 0 else float("nan")


def mmrv(imagined, true) -> float:
    """SIMPLER's mean maximum rank violation (Li et al. 2024, Eq. 1): for each policy i the largest true-success gap
    |R_i - R_j| to a policy j that the imagined scores order the other way, averaged over policies. 0 when the
    orders agree; a swap of two close policies costs little, a swap of a good and a bad one costs much."""
    s, r = np.asarray(imagined, float), np.asarray(true, float)
    if s.shape != r.shape or len(s) < 2:
        raise ValueError(f"need two equally long lists of at least 2 scores, got {len(s)} and {len(r)}")
    violated = (s[:, None] < s[None, :]) != (r[:, None] < r[None, :])
    return float((np.abs(r[:, None] - r[None, :]) * violated).max(axis=1).mean())


def rank_statistics(imagined: list[float], true: list[float]) -> dict:
    """Agreement of imagined and true success rates (fractions) over a population."""
    from scipy import stats

    a, b = np.asarray(imagined, float), np.asarray(true, float)
    if a.shape != b.shape or len(a) < 2:
        raise ValueError(f"need two equally long lists of at least 2 scores, got {len(a)} and {len(b)}")
    tau = stats.kendalltau(a, b).statistic if a.std() > 0 and b.std() > 0 else float("nan")
    return {"rank_spearman": spearman(a, b), "rank_kendall": float(tau), "rank_mmrv": mmrv(a, b),
            "success_abs_error": float(np.abs(a - b).mean()), "n_policies": int(len(a))}


def bootstrap_spearman(x_outcomes: list, y_outcomes: list, n_boot: int = 2000, seed: int = 0,
                       paired: bool = True) -> tuple[float, float]:
    """95% percentile interval of Spearman's rho between two success rates per policy, resampling each policy's
    episodes with replacement (the evaluation noise of a finite number of episodes). `paired`: the i-th episodes of
    x and y share a start (paired ranking), so one draw of indices serves both."""
    if len(x_outcomes) != len(y_outcomes) or len(x_outcomes) < 2:
        raise ValueError(f"need two equally long lists of at least 2 policies, got {len(x_outcomes)} and {len(y_outcomes)}")
    rng = np.random.default_rng(seed)
    xs = [np.asarray(o, float) for o in x_outcomes]
    ys = [np.asarray(o, float) for o in y_outcomes]
    rhos = []
    for _ in range(n_boot):
        a, b = np.empty(len(xs)), np.empty(len(xs))
        for i, (x, y) in enumerate(zip(xs, ys)):
            ix = rng.integers(0, len(x), len(x))
            a[i] = x[ix].mean()
            b[i] = y[ix if paired and len(y) == len(x) else rng.integers(0, len(y), len(y))].mean()
        rhos.append(spearman(a, b))
    rhos = np.asarray(rhos)
    rhos = rhos[np.isfinite(rhos)]
    if not len(rhos):
        return float("nan"), float("nan")
    return float(np.percentile(rhos, 2.5)), float(np.percentile(rhos, 97.5))


def ranking_report(rows: list[dict], n_boot: int = 2000, seed: int = 0) -> dict:
    """The issue's ranking keys from per-policy rows (`policy`, per-episode 0/1 `imagined_outcomes` and
    `true_outcomes` on paired starts, optionally `true_repeat_outcomes` on other starts): Spearman with anchors
    excluded (+ bootstrap CI), with anchors, MMRV, mean absolute success error, and the true-vs-true noise ceilings
    (the Spearman and the MMRV of two independent true evaluations of the same population: no model can be expected
    to beat them at this number of episodes)."""
    learned = [r for r in rows if not is_anchor(r["policy"])]
    if len(learned) < 2:
        raise ValueError(f"ranking needs at least 2 learned (non-anchor) policies, got {len(learned)}")
    rate = lambda rs, k: [float(np.mean(r[k])) for r in rs]  # noqa: E731
    out = rank_statistics(rate(learned, "imagined_outcomes"), rate(learned, "true_outcomes"))
    out["rank_spearman_ci"] = list(bootstrap_spearman([r["imagined_outcomes"] for r in learned],
                                                      [r["true_outcomes"] for r in learned], n_boot, seed))
    out["rank_spearman_with_anchors"] = (spearman(np.asarray(rate(rows, "imagined_outcomes")),
                                                   np.asarray(rate(rows, "true_outcomes")))
                                         if len(rows) > len(learned) else out["rank_spearman"])
    if all("true_repeat_outcomes" in r for r in learned):
        out["rank_noise_ceiling"] = spearman(np.asarray(rate(learned, "true_outcomes")),
                                              np.asarray(rate(learned, "true_repeat_outcomes")))
        out["rank_noise_ceiling_ci"] = list(bootstrap_spearman([r["true_outcomes"] for r in learned],
                                                               [r["true_repeat_outcomes"] for r in learned], n_boot,
                                                               seed, paired=False))
        # MMRV's floor at this number of episodes: the second true evaluation scored as if it were the model's
        out["rank_mmrv_noise_ceiling"] = mmrv(rate(learned, "true_repeat_outcomes"), rate(learned, "true_outcomes"))
    if all("imagined_progress" in r for r in learned):
        # the imagined progress score: each episode's best dense task reward (1 at success), so a policy whose
        # pushes fall short of the zone in imagination still scores by how far it got, against true success
        out["rank_spearman_progress"] = spearman(np.asarray(rate(learned, "imagined_progress")),
                                                  np.asarray(rate(learned, "true_outcomes")))
        out["rank_spearman_progress_ci"] = list(bootstrap_spearman([r["imagined_progress"] for r in learned],
                                                                   [r["true_outcomes"] for r in learned], n_boot, seed))
        out["rank_mmrv_progress"] = mmrv(rate(learned, "imagined_progress"), rate(learned, "true_outcomes"))
    out.update(paired_hallucination(learned))
    out["episodes_per_policy"] = int(min(len(r["true_outcomes"]) for r in rows))
    out["anchors"] = [r["policy"] for r in rows if is_anchor(r["policy"])]
    return out


def paired_hallucination(rows: list[dict]) -> dict:
    """Hallucinated success on paired starts, pooled over `rows` (learned policies): the share of imagined successes
    whose true episode from the same layout (same seed, same first frame), run closed-loop by the same policy, failed.
    Closed-loop pairing, unlike replaying the imagined actions open-loop (the world-model benchmark's check, whose own
    ceiling is 0.67 because pushes are chaotic), asks only whether the policy would have succeeded from there; for a
    policy that samples its actions the two episodes also differ by its draws. NaN with no imagined success.
    The metric's check, `hallucinated_success_independent`: what a model scores whose imagined successes fall on
    layouts independently of the true outcomes (each policy's true failure rate, weighted by its imagined successes);
    a model below it knows which layouts a policy solves, one at it only how often. A pooled imagined outcome
    (`pool_imagined`: a fraction per episode) counts as that share of a success."""
    imagined = [np.asarray(r["imagined_outcomes"], float) for r in rows]
    true = [np.asarray(r["true_outcomes"], float) for r in rows]
    if any(i.shape != t.shape for i, t in zip(imagined, true)):
        raise ValueError("paired hallucination: imagined and true outcomes differ in number")
    if any(((i < 0) | (i > 1)).any() for i in imagined):
        raise ValueError("paired hallucination: imagined outcomes must lie in [0, 1]")
    n = float(sum(i.sum() for i in imagined))
    wrong = sum((i * (1 - t)).sum() for i, t in zip(imagined, true))
    independent = sum(i.sum() * (1 - t.mean()) for i, t in zip(imagined, true))
    return {"hallucinated_success": float(wrong / n) if n else float("nan"),
            "hallucinated_success_independent": float(independent / n) if n else float("nan"),
            "n_imagined_successes": int(n) if n == int(n) else n}


def pool_imagined(rankings: list[list[dict]]) -> list[dict]:
    """One ranking from several imagined evaluations of the same policies on the same paired layouts (world models
    of several training seeds, or one model under several `sampler_seed`s): each episode's imagined outcome and
    progress become their mean over the rankings (the pool's success probability on that layout), the true side is
    shared. Refused where the rankings' policies, layouts or true outcomes differ: only then is the pool paired."""
    if len(rankings) < 2:
        raise ValueError(f"pooling needs at least 2 rankings, got {len(rankings)}")
    first = rankings[0]
    for k, other in enumerate(rankings[1:], 1):
        if [r["policy"] for r in other] != [r["policy"] for r in first]:
            raise ValueError(f"pooling: ranking {k} ranks other policies than ranking 0")
        for a, b in zip(first, other):
            if a.get("imagined_seeds") != b.get("imagined_seeds") or a["true_outcomes"] != b["true_outcomes"]:
                raise ValueError(f"pooling: ranking {k} ran {a['policy']!r} on other layouts or true episodes than "
                                 "ranking 0 (pool rankings of the same population, layouts and true simulator)")
    pooled = []
    for i, row in enumerate(first):
        members = [ranking[i] for ranking in rankings]
        out = {k: v for k, v in row.items() if not k.startswith("imagined_")}
        out["imagined_outcomes"] = np.mean([m["imagined_outcomes"] for m in members], 0).tolist()
        out["imagined_success"] = float(np.mean(out["imagined_outcomes"]))
        if all("imagined_progress" in m for m in members):
            out["imagined_progress"] = np.mean([m["imagined_progress"] for m in members], 0).tolist()
        out["imagined_seeds"] = row.get("imagined_seeds")
        out["imagined_members"] = len(members)
        pooled.append(out)
    return pooled


def policy_label(spec: str) -> str:
    """A short name for plots: the folder's name with its suffix (a run's `checkpoints/last` by the run's name)."""
    if "/" not in spec:
        return spec
    kind, _, rest = spec.partition(":")
    p, stochastic, noise, objects = _acting_suffix(spec, rest if kind in ("estimated-state", "act", "diffusion") and rest else spec)
    if p.parent.name == "checkpoints":
        p = p.parent.parent
    return p.name + (":stochastic" if stochastic else "") + (f":noise={noise:g}" if noise else "") + (":objects" if objects else "")


def short_labels(specs: list[str]) -> list[str]:
    """`policy_label`s without the folder-name prefix (up to a '_' or '-') that all learned policies share, so
    plot labels of one family (push_pixels_estimated_long, ..._short) stay readable."""
    labels = [policy_label(s) for s in specs]
    learned = [lab for s, lab in zip(specs, labels) if not is_anchor(s)]
    if len(learned) < 2:
        return labels
    prefix = os.path.commonprefix(learned)
    cut = max(prefix.rfind("_"), prefix.rfind("-")) + 1
    return [lab[cut:] if not is_anchor(s) else lab for s, lab in zip(specs, labels)]


def paired_worlds(spec: str, world_model: str, data: str, task: str, num_envs: int, stop_cm: float = 0.0,
                  state_readout: str = "mean", state_gate: str = "", max_steps: int | None = None,
                  sampler_seed: int = 0, state_settle: bool | None = None, object_layer: str = ""):
    """The two worlds a ranking scores `spec` in: (the policy's config, the true simulator's vector env, the world
    model's imagination env, whether the policy reads the predicted objects in imagination). `max_steps`: the
    episodes' length in both (default: the task's own)."""
    pcfg = parse_policy_spec(spec)
    model = make_world_model("video", world_model, state_gate=state_gate or None, state_settle=state_settle,
                             object_layer=object_layer or None)
    true_env = sim.make_vector_env(task, num_envs, asynchronous=False,
                                   **({"max_episode_steps": max_steps} if max_steps else {}))
    max_steps = max_steps or sim.episode_horizon(task)
    objects = acts_on_objects(spec)
    object_noise = pcfg.build(true_env).cfg.estimate_noise if objects else None
    if objects and model.state_channel is None:
        true_env.close()
        raise ValueError(f"policy spec {spec!r}: ':objects' needs a world model with a state channel; {world_model} has none")
    wm_env = make_imagination_env(model, Path(data), num_envs, max_steps, sampling_steps=1, stop_cm=stop_cm,
                                  decode_images=not objects, object_noise=object_noise or None,
                                  state_readout=state_readout, sampler_seed=sampler_seed)
    return pcfg, true_env, wm_env, objects


def imagined_policy(pcfg, true_env, wm_env, seed: int, objects: bool):
    """The policy as it acts in imagination: built against the true simulator's spaces and, for `:objects`, set to
    read the predicted objects instead of its cameras."""
    if not objects:
        return pcfg.build(wm_env, seed=seed)
    policy = pcfg.build(true_env, seed=seed)
    policy.read_object_channel = True
    policy.check_spaces(wm_env.single_observation_space, wm_env.single_action_space)
    return policy


def score_policy(spec: str, world_model: str, data: str, task: str, episodes: int, num_envs: int, seed: int,
                 threads: int | None = None, noise_ceiling: bool = True, stop_cm: float = 0.0,
                 state_readout: str = "mean", state_gate: str = "", max_steps: int | None = None,
                 sampler_seed: int = 0, state_settle: bool | None = None, object_layer: str = "") -> dict:
    """Success of one policy in the world model and in the true simulator, paired: every imagined episode starts
    from the true simulator's reset with the same seed (same layout, same first frame), the world model is stepped
    by the open-loop chunks the policy executes, and the same loop scores both. With `noise_ceiling`, a second true
    evaluation on other seeds. Runs in-process or inside a Ray worker (everything is rebuilt from paths, nothing is
    pickled but strings). `max_steps`: the episodes' length in both worlds (default: the task's own)."""
    import torch

    from wmrl.eval import evaluate

    if threads:
        torch.set_num_threads(threads)
    pcfg, true_env, wm_env, objects = paired_worlds(spec, world_model, data, task, num_envs, stop_cm, state_readout,
                                                    state_gate, max_steps, sampler_seed, state_settle, object_layer)
    out = {"policy": spec}
    runs = [("imagined", wm_env, seed, dict(start_from=true_env, chunked=True)), ("true", true_env, seed, {})]
    if noise_ceiling:
        runs.append(("true_repeat", true_env, seed + REPEAT_OFFSET, {}))
    try:
        for name, env, s, kw in runs:
            policy = (imagined_policy(pcfg, true_env, wm_env, seed, objects) if name == "imagined"
                      else pcfg.build(env, seed=seed))
            t = time.perf_counter()
            r = evaluate(policy, env, episodes, seed=s, progress=False, **kw)
            out[f"{name}_success"] = r.pc_success / 100
            out[f"{name}_ci95"] = [r.success_ci95[0] / 100, r.success_ci95[1] / 100]
            out[f"{name}_seconds"] = time.perf_counter() - t
            eps = sorted(r.per_episode, key=lambda e: e["seed"])  # finishing order differs between the two envs
            out[f"{name}_outcomes"] = [int(e["success"]) for e in eps]
            out[f"{name}_progress"] = [float(e["progress"]) for e in eps]
            out[f"{name}_seeds"] = [e["seed"] for e in eps]
            if stop_cm > 0 and name == "imagined":
                out["imagined_flagged"] = float(np.mean([e.get("flagged", False) for e in eps]))
    finally:
        true_env.close()
    if out["imagined_seeds"] != out["true_seeds"]:  # the pairing is what the statistics assume
        raise RuntimeError("paired ranking: imagined and true episodes ran on different seeds")
    return out


def score_population(specs: list[str], world_model: str, data: str, task: str, episodes: int, num_envs: int,
                     seed: int, workers: str = "local", num_workers: int = 2, progress: bool = True,
                     noise_ceiling: bool = True, stop_cm: float = 0.0, state_readout: str = "mean",
                     state_gate: str = "", max_steps: int | None = None, sampler_seed: int = 0,
                     state_settle: bool | None = None, object_layer: str = "") -> list[dict]:
    if workers not in WORKERS:
        raise ValueError(f"workers: expected one of {WORKERS}, got {workers!r}")
    for s in specs:  # fail before any work on a bad spec
        parse_policy_spec(s)
    args = (world_model, data, task, episodes, num_envs, seed)
    kw = dict(noise_ceiling=noise_ceiling, stop_cm=stop_cm, state_readout=state_readout, state_gate=state_gate,
              max_steps=max_steps, sampler_seed=sampler_seed, state_settle=state_settle, object_layer=object_layer)
    if workers == "local":
        from tqdm.auto import tqdm

        return [score_policy(s, *args, **kw)
                for s in tqdm(specs, desc="policies", disable=not progress)]
    try:
        import ray
    except ImportError as e:
        raise ValueError("--workers ray needs Ray: pip install 'wmrl[dist]'") from e
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=num_workers, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1)(score_policy)
        refs = [remote.remote(s, *args, threads=1, **kw) for s in specs]
        rows = []
        for spec, ref in zip(specs, refs):
            try:
                rows.append(ray.get(ref))
            except ray.exceptions.RayTaskError as e:  # the worker's own error, named by policy, not Ray's wrapper
                cause = e.cause if isinstance(e.cause, Exception) else e
                raise type(cause)(f"policy {spec!r}: {cause}") if isinstance(cause, (ValueError, FileNotFoundError)) \
                    else RuntimeError(f"policy {spec!r}: {cause}") from cause
        return rows
    finally:
        if started:
            ray.shutdown()


def plot_scatter(rows: list[dict], path: Path, stats: dict) -> Path:
    """True vs imagined success per policy with their 95% Wilson intervals; anchors in grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.8, 4.6))
    ax.plot([0, 1], [0, 1], color="0.7", lw=1, ls="--")
    for r, label in zip(rows, short_labels([r["policy"] for r in rows])):
        x, y = r["true_success"], r["imagined_success"]
        xerr = np.abs(np.array(r.get("true_ci95", [x, x])) - x)[:, None]
        yerr = np.abs(np.array(r.get("imagined_ci95", [y, y])) - y)[:, None]
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", ms=4, lw=0.8, capsize=2,
                    color="0.6" if is_anchor(r["policy"]) else "tab:blue")
        ax.annotate(label, (x, y), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    title = f"Spearman {stats['rank_spearman']:.2f}"
    if "rank_spearman_ci" in stats:
        lo, hi = stats["rank_spearman_ci"]
        title += f" [{lo:.2f}, {hi:.2f}], MMRV {stats['rank_mmrv']:.2f}"
    ax.set(xlim=(-0.05, 1.05), ylim=(-0.05, 1.05), xlabel="true-simulator success", ylabel="world-model success",
           title=title + f", MAE {stats['success_abs_error']:.2f}")
    ax.title.set_fontsize(8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return path


def learned_layouts(folder: str | Path) -> dict[str, list[int]]:
    """The true layouts (reset seeds) a run or dataset learned from, by where each came from: a dataset's recorded
    episode seeds (`meta/wmrl.json`); for a run (a folder with config.yaml, or a checkpoint inside one), the inputs
    its config names (`INPUT_KEYS`: datasets, and runs followed in turn: an RL run's starting policy, a world
    model's `init_from`), the datasets recorded inside it (a policy's DAgger rounds) and a world model's
    state-DAgger rounds. What cannot be found, or data recorded before seeds were kept, adds nothing: unknown, not
    fresh."""
    import yaml

    from wmrl.datasets.lerobot_v3 import LeRobotV3Dataset
    from wmrl.eval.record import recorded_seeds
    from world_models.video.state_dagger import round_layouts

    out: dict[str, list[int]] = {}
    todo, visited = [Path(folder)], set()
    while todo:
        p = todo.pop()
        if not p.exists() or p.resolve() in visited:
            continue
        visited.add(p.resolve())
        if (p / "meta/info.json").is_file():
            if seeds := recorded_seeds(p):
                out[str(p)] = sorted(set(seeds))
            continue
        run = next((q for q in (p, *list(p.parents)[:3]) if (q / "config.yaml").is_file()), None)
        if run is None or (run != p and run.resolve() in visited):
            continue
        visited.add(run.resolve())
        cfg = yaml.safe_load((run / "config.yaml").read_text()) or {}
        named = {k: [Path(v) for v in np.atleast_1d(cfg.get(k) or []).tolist() if isinstance(v, str)] for k in INPUT_KEYS}
        todo += [q for qs in named.values() for q in qs]
        todo += [m.parent.parent for m in (*run.glob("*/meta/info.json"), *run.glob("*/*/meta/info.json"))]
        rounds = int(cfg.get("state_dagger_rounds") or 0)
        data = [d for d in named["data"] + named["extra_data"] if (d / "meta/info.json").is_file()]
        if rounds and data:  # the tasks as the training run shared its starts over them
            tasks = sorted({sim.task_from_instruction(t) for d in data for t in LeRobotV3Dataset(d).tasks})
            seed, starts = int(cfg.get("seed") or 0), int(cfg.get("state_dagger_starts") or TrainWMConfig.state_dagger_starts)
            out[f"{run} (state DAgger)"] = sorted(x for r in range(rounds)
                                                  for xs in round_layouts(r, seed, tasks, starts).values() for x in xs)
    return out


def ranking_layouts(seed: int, episodes: int, repeat: bool) -> set[int]:
    """The paired layouts of a ranking, and the noise ceiling's repeat ones."""
    return set(range(seed, seed + episodes)) | (set(range(seed + REPEAT_OFFSET, seed + REPEAT_OFFSET + episodes)) if repeat else set())


def seen_layouts(folders: list[str | Path], seed: int, episodes: int, repeat: bool) -> dict[str, list[int]]:
    """Per source that holds any (see `learned_layouts`), the ranking's layouts that the world model, its data or
    a learned policy in `folders` learned from."""
    ours = ranking_layouts(seed, episodes, repeat)
    out: dict[str, list[int]] = {}
    for f in folders:
        for src, seeds in learned_layouts(f).items():
            if hit := sorted(ours.intersection(seeds)):
                out[src] = hit
    return out


def run_rank(cfg: RankConfig, progress: bool = True) -> dict:
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise ValueError(f"--max-steps: expected a positive episode length (or none: the task's own), got {cfg.max_steps}")
    if cfg.state_readout not in READOUTS:
        raise ValueError(f"--state-readout: expected one of {READOUTS}, got {cfg.state_readout!r}")
    if cfg.sampler_seed < 0:
        raise ValueError(f"--sampler-seed: expected a seed >= 0 (0: the layouts' own), got {cfg.sampler_seed}")
    if cfg.state_gate and cfg.state_gate not in GATES:
        raise ValueError(f"--state-gate: expected one of {GATES} (or empty: the model's own), got {cfg.state_gate!r}")
    if cfg.object_layer and cfg.object_layer not in OBJECT_LAYERS:
        raise ValueError(f"--object-layer: expected one of {OBJECT_LAYERS} (or empty: the model's own), got {cfg.object_layer!r}")
    data = cfg.data or world_model_data(cfg.world_model)
    check_world_model_task(cfg.world_model, data, [cfg.task], f"--task {cfg.task}")
    fitted = [parse_policy_spec(s).path for s in cfg.policies if not is_anchor(s)]
    by_source = seen_layouts([data, cfg.world_model, *fitted], cfg.seed, cfg.episodes, cfg.noise_ceiling)
    seen = sorted(set().union(*by_source.values()))
    if seen and not cfg.allow_seen_layouts:
        where = "; ".join(f"{src}: {len(x)}" for src, x in list(by_source.items())[:3])
        raise ValueError(f"{len(seen)} of the ranking's layouts (reset seeds {seen[0]}..{seen[-1]}) were learned from "
                         f"by the world model or a policy ({where}): they would be scored on what they were fitted "
                         f"to; pass --seed S with layouts none has seen (default {FRESH_LAYOUTS}), or "
                         "--allow-seen-layouts")
    run = start_run(cfg)
    t0 = time.time()
    rows = score_population(list(cfg.policies), str(cfg.world_model), str(data), cfg.task, cfg.episodes, cfg.num_envs,
                            cfg.seed, cfg.workers, cfg.num_workers, progress, cfg.noise_ceiling, cfg.stop_cm,
                            cfg.state_readout, cfg.state_gate, cfg.max_steps, cfg.sampler_seed, cfg.state_settle,
                            cfg.object_layer)
    learned = [r for r in rows if not is_anchor(r["policy"])]
    stats = (ranking_report(rows, cfg.bootstrap, cfg.seed) if len(learned) >= 2 else
             rank_statistics([r["imagined_success"] for r in rows], [r["true_success"] for r in rows]))
    plot_scatter(rows, run / "ranking.png", stats)
    result = {**stats, "policies": rows, "first_layout_seed": cfg.seed, "seen_layouts": len(seen),
              "max_steps": cfg.max_steps or sim.episode_horizon(cfg.task),
              "seen_layout_sources": {src: len(x) for src, x in by_source.items()},
              "minutes": (time.time() - t0) / 60, "run_dir": str(run)}
    write_json(run / "ranking.json", result)
    tracker = Tracker(run)
    tracker.log({k: v for k, v in result.items() if k != "policies"})
    tracker.close()
    return result
