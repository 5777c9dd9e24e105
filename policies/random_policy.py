"""Uniform random policy: the floor every learned policy must beat."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces


class RandomPolicy(torch.nn.Module):
    chunk_size = 1

    def __init__(self, action_space: spaces.Box, seed: int = 0):
        super().__init__()
        self.low, self.high = action_space.low, action_space.high
        self.rng = np.random.default_rng(seed)

    def reset(self) -> None:
        pass

    def select_action(self, obs: dict) -> np.ndarray:
        batch = len(next(v for k, v in obs.items() if k != "task"))
        return self.rng.uniform(self.low, self.high, size=(batch, *self.low.shape)).astype(np.float32)

    def predict_action_chunk(self, obs: dict) -> np.ndarray:
        return self.select_action(obs)[:, None]

    def forward(self, batch: dict):
        raise NotImplementedError("a random policy has nothing to train")
