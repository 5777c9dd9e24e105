"""RL in imagination: a VLA policy improved inside the video world model, with zero true-simulator steps.

    wmrl imagine --policy BC_RUN --world-model WM_RUN --out RUN [--algo grpo|ppo]

GRPO as in WoVR (Jiang et al., 2025) on top of DeepSeekMath's GRPO (Shao et al., 2024, Eq. 3) with DAPO's
asymmetric clip (Yu et al., 2025): groups of G imagined rollouts from one start (a real first frame, or a real
keyframe with probability `keyframe_prob`, WoVR's KIR); each rollout's return is the sum of the world model's
relative success reward (the change in success probability); the advantage is the return standardised within the
group; groups whose rollouts all succeeded or all failed carry no signal and are dropped; the clipped surrogate
(clip 1-0.2 .. 1+0.28) is averaged over each rollout's valid steps (steps after termination are masked), then over
rollouts. No KL term by default. PPO (Schulman et al., 2017) with the policy's value head and GAE is the
alternative. One policy decision is one action chunk (H actions), which is also one world-model step.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from wmrl.core.features import TASK
from world_models.env import make_imagination_env
from world_models.video.train import world_model_data

ALGOS = ("grpo", "ppo")


@dataclass
class ImagineConfig:
    policy: Path = Path("runs/policy")
    """A `wmrl train-policy` run (or checkpoint) of a VLA policy with the gaussian head."""
    world_model: Path = Path("runs/wm")
    """A `wmrl train-wm` run (or checkpoint)."""
    data: Optional[Path] = None
    """Real episodes for resets and keyframes; default: the dataset the world model was trained on."""
    out: Path = Path("runs/imagine")
    algo: str = "grpo"
    iterations: int = 30
    groups: int = 4
    """Start states per iteration (GRPO); the batch is groups * group_size imagined rollouts."""
    group_size: int = 8
    max_steps: int = 40
    """Control steps per imagined episode."""
    keyframe_prob: float = 0.3
    """Share of resets that start mid-episode from a real keyframe (KIR)."""
    success_threshold: float = 0.9
    sampling_steps: int = 1
    """Euler steps of the world model per step (1 is about 2.5x faster than 3 at similar quality)."""
    epochs: int = 2
    minibatch_rollouts: int = 16
    lr: float = 3e-5
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    """Weight of KL(pi || pi_BC) (0: none, as WoVR)."""
    gamma: float = 0.99
    gae_lambda: float = 0.95
    vf_coef: float = 0.5
    eval_episodes: int = 0
    """True-simulator episodes before and after RL (evaluation only; never used for learning)."""
    ckpt_every: int = 5
    seed: int = 0
    device: str = "cpu"
    threads: Optional[int] = None
    overwrite: bool = False
    resume: bool = False


# ---------------------------------------------------------------------------------------------- the objective
def grpo_advantages(returns: torch.Tensor, success: torch.Tensor, group_size: int,
                    eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-standardised advantages (N,) and the rollouts to keep (N,): groups (consecutive blocks of G) whose
    rollouts all succeeded or all failed are dropped."""
    if returns.shape[0] % group_size:
        raise ValueError(f"{returns.shape[0]} rollouts do not split into groups of {group_size}")
    r = returns.reshape(-1, group_size).double()
    s = success.reshape(-1, group_size).bool()
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, unbiased=False, keepdim=True) + eps)
    mixed = s.any(1) & ~s.all(1)
    return adv.reshape(-1).float(), mixed[:, None].expand(-1, group_size).reshape(-1)


def clipped_surrogate(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, clip_low: float,
                      clip_high: float) -> torch.Tensor:
    """PPO's per-step objective (to maximise): min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)."""
    rho = torch.exp(logp - logp_old)
    return torch.minimum(rho * adv, rho.clamp(1 - clip_low, 1 + clip_high) * adv)


def rollout_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of x (T, N) over each rollout's valid steps -> (N,)."""
    v = valid.float()
    return (x * v).sum(0) / v.sum(0).clamp(min=1)


def gae(rewards: torch.Tensor, values: torch.Tensor, terminal: torch.Tensor, valid: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over (T, N) steps; values (T+1, N) include the observation after the last
    step (bootstrapped at truncation, not at termination). Returns (advantages, returns), zero where invalid."""
    T = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    cont = torch.cat([valid[1:], torch.zeros_like(valid[:1])]).float()  # the next step belongs to the episode
    for t in reversed(range(T)):
        nonterminal = 1.0 - terminal[t].float()
        delta = rewards[t] + gamma * values[t + 1] * nonterminal - values[t]
        last = (delta + gamma * lam * nonterminal * cont[t] * last) * valid[t].float()
        adv[t] = last
    return adv, (adv + values[:-1]) * valid.float()


def ppo_loss(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, value: torch.Tensor, ret: torch.Tensor,
             valid: torch.Tensor, clip: float, vf_coef: float) -> tuple[torch.Tensor, dict]:
    """Clipped PPO loss averaged over valid steps: -surrogate + vf_coef * (V - R)^2."""
    v = valid.float()
    n = v.sum().clamp(min=1)
    pg = -(clipped_surrogate(logp, logp_old, adv, clip, clip) * v).sum() / n
    vf = (((value - ret) ** 2) * v).sum() / n
    return pg + vf_coef * vf, {"pg_loss": pg.item(), "vf_loss": vf.item()}


# ---------------------------------------------------------------------------------------------- rollouts
@dataclass
class Rollouts:
    obs: list[dict]  # T + 1 observation batches (the last one follows the last step)
    actions: torch.Tensor  # (T, N, H, A)
    logp: torch.Tensor  # (T, N)
    rewards: torch.Tensor  # (T, N)
    terminal: torch.Tensor  # (T, N) the step ended the episode by success
    valid: torch.Tensor  # (T, N) the step belongs to the rollout's episode
    success: torch.Tensor  # (N,)

    @property
    def returns(self) -> torch.Tensor:
        return (self.rewards * self.valid).sum(0)


def _take(obs: dict, idx: np.ndarray) -> dict:
    return {k: ([v[i] for i in idx] if k == TASK else v[idx]) for k, v in obs.items()}


@torch.no_grad()
def collect_rollouts(policy, env, group_size: int, seed: int) -> Rollouts:
    """One imagined episode per env (each group of `group_size` envs shares its start); sampled action chunks."""
    obs, _ = env.reset(seed=seed, options={"group_size": group_size} if group_size > 1 else None)
    N, H = env.num_envs, policy.cfg.chunk_size
    T = math.ceil(env.max_episode_steps / H)
    alive = np.ones(N, bool)
    success = np.zeros(N, bool)
    out = {"obs": [], "actions": [], "logp": [], "rewards": [], "terminal": [], "valid": []}
    for _ in range(T):
        a, lp = policy.sample(obs)
        out["obs"].append(obs)
        obs, r, term, trunc, info = env.step(a.cpu().numpy())
        out["actions"].append(a)
        out["logp"].append(lp)
        out["valid"].append(torch.as_tensor(alive.copy()))
        out["rewards"].append(torch.as_tensor(r * alive, dtype=torch.float32))
        out["terminal"].append(torch.as_tensor(alive & term))
        success |= alive & np.asarray(info["success"], bool)
        alive &= ~(term | trunc)
        if not alive.any():
            break
    out["obs"].append(obs)
    return Rollouts(obs=out["obs"], **{k: torch.stack(v) for k, v in out.items() if k != "obs"},
                    success=torch.as_tensor(success))


# ---------------------------------------------------------------------------------------------- updates
def _step_logp(policy, ro: Rollouts, rollout_ids: np.ndarray) -> torch.Tensor:
    """log pi(chunk_t | o_t) for the given rollouts at every step (T, n), recomputed with gradients."""
    return torch.stack([policy.log_prob(_take(o, rollout_ids), ro.actions[t][rollout_ids])
                        for t, o in enumerate(ro.obs[: len(ro.actions)])])


def _kl_to_ref(policy, ref, ro: Rollouts, ids: np.ndarray) -> torch.Tensor:
    kls = []
    for t, o in enumerate(ro.obs[: len(ro.actions)]):
        ob = _take(o, ids)
        kls.append(torch.distributions.kl_divergence(policy.dist(policy.features(ob)), ref.dist(ref.features(ob))).sum((-1, -2)))
    return rollout_mean(torch.stack(kls), ro.valid[:, ids]).mean()


def update(policy, opt, ro: Rollouts, cfg: ImagineConfig, ref=None) -> dict:
    """`epochs` passes over the rollouts in minibatches of whole rollouts."""
    N = ro.actions.shape[1]
    info: dict = {}
    if cfg.algo == "grpo":
        adv_r, keep = grpo_advantages(ro.returns, ro.success, cfg.group_size)
        ids_all = np.flatnonzero(keep.numpy())
        info["kept_groups"] = float(keep.float().mean())
        adv = adv_r[None].expand(ro.actions.shape[0], -1)
    else:
        with torch.no_grad():
            values = torch.stack([policy.value(o) for o in ro.obs])  # (T + 1, N)
        adv, ret = gae(ro.rewards, values, ro.terminal, ro.valid, cfg.gamma, cfg.gae_lambda)
        v = ro.valid.bool()
        adv = torch.where(v, (adv - adv[v].mean()) / (adv[v].std() + 1e-8), torch.zeros_like(adv))
        ids_all = np.arange(N)
    if len(ids_all) == 0:
        return {**info, "updates": 0}
    rng = np.random.default_rng()
    stats = {"loss": [], "approx_kl": [], "clip_frac": []}
    for _ in range(cfg.epochs):
        perm = rng.permutation(ids_all)
        for i in range(0, len(perm), cfg.minibatch_rollouts):
            ids = perm[i : i + cfg.minibatch_rollouts]
            logp = _step_logp(policy, ro, ids)
            old, valid = ro.logp[:, ids], ro.valid[:, ids]
            if cfg.algo == "grpo":
                surr = clipped_surrogate(logp, old, adv[:, ids], cfg.clip_low, cfg.clip_high)
                loss = -rollout_mean(surr, valid).mean()
            else:
                value = torch.stack([policy.value(_take(o, ids)) for o in ro.obs[: len(ro.actions)]])
                loss, _ = ppo_loss(logp, old, adv[:, ids], value, ret[:, ids], valid, cfg.clip_low, cfg.vf_coef)
            if ref is not None and cfg.kl_coef > 0:
                loss = loss + cfg.kl_coef * _kl_to_ref(policy, ref, ro, ids)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
            with torch.no_grad():
                ratio = torch.exp(logp - old)[valid]
                stats["loss"].append(loss.item())
                stats["approx_kl"].append(((ratio - 1) - torch.log(ratio)).mean().item())
                stats["clip_frac"].append(((ratio < 1 - cfg.clip_low) | (ratio > 1 + cfg.clip_high)).float().mean().item())
    return {**info, **{k: float(np.mean(v)) for k, v in stats.items()}, "updates": len(stats["loss"])}


# ---------------------------------------------------------------------------------------------- the command
def imagine(cfg: ImagineConfig, progress: bool = True) -> dict:
    from policies.vla import VLAPolicy
    from sim.tabletop.env import TabletopEnv
    from wmrl.eval import evaluate_on_tasks
    from wmrl.core.checkpoint import (commit_checkpoint, load_train_state, resolve_checkpoint, resume_checkpoint,
                                      save_train_state)
    from world_models.factory import make_world_model
    from wmrl.core.report import plot_curves
    from wmrl.core.run import Tracker, prepare_run_dir, save_config

    if cfg.algo not in ALGOS:
        raise ValueError(f"algo: expected one of {ALGOS}, got {cfg.algo!r}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run = prepare_run_dir(cfg.out, cfg.overwrite, cfg.resume)
    save_config(run, cfg)
    torch.manual_seed(cfg.seed)
    ck, _ = resume_checkpoint(run / "checkpoints") if cfg.resume else (None, 0)
    resuming = ck is not None
    policy = VLAPolicy.load(ck if resuming else resolve_checkpoint(cfg.policy), device=cfg.device)
    if policy.cfg.head != "gaussian":
        raise ValueError(f"{cfg.algo} needs the gaussian head's exact log-probability; {cfg.policy} has the "
                         f"{policy.cfg.head} head")
    model = make_world_model("video", str(cfg.world_model), device=cfg.device)
    env = make_imagination_env(model, cfg.data or world_model_data(cfg.world_model), cfg.groups * cfg.group_size,
                               cfg.max_steps, cfg.keyframe_prob, cfg.success_threshold, cfg.sampling_steps)
    policy.check_spaces(env.single_observation_space, env.single_action_space)
    if policy.cfg.chunk_size > model.cfg.chunk:
        raise ValueError(f"policy chunk {policy.cfg.chunk_size} exceeds the world model's chunk {model.cfg.chunk}")
    ref = copy.deepcopy(policy).eval() if cfg.kl_coef > 0 else None
    opt = torch.optim.AdamW(policy.parameters(), cfg.lr, weight_decay=0.0)
    start, result = 0, {}
    if resuming:
        start = load_train_state(ck, {"policy": opt}, cfg.device)["step"]
    tracker = Tracker(run)
    tasks = sorted(set(env.starts.vocab[TASK]))
    if cfg.eval_episodes and not resuming:
        result["eval_before"] = evaluate_on_tasks(policy, tasks, cfg.eval_episodes, run / "eval_before",
                                                  seed=20_000 + cfg.seed, progress=progress)
        tracker.log({"stage": "eval_before", **{f"{t}/{k}": v for t, m in result["eval_before"].items() for k, v in m.items()}})
    true_steps0 = TabletopEnv.steps_taken
    t0 = time.time()
    G = cfg.group_size if cfg.algo == "grpo" else 1
    for it in tqdm(range(start, cfg.iterations), initial=start, total=cfg.iterations, desc=f"imagine-{cfg.algo}",
                   disable=not progress):
        policy.eval()  # rollouts without augmentation
        ro = collect_rollouts(policy, env, G, seed=cfg.seed * 100_003 + it)
        policy.train()
        info = update(policy, opt, ro, cfg, ref)
        policy.eval()
        rec = {"iteration": it + 1, "imagined_success": float(ro.success.float().mean()),
               "imagined_return": float(ro.returns.mean()), "episode_chunks": float(ro.valid.float().sum(0).mean()),
               "log_std": float(policy.log_std.detach().mean()), "true_env_steps": TabletopEnv.steps_taken - true_steps0,
               "seconds": time.time() - t0, **info}
        tracker.log(rec, step=it + 1)
        if (it + 1) % cfg.ckpt_every == 0 or it + 1 == cfg.iterations:
            commit_checkpoint(run / "checkpoints", it + 1,
                              lambda d: (policy.save(d), save_train_state(d, it + 1, {"policy": opt})))
    result.update({"run_dir": str(run), "iterations": cfg.iterations, "rl_minutes": (time.time() - t0) / 60,
                   "true_env_steps_during_rl": TabletopEnv.steps_taken - true_steps0})
    plot_curves(run / "metrics.jsonl", run / "learning_curves.png", ["imagined_success", "imagined_return", "log_std"],
                title=f"{cfg.algo} in imagination")
    if cfg.eval_episodes:
        result["eval_after"] = evaluate_on_tasks(policy, tasks, cfg.eval_episodes, run / "eval_after",
                                                 seed=20_000 + cfg.seed, progress=progress)
    tracker.log({"stage": "done", **{k: v for k, v in result.items() if not isinstance(v, dict)}})
    tracker.close()
    return result
