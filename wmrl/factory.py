"""Assembles registered parts by name (this layer may import every package)."""

from __future__ import annotations

import gymnasium as gym

from wmrl.core.registry import POLICIES


@POLICIES.register("scripted")
def _scripted(action_space: gym.spaces.Box, seed: int = 0, noise: float = 0.0, failure_prob: float = 0.0, **_):
    from sim.tabletop.experts import ScriptedExpert

    if action_space.shape != (4,):
        raise ValueError("the scripted expert drives the end-effector delta control (4-D actions)")
    return ScriptedExpert(noise=noise, failure_prob=failure_prob, seed=seed)


@POLICIES.register("random")
def _random(action_space: gym.spaces.Box, seed: int = 0, **_):
    from policies.random_policy import RandomPolicy

    return RandomPolicy(action_space, seed=seed)


def make_policy(name: str, action_space: gym.spaces.Box, **kwargs):
    return POLICIES.get(name)(action_space, **kwargs)
