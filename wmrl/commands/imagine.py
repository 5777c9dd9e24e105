"""`wmrl imagine --policy RUN --world-model RUN --out RUN --algo grpo|ppo`: RL of a VLA policy inside the video world
model (WoVR, World-VLA-Loop), zero true-simulator steps during learning. The algorithm is `wmrl.rl.imagine`."""

from wmrl.rl.imagine import ImagineConfig, imagine

__all__ = ["ImagineConfig", "imagine"]
