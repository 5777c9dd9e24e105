"""The SO-101 through the stack a physical one uses: LeRobot's driver API (the MuJoCo follower standing in at the
hardware boundary), `LeRobotArm`, `SafeRobot` with the SO-101's limits and kinematics, and `wmrl deploy`."""

import json
import math

import numpy as np
import pytest

import sim.so101
from real_robot.adapters import SO101Arm
from real_robot.lerobot_adapter import LeRobotArm
from real_robot.safety import SafeRobot
from wmrl.core import so101 as K
from wmrl.core.features import OBS_ENV_STATE, OBS_STATE

pytestmark = pytest.mark.skipif(not sim.so101.available(), reason="the SO-101 model is not installed (pip install 'wmrl[so101]')")


@pytest.fixture
def follower():
    from real_robot.so101 import SimSO101Follower

    f = SimSO101Follower(task="reach-red", cameras=("front",), seed=2)
    yield f
    f.disconnect()


def test_the_follower_speaks_lerobots_api_in_its_units(follower):
    follower.connect()
    raw = follower.get_observation()
    assert set(k for k in raw if k.endswith(".pos")) == {f"{m}.pos" for m in K.JOINTS + (K.GRIPPER,)}
    q = follower.env.arm_joints()
    assert raw["shoulder_lift.pos"] == pytest.approx(math.degrees(q[1]))  # use_degrees: 0 mid-range
    assert raw["gripper.pos"] == pytest.approx(0.0, abs=1e-6)  # home: open = 0
    assert raw["front"].shape == (64, 64, 3) and raw["front"].dtype == np.uint8
    with pytest.raises(KeyError, match="wrist_roll"):
        follower.send_action({k: v for k, v in raw.items() if k.endswith(".pos") and not k.startswith("wrist_roll")})
    # LeRobot's max_relative_target: each motor's goal clipped to within that many degrees of where it is
    follower.config.max_relative_target = 5.0
    goal = {k: v + 30.0 for k, v in raw.items() if k.endswith(".pos")}
    sent = follower.send_action(goal)
    assert all(sent[k] == pytest.approx(raw[k] + 5.0) for k in sent)


def test_lerobot_arm_sees_the_cell_as_the_simulator_reports_it(follower):
    """The deployment side rebuilds the SO-101 cell's observation.state (tip by FK, opening from the gripper joint)
    from what the driver reports, equal to what the simulator itself reports."""
    arm = LeRobotArm(follower)
    arm.connect()
    for step in range(3):
        obs = arm.get_observation()
        assert obs[OBS_STATE].shape == (6,) and OBS_ENV_STATE in obs and obs["task"] == "reach the red cube"
        rebuilt = SO101Arm().policy_observation(obs)[OBS_STATE]
        np.testing.assert_allclose(rebuilt, follower._obs[OBS_STATE], atol=2e-5)
        cmd = np.append(obs[OBS_STATE][:5] + [0.1, -0.05, 0.05, 0.0, 0.0], 0.5)
        sent = arm.send_action(cmd)
        np.testing.assert_allclose(sent, cmd, atol=1e-6)


def test_safety_limits_hold_at_the_so101(follower):
    from real_robot.so101 import so101_safety

    cfg = so101_safety()
    robot = SafeRobot(LeRobotArm(follower), cfg, fk=K.forward_kinematics)
    robot.connect()
    start = robot.get_observation()[OBS_STATE][:5].astype(np.float64)
    beyond = np.append(np.asarray(K.JOINT_HIGH) + 1.0, 0.0)  # every joint past its range
    for _ in range(40):
        sent = robot.send_action(beyond)
        assert np.all(sent[:5] <= np.asarray(cfg.joint_high) - cfg.joint_margin + 1e-6)
        assert np.all(np.abs(sent[:5] - start) <= cfg.max_delta + 1e-6)  # and by at most max_delta per step
        assert np.all(K.forward_kinematics(sent) >= np.asarray(cfg.workspace_low) - 1e-6)
        assert np.all(K.forward_kinematics(sent) <= np.asarray(cfg.workspace_high) + 1e-6)
        start = sent[:5]
    q = follower.env.arm_joints()[:5]
    assert np.all(q <= np.asarray(cfg.joint_high) + 0.02)  # the arm itself stayed inside (small tracking error)
    tip_z = follower.env.ee_pos()[2]
    assert tip_z > 0.0  # never driven into the table
    kinds = {t.kind for t in robot.trips}
    assert {"joint_limit", "workspace"} & kinds
    before = len(robot.trips)
    held = robot.send_action(np.full(6, np.nan))
    assert robot.trips[before].kind == "invalid_command"
    np.testing.assert_allclose(held, robot._last_sent)


def test_deploy_drives_the_so101_and_records_a_lerobot_dataset(tmp_path):
    from wmrl.commands.deploy import DeployConfig, deploy
    from wmrl.datasets import LeRobotV3Dataset

    out = deploy(DeployConfig(robot="sim-so101", task="reach-red", episodes=3, out=tmp_path / "run"))
    assert out["episodes"] == 3 and out["success_rate"] == 1.0 and not out["estopped"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert all(r["success"] and r["steps"] < 40 for r in rows)
    ds = LeRobotV3Dataset(tmp_path / "run" / "dataset")
    info = json.loads((tmp_path / "run" / "dataset" / "meta" / "info.json").read_text())
    assert info["robot_type"] == "so101_follower" and info["features"][OBS_STATE]["shape"] == [6]
    assert ds.num_episodes == 3
    with pytest.raises(ValueError, match="operator"):
        deploy(DeployConfig(robot="sim-so101", operator="scripted", out=tmp_path / "op"))


def test_calibration_recovers_a_known_so101_servo_gain_and_latency(tmp_path):
    """SO-101 logs recorded through LeRobot's driver API (what `wmrl sysid --robot sim-so101` records) replay in the
    SO-101 twin: a known servo gain and actuation latency are recovered on a tiny budget."""
    from real_robot.calibration import CalibrateConfig, SysIdConfig, calibrate, collect_logs, load_logs, record_sysid, robot_of
    from sim.so101.env import CELL

    truth = CELL.replace(arm_kp=0.7, latency_s=0.03)
    collect_logs(tmp_path / "logs", episodes=2, steps=25, noise_std=0.0, twin=truth, robot="sim-so101")
    assert robot_of(tmp_path / "logs") == "so101"
    _, eps = load_logs(tmp_path / "logs")
    assert eps[0][OBS_STATE].shape[1] == 6  # the driver's layout: 5 joints and the gripper
    np.testing.assert_allclose(eps[0]["hand"][0], K.forward_kinematics(eps[0][OBS_STATE][0]))
    r = calibrate(CalibrateConfig(logs=tmp_path / "logs", out=tmp_path / "twin.yaml", params=("arm_kp", "latency_s"),
                                  generations=8, popsize=6, progress=False))
    assert r["robot"] == "so101"
    assert abs(r["fitted"]["arm_kp"] - truth.arm_kp) < abs(CELL.arm_kp - truth.arm_kp) / 3
    assert abs(r["fitted"]["latency_s"] - truth.latency_s) < 0.01
    assert r["error_after"]["ee_rmse_mm"] < 0.25 * r["error_before"]["ee_rmse_mm"]
    with pytest.raises(ValueError, match="tabletop cell \\(sim-real\\) only"):
        record_sysid(SysIdConfig(out=tmp_path / "push", robot="sim-so101", task="push-red", motion="push"))
