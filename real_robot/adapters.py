"""Policies that act in end-effector deltas (the scripted expert, the VLA) driving an arm that takes absolute joint
targets. Absolute targets are what chunk execution needs: an action keyed by its control step means the same
thing whenever it is executed, so chunks can be time-aligned and blended (a delta cannot).

The chunk's end-effector waypoints are integrated from the *observed* hand position (each delta times the arm's
`ee_step`, clipped to its workspace) and turned into joint targets by the arm's inverse kinematics. A single-step
policy (`chunk_size == 1`) is rolled forward kinematically for `horizon` steps: its own deltas move the hand in a
copy of the observation, objects held still, so its chunk is an open-loop plan like a VLA's.

`Arm` says what differs between arms: the tabletop cell's 4-joint arm (closed-form IK, its observation already in
the policy's layout) and LeRobot's SO-101 (numeric IK; the driver reports joints, which `policy_observation` turns
into the SO-101 cell's `observation.state`, the layout its policies were trained on).
"""

from __future__ import annotations

import numpy as np

from wmrl.core import so101
from wmrl.core.arm import EE_STEP, WORKSPACE_HIGH, WORKSPACE_LOW, inverse_kinematics, step_hand
from wmrl.core.features import OBS_STATE


def joint_command(ee_target: np.ndarray, gripper: float) -> np.ndarray:
    """[4 arm joint targets from the closed-form IK, gripper in [-1, 1]]."""
    return np.concatenate([inverse_kinematics(ee_target), [float(np.clip(gripper, -1, 1))]])


class Arm:
    """The tabletop cell's arm: observations already in the policy's layout (hand at `observation.state[5:8]`),
    commands [yaw, shoulder, elbow, wrist, gripper] from the closed-form IK."""

    ee_step = EE_STEP
    workspace = (WORKSPACE_LOW, WORKSPACE_HIGH)

    def policy_observation(self, obs: dict) -> dict:
        return obs

    def command(self, ee_target: np.ndarray, gripper: float) -> np.ndarray:
        return joint_command(ee_target, gripper)


class SO101Arm(Arm):
    """LeRobot's SO-101 through `real_robot.lerobot_adapter.LeRobotArm`: `observation.state` = 5 joints (rad) and the
    gripper in [-1, 1]; commands the same 6 entries, the wrist roll held at its observed angle."""

    ee_step = so101.EE_STEP
    workspace = (so101.WORKSPACE_LOW, so101.WORKSPACE_HIGH)

    def __init__(self):
        self.kinematics = so101.SO101Kinematics()
        self.roll = 0.0

    def policy_observation(self, obs: dict) -> dict:
        s = np.asarray(obs[OBS_STATE], np.float64)
        self.kinematics.last, self.roll = s[:5].copy(), float(s[4])  # plan from where the arm is
        return {**obs, OBS_STATE: so101.policy_state(s[:5], s[5]).astype(np.float32)}

    def command(self, ee_target: np.ndarray, gripper: float) -> np.ndarray:
        q = self.kinematics.ik(ee_target, roll=self.roll)
        return np.append(q, float(np.clip(gripper, -1, 1)))


class EEDeltaChunkToJoint:
    def __init__(self, policy, horizon: int = 8, ee_step: float | None = None, arm: Arm | None = None):
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.arm = arm or Arm()
        self.policy, self.horizon, self.ee_step = policy, horizon, ee_step or self.arm.ee_step

    def _batched(self, obs: dict) -> dict:
        out = {}
        for k, v in obs.items():
            if k.startswith("observation."):
                out[k] = np.asarray(v)[None]
            elif k == "task":
                out[k] = [v]
        return out

    def __call__(self, obs: dict) -> np.ndarray:
        """(H, joints + 1) joint targets with the gripper last, for one observation of the robot."""
        obs = self.arm.policy_observation(obs)
        b = self._batched(obs)
        if getattr(self.policy, "chunk_size", 1) > 1:
            deltas = np.asarray(self.policy.predict_action_chunk(b))[0][: self.horizon]
            ee = np.asarray(obs[OBS_STATE], np.float64)[5:8].copy()
            waypoints = []
            for a in deltas:
                ee = step_hand(ee, a, self.ee_step, *self.arm.workspace)
                waypoints.append((ee.copy(), a[3]))
        else:
            state = np.array(b[OBS_STATE], np.float64)
            waypoints = []
            for _ in range(self.horizon):
                a = np.asarray(self.policy.select_action({**b, OBS_STATE: state.astype(np.float32)}))[0]
                ee = step_hand(state[0, 5:8], a, self.ee_step, *self.arm.workspace)
                state[0, 5:8] = ee
                waypoints.append((ee, a[3]))
        return np.stack([self.arm.command(ee, g) for ee, g in waypoints])


__all__ = ["Arm", "EEDeltaChunkToJoint", "SO101Arm", "step_hand", "joint_command"]
