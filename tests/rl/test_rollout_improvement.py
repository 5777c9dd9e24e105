"""Rollout policy improvement on a hand-checkable line world (the tabletop's snapshot/restore it relies on is tested
with the simulator, tests/sim/test_tabletop.py)."""

import numpy as np
import pytest
import torch

from wmrl.rl.rollout_improvement import RolloutImprovementConfig, improved_labels, merge, regress


class LineWorld:
    """x starts at 0, each action adds a[0] (clipped to [-1, 1]); success when x >= 2.5, at most 10 steps."""

    def reset(self, seed=None):
        self.x, self.t = 0.0, 0
        return self._obs(), {}

    def _obs(self):
        return {"observation.state": np.array([self.x, self.t], np.float32)}

    def step(self, a):
        self.x += float(np.clip(a[0], -1, 1))
        self.t += 1
        ok = self.x >= 2.5
        return self._obs(), float(ok), ok, (not ok) and self.t >= 10, {"success": ok}

    def snapshot(self):
        return {"x": self.x, "t": self.t}

    def restore(self, snap):
        self.x, self.t = snap["x"], snap["t"]
        return self._obs()


class ConstantActor(torch.nn.Module):
    """mu = tanh(b) on the one action dim, whatever the state."""

    class cfg:
        action_dim = 1

    def __init__(self, b: float):
        super().__init__()
        self.b = torch.nn.Parameter(torch.tensor([b]))

    def features(self, obs):
        return torch.as_tensor(np.asarray(obs["observation.state"], np.float32)).reshape(-1, 2)

    def mu(self, f):
        return torch.tanh(self.b).expand(len(f), 1)


def test_labels_are_the_smallest_successful_change_and_regression_makes_the_policy_succeed():
    # tanh(b) = 0.2: ten steps reach x = 2.0, a failure. A probe at step t replaces one step's 0.2 by c and continues
    # with 0.2, reaching 1.8 + c: it succeeds exactly when c >= 0.7.
    policy = ConstantActor(float(np.arctanh(0.2)))
    cfg = RolloutImprovementConfig(starts=1, candidates=6, sigma=0.6, dims=(0,), stride=1, steps=200, batch=32,
                                   anchor_share=0.5)
    envs = [LineWorld() for _ in range(1 + cfg.candidates)]
    rng = np.random.default_rng(0)
    new = improved_labels(policy, envs, [0], cfg, np.random.default_rng(0))
    assert new["success"] == 0 and new["probed"] == 10
    # the same draws, by hand: per probed step, the smallest perturbation whose action reaches 0.7
    expected = []
    for _ in range(10):
        c = np.clip(0.2 + rng.normal(0, 0.6, 6), -1, 1).astype(np.float32)
        ok = c >= 0.7 - 1e-6
        if ok.any():
            expected.append(c[ok][np.argmin(np.abs(c[ok] - 0.2))])
    assert new["improved"] == len(expected) > 0
    np.testing.assert_allclose(new["y"][:, 0].numpy(), expected, atol=1e-6)
    # the probed states are the policy's own trajectory (x = 0.2 t); every other one anchors the action it takes now
    np.testing.assert_allclose(new["x"][:, 0].numpy() / 0.2, new["x"][:, 1].numpy(), atol=1e-4)
    assert len(new["x_anchor"]) == 10 - len(expected)
    assert set(new["x_anchor"][:, 1].tolist()).isdisjoint(new["x"][:, 1].tolist())
    np.testing.assert_allclose(new["y_anchor"].numpy(), 0.2, atol=1e-6)
    memory = merge(None, new)
    for _ in range(3):  # regress, probe again with the improved policy, aggregate
        regress(policy, torch.optim.Adam(policy.parameters(), 0.05), memory, cfg, torch.Generator().manual_seed(0))
        new = improved_labels(policy, envs, [0], cfg, rng)
        memory = merge(memory, new)
    assert torch.tanh(policy.b).item() >= 0.25 and new["success"] == 1.0  # ten steps now reach 2.5
    assert len(memory["x"]) >= len(expected)  # labels aggregate over rounds; anchors are the last round's
    assert len(memory["x_anchor"]) == len(new["x_anchor"]) > 0
    with pytest.raises(ValueError, match="need 7 envs"):
        improved_labels(policy, envs[:3], [0], cfg, rng)
    with pytest.raises(ValueError, match="anchor_share"):
        RolloutImprovementConfig(anchor_share=1.0).validate()


def test_with_noisy_continuations_a_candidate_must_beat_the_own_action_by_the_margin():
    """Each candidate and the policy's own action are continued M times with noise; a label needs the candidate's
    successes to exceed the own action's by `margin`: the better actions here push further (x reaches 2.5 sooner)."""
    cfg = RolloutImprovementConfig(starts=3, candidates=3, sigma=0.6, dims=(0,), stride=1, continuations=4,
                                   continuation_noise=0.3, margin=2)
    assert cfg.probe_envs == (3 + 1) * 4
    envs = [LineWorld() for _ in range(1 + cfg.probe_envs)]
    policy = ConstantActor(float(np.arctanh(0.2)))
    new = improved_labels(policy, envs, [0, 1, 2], cfg, np.random.default_rng(0))
    assert new["probed"] == 30 and 0 < new["improved"] < 30
    assert new["y"][:, 0].mean() > 0.6  # the own action is 0.2; what beats it by 2 of 4 pushes further
    assert len(new["x_anchor"]) == 30 - new["improved"]
    strict = RolloutImprovementConfig(**{**cfg.__dict__, "margin": 5})  # more than 4 continuations can show
    assert improved_labels(policy, envs, [0, 1, 2], strict, np.random.default_rng(0))["improved"] == 0
    with pytest.raises(ValueError, match="need 17 envs"):
        improved_labels(policy, envs[:5], [0], cfg, np.random.default_rng(0))
    with pytest.raises(ValueError, match="continuation_noise"):
        RolloutImprovementConfig(continuations=4).validate()
