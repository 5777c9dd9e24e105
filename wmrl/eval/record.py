"""Record a policy's episodes on a task (the scripted expert by default) into a LeRobot v3 dataset: the one evaluation
loop with its episodes written out. `wmrl collect` is its command; co-evolution records true rollouts with it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import sim
from policies.factory import make_policy
from wmrl.core.episode import features_for
from wmrl.core.io import check_out, recognise
from wmrl.datasets import LeRobotV3Dataset, LeRobotV3Writer, write_episode
from wmrl.datasets.video import check_codec
from wmrl.eval.loop import EvalResult, evaluate

LEARNED_TYPES = ("vla", "estimated-state", "act", "diffusion")  # what `--policy-path` can record


@dataclass
class CollectConfig:
    task: str = "push-red"
    """Task name (`wmrl tasks` lists them), e.g. push-red or tabletop-real-lift-blue."""
    episodes: int = 50
    out: Path = Path("data/push-red")
    noise: float = 0.0
    """Std of Gaussian noise on the expert's translational actions."""
    failures: float = 0.0
    """Share of episodes recorded in near-success failure mode (missed grasps, pushes that stop short)."""
    perturbed: float = 0.0
    """Share of episodes perturbed like a learning policy (extra noise, random-action segments, then recovery), so a
    world model trained on the data sees the states RL in imagination and ranking visit."""
    seed: int = 0
    num_envs: int = 2
    """Parallel simulator processes (gymnasium AsyncVectorEnv)."""
    image_size: int = 64
    max_episode_steps: int = 0
    """Cut episodes at this many control steps (0: the task's own horizon)."""
    post_success_steps: int = 0
    """Keep recording this many steps after success before the episode ends (more success frames)."""
    codec: str = "h264"
    overwrite: bool = False
    resume: bool = False
    """Append to an existing dataset (episodes continue from its last one)."""
    policy_path: Optional[Path] = None
    """Record a learned policy instead of the scripted expert, sampling its actions (failures included)."""
    policy_type: str = "vla"
    """The learned policy's type (`--policy-path`): vla, estimated-state, act or diffusion. Recording the policies
    a world model will be asked about gives its data the states they visit (issue 14, part 6)."""


def collect(cfg: CollectConfig, progress: bool = True) -> dict:
    check_codec(cfg.codec)  # before simulating anything
    check_out(cfg.out)
    for name in ("num_envs", "image_size", "post_success_steps", "max_episode_steps"):
        least = 0 if name in ("post_success_steps", "max_episode_steps") else 1
        if getattr(cfg, name) < least:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(cfg, name)}")
    if not (math.isfinite(cfg.noise) and cfg.noise >= 0):
        raise ValueError(f"--noise must be a finite number >= 0, got {cfg.noise}")
    if cfg.episodes <= 0:
        raise ValueError(f"--episodes must be positive, got {cfg.episodes}")
    if not 0.0 <= cfg.failures <= 1.0:
        raise ValueError(f"--failures must be in [0, 1], got {cfg.failures}")
    if not 0.0 <= cfg.perturbed <= 1.0:
        raise ValueError(f"--perturbed must be in [0, 1], got {cfg.perturbed}")
    if cfg.policy_path is not None and cfg.policy_type not in LEARNED_TYPES:
        raise ValueError(f"--policy-type: expected one of {LEARNED_TYPES}, got {cfg.policy_type!r}")
    mode = "overwrite" if cfg.overwrite else ("resume" if cfg.resume else "create")
    if cfg.overwrite and cfg.resume:
        raise ValueError("--overwrite and --resume exclude each other")
    existing = cfg.out.exists() and (not cfg.out.is_dir() or any(cfg.out.iterdir()))
    if mode == "create" and existing:
        raise FileExistsError(f"{cfg.out} already exists; pass --overwrite to replace it or --resume to append")
    if existing and recognise(cfg.out) != "dataset" and not (mode == "overwrite" and recognise(cfg.out) == "run"):
        raise FileExistsError(f"{cfg.out} is not a LeRobot dataset; --{mode} refuses to touch it")
    horizon = {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}
    env = sim.make_vector_env(cfg.task, cfg.num_envs, image_size=cfg.image_size,
                              post_success_steps=cfg.post_success_steps, **horizon)
    try:
        if cfg.policy_path is not None:
            policy = make_policy(cfg.policy_type, env.single_action_space, path=cfg.policy_path, stochastic=True,
                                 observation_space=env.single_observation_space)
        else:
            policy = make_policy("scripted", env.single_action_space, seed=cfg.seed, noise=cfg.noise,
                                 failure_prob=cfg.failures, perturb_prob=cfg.perturbed)
        seed = cfg.seed
        if mode == "resume":  # continue the seed sequence so resumed episodes are new ones
            seed += LeRobotV3Dataset(cfg.out).num_episodes
        source, pid = ("policy", str(cfg.policy_path)) if cfg.policy_path is not None else ("expert", "scripted")
        result, frames = record(policy, env, cfg.episodes, cfg.out, seed=seed, source=source, policy_id=pid, mode=mode,
                                codec=cfg.codec, task=cfg.task, progress=progress)
    finally:
        env.close()
    return {"dataset": str(cfg.out), "episodes": cfg.episodes, "frames": frames, **result.metrics()}


def record(policy, env, episodes: int, out: Path, *, seed: int, source: str, policy_id: str, task: str,
           mode: str = "create", codec: str = "h264", progress: bool = True) -> tuple[EvalResult, int]:
    """`evaluate(policy, env)` for `episodes` episodes, each written to the LeRobot v3 dataset `out` as it ends
    (`mode`: create | overwrite | resume). Returns the evaluation and the number of frames written."""
    writer: list[LeRobotV3Writer] = []
    fps, robot_type = int(env.metadata.get("render_fps", 10)), env.metadata.get("robot_type")  # the suite's control rate
    before = recorded_seeds(out) if mode == "resume" else []

    def on_episode(ep: dict) -> None:
        if not writer:  # features come from the first episode
            writer.append(LeRobotV3Writer(out, fps=fps, features=features_for(ep), robot_type=robot_type,
                                          mode=mode, codec=codec, extra_meta={"task": task, "control": env.metadata.get("control")}))
        write_episode(writer[0], ep)

    result = evaluate(policy, env, episodes, seed=seed, source=source, policy_id=policy_id, on_episode=on_episode,
                      progress=progress)
    # the layouts this data was recorded on (episodes end, and are written, in the order of `per_episode`), so a
    # ranking or an evaluation can refuse to score on the layouts a model or a policy learned from
    if before is not None:
        writer[0].extra_meta["episode_seeds"] = before + [int(r["seed"]) for r in result.per_episode]
    writer[0].finalize()
    return result, writer[0].num_frames


def recorded_seeds(root: Path) -> list[int] | None:
    """The reset seed of every episode of a dataset `record` wrote (`meta/wmrl.json`), in episode order; None for
    data recorded before seeds were kept, or written by anything else."""
    import json

    meta = Path(root) / "meta" / "wmrl.json"
    if not meta.exists():
        return None
    seeds = json.loads(meta.read_text()).get("episode_seeds")
    return [int(s) for s in seeds] if isinstance(seeds, list) else None
