"""D4RL-style offline datasets made locally, with no downloads: `wmrl datasets make --env E --kind K --out DIR`.

D4RL's recipe (Fu et al. 2020) on gymnasium v5: train SAC online (cached per env and budget), then
- random: a uniform random policy; expert: the final SAC policy; medium: the SAC snapshot whose return is nearest to
  1/3 of the way from random to expert; medium-replay: SAC's own replay up to that snapshot; medium-expert: medium +
  expert; mixed: random data plus `expert_fraction` of expert trajectories (Hong et al. 2023's mixed sets).
Every step stores `observation.state`, `action`, `next.reward`, `next.terminated`, `next.truncated` and the
simulator's `qpos`/`qvel`, in LeRobot v3 (through the common replay). `meta/wmrl.json` names the env, the kind
and the reference returns that normalise scores: 100 (R - R_random) / (R_expert - R_random).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from policies.random_policy import RandomPolicy
from sim.locomotion import make_state_env
from wmrl.core.episode import features_for
from wmrl.core.features import ACTION, REWARD, TASK
from wmrl.core.io import recognise, remove_for_overwrite, write_json
from wmrl.datasets.lerobot_v3 import LeRobotV3Writer, write_episode
from wmrl.eval import evaluate
from wmrl.replay import EpisodeReplay


KINDS = ("random", "medium", "medium-replay", "expert", "medium-expert", "mixed")


@dataclass
class MakeDatasetConfig:
    env: str = "HalfCheetah-v5"
    kind: str = "medium"
    out: Path = Path("data/halfcheetah-medium")
    transitions: int = 100_000
    """steps collected by the chosen policy (medium-expert: this many of each; medium-replay: ignored)"""
    sac_steps: int = 100_000
    """online SAC budget that defines 'expert' here (cached under `cache`)"""
    sac_hidden: int = 256
    expert_fraction: float = 0.05
    """mixed: share of transitions from expert trajectories"""
    reference_episodes: int = 10
    cache: Path = Path("runs/datasets")
    seed: int = 0
    overwrite: bool = False
    progress: bool = True


def normalized_score(ret: float, reference: dict) -> float:
    return 100.0 * (ret - reference["random"]) / (reference["expert"] - reference["random"])


def _sac_run(cfg: MakeDatasetConfig) -> Path:
    """Online SAC with actor snapshots at every evaluation; reused when the cache has it."""
    from wmrl.rl.agents import save_agent
    from wmrl.rl.sac import SAC, OnlineConfig, SACConfig, spaces_of, train_online

    run = Path(cfg.cache) / f"sac-{cfg.env}-{cfg.sac_steps}-h{cfg.sac_hidden}-s{cfg.seed}"
    if (run / "curve.json").exists():
        return run
    torch.manual_seed(cfg.seed)  # the initial weights too: the dataset must not depend on what ran before
    agent = SAC(SACConfig(**spaces_of(cfg.env), hidden=cfg.sac_hidden))
    eval_every = max(cfg.sac_steps // 20, 1000)
    replay = EpisodeReplay(cfg.sac_steps + 5_000, seed=cfg.seed)
    snaps: list[dict] = []

    def log(row):
        save_agent(agent, run / "snapshots" / f"step_{row['env_step']:08d}")
        snaps.append({"env_step": row["env_step"], "return": row["return"]})

    ocfg = OnlineConfig(env=cfg.env, steps=cfg.sac_steps, random_steps=min(5_000, cfg.sac_steps // 10),
                        eval_every=eval_every, eval_episodes=5, seed=cfg.seed)
    train_online(agent, ocfg, replay=replay, log=log, progress=cfg.progress)
    replay.save(run / "replay")  # medium-replay is cut from it
    write_json(run / "curve.json", snaps)
    return run


def _collect(actor, env_id: str, n_transitions: int, seed: int, stochastic: bool) -> list[dict]:
    env = make_state_env(env_id)
    eps: list[dict] = []
    steps = [0]

    def keep(ep):
        eps.append(ep)
        steps[0] += len(ep[ACTION]) - 1

    if hasattr(actor, "deterministic"):
        actor.deterministic = not stochastic
    i = 0
    while steps[0] < n_transitions:  # whole episodes until the budget is met
        evaluate(actor, env, 1, seed=seed + i, on_episode=keep, progress=False, source="policy")
        i += 1
    env.close()
    return eps


def make_dataset(cfg: MakeDatasetConfig) -> dict:
    from wmrl.rl.agents import load_agent
    from wmrl.rl.sac import evaluate_return

    if cfg.kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {cfg.kind!r}")
    if not 0.0 < cfg.expert_fraction < 1.0:
        raise ValueError(f"expert_fraction must be in (0, 1), got {cfg.expert_fraction}")
    out = Path(cfg.out)
    if out.exists() and any(out.iterdir()) and not cfg.overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
    if out.exists() and any(out.iterdir()):
        if recognise(out) is None:  # refused before the expensive part, not after it
            raise FileExistsError(f"{out} is neither a wmrl run nor a LeRobot dataset; --overwrite refuses to delete it")
    env = make_state_env(cfg.env)
    random_policy = RandomPolicy(env.action_space, seed=cfg.seed)
    fps = int(round(1.0 / env.unwrapped.dt)) if cfg.env != "PointEdge-v0" else 10
    env.close()
    run = _sac_run(cfg)
    snaps = json.loads((run / "curve.json").read_text())
    ref_random = evaluate_return(random_policy, cfg.env, cfg.reference_episodes)
    expert = load_agent(run / "snapshots" / f"step_{snaps[-1]['env_step']:08d}").actor
    ref_expert = evaluate_return(expert, cfg.env, cfg.reference_episodes)
    target = ref_random + (ref_expert - ref_random) / 3
    med_snap = min(snaps, key=lambda s: abs(s["return"] - target))
    medium = load_agent(run / "snapshots" / f"step_{med_snap['env_step']:08d}").actor
    n = cfg.transitions
    if cfg.kind == "random":
        eps = _collect(random_policy, cfg.env, n, cfg.seed, True)
    elif cfg.kind == "expert":
        eps = _collect(expert, cfg.env, n, cfg.seed, True)
    elif cfg.kind == "medium":
        eps = _collect(medium, cfg.env, n, cfg.seed, True)
    elif cfg.kind == "medium-expert":
        eps = _collect(medium, cfg.env, n, cfg.seed, True) + _collect(expert, cfg.env, n, cfg.seed + 10**6, True)
    elif cfg.kind == "mixed":
        n_exp = int(n * cfg.expert_fraction)
        eps = _collect(random_policy, cfg.env, n - n_exp, cfg.seed, True) + _collect(expert, cfg.env, n_exp, cfg.seed + 10**6, True)
    else:  # medium-replay: SAC's buffer up to the medium snapshot
        rb = EpisodeReplay.load(run / "replay")
        eps, seen = [], 0
        for eid in sorted(rb.episodes):
            ep = rb.get_episode(eid)
            seen += len(ep[ACTION]) - 1
            if seen > med_snap["env_step"]:
                break
            eps.append(ep)
    if not eps:
        raise ValueError(f"{cfg.kind}: no episodes collected (budget {n} transitions)")
    reference = {"random": ref_random, "expert": ref_expert}
    returns = [float(np.sum(ep[REWARD])) for ep in eps]
    replay = EpisodeReplay(sum(len(ep[ACTION]) for ep in eps), seed=cfg.seed)
    for ep in eps:
        ep[TASK] = [cfg.env] * len(ep[ACTION])
        replay.add_episode(ep)
    if out.exists() and cfg.overwrite:
        remove_for_overwrite(out)

    meta = {"env": cfg.env, "kind": cfg.kind, "reference_returns": reference, "sac_run": str(run),
            "medium_snapshot": med_snap, "episode_return_mean": float(np.mean(returns)),
            "normalized_score_mean": normalized_score(float(np.mean(returns)), reference)}
    writer = LeRobotV3Writer(out, fps=fps, features=features_for(eps[0]), robot_type=cfg.env, extra_meta=meta)
    for ep in eps:
        write_episode(writer, ep)
    writer.finalize()
    result = {"out": str(out), "episodes": len(eps), "transitions": int(sum(len(e[ACTION]) - 1 for e in eps)), **meta}
    write_json(out / "meta" / "make.json", result)
    return result


__all__ = ["MakeDatasetConfig", "make_dataset", "normalized_score", "KINDS"]
