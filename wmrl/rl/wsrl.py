"""Offline-to-online fine-tuning: WSRL and the naive baselines (Zhou et al. 2024, "Efficient Online RL Fine-Tuning
Need Not Retain Offline Data").

| method        | starts from             | online buffer at start | first steps                         | then                      |
|---------------|-------------------------|------------------------|-------------------------------------|---------------------------|
| wsrl          | the whole offline agent | empty, no offline data | `warmup` steps of the loaded policy, | SAC, UTD `utd`, min over 2 |
|               |                         |                        | no gradient updates                  | of N critics, no entropy backup |
| naive         | the whole offline agent | empty                  | none                                 | SAC, UTD 1                |
| naive-retain  | the whole offline agent | the offline dataset    | none                                 | SAC on 50/50 offline/online batches |

`wmrl finetune --algo wsrl --agent RUN --env HalfCheetah-v5 --steps 50000 --out RUN2 [--data DIR for naive-retain]`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from wmrl.core.checkpoint import commit_checkpoint
from wmrl.core.io import write_json
from wmrl.core.run import Tracker, start_run
from wmrl.replay import EpisodeReplay, MixedReplay
from wmrl.rl.agents import load_agent, save_agent
from wmrl.rl.sac import OnlineConfig, train_online


METHODS = ("wsrl", "naive", "naive-retain")


@dataclass
class FinetuneConfig:
    agent: Path = Path("runs/offline")
    """an offline run folder or checkpoint of a SAC-family agent (ravl, mbpo, mopo, sac-n, edac)"""
    out: Path = Path("runs/finetune")
    algo: str = "wsrl"
    env: str = ""
    """default: the environment recorded with the offline run's dataset"""
    data: Path | None = None
    """the offline dataset (needed by naive-retain only)"""
    steps: int = 50_000
    warmup: int = 5_000  # WSRL: env steps with the loaded policy and no updates
    utd: int = 4
    target_subsample: int = 2
    online_ratio: float = 0.5  # naive-retain: share of online data in each batch
    eval_every: int = 5_000
    eval_episodes: int = 5
    seed: int = 0
    overwrite: bool = False
    progress: bool = True


def finetune(cfg: FinetuneConfig) -> dict:
    from wmrl.rl.ravl import dataset_env
    from wmrl.rl.sac import SAC

    if cfg.algo not in METHODS:
        raise ValueError(f"algo: expected one of {', '.join(METHODS)}, got {cfg.algo!r}")
    if cfg.warmup < 0 or cfg.steps <= 0 or cfg.utd < 1:
        raise ValueError(f"steps must be positive, warmup >= 0 and utd >= 1; got {cfg.steps}, {cfg.warmup}, {cfg.utd}")
    if cfg.algo == "naive-retain" and cfg.data is None:
        raise ValueError("naive-retain keeps the offline data: pass --data DIR")
    if cfg.algo == "wsrl":
        agent = load_agent(cfg.agent, utd=cfg.utd, target_subsample=cfg.target_subsample, backup_entropy=False)
    else:
        agent = load_agent(cfg.agent)
    if not isinstance(agent, SAC):
        raise ValueError(f"{cfg.agent}: fine-tuning needs a SAC-family agent (ravl, mbpo, mopo, sac-n, edac), got {type(agent).__name__}")
    env = cfg.env
    if not env:
        import yaml

        run_cfg = Path(cfg.agent) / "config.yaml"
        data = yaml.safe_load(run_cfg.read_text()).get("data") if run_cfg.exists() else None
        env = dataset_env(Path(data)) if data else ""
    if not env:
        raise ValueError(f"{cfg.agent}: cannot tell which environment it was trained for; pass --env")
    run = start_run(cfg)
    online = EpisodeReplay(cfg.steps + 2_000, seed=cfg.seed)
    sample = None
    if cfg.algo == "naive-retain":
        offline = EpisodeReplay.from_lerobot(cfg.data, seed=cfg.seed)
        sample = MixedReplay(offline, online, online_ratio=cfg.online_ratio).sample
    ocfg = OnlineConfig(env=env, steps=cfg.steps, random_steps=0, warmup_no_update=cfg.warmup if cfg.algo == "wsrl" else 0,
                        eval_every=cfg.eval_every, eval_episodes=cfg.eval_episodes, seed=cfg.seed)
    tracker = Tracker(run)
    t0 = time.time()
    res = train_online(agent, ocfg, replay=online, sample=sample, log=tracker.log, progress=cfg.progress)
    tracker.close()

    commit_checkpoint(run / "checkpoints", cfg.steps,
                      lambda d: save_agent(agent, d))
    out = {"run_dir": str(run), "algo": cfg.algo, "env": env, "final_return": res["final_return"],
           "updates": res["updates"], "online_transitions": len(online) - online.num_episodes,
           "curve": res["curve"], "minutes": (time.time() - t0) / 60}
    write_json(run / "result.json", out)
    return out


__all__ = ["FinetuneConfig", "finetune", "METHODS"]
