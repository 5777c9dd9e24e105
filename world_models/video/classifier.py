"""A success classifier on real pixels (WoVR's reward model), separate from the world model's latent success head,
so that the two reward sources can be compared on generated frames."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from world_models.video.networks import TaskEncoder


class SuccessClassifier(nn.Module):
    def __init__(self, cameras: tuple[str, ...], task_vocab: list[str], width: int = 16, task_dim: int = 32):
        super().__init__()
        self.cameras = tuple(cameras)
        c = 3 * len(self.cameras)
        self.conv = nn.Sequential(
            nn.Conv2d(c, width, 4, stride=2, padding=1), nn.SiLU(),          # 32
            nn.Conv2d(width, 2 * width, 4, stride=2, padding=1), nn.SiLU(),  # 16
            nn.Conv2d(2 * width, 4 * width, 4, stride=2, padding=1), nn.SiLU(),  # 8
            nn.Conv2d(4 * width, 4 * width, 4, stride=2, padding=1), nn.SiLU(),  # 4
            nn.Flatten())
        self.task = TaskEncoder(task_vocab, task_dim)
        self.fc = nn.Linear(4 * width * 16, 128)
        self.task_proj = nn.Linear(task_dim, 128)
        self.out = nn.Sequential(nn.SiLU(), nn.Linear(128, 1))

    def forward(self, images: dict[str, torch.Tensor | np.ndarray], tasks: list[str]) -> torch.Tensor:
        """{camera key: uint8 (N, 64, 64, 3)} and N instructions -> success logits (N,)."""
        dev = self.fc.weight.device
        x = torch.cat([torch.as_tensor(np.asarray(images[f"observation.images.{c}"]), device=dev).permute(0, 3, 1, 2)
                       for c in self.cameras], dim=1).float() / 127.5 - 1.0
        return self.out(self.fc(self.conv(x)) + self.task_proj(self.task(tasks))).squeeze(-1)
