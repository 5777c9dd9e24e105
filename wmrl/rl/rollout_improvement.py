"""Rollout policy improvement: Bertsekas' rollout algorithm as approximate policy iteration (Lagoudakis & Parr,
2003; Bertsekas, "Rollout algorithms", 1997), for a deterministic actor and a model that can be restored.

Policy-gradient fine-tuning of a behaviour-cloned actor needs many rollouts to find which of its per-step noise
mattered, and where the mean policy stalls between two ways round an object the gradient of success with respect to
the mean is about zero by symmetry. Rollout improvement asks the model directly instead: at states the current
policy visits on its failed episodes, try a few perturbed actions, continue each with the current policy to the end
of the episode, and where one succeeds and the policy's own action does not, that action is better there (exactly so
when the model and the continuation are deterministic: one rollout decides). The actor then regresses onto these
improved actions (aggregated over rounds, as DAgger aggregates labels) and, at every other state its episodes of
the round visited, onto its own current action (a trust region: a first version that anchored only on successful
episodes lost 18 points, the few labels pulling the whole network).

The model is anything with `reset(seed)`, `step(action)`, `snapshot()` and `restore(snapshot)` (gymnasium's API
plus the two): the true simulator as a perfect model (`sim.tabletop.TabletopEnv`), the reward is the task's success.
The learner is an actor with `features(obs)` and a mean `mu(features)` (`policies.estimated_state`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class RolloutImprovementConfig:
    starts: int = 24
    """Episodes (layouts) of the current policy per round."""
    candidates: int = 4
    """Perturbed actions tried at each probed state."""
    sigma: float = 0.5
    """Standard deviation of the perturbation (action units; the translational dims)."""
    dims: tuple[int, ...] = (0, 1, 2)
    """Action dims the candidates perturb (the gripper, held in a push, is left as the policy sets it)."""
    stride: int = 8
    """Probe every stride-th step of a failed episode."""
    steps: int = 300
    """Adam steps on the aggregated labels per round."""
    batch: int = 256
    anchor_share: float = 0.5
    """Share of each batch drawn from the anchors: the policy's own actions at the round's other visited states."""
    continuations: int = 1
    """Rollouts per candidate (and, when > 1, for the policy's own action too), each continued with
    `continuation_noise` on the policy's mean: a candidate is better when its successes exceed the own action's by
    `margin`. 1: one deterministic continuation, compared with the failed episode itself."""
    continuation_noise: float = 0.0
    """Gaussian noise (action units, the `dims`) on the continuations' actions."""
    margin: int = 1

    def validate(self) -> None:
        if min(self.starts, self.candidates, self.stride, self.steps, self.batch, self.continuations, self.margin) <= 0 \
                or self.sigma <= 0:
            raise ValueError(f"rollout improvement: starts, candidates, stride, steps, batch, continuations, margin and "
                             f"sigma must be positive: {self}")
        if not 0 <= self.anchor_share < 1:
            raise ValueError(f"anchor_share must lie in [0, 1), got {self.anchor_share}")
        if (self.continuations > 1) != (self.continuation_noise > 0):
            raise ValueError("continuations > 1 needs continuation_noise > 0 (and noise needs several continuations): "
                             f"got {self.continuations} and {self.continuation_noise}")

    @property
    def probe_envs(self) -> int:
        """Envs the probes step at once: every candidate's continuations (and the own action's, with noise)."""
        return (self.candidates + (self.continuations > 1)) * self.continuations


def _continue(policy, envs, obs: list[dict], done: np.ndarray, noise: float = 0.0, dims=(),
              rng: np.random.Generator | None = None) -> np.ndarray:
    """Step every env not `done` with the policy's mean (plus `noise` on `dims`) until its episode ends; True where it
    succeeded."""
    ok = np.zeros(len(envs), bool)
    while not done.all():
        idx = np.flatnonzero(~done)
        with torch.no_grad():
            acts = policy.mu(policy.features(_stack([obs[i] for i in idx]))).cpu().numpy()
        if noise > 0:
            acts[:, list(dims)] += rng.normal(0.0, noise, (len(idx), len(dims)))
        for a, i in zip(acts, idx):
            obs[i], _, term, trunc, info = envs[i].step(a)
            ok[i] |= bool(info["success"])
            done[i] = term or trunc
    return ok


def _stack(obs: list[dict]) -> dict:
    return {k: (np.stack([o[k] for o in obs]) if not isinstance(obs[0][k], str) else [o[k] for o in obs]) for k in obs[0]}


def improved_labels(policy, envs: list, seeds: list[int], cfg: RolloutImprovementConfig,
                    rng: np.random.Generator) -> dict:
    """One round of probing. `envs`: 1 + cfg.probe_envs restorable envs of the task. Returns the improved
    (features, action) pairs, the anchors (the policy's own action at every other visited state) and counts."""
    cfg.validate()
    main, probes = envs[0], envs[1 : 1 + cfg.probe_envs]
    if len(probes) < cfg.probe_envs:
        raise ValueError(f"need {1 + cfg.probe_envs} envs, got {len(envs)}")
    M, own = cfg.continuations, cfg.continuations > 1  # with noisy continuations the own action is scored alike
    X, Y, XA, YA = [], [], [], []
    n_ok = n_probed = 0
    for seed in seeds:
        obs, _ = main.reset(seed=int(seed))
        traj, ok, done = [], False, False
        while not done:
            with torch.no_grad():
                f = policy.features(obs)
                a = policy.mu(f)[0].cpu().numpy()
            probe = not len(traj) % cfg.stride  # only these states are restored later
            traj.append((main.snapshot() if probe else None, f[0], a))
            obs, _, term, trunc, info = main.step(a)
            ok |= bool(info["success"])
            done = term or trunc
        n_ok += ok
        improved_at = set()
        for t in range(0, 0 if ok else len(traj), cfg.stride):
            snap, f, a = traj[t]
            n_probed += 1
            eps = np.zeros((cfg.candidates, len(a)), np.float32)
            eps[:, list(cfg.dims)] = rng.normal(0.0, cfg.sigma, (cfg.candidates, len(cfg.dims)))
            cand = np.clip(a + eps, -1.0, 1.0)
            tried = np.repeat(np.concatenate([cand, a[None]]) if own else cand, M, axis=0)
            pobs, done_k, ok_k = [], np.zeros(len(tried), bool), np.zeros(len(tried), bool)
            for k, (env, c) in enumerate(zip(probes, tried)):
                env.restore(snap)
                o, _, term, trunc, info = env.step(c)
                pobs.append(o)
                ok_k[k], done_k[k] = bool(info["success"]), term or trunc
            ok_k |= _continue(policy, probes, pobs, done_k.copy(), cfg.continuation_noise, cfg.dims, rng)
            wins = ok_k.reshape(-1, M).sum(1)  # per candidate (then the own action, with noise)
            better = wins[: cfg.candidates] - (wins[-1] if own else 0) >= cfg.margin
            if better.any():  # the best; among equals, the smallest change
                best = np.flatnonzero(better & (wins[: cfg.candidates] == wins[: cfg.candidates][better].max()))
                k = best[np.argmin(np.abs(eps[best]).sum(1))]
                X.append(f)
                Y.append(cand[k])
                improved_at.add(t)
        XA += [f for t, (_, f, _) in enumerate(traj) if t not in improved_at]  # elsewhere: act as now
        YA += [a for t, (_, _, a) in enumerate(traj) if t not in improved_at]
    stack = lambda xs: torch.stack(xs) if xs else torch.zeros((0, 0))
    A = policy.cfg.action_dim
    return {"x": stack(X), "y": torch.as_tensor(np.array(Y, np.float32)).reshape(-1, A),
            "x_anchor": stack(XA), "y_anchor": torch.as_tensor(np.array(YA, np.float32)).reshape(-1, A),
            "success": n_ok / max(1, len(seeds)), "probed": n_probed, "improved": len(X)}


def regress(policy, opt, memory: dict, cfg: RolloutImprovementConfig, gen: torch.Generator) -> float:
    """`cfg.steps` Adam steps of the actor's mean onto the improved actions, mixed with the anchors. Returns the
    last loss (0 when there is nothing to learn yet)."""
    x, y, xa, ya = memory["x"], memory["y"], memory["x_anchor"], memory["y_anchor"]
    if len(x) == 0:
        return 0.0
    n_anchor = int(round(cfg.batch * cfg.anchor_share)) if len(xa) else 0
    loss = torch.zeros(())
    for _ in range(cfg.steps):
        i = torch.randint(0, len(x), (cfg.batch - n_anchor,), generator=gen)
        bx, by = x[i], y[i]
        if n_anchor:
            j = torch.randint(0, len(xa), (n_anchor,), generator=gen)
            bx, by = torch.cat([bx, xa[j]]), torch.cat([by, ya[j]])
        loss = ((policy.mu(bx) - by.clamp(-0.999, 0.999)) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss.detach())


def merge(memory: dict | None, new: dict) -> dict:
    """The improved labels aggregated over rounds (DAgger's data aggregation); the anchors are this round's only, a
    trust region around the current policy."""
    cat = lambda a, b: b if len(a) == 0 else a if len(b) == 0 else torch.cat([a, b])
    return {"x": new["x"] if memory is None else cat(memory["x"], new["x"]),
            "y": new["y"] if memory is None else cat(memory["y"], new["y"]),
            "x_anchor": new["x_anchor"], "y_anchor": new["y_anchor"]}
