"""A 2-D point environment for seeing edge-of-reach states (reconstructed from the description in Sims et al. 2024,
"The Edge-of-Reach Problem in Offline Model-Based RL"; the paper's exact specification was not published).

The point moves by its action, s' = clip(s + 0.5 a, -B, B); the reward is minus the distance to a goal outside the
region the behaviour data covers. With k-step truncated rollouts from dataset states, states k steps out are only
ever Bellman *targets*, never trained inputs, so their Q-values are never corrected: "bootstrapping from the void",
even under the true dynamics. `qpos` is the position (qvel is unused zeros), so the true-dynamics oracle applies.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class _PointData:  # the slice of MuJoCo's `data` that the oracle and the state wrapper read
    def __init__(self):
        self.qpos = np.zeros(2)
        self.qvel = np.zeros(2)  # unused (a kinematic point); non-empty so datasets keep one schema


class PointEdgeEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, bound: float = 10.0, goal: tuple[float, float] = (6.0, 6.0), max_episode_steps: int = 30,
                 step_size: float = 0.5):
        self.bound, self.goal, self.T, self.step_size = bound, np.asarray(goal, np.float64), max_episode_steps, step_size
        self.observation_space = gym.spaces.Box(-bound, bound, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.data = _PointData()
        self.t = 0

    def set_state(self, qpos: np.ndarray, qvel: np.ndarray) -> None:
        self.data.qpos = np.asarray(qpos, np.float64).copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.data.qpos = self.np_random.uniform(-1.0, 1.0, 2)
        self.t = 0
        return self.data.qpos.astype(np.float32), {}

    def step(self, action):
        a = np.clip(np.asarray(action, np.float64), -1.0, 1.0)
        self.data.qpos = np.clip(self.data.qpos + self.step_size * a, -self.bound, self.bound)
        self.t += 1
        reward = -float(np.linalg.norm(self.data.qpos - self.goal)) / self.bound
        return self.data.qpos.astype(np.float32), reward, False, self.t >= self.T, {}


def point_termination(obs: np.ndarray, act: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    return np.zeros(len(nxt), bool)
