"""The scripted expert of every suite, as one batched policy (`wmrl.core.protocols.Policy`), and DART/DAgger labels.

Each suite supplies a reactive `expert_action(instruction, state, environment_state, failure) -> action`: the
tabletop's hand-written controllers (`sim.tabletop.experts`), Meta-World's own scripted policies
(`sim.metaworld.experts`) and a pick-and-place controller for LIBERO (`sim.libero.experts`), when installed. `expert_action` here dispatches on the instruction, so one expert drives
a batch that mixes tasks and suites, and noise, failure modes and perturbation segments work the same in all.
"""

from __future__ import annotations

import numpy as np
import torch

import sim.libero
import sim.metaworld
from sim.tabletop import experts as tabletop
from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE, TASK


def expert_action(task: str, state: np.ndarray, env_state: np.ndarray, failure: bool) -> np.ndarray:
    """The clean scripted action for one observation of any suite's task (the instruction says which)."""
    if sim.metaworld.available():
        from sim.metaworld import experts as metaworld

        if metaworld.task_of(task) is not None:
            return metaworld.expert_action(task, state, env_state, failure)
    if sim.libero.available():
        from sim.libero import experts as libero

        if libero.task_of(task) is not None:
            return libero.expert_action(task, state, env_state, failure)
    return tabletop.expert_action(task, state, env_state, failure)


def expert_labels(episode: dict) -> dict:
    """The episode with every `action` replaced by the clean expert's action at that frame's state (success mode, no
    noise, no perturbation): DART's labels (Laskey et al., 2017: noise perturbs the states the data visits, not what
    the learner is taught) and DAgger's relabelling of a learner's own states (Ross et al., 2011). Needs the
    privileged `observation.environment_state` the simulator records."""
    missing = [k for k in (OBS_STATE, OBS_ENV_STATE, TASK, ACTION) if k not in episode]
    if missing:
        raise ValueError(f"expert labels need {missing} in every episode (record with the simulator's environment "
                         "state, or train on the recorded actions)")
    tasks = episode[TASK]
    tasks = [tasks] * len(episode[OBS_STATE]) if isinstance(tasks, str) else list(tasks)
    acts = np.stack([expert_action(t, s, e, False) for t, s, e in zip(tasks, np.asarray(episode[OBS_STATE]),
                                                                        np.asarray(episode[OBS_ENV_STATE]))])
    return {**episode, ACTION: np.clip(acts, -1.0, 1.0).astype(np.asarray(episode[ACTION]).dtype)}


class ScriptedExpert(torch.nn.Module):
    """Policy (see `wmrl.core.protocols.Policy`) wrapping `expert_action` for batched observations.

    noise: std of Gaussian noise on the translational action dims. failure_prob: chance that an episode runs in
    near-success failure mode, redrawn per batch entry at every `reset()`. perturb_prob: chance that an episode is
    perturbed the way a learning policy behaves (world-model training data that covers what RL and ranking visit):
    translational noise `PERTURB_NOISE` and, at each step with probability `PERTURB_SEGMENT_PROB`, a segment of
    3-8 uniformly random actions (gripper included); the reactive expert then recovers from wherever it is.
    """

    chunk_size = 1
    PERTURB_NOISE = 0.3
    PERTURB_SEGMENT_PROB = 0.1

    def __init__(self, noise: float = 0.0, failure_prob: float = 0.0, seed: int = 0, perturb_prob: float = 0.0):
        super().__init__()
        if noise < 0 or not 0.0 <= failure_prob <= 1.0 or not 0.0 <= perturb_prob <= 1.0:
            raise ValueError(f"noise must be >= 0, failure_prob and perturb_prob in [0, 1]; got {noise}, "
                             f"{failure_prob}, {perturb_prob}")
        self.noise, self.failure_prob, self.perturb_prob = noise, failure_prob, perturb_prob
        self.rng = np.random.default_rng(seed)
        self.failure: np.ndarray | None = None
        self.perturbed: np.ndarray | None = None
        self.segment: np.ndarray | None = None  # steps left in each entry's random segment, and its action
        self.segment_action: np.ndarray | None = None

    def reset(self) -> None:
        self.failure = self.perturbed = None

    def _failures(self, batch: int) -> np.ndarray:
        if self.failure is None or len(self.failure) != batch:
            self.failure = self.rng.random(batch) < self.failure_prob
            self.perturbed = self.rng.random(batch) < self.perturb_prob
            self.segment = np.zeros(batch, np.int64)
            self.segment_action = None  # sized by the first actions (4-D tabletop, 7-D LIBERO)
        return self.failure

    def _perturb(self, actions: np.ndarray) -> np.ndarray:
        p = self.perturbed
        if not p.any():
            return actions
        if self.segment_action is None or self.segment_action.shape != actions.shape:
            self.segment_action = np.zeros(actions.shape, np.float32)
        actions[p, :3] += self.rng.normal(0.0, self.PERTURB_NOISE, size=(int(p.sum()), 3))
        start = p & (self.segment == 0) & (self.rng.random(len(p)) < self.PERTURB_SEGMENT_PROB)
        self.segment[start] = self.rng.integers(3, 9, int(start.sum()))
        self.segment_action[start] = self.rng.uniform(-1, 1, (int(start.sum()), actions.shape[1]))
        on = self.segment > 0
        actions[on] = self.segment_action[on]
        self.segment[on] -= 1
        return actions

    @torch.no_grad()
    def select_action(self, obs: dict) -> np.ndarray:
        state, env_state, tasks = obs[OBS_STATE], obs[OBS_ENV_STATE], obs[TASK]
        if isinstance(tasks, str):
            tasks = [tasks]
        state = np.asarray(state).reshape(len(tasks), -1)
        env_state = np.asarray(env_state).reshape(len(tasks), -1)
        failure = self._failures(len(tasks))
        actions = np.stack([expert_action(t, s, e, f) for t, s, e, f in zip(tasks, state, env_state, failure)])
        if self.noise > 0:
            actions[:, :3] += self.rng.normal(0.0, self.noise, size=(len(tasks), 3))
        actions = self._perturb(actions)
        return np.clip(actions, -1.0, 1.0).astype(np.float32)

    def predict_action_chunk(self, obs: dict) -> np.ndarray:
        return self.select_action(obs)[:, None]

    def forward(self, batch: dict):
        raise NotImplementedError("a scripted expert has nothing to train")

