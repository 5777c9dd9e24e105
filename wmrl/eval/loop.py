"""The one evaluation loop: any policy, any (vector) env, N episodes, the same metrics everywhere.

Batches of `num_envs` episodes run in parallel; each env contributes its first episode of the batch and is ignored
after it ends (its autoreset is never used), so every episode starts from a seeded reset.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

import sim
from sim import task_from_instruction
from wmrl.core.episode import build_episode
from wmrl.core.features import TASK, is_image_key
from wmrl.core.protocols import Policy
from wmrl.datasets.episode_videos import write_episode_videos


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a success rate (well behaved at 0% and 100%, unlike the normal one)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class EvalResult:
    pc_success: float  # percent, LeRobot's name
    success_ci95: tuple[float, float]  # percent
    avg_sum_reward: float
    avg_max_reward: float
    avg_episode_length: float
    episode_lengths: list[int]
    per_episode: list[dict]
    episodes: list[dict] = field(default_factory=list, repr=False)  # recorded episode dicts when asked
    video_paths: list[str] = field(default_factory=list)

    def metrics(self) -> dict:
        return {"pc_success": self.pc_success, "success_ci95_low": self.success_ci95[0],
                "success_ci95_high": self.success_ci95[1], "avg_sum_reward": self.avg_sum_reward,
                "avg_max_reward": self.avg_max_reward, "avg_episode_length": self.avg_episode_length,
                "n_episodes": len(self.per_episode)}


def _as_vector_env(env: gym.Env | gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    if isinstance(env, gym.vector.VectorEnv):
        return env
    return gym.vector.SyncVectorEnv([lambda: env])


def _slice(obs: dict, i: int) -> dict:
    return {k: (v[i] if not isinstance(v, str) else v) for k, v in obs.items()}


def evaluate(policy: Policy, env: gym.Env | gym.vector.VectorEnv, n_episodes: int, seed: int = 0,
             record: bool = False, source: str = "policy", policy_id: str = "", info_keys: tuple[str, ...] = ("qpos", "qvel"),
             video_dir: str | Path | None = None, max_videos: int = 8, progress: bool = True,
             on_episode: Callable[[dict], None] | None = None, start_from: gym.vector.VectorEnv | None = None,
             chunked: bool = False) -> EvalResult:
    """Run `policy` for `n_episodes` and return LeRobot's metrics (`pc_success`, `avg_sum_reward`,
    `avg_max_reward`) with a 95% Wilson interval, episode lengths and per-episode records. A record's `progress` is
    the best dense task reward the episode reached: the reward itself, or `info["task_reward"]` where the env
    rewards something else (a world model's relative-success reward).

    record: keep every episode as an episode dict (`wmrl.core.episode`); `on_episode` receives each one as it
    finishes (e.g. a dataset writer), so long collections need not hold them all. video_dir: write mp4s of the
    first `max_videos` episodes and a grid GIF.

    start_from: another vector env (the true simulator) reset with the same seeds, whose observations become this
    env's starts (`reset(options={"observations": ...})`, a world model's env): paired evaluation, the same
    layouts in both. chunked: step an env that takes whole chunks (`max_chunk`, a world model's env, trained on
    chunks) with each open-loop chunk the policy executes (`cfg.n_action_steps` > 1) in one call, instead of one
    action at a time; not with recording (an episode's observations exist only at chunk boundaries).
    """
    if n_episodes <= 0:
        raise ValueError(f"n_episodes must be positive, got {n_episodes}")
    venv = _as_vector_env(env)
    B = venv.num_envs
    if start_from is not None and start_from.num_envs != B:
        raise ValueError(f"start_from has {start_from.num_envs} envs, the env {B}: paired starts need equal batches")
    h = chunk_steps(policy, venv) if chunked else 1
    if h > 1 and (record or on_episode is not None or video_dir is not None):
        raise ValueError("chunked evaluation cannot record episodes (observations exist only at chunk boundaries)")
    act_shape = venv.single_action_space.shape
    keep = record or on_episode is not None or video_dir is not None
    per_episode: list[dict] = []
    episodes: list[dict] = []
    bar = tqdm(total=n_episodes, desc="episodes", disable=not progress, leave=False)
    batch = 0
    while len(per_episode) < n_episodes:
        n_here = min(B, n_episodes - len(per_episode))
        if start_from is not None:
            starts, _ = start_from.reset(seed=seed + batch * B)
            obs, info = venv.reset(seed=seed + batch * B, options={"observations": starts})
        else:
            obs, info = venv.reset(seed=seed + batch * B)
        policy.reset()
        active = np.arange(B) < n_here
        traj = [{"obs": [_slice(obs, i)], "act": [], "rew": [], "prog": [], "term": [], "trunc": [], "succ": [],
                 "extra": {k: [np.asarray(info[k][i])] for k in info_keys if k in info}} for i in range(B)]
        while active.any():
            if h > 1:
                with torch.no_grad():
                    action = policy.predict_action_chunk(obs)[:, :h]
            else:
                action = policy.select_action(obs)
            action = np.asarray(action.detach().cpu() if hasattr(action, "detach") else action, dtype=np.float32)
            if action.shape != ((B, h, *act_shape) if h > 1 else (B, *act_shape)):
                raise ValueError(f"action: policy returned shape {action.shape}, env expects {(B, *act_shape)}")
            if not np.all(np.isfinite(action[active])):
                raise ValueError("action: policy returned NaN or inf")
            obs, reward, terminated, truncated, info = venv.step(action)
            success = np.asarray(info.get("success", np.zeros(B, bool)), dtype=bool)
            progress = np.asarray(info.get("task_reward", reward), dtype=np.float64)
            for i in np.flatnonzero(active):
                tr = traj[i]
                if h > 1:  # the chunk's first h-1 actions: reward, success and the end come with its last
                    tr["act"] += list(action[i, :-1])
                    tr["rew"] += [0.0] * (h - 1)
                    tr["prog"] += [0.0] * (h - 1)
                    tr["term"] += [False] * (h - 1)
                    tr["trunc"] += [False] * (h - 1)
                    tr["succ"] += [False] * (h - 1)
                tr["act"].append(action[i, -1] if h > 1 else action[i])
                tr["rew"].append(float(reward[i]))
                tr["prog"].append(float(progress[i]))
                tr["term"].append(bool(terminated[i]))
                tr["trunc"].append(bool(truncated[i]))
                tr["succ"].append(bool(success[i]))
                if keep:
                    tr["obs"].append(_slice(obs, i))
                    for k in tr["extra"]:
                        tr["extra"][k].append(np.asarray(info[k][i]))
                if terminated[i] or truncated[i]:
                    active[i] = False
                    rec = {"episode": len(per_episode), "seed": int(seed + batch * B + i), "task": tr["obs"][0].get(TASK, ""),
                           "success": bool(any(tr["succ"])), "sum_reward": float(np.sum(tr["rew"])),
                           "max_reward": float(np.max(tr["rew"])), "progress": float(np.max(tr["prog"])),
                           "length": len(tr["act"])}
                    if "flagged" in info:  # a world model's hallucination flag ended it (`WorldModelEnv(stop_cm=...)`)
                        rec["flagged"] = bool(info["flagged"][i])
                    per_episode.append(rec)
                    if keep:
                        ep = build_episode(tr["obs"], tr["act"], tr["rew"], tr["term"], tr["trunc"], tr["succ"],
                                           source=source, policy_id=policy_id, extras=tr["extra"])
                        if on_episode is not None:
                            on_episode(ep)
                        if record or (video_dir is not None and len(episodes) < max_videos):
                            episodes.append(ep)
                    bar.update(1)
        batch += 1
    bar.close()
    per_episode = per_episode[:n_episodes]
    n_succ = sum(r["success"] for r in per_episode)
    lo, hi = wilson_interval(n_succ, len(per_episode))
    lengths = [r["length"] for r in per_episode]
    result = EvalResult(
        pc_success=100.0 * n_succ / len(per_episode), success_ci95=(100.0 * lo, 100.0 * hi),
        avg_sum_reward=float(np.mean([r["sum_reward"] for r in per_episode])),
        avg_max_reward=float(np.mean([r["max_reward"] for r in per_episode])),
        avg_episode_length=float(np.mean(lengths)), episode_lengths=lengths, per_episode=per_episode,
        episodes=episodes if record else [],
    )
    if video_dir is not None and episodes:
        result.video_paths = write_episode_videos(episodes[:max_videos], video_dir, per_episode[:max_videos])
    return result


def chunk_steps(policy: Policy, venv: gym.vector.VectorEnv) -> int:
    """Actions per env step for chunked evaluation: the policy's open-loop chunk (`cfg.n_action_steps`, no temporal
    ensembling, no observation history) when the env takes chunks that long, else 1."""
    cfg = getattr(policy, "cfg", None)
    n = getattr(cfg, "n_action_steps", 1)
    if n <= 1 or getattr(policy, "ensembler", None) is not None or not hasattr(policy, "predict_action_chunk"):
        return 1
    if getattr(cfg, "n_obs_steps", 1) > 1:  # it keeps an observation history (Diffusion Policy): every step counts
        return 1
    return n if n <= getattr(venv, "max_chunk", 0) else 1


def camera_keys(ep: dict[str, Any]) -> list[str]:
    return [k for k in ep if is_image_key(k)]


def evaluate_on_tasks(policy, instructions: list[str], episodes: int, out: Path | None, seed: int, num_envs: int = 2,
                      progress: bool = True) -> dict:
    """True-simulator success of `policy` on each task named by an instruction (per task: metrics, videos)."""
    out_ = {}
    for task in sorted({task_from_instruction(t) for t in instructions}):
        env = sim.make_vector_env(task, num_envs)
        try:
            policy.check_spaces(env.single_observation_space, env.single_action_space)
            r = evaluate(policy, env, episodes, seed=seed, progress=progress,
                         video_dir=(out / task / "videos") if out is not None else None, max_videos=4)
        finally:
            env.close()
        out_[task] = r.metrics()
    return out_
