"""Gymnasium's MuJoCo locomotion tasks in wmrl's conventions, for offline and offline-to-online RL.

`make_state_env("HalfCheetah-v5")` returns an env whose observations are dicts (`observation.state`, LeRobot's name)
and whose `info` carries the simulator's exact `qpos`/`qvel` at every step, so datasets can store them and the
true-dynamics oracle (`world_models.dynamics.TrueDynamics`) can restore any state exactly. Gymnasium clips some
velocities in Hopper/Walker observations, so restoring from the observation alone would be wrong there.

`TERMINATION[env_id](obs, action, next_obs) -> bool array` are the hand-written termination rules that model
rollouts need (MBPO/MOPO/RAVL), written from gymnasium's `is_healthy` definitions.
"""

from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np

from wmrl.core.features import OBS_STATE

LOCOMOTION_ENVS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "InvertedPendulum-v5")


class StateDictEnv(gym.Wrapper):
    """Array observations -> {`observation.state`: float32}; `info["qpos"]`, `info["qvel"]` after reset and every step."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        box = env.observation_space
        self.observation_space = gym.spaces.Dict({OBS_STATE: gym.spaces.Box(box.low, box.high, box.shape, np.float32)})

    def _wrap(self, obs: np.ndarray, info: dict) -> tuple[dict, dict]:
        data = self.env.unwrapped.data
        info = {**info, "qpos": data.qpos.astype(np.float64), "qvel": data.qvel.astype(np.float64)}
        return {OBS_STATE: np.asarray(obs, np.float32)}, info

    def reset(self, *, seed=None, options=None):
        return self._wrap(*self.env.reset(seed=seed, options=options))

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        o, info = self._wrap(obs, info)
        return o, float(reward), bool(terminated), bool(truncated), info


def make_state_env(env_id: str, **kwargs) -> StateDictEnv:
    if env_id not in LOCOMOTION_ENVS and env_id != "PointEdge-v0":
        raise ValueError(f"unknown state env {env_id!r}; valid: {', '.join(LOCOMOTION_ENVS + ('PointEdge-v0',))}")
    if env_id == "PointEdge-v0":
        from sim.point import PointEdgeEnv

        return StateDictEnv(PointEdgeEnv(**kwargs))
    return StateDictEnv(gym.make(env_id, **kwargs))


def state_from_obs(env_id: str, obs: np.ndarray) -> dict[str, np.ndarray]:
    """(qpos, qvel) that reproduce observations (B, O) of generated data (PGD has no simulator state to store).

    Gymnasium's locomotion observations drop the root's x position, which no dynamics depend on (it is set to 0),
    and Hopper/Walker clip velocities to [-10, 10], so restoring a clipped velocity is approximate there."""
    obs = np.asarray(obs, np.float64)
    if env_id == "PointEdge-v0":
        return {"qpos": obs.copy(), "qvel": np.zeros((len(obs), 2))}
    if env_id not in LOCOMOTION_ENVS[:3]:
        raise ValueError(f"state_from_obs: no rule for {env_id!r}; known: {', '.join(LOCOMOTION_ENVS[:3])}, PointEdge-v0")
    nq = {"HalfCheetah-v5": 9, "Hopper-v5": 6, "Walker2d-v5": 9}[env_id]
    if obs.shape[-1] != 2 * nq - 1:
        raise ValueError(f"{env_id} observations have {2 * nq - 1} dims, got {obs.shape[-1]}")
    return {"qpos": np.concatenate([np.zeros((len(obs), 1)), obs[:, : nq - 1]], axis=1), "qvel": obs[:, nq - 1 :].copy()}


# ---------------------------------------------------------------------- termination rules (batched, numpy)
def _never(obs: np.ndarray, act: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    return np.zeros(len(nxt), bool)


def _hopper(obs: np.ndarray, act: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    z, angle, rest = nxt[:, 0], nxt[:, 1], nxt[:, 1:]
    healthy = (np.abs(rest) < 100).all(-1) & (z > 0.7) & (np.abs(angle) < 0.2) & np.isfinite(nxt).all(-1)
    return ~healthy


def _walker(obs: np.ndarray, act: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    z, angle = nxt[:, 0], nxt[:, 1]
    healthy = (z > 0.8) & (z < 2.0) & (angle > -1.0) & (angle < 1.0) & np.isfinite(nxt).all(-1)
    return ~healthy


def _pendulum(obs: np.ndarray, act: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    return ~(np.isfinite(nxt).all(-1) & (np.abs(nxt[:, 1]) <= 0.2))


TERMINATION: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "HalfCheetah-v5": _never, "Hopper-v5": _hopper, "Walker2d-v5": _walker, "InvertedPendulum-v5": _pendulum,
}


def termination_fn(env_id: str) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    if env_id == "PointEdge-v0":
        from sim.point import point_termination

        return point_termination
    if env_id not in TERMINATION:
        raise ValueError(f"no termination rule for {env_id!r}; known: {', '.join(TERMINATION)}")
    return TERMINATION[env_id]
