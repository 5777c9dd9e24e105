"""LeRobot arms (SO-100 / SO-101 followers and anything with LeRobot's robot API) behind wmrl's `Robot` protocol.

LeRobot robots exchange dicts: `get_observation() -> {"shoulder_pan.pos": deg, ..., "gripper.pos": 0..100,
"<camera>": HxWx3 uint8}` and `send_action({"<motor>.pos": ...}) -> the action actually sent` (after the driver's
own `max_relative_target` clip). `LeRobotArm` turns that into wmrl's arrays: `observation.state` = joint angles in
radians (gripper as -1 open .. +1 closed), cameras as `observation.images.<name>`, commands as [joints (rad),
gripper], and stamps each observation with the monotonic clock (the stale-observation check needs it).

    from lerobot.robots.so101_follower import SO101Follower, SO101FollowerConfig
    arm = LeRobotArm(SO101Follower(SO101FollowerConfig(port="/dev/ttyACM0", id="follower", use_degrees=True)))
    robot = SafeRobot(arm, SafetyConfig(joint_low=..., joint_high=..., workspace_low=..., ...), fk=your_arm_fk)

lerobot is an optional dependency (it cannot be installed next to this project's torch here): the adapter only
assumes the dict API. It is tested against `real_robot.so101.SimSO101Follower`, the MuJoCo SO-101 behind that API.
Keys a cell adds beside the motors (`observation.environment_state` from an object tracker, `task`, `success`) pass
through unchanged; `reset_episode` is forwarded to drivers that have one (a simulated cell; a real one is reset by
hand).
"""

from __future__ import annotations

import math
import time

import numpy as np

from wmrl.core.features import OBS_ENV_STATE, OBS_STATE, TASK, image_key

SO_ARM_JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll")
PASS_THROUGH = (OBS_ENV_STATE, TASK, "success", "step")


class LeRobotArm:
    def __init__(self, robot, joints: tuple[str, ...] = SO_ARM_JOINTS, gripper: str | None = "gripper",
                 degrees: bool = True, gripper_range: tuple[float, float] = (0.0, 100.0)):
        self.robot, self.joints, self.gripper, self.degrees = robot, tuple(joints), gripper, degrees
        self.g_open, self.g_closed = gripper_range
        self.cameras = tuple(getattr(getattr(robot, "config", None), "cameras", {}) or {})

    @property
    def dim(self) -> int:
        """Joints + one gripper entry, always: wmrl's command layout (and `SafeRobot`'s) ends in the gripper; an arm
        without one accepts that entry and ignores it, so no joint is ever read as a gripper."""
        return len(self.joints) + 1

    action_dim = dim  # the `Robot` protocol's name, checked against the safety limits at connect

    def _to_rad(self, v: float) -> float:
        return math.radians(v) if self.degrees else float(v)

    def _from_rad(self, v: float) -> float:
        return math.degrees(v) if self.degrees else float(v)

    def _g_to_unit(self, v: float) -> float:  # driver units -> -1 (open) .. +1 (closed)
        return float(np.clip(2 * (v - self.g_open) / (self.g_closed - self.g_open) - 1, -1, 1))

    def _g_from_unit(self, u: float) -> float:
        return float(self.g_open + (np.clip(u, -1, 1) + 1) / 2 * (self.g_closed - self.g_open))

    def connect(self) -> None:
        self.robot.connect()

    def get_observation(self) -> dict:
        raw = self.robot.get_observation()
        missing = [f"{j}.pos" for j in self.joints + ((self.gripper,) if self.gripper else ()) if f"{j}.pos" not in raw]
        if missing:
            raise ConnectionError(f"the arm's observation lacks {missing}; it has {sorted(raw)}")
        state = [self._to_rad(raw[f"{j}.pos"]) for j in self.joints]
        state.append(self._g_to_unit(raw[f"{self.gripper}.pos"]) if self.gripper else -1.0)
        obs = {OBS_STATE: np.asarray(state, np.float32), "timestamp_monotonic": time.monotonic()}
        for cam in self.cameras or [k for k, v in raw.items() if isinstance(v, np.ndarray) and v.ndim == 3]:
            if cam in raw:
                obs[image_key(cam)] = np.asarray(raw[cam])
        obs["gripper_command"] = state[-1]
        obs.update({k: raw[k] for k in PASS_THROUGH if k in raw})
        return obs

    def reset_episode(self, seed: int | None = None) -> None:
        if not hasattr(self.robot, "reset_episode"):
            raise NotImplementedError("this arm's driver cannot reset its cell: reset it by hand between episodes")
        self.robot.reset_episode(seed)

    def send_action(self, action) -> np.ndarray:
        a = np.asarray(action, np.float64)
        if a.shape != (self.dim,) or not np.all(np.isfinite(a)):
            raise ValueError(f"command: expected {self.dim} finite values, got {a}")
        cmd = {f"{j}.pos": self._from_rad(a[i]) for i, j in enumerate(self.joints)}
        if self.gripper:
            cmd[f"{self.gripper}.pos"] = self._g_from_unit(a[-1])
        sent = self.robot.send_action(cmd) or cmd  # LeRobot returns what it actually sent
        out = [self._to_rad(sent[f"{j}.pos"]) for j in self.joints]
        out.append(self._g_to_unit(sent[f"{self.gripper}.pos"]) if self.gripper else float(a[-1]))
        return np.asarray(out, np.float32)

    def disconnect(self) -> None:
        self.robot.disconnect()


__all__ = ["LeRobotArm", "SO_ARM_JOINTS"]
