"""Assembles registered parts by name (this layer may import every package)."""

from __future__ import annotations

import gymnasium as gym

from wmrl.core.registry import POLICIES, WORLD_MODELS


@POLICIES.register("scripted")
def _scripted(action_space: gym.spaces.Box, seed: int = 0, noise: float = 0.0, failure_prob: float = 0.0,
              perturb_prob: float = 0.0, **_):
    from sim.tabletop.experts import ScriptedExpert

    if action_space.shape != (4,):
        raise ValueError("the scripted expert drives the end-effector delta control (4-D actions)")
    return ScriptedExpert(noise=noise, failure_prob=failure_prob, seed=seed, perturb_prob=perturb_prob)


@POLICIES.register("random")
def _random(action_space: gym.spaces.Box, seed: int = 0, **_):
    from policies.random_policy import RandomPolicy

    return RandomPolicy(action_space, seed=seed)


@POLICIES.register("vla")
def _vla(action_space: gym.spaces.Box, path: str | None = None, device: str = "cpu", stochastic: bool = False,
         observation_space: gym.spaces.Dict | None = None, **_):
    """A trained VLA policy from a `wmrl train-policy` run folder or checkpoint folder."""
    from policies.vla import VLAPolicy
    from wmrl.core.checkpoint import resolve_checkpoint

    if path is None:
        raise ValueError("policy vla needs a checkpoint: --policy.path RUN_DIR")
    policy = VLAPolicy.load(resolve_checkpoint(path), device=device).eval()
    policy.check_spaces(observation_space, action_space)
    policy.stochastic = stochastic
    return policy


def make_policy(name: str, action_space: gym.spaces.Box, **kwargs):
    return POLICIES.get(name)(action_space, **kwargs)


@WORLD_MODELS.register("video")
def _video_world_model(path: str, device: str = "cpu", **_):
    """A trained video world model from a `wmrl train-wm` run folder or checkpoint folder."""
    from world_models.video.model import VideoWorldModel
    from wmrl.core.checkpoint import resolve_checkpoint

    return VideoWorldModel.load(resolve_checkpoint(path), device=device)


def make_world_model(kind: str, path: str, **kwargs):
    return WORLD_MODELS.get(kind)(path, **kwargs)
