"""Human corrections during rollouts (RaC, Hu et al. 2025; HIL-SERL, Luo et al. 2024).

An `Operator` watches the rollout and may take over. When it does, it first *recovers*: it brings the hand back to
the last state where the policy was still on track (an in-distribution state), then *corrects*: it completes the
subtask itself, and hands control back. Every frame is labelled in the episode: `intervention` (bool, LeRobot's
name), `intervention.phase` (0 policy, 1 recovery, 2 correction; names in meta/wmrl.json) and `source` (`policy`
or `human`), and the episode is written in LeRobot v3, so `wmrl train-policy` can fine-tune on it.

Operators: `ScriptedOperator` (for tests and benchmarks: takes over when the policy's action points away from the
scripted expert's for `patience` steps) and `KeyboardOperator` (a terminal teleop: w/s x, a/d y, r/f z, space
toggles the gripper, t takes over, b switches to correction, h hands back).
"""

from __future__ import annotations

import sys
from typing import Protocol

import numpy as np

from real_robot.adapters import joint_command
from sim.experts import ScriptedExpert
from wmrl.core.arm import EE_STEP, forward_kinematics, step_hand
from wmrl.core.episode import build_episode
from wmrl.core.features import OBS_ENV_STATE, OBS_STATE, SOURCE, TASK


PHASES = {0: "policy", 1: "recovery", 2: "correction"}


class Operator(Protocol):
    def reset(self) -> None: ...

    def step(self, obs: dict, policy_action: np.ndarray) -> tuple[np.ndarray | None, int]:
        """The operator's action and phase (1 recovery, 2 correction), or (None, 0) to let the policy act."""


class ScriptedOperator:
    """Watches with the scripted expert. Takes over after `patience` steps of the policy's translation pointing away
    from the expert's (cosine < `min_cosine`); recovers to the last on-track hand position (within `tolerance`),
    then corrects with the expert until the task succeeds, then hands back."""

    def __init__(self, patience: int = 3, min_cosine: float = 0.0, tolerance: float = 0.01, max_correction: int = 60):
        self.expert = ScriptedExpert()
        self.patience, self.min_cosine, self.tolerance, self.max_correction = patience, min_cosine, tolerance, max_correction
        self.reset()

    def reset(self) -> None:
        self.phase, self.bad, self.anchor, self.corrected = 0, 0, None, 0

    def step(self, obs: dict, policy_action: np.ndarray) -> tuple[np.ndarray | None, int]:
        ee = np.asarray(obs[OBS_STATE], np.float64)[5:8]
        expert = self.expert.select_action({k: v if k == "task" else np.asarray(v)[None] for k, v in obs.items()
                                            if k in (OBS_STATE, OBS_ENV_STATE, TASK)})[0]
        if self.phase == 0:
            p, e = np.asarray(policy_action[:3], np.float64), expert[:3]
            cos = float(p @ e / (np.linalg.norm(p) * np.linalg.norm(e) + 1e-9))
            if cos >= self.min_cosine or np.linalg.norm(e) < 0.05:
                self.bad, self.anchor = 0, ee.copy()  # on track: remember this state
                return None, 0
            self.bad += 1
            if self.bad < self.patience:
                return None, 0
            self.phase = 1 if self.anchor is not None else 2
        if self.phase == 1:
            if np.linalg.norm(self.anchor - ee) > self.tolerance:
                return np.concatenate([np.clip((self.anchor - ee) / EE_STEP, -1, 1), [expert[3]]]).astype(np.float32), 1
            self.phase = 2
        if bool(obs.get("success", False)) or self.corrected >= self.max_correction:
            self.reset()
            self.anchor = ee.copy()
            return None, 0
        self.corrected += 1
        return expert.astype(np.float32), 2


class KeyboardOperator:
    """Terminal teleop (POSIX): reads keys without blocking. The hand moves `speed` of a full step per key press."""

    KEYS = {"w": (0, 1), "s": (0, -1), "a": (1, 1), "d": (1, -1), "r": (2, 1), "f": (2, -1)}

    def __init__(self, speed: float = 0.5):
        import termios
        import tty

        self.speed, self.gripper, self.phase = speed, -1.0, 0
        self._fd = sys.stdin.fileno()
        self._saved = termios.tcgetattr(self._fd)
        tty.setcbreak(self._fd)

    def reset(self) -> None:
        self.phase = 0

    def _keys(self) -> str:
        import select

        out = ""
        while select.select([sys.stdin], [], [], 0)[0]:
            out += sys.stdin.read(1)
        return out

    def step(self, obs: dict, policy_action: np.ndarray) -> tuple[np.ndarray | None, int]:
        a = np.zeros(4, np.float32)
        for k in self._keys():
            if k == "t":
                self.phase = 1
            elif k == "b":
                self.phase = 2
            elif k == "h":
                self.phase = 0
            elif k == " ":
                self.gripper = -self.gripper
            elif k in self.KEYS:
                axis, sign = self.KEYS[k]
                a[axis] += sign * self.speed
        if self.phase == 0:
            return None, 0
        a[3] = self.gripper
        return np.clip(a, -1, 1), self.phase

    def close(self) -> None:
        import termios

        termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)


class JointOperator:
    """An end-effector operator (scripted or keyboard) on an arm that takes joint targets (`wmrl deploy`): the
    policy's joint command is shown to it as the end-effector delta it implies, and its deltas are integrated from
    the observed hand and sent through the arm's IK (like `real_robot.adapters`)."""

    def __init__(self, operator: Operator):
        self.operator = operator

    def reset(self) -> None:
        self.operator.reset()

    def step(self, obs: dict, policy_command: np.ndarray) -> tuple[np.ndarray | None, int]:
        ee = np.asarray(obs[OBS_STATE], np.float64)[5:8]
        implied = np.concatenate([(forward_kinematics(np.asarray(policy_command[:4])) - ee) / EE_STEP, [policy_command[4]]])
        a, phase = self.operator.step(obs, implied)
        if a is None:
            return None, 0
        return joint_command(step_hand(ee, a, EE_STEP), a[3]), phase


def rollout_with_operator(env, policy, operator: Operator, seed: int, max_steps: int | None = None) -> dict:
    """One episode of `policy` in `env` (gymnasium, end-effector control) with `operator` able to take over.
    Returns the episode dict (`wmrl.core.episode`) with the intervention labels."""
    obs, info = env.reset(seed=seed)
    policy.reset()
    operator.reset()
    observations, actions, rewards, terms, truncs, succ, phases = [obs], [], [], [], [], [], []
    for _ in range(max_steps or 10**9):
        batched = {k: (np.asarray(v)[None] if k != "task" else [v]) for k, v in obs.items()}
        a_pi = np.asarray(policy.select_action(batched))[0]
        a_op, phase = operator.step({**obs, "success": bool(succ[-1]) if succ else False}, a_pi)
        a = a_pi if a_op is None else a_op
        obs, r, te, tr, info = env.step(a)
        observations.append(obs)
        actions.append(np.asarray(a, np.float32))
        rewards.append(r)
        terms.append(te)
        truncs.append(tr)
        succ.append(bool(info.get("success", False)))
        phases.append(phase)
        if te or tr:
            break
    ep = build_episode(observations, actions, rewards, terms, truncs, succ, source="policy",
                       intervention=[p > 0 for p in phases],
                       extras={"intervention.phase": [np.int8(p) for p in phases] + [np.int8(phases[-1])]})
    ep[SOURCE] = ["human" if p > 0 else "policy" for p in phases] + ["human" if phases[-1] > 0 else "policy"]
    return ep


__all__ = ["Operator", "ScriptedOperator", "KeyboardOperator", "JointOperator", "rollout_with_operator", "PHASES"]
