"""World model and policy co-evolution, and fine-tuning on imagined successes.

- `hallucination_rate`: roll the policy out in the world model from true-simulator starts, then replay each imagined
  success's actions in the true simulator from the same start. A hallucinated success is an imagined success whose
  replay fails (WoVR's PACE motivation: an evolving policy finds the world model's blind spots).
- `evolve_world_model` (WoVR's PACE, World-VLA-Loop): a small, configurable budget of true-simulator rollouts of
  the evolved policy, failures included, then a short fine-tune of the world model on them plus its original data.
- `imagined_success_sft` (Ctrl-World): roll out in the world model, keep the trajectories it judges successful and
  fine-tune the policy on them by behaviour cloning.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import sim
from policies.vla.bc import bc_train
from sim import replay_in_true_sim  # noqa: F401  (re-exported: co-evolution replays imagined successes)
from sim import success_and_reward
from wmrl.core.episode import build_episode
from wmrl.core.features import ACTION, IS_LAST, OBS_ENV_STATE, OBS_STATE, TASK, image_key
from wmrl.eval.record import CollectConfig, collect
from wmrl.replay import EpisodeReplay
from world_models.video.model import imagined_success
from world_models.video.train import TrainWMConfig, recorded_recipe, train_world_model


def _true_starts(task: str, seeds: list[int], **env_kwargs) -> tuple[dict, list]:
    """True-simulator reset observations (batched) for the given seeds."""
    env = sim.make_env(task, **env_kwargs).unwrapped
    obs = [env.reset(seed=s)[0] for s in seeds]
    env.close()
    batch = {k: np.stack([o[k] for o in obs]) for k in obs[0] if k != TASK}
    batch[TASK] = [o[TASK] for o in obs]
    return batch, obs


@torch.no_grad()
def imagine_from(policy, model, starts: dict, max_steps: int, success_threshold: float = 0.9, record: bool = False,
                 seed: int = 0, rules=success_and_reward) -> dict:
    """Run `policy` chunk by chunk in the world model from given start observations (B of them). Returns per rollout
    the executed actions and the imagined success; with `record`, the imagined observation after every control step
    (all frames of each chunk decoded), so that rollouts become episodes."""
    n = len(starts[TASK])
    obs = {**{image_key(c): starts[image_key(c)] for c in model.cfg.cameras}, OBS_STATE: starts[OBS_STATE],
           TASK: list(starts[TASK])}
    if model.state_channel is not None:
        obs[OBS_ENV_STATE] = starts[OBS_ENV_STATE]
    state = model.encode(obs)
    g = torch.Generator(device=model.device).manual_seed(seed)
    alive = np.ones(n, bool)
    success = np.zeros(n, bool)
    acts: list[list[np.ndarray]] = [[] for _ in range(n)]
    frames: list[list[dict]] = [[{k: v[i] for k, v in obs.items()}] for i in range(n)]
    t = 0
    while t < max_steps and alive.any():
        h = min(model.cfg.chunk, policy.cfg.chunk_size, max_steps - t)
        chunk = np.clip(np.asarray(policy.predict_action_chunk(obs), np.float32)[:, :h], -1, 1)
        state, preds = model.step(state, torch.from_numpy(chunk), steps=1, generator=g)
        ok = imagined_success(model, preds, obs[TASK], rules, success_threshold)  # (B, h)
        pts = preds.get("points")
        imgs = model.decode(preds["latents"] if record else preds["latents"][:, -1:], state,
                            preds["pose"] if record else preds["pose"][:, -1:],
                            None if pts is None else (pts if record else pts[:, -1:]))
        st = preds[OBS_STATE].cpu().numpy()
        for i in np.flatnonzero(alive):
            hit = np.flatnonzero(ok[i])
            k = int(hit[0]) + 1 if len(hit) else h  # steps of this chunk taken until success
            acts[i].extend(chunk[i, :k])
            if record:
                frames[i].extend({**{c: imgs[c][i, j] for c in imgs}, OBS_STATE: st[i, j], TASK: obs[TASK][i]}
                                 for j in range(k))
            if len(hit):
                success[i], alive[i] = True, False
        obs = {**{c: v[:, -1] for c, v in imgs.items()}, OBS_STATE: st[:, -1], TASK: obs[TASK]}
        if OBS_ENV_STATE in preds:
            obs[OBS_ENV_STATE] = preds[OBS_ENV_STATE][:, -1].cpu().numpy()
        t += h
    return {"actions": [np.stack(a) for a in acts], "success": success, "frames": frames}


def hallucination_rate(policy, model, task: str, n: int, seed: int = 30_000, success_threshold: float = 0.9,
                       rules=success_and_reward) -> dict:
    """Imagined successes whose action replay fails in the true simulator, as a share of imagined successes (NaN
    when nothing succeeded in imagination: no success, nothing to call hallucinated; `n_imagined_success` says)."""
    seeds = [seed + i for i in range(n)]
    starts, _ = _true_starts(task, seeds)
    max_steps = sim.episode_horizon(task)
    r = imagine_from(policy, model, starts, max_steps, success_threshold, seed=seed, rules=rules)
    true = np.array([replay_in_true_sim(task, s, a) for s, a in zip(seeds, r["actions"])])
    imagined = r["success"]
    n_imag = int(imagined.sum())
    return {"hallucinated_success": float((imagined & ~true).sum() / n_imag) if n_imag else float("nan"),
            "imagined_success": float(imagined.mean()), "replayed_true_success": float(true.mean()),
            "missed_success": float((~imagined & true).mean()), "n": n, "n_imagined_success": n_imag}


def evolve_world_model(wm_run: Path, policy_path: Path, task: str, budget: int, out: Path, steps: int = 600,
                       seed: int = 40_000, progress: bool = True, mask_steps: int | None = None) -> Path:
    """Collect `budget` true rollouts of the evolved policy and fine-tune the world model on them plus its data.
    `mask_steps`: the change mask's refit after the fine-tune, from the base's fitted mask (None: a quarter of the
    base's fit; on demo50's models 200 instead of 800 steps cost -0.12 [-0.19, -0.04] dB masked; no refit -0.14)."""
    import yaml

    data = collect(CollectConfig(task=task, episodes=budget, out=out / "rollouts", policy_path=policy_path, seed=seed,
                                 overwrite=True, num_envs=1, post_success_steps=3), progress=progress)
    base = yaml.safe_load((Path(wm_run) / "config.yaml").read_text())
    cfg = TrainWMConfig(**{**recorded_recipe(base), "data": Path(base["data"]), "extra_data": (out / "rollouts",),
                           "out": out / "world_model", "init_from": Path(wm_run), "ae_steps": 0,
                           # the base's unseen episodes stay unseen: the fits after training read them again
                           "calibration_data": Path(base["calibration_data"]) if base.get("calibration_data") else None,
                           "state_steps": steps // 2, "dyn_steps": steps, "unroll_steps": steps // 5,
                           # the mask is refitted from the base's fitted one: a quarter of its steps (README, session 52)
                           "change_mask_steps": -(-base.get("change_mask_steps", 0) // 4) if mask_steps is None else mask_steps,
                           "lr": base["lr"] / 3, "videos": 2, "overwrite": True, "seed": seed})
    train_world_model(cfg, progress=progress)
    return out / "world_model"


def imagined_success_sft(policy, model, task: str, n: int, steps: int, out: Path | None = None, seed: int = 50_000,
                         batch_size: int = 32, lr: float = 1e-4, success_threshold: float = 0.9,
                         progress: bool = True, rules=success_and_reward) -> dict:
    """Ctrl-World's recipe: keep the imagined trajectories the world model judges successful and behaviour-clone
    them (from true-simulator start frames, with the policy sampling so that trajectories differ)."""
    starts, _ = _true_starts(task, [seed + i for i in range(n)])
    max_steps = sim.episode_horizon(task)
    stochastic, policy.stochastic = policy.stochastic, True
    r = imagine_from(policy, model, starts, max_steps, success_threshold, record=True, seed=seed, rules=rules)
    policy.stochastic = stochastic
    keep = np.flatnonzero(r["success"])
    info = {"imagined_rollouts": n, "imagined_successes": int(len(keep))}
    if len(keep) == 0:
        return {**info, "steps": 0}
    replay = EpisodeReplay(sum(len(r["frames"][i]) for i in keep) + len(keep), seed=seed)
    keys = [image_key(c) for c in policy.cfg.cameras] + [OBS_STATE, TASK]
    for i in keep:
        fr = r["frames"][i]
        T = len(fr) - 1  # one frame per executed action, plus the start
        ep = build_episode([{k: f[k] for k in keys} for f in fr], list(r["actions"][i][:T]), [0.0] * T,
                           [t == T - 1 for t in range(T)], [False] * T, [t == T - 1 for t in range(T)],
                           source="world_model", policy_id="imagined")
        replay.add_episode({k: v for k, v in ep.items() if k in keys + [ACTION, IS_LAST]})
    res = bc_train(policy, replay, steps, batch_size, lr, run=out, progress=progress, desc="imagined-sft")
    return {**info, **res}
