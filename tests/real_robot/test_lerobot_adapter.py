"""The LeRobot arm adapter against a stand-in SO-101 driver with LeRobot's dict API (the hardware boundary: no arm
is attached here, and lerobot cannot be installed beside this torch)."""

import math

import numpy as np
import pytest

from real_robot.lerobot_adapter import SO_ARM_JOINTS, LeRobotArm


class _SO101Driver:
    """LeRobot's dict API with a follower that clips each step to 10 degrees (its max_relative_target)."""

    def __init__(self):
        self.pos = {f"{j}.pos": 0.0 for j in SO_ARM_JOINTS} | {"gripper.pos": 0.0}
        self.connected = False

    def connect(self):
        self.connected = True

    def get_observation(self):
        return dict(self.pos) | {"front": np.zeros((4, 6, 3), np.uint8)}

    def send_action(self, action):
        sent = {k: self.pos[k] + float(np.clip(v - self.pos[k], -10, 10)) if k != "gripper.pos" else v for k, v in action.items()}
        self.pos.update(sent)
        return sent

    def disconnect(self):
        self.connected = False


def test_units_round_trip_and_the_driver_clip_is_reported():
    drv = _SO101Driver()
    arm = LeRobotArm(drv)
    arm.connect()
    obs = arm.get_observation()
    assert obs["observation.state"].shape == (6,) and obs["observation.state"][-1] == -1.0  # open gripper
    assert obs["observation.images.front"].shape == (4, 6, 3) and "timestamp_monotonic" in obs
    sent = arm.send_action([math.radians(5), math.radians(30), 0, 0, 0, 1.0])
    np.testing.assert_allclose(sent[:2], [math.radians(5), math.radians(10)], atol=1e-6)  # 30 deg clipped to 10
    assert drv.pos["gripper.pos"] == 100.0 and sent[-1] == 1.0
    with pytest.raises(ValueError, match="6 finite values"):
        arm.send_action([0, 0, 0, 0, math.nan, 0])


def test_under_the_safety_layer():
    from real_robot.safety import SafeRobot, SafetyConfig

    cfg = SafetyConfig(joint_low=(-2.0,) * 5, joint_high=(2.0,) * 5, max_delta=0.1, workspace_low=(-1, -1, -1),
                       workspace_high=(1, 1, 1))
    safe = SafeRobot(LeRobotArm(_SO101Driver()), cfg, fk=lambda q: np.zeros(3))
    safe.connect()
    sent = safe.send_action([1.0, 0, 0, 0, 0, 0.0])
    assert sent[0] == pytest.approx(0.1, abs=1e-6) and safe.trips[-1].kind in ("step_delta", "velocity_acceleration")



def test_an_arm_without_a_gripper_never_reads_a_joint_as_one():
    from real_robot.safety import SafeRobot, SafetyConfig

    drv = _SO101Driver()
    arm = LeRobotArm(drv, gripper=None)
    assert arm.action_dim == 6  # 5 joints + the (ignored) gripper entry SafeRobot's layout ends with
    cfg = SafetyConfig(joint_low=(-2.0,) * 5, joint_high=(2.0,) * 5, workspace_low=(-1, -1, -1), workspace_high=(1, 1, 1))
    safe = SafeRobot(arm, cfg, fk=lambda q: np.zeros(3))
    safe.connect()
    sent = safe.send_action([0, 0, 0, 0, 0.05, 1.0])
    assert sent[4] == pytest.approx(0.05, abs=1e-6)  # wrist_roll moved as a joint, not clamped as a gripper
    assert "gripper.pos" in drv.pos and drv.pos["gripper.pos"] == 0.0  # the driver got no gripper command
    with pytest.raises(ValueError, match="the robot has 5 joints but the safety limits name 4"):
        SafeRobot(LeRobotArm(_SO101Driver(), gripper=None), SafetyConfig()).connect()
