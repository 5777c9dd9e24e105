"""Twin-guided exploration (TwinRL-VLA): spend real-robot time where the policy fails, found in the digital twin.

A configuration is a cell layout (a layout seed: cube poses and zone). The policy is behaviour-cloned from scripted
demonstrations on privileged state (`observation.state` + `observation.environment_state`, a tanh-Gaussian MLP).

1. Twin demonstrations: the scripted expert in the twin under domain randomisation, at configurations outside the
   pool, give the first BC data set.
2. Failure map: the policy's success in the twin at every pool configuration (`twin_rollouts` stochastic rollouts).
3. Each round, `per_round` real demonstrations (the expert in `tabletop-real`, i.e. real-robot time) go to pool
   configurations: `guided` draws them with weights p(1 - p) from the twin success p (low but non-zero success
   first; cells at p = 0 or 1 get a small floor), `uniform` draws them uniformly. The policy is retrained on all
   data and its true success on the whole pool is measured in `tabletop-real`.
4. `corrections` (RaC, Hu et al. 2025; HG-DAgger): instead of full demonstrations, the current policy runs at
   `per_round` uniformly drawn configurations while a scripted operator watches (`real_robot.intervention`); only the
   operator's recovery and correction frames join the data, but every step of the rollout counts as robot time.
The comparison is the real robot steps each strategy needs to reach a target success.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from policies.state.networks import TanhGaussianActor
from sim.tabletop.env import TabletopEnv
from sim.experts import ScriptedExpert
from wmrl.core.features import ACTION, INTERVENTION, OBS_ENV_STATE, OBS_STATE, TASK


@dataclass
class TwinRLConfig:
    task: str = "reach-red"  # the benchmark's task; push-red also works in the real cell since the contact fix
    pool: int = 24  # configurations (layout seeds 0 .. pool-1)
    twin_demos: int = 2
    rounds: int = 8
    per_round: int = 2
    twin_rollouts: int = 3
    bc_steps: int = 800
    hidden: int = 256
    domain_randomization: float = 0.1
    seed: int = 0


def _features(obs: dict) -> np.ndarray:
    return np.concatenate([np.asarray(obs[OBS_STATE], np.float32).reshape(-1),
                           np.asarray(obs[OBS_ENV_STATE], np.float32).reshape(-1)])


def make_env(task: str, twin, domain_randomization: float = 0.0):
    return TabletopEnv(task=task, cameras=(), twin=twin, domain_randomization=domain_randomization)


def demonstrate(env, layout_seed: int) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """One scripted-expert episode: (features, actions, steps). A failed demonstration returns no data (an operator
    discards it) but its steps still count as robot time."""
    expert = ScriptedExpert()
    obs, _ = env.reset(seed=layout_seed)
    xs, acts = [], []
    while True:
        a = expert.select_action({OBS_STATE: obs[OBS_STATE][None], OBS_ENV_STATE: obs[OBS_ENV_STATE][None], TASK: [obs[TASK]]})[0]
        xs.append(_features(obs))
        acts.append(a)
        obs, _, te, tr, info = env.step(a)
        if te or tr:
            return (xs, acts, len(acts)) if info.get("success", False) else ([], [], len(acts))


def twin_demonstrations(env, n: int, first_seed: int) -> tuple[list, list]:
    """Data of n successful expert episodes (failed ones are skipped; at most 5n tries)."""
    X, A, got = [], [], 0
    for i in range(5 * n):
        xs, acts, _ = demonstrate(env, first_seed + i)
        X, A, got = X + xs, A + acts, got + bool(xs)
        if got == n:
            return X, A
    raise RuntimeError(f"the expert succeeded in only {got} of {5 * n} episodes in this twin")


class BCPolicy:
    """tanh-Gaussian MLP on privileged state, trained by maximum likelihood on demonstrations."""

    def __init__(self, obs_dim: int, act_dim: int = 4, hidden: int = 256, seed: int = 0):
        torch.manual_seed(seed)
        self.actor = TanhGaussianActor(obs_dim, act_dim, hidden, layers=2)
        self.mean, self.std = np.zeros(obs_dim, np.float32), np.ones(obs_dim, np.float32)

    def fit(self, X: np.ndarray, A: np.ndarray, steps: int, seed: int = 0) -> float:
        self.mean, self.std = X.mean(0), X.std(0) + 1e-3
        x = torch.as_tensor((X - self.mean) / self.std)
        a = torch.as_tensor(np.clip(A, -0.999, 0.999))
        opt = torch.optim.Adam(self.actor.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(seed)
        loss = torch.zeros(())
        for _ in range(steps):
            idx = torch.randint(len(x), (min(256, len(x)),), generator=g)
            loss = -self.actor.log_prob(x[idx], a[idx]).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return loss.item()

    @torch.no_grad()
    def act(self, obs: dict, stochastic: bool) -> np.ndarray:
        x = torch.as_tensor(((_features(obs) - self.mean) / self.std)[None])
        self.actor.deterministic = not stochastic
        return self.actor.act(x)[0].numpy()

    # the batched Policy interface, so the shared rollout helpers (`rollout_with_operator`) can drive it
    def reset(self) -> None:
        pass

    def select_action(self, batch: dict) -> np.ndarray:
        return self.act({k: v[0] for k, v in batch.items()}, stochastic=False)[None]


def correct(env, policy: BCPolicy, layout_seed: int, operator=None) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """One policy rollout with a scripted operator taking over (RaC): (features, actions) of the operator's recovery
    and correction frames only, and the rollout's steps (all of them are robot time)."""
    from real_robot.intervention import ScriptedOperator, rollout_with_operator

    ep = rollout_with_operator(env, policy, operator or ScriptedOperator(), layout_seed)
    steps = len(ep[INTERVENTION]) - 1
    keep = np.flatnonzero(ep[INTERVENTION][:steps])
    xs = [_features({OBS_STATE: ep[OBS_STATE][t], OBS_ENV_STATE: ep[OBS_ENV_STATE][t]}) for t in keep]
    return xs, [ep[ACTION][t] for t in keep], steps


def success_rate(env, policy: BCPolicy, seeds, stochastic: bool = False, repeats: int = 1) -> np.ndarray:
    """Per-configuration success of `policy` in `env` (a twin or the real cell)."""
    out = []
    for s in seeds:
        wins = 0
        for r in range(repeats):
            obs, _ = env.reset(seed=int(s))
            torch.manual_seed(1000 * int(s) + r)
            while True:
                obs, _, te, tr, info = env.step(policy.act(obs, stochastic))
                if te or tr:
                    wins += bool(info.get("success", False))
                    break
        out.append(wins / repeats)
    return np.asarray(out)


def allocate(p: np.ndarray | None, n: int, k: int, rng: np.random.Generator, floor: float = 0.02) -> np.ndarray:
    """k of n configurations without replacement: weights p(1 - p) + floor from twin success p (guided), or
    uniform when p is None."""
    if p is None:
        return rng.choice(n, k, replace=False)
    w = np.asarray(p, np.float64) * (1 - np.asarray(p, np.float64)) + floor
    return rng.choice(n, k, replace=False, p=w / w.sum())


STRATEGIES = ("guided", "uniform", "corrections")


def run(cfg: TwinRLConfig, twin, strategy: str) -> dict:
    """One strategy (`guided`, `uniform` or `corrections`) from the same twin demonstrations; returns the learning
    curve in real robot steps."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
    rng = np.random.default_rng(cfg.seed)
    twin_env = make_env(cfg.task, twin, cfg.domain_randomization)
    real_env = make_env(cfg.task, "real")
    X, A = twin_demonstrations(twin_env, cfg.twin_demos, 10_000 + cfg.seed * 1000)
    pool = np.arange(cfg.pool)
    policy = BCPolicy(len(X[0]), hidden=cfg.hidden, seed=cfg.seed)
    policy.fit(np.asarray(X), np.asarray(A), cfg.bc_steps, cfg.seed)
    curve = [{"real_steps": 0, "real_success": float(success_rate(real_env, policy, pool).mean())}]
    real_steps = 0
    for _ in range(cfg.rounds):
        p = success_rate(twin_env, policy, pool, stochastic=True, repeats=cfg.twin_rollouts) if strategy == "guided" else None
        chosen = pool[allocate(p, len(pool), cfg.per_round, rng)]
        for s in chosen:
            xs, acts, n = correct(real_env, policy, int(s)) if strategy == "corrections" else demonstrate(real_env, int(s))
            X += xs
            A += acts
            real_steps += n
        policy = BCPolicy(len(X[0]), hidden=cfg.hidden, seed=cfg.seed)
        policy.fit(np.asarray(X), np.asarray(A), cfg.bc_steps, cfg.seed)
        curve.append({"real_steps": real_steps, "real_success": float(success_rate(real_env, policy, pool).mean()),
                      "chosen": [int(c) for c in chosen]})
    twin_env.close()
    real_env.close()
    return {"strategy": strategy, "curve": curve}


def steps_to_reach(curve: list[dict], target: float) -> float:
    """Real demonstration steps at the first evaluation reaching `target` success (inf if never)."""
    for c in curve:
        if c["real_success"] >= target:
            return float(c["real_steps"])
    return float("inf")


__all__ = ["TwinRLConfig", "BCPolicy", "run", "allocate", "twin_demonstrations", "success_rate", "demonstrate", "correct",
           "steps_to_reach", "STRATEGIES"]
