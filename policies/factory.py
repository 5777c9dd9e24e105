"""Policies by registered name (`--policy.type scripted | random | vla | estimated-state | act | diffusion`), LeRobot's `make_policy`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import gymnasium as gym
import torch

from policies.estimated_state import EstimatedStatePolicy
from policies.lerobot.act import ACTPolicy
from policies.lerobot.diffusion import DiffusionPolicy
from policies.random_policy import RandomPolicy
from policies.vla import VLAPolicy
from sim.experts import ScriptedExpert
from wmrl.core.checkpoint import resolve_checkpoint
from wmrl.core.registry import POLICIES


@POLICIES.register("scripted")
def _scripted(action_space: gym.spaces.Box, seed: int = 0, noise: float = 0.0, failure_prob: float = 0.0,
              perturb_prob: float = 0.0, **_):
    if action_space.shape not in ((4,), (7,)):
        raise ValueError("the scripted expert drives end-effector delta control: 4-D actions (tabletop, Meta-World, "
                         f"SO-101) or LIBERO's 7-D OSC_POSE; got {action_space.shape}")
    return ScriptedExpert(noise=noise, failure_prob=failure_prob, seed=seed, perturb_prob=perturb_prob)


@POLICIES.register("random")
def _random(action_space: gym.spaces.Box, seed: int = 0, **_):
    return RandomPolicy(action_space, seed=seed)


@POLICIES.register("vla")
def _vla(action_space: gym.spaces.Box, path: str | None = None, device: str = "cpu", stochastic: bool = False,
         seed: int = 0, observation_space: gym.spaces.Dict | None = None, noise: float = 0.0, **_):
    """A trained VLA policy from a `wmrl train-policy` run folder or checkpoint folder; `noise`: Gaussian action
    noise on the translational dims (a degraded copy of a strong policy)."""
    if not noise >= 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    if path is None:
        raise ValueError("policy vla needs a checkpoint: --policy.path RUN_DIR")
    policy = VLAPolicy.load(resolve_checkpoint(path), device=device).eval()
    policy.check_spaces(observation_space, action_space)
    policy.stochastic, policy.action_noise = stochastic, float(noise)
    policy.generator = torch.Generator(device=device).manual_seed(seed)  # a sampling policy acts reproducibly per seed
    return policy


@POLICIES.register("estimated-state")
def _estimated_state(action_space: gym.spaces.Box, path: str | None = None, device: str = "cpu",
                     observation_space: gym.spaces.Dict | None = None, stochastic: bool = False, noise: float = 0.0,
                     seed: int = 0, **_):
    """A two-stage pixel policy (object positions estimated from the cameras, then an MLP actor) from a
    `wmrl train-policy --type estimated-state` run folder or checkpoint folder; `stochastic` and `noise` as for vla."""
    if not noise >= 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    if path is None:
        raise ValueError("policy estimated-state needs a checkpoint: --policy.path RUN_DIR")
    policy = EstimatedStatePolicy.load(resolve_checkpoint(path), device=device)
    policy.check_spaces(observation_space, action_space)
    policy.stochastic, policy.action_noise = stochastic, float(noise)
    policy.generator = torch.Generator(device=device).manual_seed(seed)
    return policy


def _lerobot(cls, kind: str):
    def build(action_space: gym.spaces.Box, path: str | None = None, device: str = "cpu", seed: int = 0,
              observation_space: gym.spaces.Dict | None = None, **_):
        if path is None:
            raise ValueError(f"policy {kind} needs a LeRobot checkpoint: --policy.path DIR (the folder with config.json "
                             "and model.safetensors)")
        policy = cls.load(path, device=device, seed=seed)
        policy.check_spaces(observation_space, action_space)
        return policy

    build.__doc__ = f"A LeRobot {kind} checkpoint (lerobot's file layout, read without lerobot)."
    return build


POLICIES.register("act")(_lerobot(ACTPolicy, "act"))
POLICIES.register("diffusion")(_lerobot(DiffusionPolicy, "diffusion"))


def make_policy(name: str, action_space: gym.spaces.Box, **kwargs):
    return POLICIES.get(name)(action_space, **kwargs)


@dataclass
class PolicyConfig:
    type: str = "scripted"
    """Registered policy name (`--policy.type scripted`; `--policy scripted` is short for it)."""
    noise: float = 0.0
    """Scripted expert, VLA and estimated-state: Gaussian action noise (std) on the translational dims."""
    failure_prob: float = 0.0
    """Scripted expert only: share of episodes in near-success failure mode."""
    path: Optional[Path] = None
    """Learned policies: a `wmrl train-policy` run or checkpoint folder (vla), a LeRobot checkpoint folder (act, diffusion)."""
    stochastic: bool = False
    """Learned policies: sample actions instead of acting with the mean."""

    def build(self, env, seed: int = 0):
        """The policy for `env` (a vector env); learned policies are checked against its spaces."""
        return make_policy(self.type, env.single_action_space, seed=seed, noise=self.noise, failure_prob=self.failure_prob,
                           path=self.path, stochastic=self.stochastic, observation_space=env.single_observation_space)
