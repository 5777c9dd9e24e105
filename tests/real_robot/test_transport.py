"""The ZeroMQ + msgpack transport: observations and actions round-trip exactly, errors come back as messages, a
missing server is a ConnectionError, and a real-time robot in its own process runs under the safety layer."""

import threading

import numpy as np
import pytest

from real_robot.transport import RemoteRobot, pack, serve, spawn_sim_robot, unpack


def test_pack_round_trips_observations_exactly():
    obs = {"observation.images.front": np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3),
           "observation.state": np.array([0.1, -2.5, 3.0], np.float32), "task": "push the red cube", "success": True,
           "step": np.int64(7), "nested": {"q": np.zeros((0, 3), np.float64)}, "tuple": (1, 2)}
    back = unpack(pack(obs))
    for k in ("observation.images.front", "observation.state"):
        assert back[k].dtype == obs[k].dtype and back[k].shape == obs[k].shape
        np.testing.assert_array_equal(back[k], obs[k])
    assert back["task"] == obs["task"] and back["success"] is True and back["step"] == 7 and back["tuple"] == [1, 2]
    assert back["nested"]["q"].shape == (0, 3)
    with pytest.raises(TypeError, match="plain types and numpy arrays only"):
        pack({"f": lambda: 0})
    with pytest.raises(TypeError):
        pack(np.array([object()], dtype=object))


def test_remote_robot_round_trip_and_errors():
    from real_robot.sim_robot import SimRealRobot

    robot = SimRealRobot("reach-red", cameras=("front",), image_size=32)
    addr = "tcp://127.0.0.1:5611"
    ready = threading.Event()
    t = threading.Thread(target=serve, args=(robot, addr), kwargs={"ready": ready}, daemon=True)
    t.start()
    ready.wait(5)
    remote = RemoteRobot(addr, timeout_s=10)
    try:
        remote.connect()
        obs = remote.get_observation()
        assert obs["observation.images.front"].shape == (32, 32, 3) and obs["observation.state"].shape == (8,)
        target = np.concatenate([obs["observation.state"][:4] + 0.01, [-1.0]]).astype(np.float32)
        np.testing.assert_array_equal(remote.send_action(target), target)
        np.testing.assert_allclose(robot._target, target, atol=1e-7)  # what arrived is what was sent
        with pytest.raises(RuntimeError, match="joint command: expected shape"):
            remote.send_action(np.zeros(3))
        with pytest.raises(RuntimeError, match="unknown method 'explode'"):
            remote.call("explode")
        remote.disconnect()
    finally:
        RemoteRobot(addr, timeout_s=5).shutdown_server()
        t.join(5)
    with pytest.raises(ConnectionError, match="no reply from the robot at tcp://127.0.0.1:5611 within 200 ms"):
        RemoteRobot(addr, timeout_s=0.2).get_observation()


def test_real_time_robot_in_its_own_process_under_the_safety_layer():
    from real_robot.executor import ExecutorConfig, run_episode
    from real_robot.safety import SafeRobot, SafetyConfig

    addr = "tcp://127.0.0.1:5612"
    proc = spawn_sim_robot(addr, task="reach-red", cameras=("front",), image_size=32, control_hz=20, obs_latency_s=0.02)
    try:
        safe = SafeRobot(RemoteRobot(addr, timeout_s=5), SafetyConfig(control_hz=20))
        safe.connect()

        def chunk(obs):
            s = obs["observation.state"].astype(np.float64)
            return np.stack([np.concatenate([s[:4] + [0.01 * (i + 1), 0, 0, 0], [-1.0]]) for i in range(5)])

        res = run_episode(safe, chunk, ExecutorConfig(mode="aligned", control_hz=20), 20, latency=lambda: 0.05)
        assert res["steps"] == 20 and res["deadline_miss_rate"] < 0.2
        yaw = [a[0] for a in res["log"]["sent"]]
        assert yaw[-1] > yaw[0] + 0.02  # the arm was driven through the wire
        safe.robot.shutdown_server()
        proc.join(10)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
