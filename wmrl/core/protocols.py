"""The small interfaces every part of wmrl is written against (DreamerV3 style: the signatures are the contract).

Observations are dicts keyed by LeRobot feature names (see `wmrl.core.features`), batched along the first axis.
Environments are plain gymnasium envs / `gymnasium.vector.VectorEnv`s, so no Env protocol is restated here.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

Obs = dict[str, Any]  # feature name -> batched array (B, ...) or, for `task`, a sequence of B strings


@runtime_checkable
class Policy(Protocol):
    """A policy (a `torch.nn.Module` for learned ones).

    - `reset()`: forget per-episode state (action queues, failure modes); called at every batch of episodes.
    - `predict_action_chunk(obs) -> (B, H, A)`: a whole chunk of H future actions.
    - `select_action(obs) -> (B, A)`: the next action, popped from a queue refilled by `predict_action_chunk`.
    - `forward(batch) -> (loss, info)`: the training loss on a batch from the replay or a dataset.
    RL-capable policies add `sample(obs) -> (actions, log_prob)` and `log_prob(obs, actions)`.
    """

    def reset(self) -> None: ...

    def predict_action_chunk(self, obs: Obs) -> Any: ...

    def select_action(self, obs: Obs) -> Any: ...

    def forward(self, batch: dict) -> tuple[Any, dict]: ...


@runtime_checkable
class WorldModel(Protocol):
    """An action-conditioned simulator learned from data.

    - `encode(obs) -> state`: a latent state from observations (frames, proprioception, task).
    - `step(state, action_chunk (B, H, A)) -> (state, preds)`: advance by a whole chunk; `preds` holds per-step
      `reward`, `success` (probability), `done` and `observation.state` predictions, each (B, H, ...).
    - `decode(latents, state, poses) -> {camera key: uint8 (B, H, H_img, W_img, 3)}`: frames of `preds["latents"]`,
      only when asked (the costly part), anchored on the rollout's `state` and placed at `preds["pose"]` (the frames'
      commanded poses, which a decode that warps the start frame to them needs).
    """

    def encode(self, obs: Obs) -> Any: ...

    def step(self, state: Any, action_chunk: Any) -> tuple[Any, dict]: ...

    def decode(self, latents: Any, state: Any = None, poses: Any = None) -> dict[str, np.ndarray]: ...


@runtime_checkable
class Robot(Protocol):
    """A robot arm (real, or MuJoCo-backed standing in for one). LeRobot's robot interface.

    `send_action(a)` returns the action that actually went out (after clipping and safety checks).
    """

    def connect(self) -> None: ...

    def get_observation(self) -> Obs: ...

    def send_action(self, action: np.ndarray) -> np.ndarray: ...

    def disconnect(self) -> None: ...


@runtime_checkable
class ReplayBuffer(Protocol):
    """Episodes of frames, stored once, sampled as transitions or as windows (see `wmrl.replay`)."""

    def add_episode(self, episode: dict[str, np.ndarray]) -> int: ...

    def sample(self, batch_size: int) -> dict[str, np.ndarray]: ...

    def sample_windows(self, batch_size: int, length: int) -> dict[str, np.ndarray]: ...

    def __len__(self) -> int: ...
