"""The safety layer: each pure check, the watchdog and the stale-observation check on a fake clock, the e-stop latch,
a lost connection, unsafe configs, and a small fuzz run against the MuJoCo-backed robot."""

import logging
import math

import numpy as np
import pytest

from real_robot.safety import (SafeRobot, SafetyConfig, clamp_gripper, clamp_joints, clamp_motion, clamp_step,
                               finite_and_shaped, limit_workspace, observation_stale, violations, watchdog_expired)
from real_robot.sim_robot import SimRealRobot
from sim.tabletop.model import forward_kinematics


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_finite_and_shaped():
    assert finite_and_shaped([0, 0, 0, 0, 0], 5) is None
    assert finite_and_shaped([0, 0, math.nan, 0, 0], 5) == "NaN or inf"
    assert finite_and_shaped([0, 0, math.inf, 0, 0], 5) == "NaN or inf"
    assert "expected (5,)" in finite_and_shaped(np.zeros((2, 5)), 5)
    assert finite_and_shaped(["a", 1, 2, 3, 4], 5) == "not numeric"


def test_clamps_by_hand():
    np.testing.assert_allclose(clamp_joints(np.array([2.0, -2.0]), (-1, -1), (1, 1), 0.1), [0.9, -0.9])
    np.testing.assert_allclose(clamp_step(np.array([1.0, 0.05]), np.zeros(2), 0.2), [0.2, 0.05])
    # velocity cap: 1 rad in 0.1 s would be 10 rad/s; capped at 2 rad/s -> 0.2 rad
    np.testing.assert_allclose(clamp_motion(np.array([1.0]), np.zeros(1), np.zeros(1), 0.1, 2.0, 1e9), [0.2])
    # acceleration cap: from rest, 5 rad/s^2 over 0.1 s allows 0.5 rad/s -> 0.05 rad
    np.testing.assert_allclose(clamp_motion(np.array([1.0]), np.zeros(1), np.zeros(1), 0.1, 2.0, 5.0), [0.05])
    # ... and from 1 rad/s the same cap allows 1.5 rad/s
    np.testing.assert_allclose(clamp_motion(np.array([1.0]), np.zeros(1), np.ones(1), 0.1, 2.0, 5.0), [0.15])
    assert clamp_gripper(3.0, -1, 1) == 1.0 and clamp_gripper(-0.5, -1, 1) == -0.5


def test_workspace_limit_stops_on_the_boundary():
    fk = lambda q: np.array([q[0], q[1], 0.5])  # a toy arm: the hand sits at (q0, q1)
    q = limit_workspace(np.array([2.0, 0.0]), np.array([0.0, 0.0]), fk, (-1, -1, 0), (1, 1, 1))
    assert q[0] == pytest.approx(1.0, abs=1e-5) and q[0] <= 1.0
    np.testing.assert_array_equal(limit_workspace(np.array([0.5, 0.5]), np.zeros(2), fk, (-1, -1, 0), (1, 1, 1)), [0.5, 0.5])
    # a previous target outside the box (never produced by the layer itself): hold it rather than guess
    np.testing.assert_array_equal(limit_workspace(np.array([3.0, 0]), np.array([2.0, 0]), fk, (-1, -1, 0), (1, 1, 1)), [2.0, 0])


def test_watchdog_and_staleness_predicates():
    assert watchdog_expired(10.6, 10.0, 0.5) and not watchdog_expired(10.4, 10.0, 0.5)
    assert observation_stale(5.0, 4.0, 0.5) and not observation_stale(5.0, 4.8, 0.5)


@pytest.fixture
def robot():
    r = SimRealRobot("reach-red", cameras=("front",), image_size=32, noise_std=0.0)
    yield r
    r.disconnect()


def test_watchdog_holds_on_a_fake_clock(robot):
    clock = FakeClock()
    safe = SafeRobot(robot, SafetyConfig(watchdog_s=0.5), clock=clock)
    safe.connect()
    home = safe._last_sent.copy()
    sent = safe.send_action(home + np.array([0.05, 0, 0, 0, 0]))
    clock.t += 0.4
    assert not safe.check_watchdog()
    clock.t += 0.2  # 0.6 s without a command
    before = robot.commands
    assert safe.check_watchdog()
    assert robot.commands == before + 1 and np.allclose(robot._target, sent)  # held the last target
    assert [t.kind for t in safe.trips] == ["watchdog"]
    clock.t += 0.3
    assert not safe.check_watchdog()  # one hold per timeout period, not one per call


def test_stale_observations_hold_position(robot):
    clock = FakeClock()
    safe = SafeRobot(robot, SafetyConfig(stale_obs_s=0.5), clock=clock)
    safe.connect()  # a new frame arrives at t = 100
    clock.t += 0.3
    first = safe.send_action(safe._last_sent + 0.02)
    assert not safe.step_trips  # 0.3 s old: fresh enough
    clock.t += 0.6  # 0.9 s without reading a new frame: the command is refused and the arm holds
    np.testing.assert_allclose(safe.send_action(first + 0.02), first, atol=1e-6)
    assert safe.trips[-1].kind == "stale_observation"
    safe.get_observation()  # the robot stepped since: a new frame, fresh again
    assert not np.allclose(safe.send_action(first + 0.02), first)


def test_estop_latches_until_rearmed(robot):
    safe = SafeRobot(robot, SafetyConfig(stale_obs_s=1e3))
    safe.connect()
    held = safe._last_sent.copy()
    safe.estop("operator pressed the button")
    np.testing.assert_allclose(safe.send_action(held + 0.05), held, atol=1e-6)
    np.testing.assert_allclose(safe.send_action(held + 0.05), held, atol=1e-6)
    assert [t.kind for t in safe.trips] == ["estop", "estop_latched", "estop_latched"]
    safe.rearm()
    assert not np.allclose(safe.send_action(held + 0.05), held)


def test_a_lost_connection_latches_the_estop_and_names_the_cause(robot):
    safe = SafeRobot(robot)
    safe.connect()
    robot.disconnect()
    with pytest.raises(ConnectionError, match="robot connection lost .*not connected"):
        safe.get_observation()
    assert safe.estopped and safe.trips[-1].kind == "estop"


def test_settings_that_disable_a_limit_need_unsafe(caplog):
    with pytest.raises(ValueError, match="max_velocity=inf.*--unsafe"):
        SafetyConfig(max_velocity=math.inf).validate()
    with pytest.raises(ValueError, match="empty workspace"):
        SafetyConfig(workspace_low=(1, 0, 0), workspace_high=(0, 1, 1)).validate()
    with caplog.at_level(logging.WARNING, logger="wmrl.safety"):
        SafetyConfig(max_velocity=math.inf, unsafe=True).validate()
    assert "UNSAFE" in caplog.text


def test_fuzzed_commands_never_reach_the_robot_outside_the_limits(robot):
    cfg = SafetyConfig(stale_obs_s=1e3)
    safe = SafeRobot(robot, cfg)
    safe.connect()
    rng = np.random.default_rng(0)
    bad = 0
    prev = safe._last_sent.copy()
    for i in range(300):
        kind = i % 5
        a = rng.uniform(-4, 4, 5)
        if kind == 1:
            a[rng.integers(5)] = rng.choice([math.nan, math.inf, -math.inf])
        elif kind == 2:
            a *= 1e6
        elif kind == 3:
            a = prev + rng.normal(0, 0.05, 5)  # small, plausible moves
        elif kind == 4:
            a = rng.uniform(-4, 4, 3)  # wrong shape
        sent = safe.send_action(a).astype(np.float64)
        bad += bool(violations(prev, sent, cfg, forward_kinematics, tol=1e-4))
        assert safe.step_trips or kind == 3  # everything but the plausible moves trips something
        prev = sent
    assert bad == 0


SETTINGS = ("joint_margin", "max_delta", "max_velocity", "max_acceleration", "max_gripper_delta", "gripper_low",
            "gripper_high", "control_hz", "watchdog_s", "stale_obs_s")


@pytest.mark.parametrize("name", SETTINGS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0, 0.0])
def test_every_setting_that_would_disable_a_limit_is_refused_or_needs_unsafe(name, value):
    cfg = SafetyConfig(**{name: value})
    if math.isnan(value):  # NaN is never a setting, not even with --unsafe
        for unsafe in (False, True):
            with pytest.raises(ValueError, match="NaN"):
                SafetyConfig(**{name: value, "unsafe": unsafe}).validate()
        return
    # settings that still leave every limit working: no margin, or a gripper range that is narrower but not empty
    if (name, value) in {("joint_margin", 0.0), ("gripper_low", -1.0), ("gripper_low", 0.0), ("gripper_high", 0.0)}:
        cfg.validate()
        return
    with pytest.raises(ValueError, match="--unsafe"):
        cfg.validate()
    SafetyConfig(**{name: value, "unsafe": True}).validate()  # allowed, and logged


@pytest.mark.parametrize("field,value", [("joint_low", (-1.0, -1.0, -1.0)), ("joint_high", (1.0,) * 5),
                                         ("workspace_low", (0.0, 0.0)), ("workspace_high", (1.0, 1.0, 1.0, 1.0)),
                                         ("joint_low", (-1.0, math.nan, -1.0, -1.0)), ("joint_high", ("a", 1, 1, 1))])
def test_malformed_limit_tuples_are_refused_even_with_unsafe(field, value):
    with pytest.raises(ValueError):
        SafetyConfig(**{field: value, "unsafe": True}).validate()


def test_limits_for_another_arm_are_refused_at_connect(robot):
    cfg = SafetyConfig(joint_low=(-1.0,) * 5, joint_high=(1.0,) * 5)
    cfg.validate()  # consistent by itself ...
    with pytest.raises(ValueError, match="the robot has 4 joints but the safety limits name 5"):
        SafeRobot(robot, cfg).connect()  # ... but not for this arm


def test_numeric_errors_are_refusals_and_the_gripper_is_rate_limited(robot):
    safe = SafeRobot(robot, SafetyConfig(stale_obs_s=1e3, max_gripper_delta=0.5))
    safe.connect()
    held = safe._last_sent.copy()
    for bad in ([10**400, 0, 0, 0, 0], [1j, 0, 0, 0, 0], "abcde", [[0, 0, 0, 0, 0]], None):
        np.testing.assert_allclose(safe.send_action(bad), held, atol=1e-6)
        assert safe.step_trips == ["invalid_command"]
    sent = safe.send_action(np.r_[held[:4], 1.0])  # open (-1) -> closed (+1) in one step: 0.5 per step
    assert sent[-1] == pytest.approx(held[-1] + 0.5) and safe.step_trips == ["gripper_limit"]
    assert "gripper rate" in violations(held, np.r_[held[:4], 1.0], safe.cfg, forward_kinematics)


def test_reset_goes_through_the_layer_and_is_refused_while_estopped(robot):
    safe = SafeRobot(robot, SafetyConfig(stale_obs_s=1e3))
    safe.connect()
    safe.send_action(safe._last_sent + np.r_[0.1, 0, 0, 0, 0])
    obs = safe.reset_episode(5)
    np.testing.assert_allclose(safe._last_sent[:4], obs["observation.state"][:4], atol=1e-9)  # home is the held target
    safe.estop()
    with pytest.raises(RuntimeError, match="e-stop is latched"):
        safe.reset_episode(6)
