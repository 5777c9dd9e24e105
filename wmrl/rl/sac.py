"""SAC with an N-critic ensemble: SAC (N=2), SAC-N, EDAC (eta > 0), REDQ-style subsampled targets (WSRL).

Haarnoja et al. 2018 (SAC); An et al. 2021, "Uncertainty-Based Offline RL with Diversified Q-Ensemble" (SAC-N,
EDAC, eq. 5's gradient-diversity term); Chen et al. 2021 (REDQ: min over a random subset of M critics).

    target   y = r + gamma (1 - terminated) [min_{i in S} Qbar_i(s', a') - alpha log pi(a'|s')],  a' ~ pi(.|s')
    critic   L_Q = sum_i E[(Q_i(s, a) - y)^2] + eta E[1/(N-1) sum_{i != j} g_i . g_j],  g_i = grad_a Q_i / |grad_a Q_i|
    actor    L_pi = E[alpha log pi(a~|s) - min_i Q_i(s, a~)]
    alpha    L_alpha = -E[log alpha (log pi(a~|s) + target_entropy)]

`train_online` is plain online SAC in a gymnasium env through the common replay: the reference return, the
behaviour policies of `wmrl datasets make`, and WSRL's fine-tuning phase all use it.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from policies.state.networks import CriticEnsemble, TanhGaussianActor
from sim.locomotion import make_state_env
from wmrl.core.episode import build_episode
from wmrl.core.features import ACTION, OBS_STATE, REWARD, TERMINATED
from wmrl.eval import evaluate
from wmrl.replay import EpisodeReplay


@dataclass
class SACConfig:
    obs_dim: int = 0  # filled from the data or env (`for_env`, `for_data`)
    act_dim: int = 0
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    num_critics: int = 2  # N; 10 for SAC-N/EDAC/RAVL
    eta: float = 0.0  # EDAC gradient-diversity weight; 1.0 for RAVL
    target_subsample: int = 0  # REDQ: min over this many random critics (0 = all N)
    gamma: float = 0.99
    tau: float = 5e-3
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    init_alpha: float = 1.0
    target_entropy: float | None = None  # None: -|A|
    backup_entropy: bool = True  # WSRL fine-tuning drops the entropy term from the target
    hidden: int = 256
    layers: int = 3
    layer_norm: bool = False
    batch_size: int = 256
    utd: int = 1  # critic updates per actor update (WSRL: 4)


def batch_tensors(batch: dict, device="cpu") -> dict[str, torch.Tensor]:
    """Replay sample (LeRobot names) -> the tensors the losses use."""
    t = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32, device=device)
    return {"obs": t(batch[OBS_STATE]), "act": t(batch[ACTION]), "rew": t(batch[REWARD]).reshape(-1),
            "next_obs": t(batch[f"next.{OBS_STATE}"]), "term": t(batch[TERMINATED]).reshape(-1)}


def edac_diversity(grad: torch.Tensor) -> torch.Tensor:
    """EDAC's ensemble similarity from the critics' action gradients `grad` (N, B, A), e.g.
    `CriticEnsemble.q_and_action_grad`: mean over pairs i != j of cos(grad_a Q_i, grad_a Q_j) (An et al. 2021, eq. 5)."""
    N = grad.shape[0]
    g = grad / (grad.norm(dim=-1, keepdim=True) + 1e-10)
    sim = torch.einsum("nba,mba->bnm", g, g)  # (B, N, N)
    off = sim.sum(dim=(1, 2)) - sim.diagonal(dim1=1, dim2=2).sum(-1)
    return off.mean() / (N - 1)


class SAC(torch.nn.Module):
    def __init__(self, cfg: SACConfig):
        super().__init__()
        if cfg.obs_dim <= 0 or cfg.act_dim <= 0 or len(cfg.action_low) != cfg.act_dim or len(cfg.action_high) != cfg.act_dim:
            raise ValueError(f"SACConfig needs obs_dim, act_dim and an action box of act_dim bounds; got obs_dim="
                             f"{cfg.obs_dim}, act_dim={cfg.act_dim}, {len(cfg.action_low)}/{len(cfg.action_high)} bounds")
        obs_dim, act_dim = cfg.obs_dim, cfg.act_dim
        action_low, action_high = np.asarray(cfg.action_low), np.asarray(cfg.action_high)
        if cfg.num_critics < 1 or (cfg.eta > 0 and cfg.num_critics < 2):
            raise ValueError(f"num_critics must be >= 1 (>= 2 with eta > 0), got {cfg.num_critics}")
        if cfg.target_subsample > cfg.num_critics:
            raise ValueError(f"target_subsample {cfg.target_subsample} > num_critics {cfg.num_critics}")
        self.cfg = cfg
        self.actor = TanhGaussianActor(obs_dim, act_dim, cfg.hidden, cfg.layers, cfg.layer_norm, action_low, action_high)
        self.critic = CriticEnsemble(obs_dim, act_dim, cfg.num_critics, cfg.hidden, cfg.layers, cfg.layer_norm)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.nn.Parameter(torch.tensor(float(np.log(cfg.init_alpha))))
        self.target_entropy = -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy
        self.opt_actor = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_lr, fused=True)
        self.opt_critic = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr, fused=True)
        self.opt_alpha = torch.optim.Adam([self.log_alpha], lr=cfg.alpha_lr)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.opt_actor, "critic": self.opt_critic, "alpha": self.opt_alpha}

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp()

    @torch.no_grad()
    def target_q(self, rew, next_obs, term) -> torch.Tensor:
        a2, logp2 = self.actor.sample(next_obs)
        q = self.target(next_obs, a2)  # (N, B)
        if self.cfg.target_subsample:
            q = q[torch.randperm(q.shape[0])[: self.cfg.target_subsample]]
        v = q.min(0).values
        if self.cfg.backup_entropy:
            v = v - self.alpha * logp2
        return rew + self.cfg.gamma * (1 - term) * v

    def critic_loss(self, b: dict) -> tuple[torch.Tensor, dict]:
        y = self.target_q(b["rew"], b["next_obs"], b["term"])
        if self.cfg.eta > 0:  # one forward gives Q and the action gradients the diversity term needs
            q, grad_a = self.critic.q_and_action_grad(b["obs"], b["act"])
        else:
            q = self.critic(b["obs"], b["act"])
        loss = ((q - y) ** 2).mean(1).sum()
        info = {"q_mean": q.mean().item(), "q_std": q.std(0).mean().item(), "target_mean": y.mean().item()}
        if self.cfg.eta > 0:
            div = edac_diversity(grad_a)
            loss = loss + self.cfg.eta * div
            info["edac_diversity"] = div.item()
        info["critic_loss"] = loss.item()
        return loss, info

    def update(self, b: dict[str, torch.Tensor]) -> dict:
        """One step in RAVL's order: alpha, actor, critic (`utd` critic steps on minibatches of the batch)."""
        a, logp = self.actor.sample(b["obs"])
        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.opt_alpha.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.opt_alpha.step()
        self.critic.requires_grad_(False)  # the actor's step needs dQ/da, not the critics' weight gradients
        try:
            q_pi = self.critic(b["obs"], a).min(0).values
            actor_loss = (self.alpha.detach() * logp - q_pi).mean()
            self.opt_actor.zero_grad(set_to_none=True)
            actor_loss.backward()
        finally:
            self.critic.requires_grad_(True)
        self.opt_actor.step()
        info = {}
        for part in torch.arange(len(b["obs"])).chunk(self.cfg.utd):
            loss, info = self.critic_loss({k: v[part] for k, v in b.items()})
            if not torch.isfinite(loss):
                raise FloatingPointError(f"critic loss is {loss.item()} (Q-values diverged); last good checkpoint kept")
            self.opt_critic.zero_grad(set_to_none=True)
            loss.backward()
            self.opt_critic.step()
            with torch.no_grad():
                torch._foreach_lerp_(list(self.target.parameters()), list(self.critic.parameters()), self.cfg.tau)
        return {**info, "actor_loss": actor_loss.item(), "alpha": self.alpha.item(), "entropy": -logp.mean().item()}

    @torch.no_grad()
    def q_values(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.critic(obs, act)


# ---------------------------------------------------------------------- online SAC through the common replay
@dataclass
class OnlineConfig:
    env: str = "HalfCheetah-v5"
    steps: int = 50_000
    random_steps: int = 5_000  # uniform random actions first (none for WSRL, which warms up with its own policy)
    warmup_no_update: int = 0  # WSRL: env steps with the loaded policy and no gradient updates
    update_every: int = 1
    eval_every: int = 5_000
    eval_episodes: int = 5
    seed: int = 0


def evaluate_return(actor: TanhGaussianActor, env_id: str, episodes: int, seed: int = 10_000) -> float:
    env = make_state_env(env_id)
    r = evaluate(actor, env, episodes, seed=seed, progress=False)
    env.close()
    return r.avg_sum_reward


def train_online(agent: SAC, cfg: OnlineConfig, replay=None, sample: Callable | None = None,
                 on_episode: Callable[[dict], None] | None = None, log: Callable[[dict], None] | None = None,
                 progress: bool = True) -> dict:
    """Online SAC. Episodes enter `replay` (an EpisodeReplay) when they end; `sample(batch_size)` overrides where
    batches come from (e.g. a MixedReplay that keeps offline data; it must accept `keys=`). Returns the evaluation
    curve, the number of gradient updates and the replay."""
    replay = replay if replay is not None else EpisodeReplay(cfg.steps + 2_000, seed=cfg.seed)
    sample = sample or replay.sample
    env = make_state_env(cfg.env)
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)
    obs, info = env.reset(seed=cfg.seed)
    traj = {"obs": [obs], "act": [], "rew": [], "term": [], "trunc": [], "qpos": [info["qpos"]], "qvel": [info["qvel"]]}
    curve, t0, upd, updates = [], time.time(), {}, 0
    keys = [OBS_STATE, ACTION, REWARD, TERMINATED]
    for step in tqdm(range(1, cfg.steps + 1), desc=f"sac {cfg.env}", disable=not progress, leave=False):
        if step <= cfg.random_steps:
            act = rng.uniform(env.action_space.low, env.action_space.high).astype(np.float32)
        else:
            with torch.no_grad():
                act = agent.actor.sample(torch.as_tensor(obs[OBS_STATE])[None])[0][0].numpy()
        obs, rew, term, trunc, info = env.step(act)
        for k, v in (("obs", obs), ("act", act), ("rew", rew), ("term", term), ("trunc", trunc), ("qpos", info["qpos"]), ("qvel", info["qvel"])):
            traj[k].append(v)
        if term or trunc:
            ep = build_episode(traj["obs"], traj["act"], traj["rew"], traj["term"], traj["trunc"], [False] * len(traj["act"]),
                               source="policy", extras={"qpos": traj["qpos"], "qvel": traj["qvel"]})
            replay.add_episode(ep)
            if on_episode:
                on_episode(ep)
            obs, info = env.reset()
            traj = {"obs": [obs], "act": [], "rew": [], "term": [], "trunc": [], "qpos": [info["qpos"]], "qvel": [info["qvel"]]}
        ready = len(replay) > agent.cfg.batch_size and step > max(cfg.random_steps, cfg.warmup_no_update)
        if ready and step % cfg.update_every == 0:
            n = agent.cfg.batch_size * agent.cfg.utd  # UTD: `utd` critic minibatches per actor batch (WSRL)
            upd = agent.update(batch_tensors(sample(n, keys=keys)))
            updates += 1
        if step % cfg.eval_every == 0 or step == cfg.steps:
            ret = evaluate_return(agent.actor, cfg.env, cfg.eval_episodes)
            row = {"env_step": step, "return": ret, "minutes": (time.time() - t0) / 60, "updates": updates,
                   **{k: v for k, v in upd.items() if k in ("q_mean", "critic_loss", "alpha")}}
            curve.append(row)
            if log:
                log(row)
    env.close()
    return {"curve": curve, "final_return": curve[-1]["return"] if curve else float("nan"), "updates": updates,
            "replay": replay}


def spaces_of(env_id: str) -> dict:
    """obs_dim, act_dim and the action box of a state env, as SACConfig fields."""
    env = make_state_env(env_id)
    box = env.action_space
    out = {"obs_dim": int(env.observation_space[OBS_STATE].shape[0]), "act_dim": int(box.shape[0]),
           "action_low": tuple(float(x) for x in box.low), "action_high": tuple(float(x) for x in box.high)}
    env.close()
    return out


__all__ = ["SACConfig", "SAC", "spaces_of", "OnlineConfig", "train_online", "edac_diversity", "batch_tensors", "evaluate_return"]
