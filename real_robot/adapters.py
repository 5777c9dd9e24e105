"""Policies that act in end-effector deltas (the scripted expert, the VLA) driving an arm that takes absolute joint
targets. Absolute targets are what chunk execution needs: an action keyed by its control step means the same
thing whenever it is executed, so chunks can be time-aligned and blended (a delta cannot).

The chunk's end-effector waypoints are integrated from the *observed* hand position (each delta times `ee_step`,
clipped to the workspace) and turned into joint targets by the arm's closed-form IK. A single-step policy
(`chunk_size == 1`) is rolled forward kinematically for `horizon` steps: its own deltas move the hand in a copy of
the observation, objects held still, so its chunk is an open-loop plan like a VLA's.
"""

from __future__ import annotations

import numpy as np

from wmrl.core.arm import EE_STEP, inverse_kinematics, step_hand
from wmrl.core.features import OBS_STATE


def joint_command(ee_target: np.ndarray, gripper: float) -> np.ndarray:
    """[4 arm joint targets from the closed-form IK, gripper in [-1, 1]]."""
    return np.concatenate([inverse_kinematics(ee_target), [float(np.clip(gripper, -1, 1))]])


class EEDeltaChunkToJoint:
    def __init__(self, policy, horizon: int = 8, ee_step: float | None = None):
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.policy, self.horizon, self.ee_step = policy, horizon, ee_step or EE_STEP

    def _batched(self, obs: dict) -> dict:
        out = {}
        for k, v in obs.items():
            if k.startswith("observation."):
                out[k] = np.asarray(v)[None]
            elif k == "task":
                out[k] = [v]
        return out

    def __call__(self, obs: dict) -> np.ndarray:
        """(H, 5) joint targets [yaw, shoulder, elbow, wrist, gripper] for one observation of the robot."""
        b = self._batched(obs)
        if getattr(self.policy, "chunk_size", 1) > 1:
            deltas = np.asarray(self.policy.predict_action_chunk(b))[0][: self.horizon]
            ee = np.asarray(obs[OBS_STATE], np.float64)[5:8].copy()
            waypoints = []
            for a in deltas:
                ee = step_hand(ee, a, self.ee_step)
                waypoints.append((ee.copy(), a[3]))
        else:
            state = np.array(b[OBS_STATE], np.float64)
            waypoints = []
            for _ in range(self.horizon):
                a = np.asarray(self.policy.select_action({**b, OBS_STATE: state.astype(np.float32)}))[0]
                ee = step_hand(state[0, 5:8], a, self.ee_step)
                state[0, 5:8] = ee
                waypoints.append((ee, a[3]))
        return np.stack([joint_command(ee, g) for ee, g in waypoints])


__all__ = ["EEDeltaChunkToJoint", "step_hand", "joint_command"]
