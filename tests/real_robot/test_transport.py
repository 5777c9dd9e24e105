"""The ZeroMQ + msgpack transport: observations and actions round-trip exactly, errors come back as messages, a
missing server is a ConnectionError, and a real-time robot in its own process runs under the safety layer."""

import threading

import numpy as np
import pytest

from real_robot.sim_robot import spawn_sim_robot
from real_robot.transport import RemoteRobot, pack, unpack


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


@pytest.fixture
def served(tmp_path):
    """A `SimRealRobot` behind `serve_robot` in a thread: (address, the server-side service, the robot, counts)."""
    from real_robot.sim_robot import SimRealRobot
    from real_robot.transport import RobotService, serve
    from wmrl.commands.deploy import free_port

    robot = SimRealRobot("reach-red", cameras=("front",), image_size=32, noise_std=0.0)
    service = RobotService(robot)
    addr = f"tcp://127.0.0.1:{free_port()}"
    ready, counts = threading.Event(), {}

    def run():  # the simulator's renderer belongs to the thread that made it: connect and close it here
        try:
            counts.update(serve(service, addr, ready=ready, tick=service.tick))
        finally:
            service.disconnect()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(5)
    yield addr, service, robot, counts
    if t.is_alive():
        RemoteRobot(addr, timeout_s=5).shutdown_server()
    t.join(5)


def test_remote_robot_round_trip_and_errors(served):
    addr, service, robot, _ = served
    remote = RemoteRobot(addr, timeout_s=10)
    remote.connect()
    assert remote.action_dim == 5
    obs = remote.get_observation()
    assert obs["observation.images.front"].shape == (32, 32, 3) and obs["observation.state"].shape == (8,)
    target = np.concatenate([obs["observation.state"][:4] + 0.01, [-1.0]]).astype(np.float32)
    np.testing.assert_allclose(remote.send_action(target), target, atol=1e-6)
    np.testing.assert_allclose(robot._target, target, atol=1e-6)  # what arrived is what was sent
    with pytest.raises(RuntimeError, match="unknown method 'explode'"):
        remote.call("explode")
    remote.disconnect()
    with pytest.raises(ConnectionError, match="no reply within 200 ms"):
        RemoteRobot("tcp://127.0.0.1:1", timeout_s=0.2).get_observation()


def test_a_direct_client_cannot_drive_the_arm_past_the_limits(served):
    """No client-side layer: out-of-limit, too-fast, NaN and wrong-shape commands straight to the server. Every
    command that reached the arm is audited against the limits, and each refused or limited one left a trip."""
    from real_robot.safety import SafetyConfig, violations
    from sim.tabletop.model import forward_kinematics

    addr, service, robot, _ = served
    cfg = SafetyConfig()
    remote = RemoteRobot(addr, timeout_s=10)
    remote.connect()
    remote.get_observation()
    prev = service.safe._last_sent.copy()
    cases = [[1.6, 1.6, 2.8, 2.8, 1.0],  # the command: past the margins, ~1.6 rad in one step
             [5.0, -5.0, 5.0, -5.0, 5.0], [np.nan, 0, 0, 0, 0], [0, np.inf, 0, 0, 0], [1e300, 0, 0, 0, 0],
             list(prev[:4] + 0.24) + [1.0],  # within max_delta but too fast and a full gripper swing
             [0.0, 0.0, 0.0], list(prev)]
    for a in cases:
        n_trips = len(service.safe.trips)
        sent = np.asarray(remote.call("send_action", np.asarray(a, np.float64)), np.float64)  # float64 on the wire
        at_arm = robot._target.astype(np.float64)
        np.testing.assert_allclose(at_arm, sent, atol=1e-6)  # the reply is what reached the arm
        assert violations(prev, at_arm, cfg, forward_kinematics, tol=1e-5) == [], a
        if not np.allclose(np.asarray(a, np.float64)[:5] if len(a) == 5 else np.zeros(5), at_arm, atol=1e-5):
            assert len(service.safe.trips) > n_trips, f"{a} was changed without a recorded trip"
        prev = at_arm
    kinds = {t["kind"] for t in remote.trips()}
    assert {"joint_limit", "invalid_command", "velocity_acceleration", "gripper_limit"} <= kinds
    # a reset goes through the same layer: the held target becomes the arm's new home pose
    remote.reset_episode(3)
    np.testing.assert_allclose(service.safe._last_sent[:4], remote.get_observation()["observation.state"][:4], atol=1e-6)
    with pytest.raises(RuntimeError, match="seed: an integer"):
        remote.reset_episode("x")


def test_the_server_watchdog_holds_when_commands_stop(served):
    addr, service, robot, _ = served
    service.safe.cfg.watchdog_s = 0.2
    remote = RemoteRobot(addr, timeout_s=10)
    remote.connect()
    remote.get_observation()
    before = robot.commands
    import time

    time.sleep(0.6)  # the client went silent: the server loop holds the last target by itself
    assert robot.commands > before
    assert [t["kind"] for t in remote.trips()].count("watchdog") == 1  # recorded once per silence


def test_fuzzed_messages_never_stop_the_server(served):
    """Random bytes, several frames, oversized messages, pickles, object arrays, unknown msgpack extensions, raw TCP
    garbage: the server answers with an error or drops, and still serves a well-formed client afterwards."""
    import pickle
    import socket

    import msgpack
    import zmq

    addr, service, robot, counts = served
    rng = np.random.default_rng(0)
    ctx = zmq.Context.instance()
    host, port = addr[len("tcp://"):].split(":")
    payloads = [rng.bytes(int(rng.integers(0, 300))) for _ in range(40)]
    payloads += [pickle.dumps({"method": "send_action", "args": [[9.0] * 5]}),
                 msgpack.packb({"method": "send_action", "args": [msgpack.ExtType(7, b"\x00")]}),
                 msgpack.packb({"method": "send_action", "args": [msgpack.ExtType(1, msgpack.packb(["|O8", [1], b"\x00" * 8]))]}),
                 msgpack.packb({"method": "send_action", "args": [msgpack.ExtType(1, msgpack.packb(["<f8", [10**6], b""]))]}),
                 msgpack.packb([1, 2, 3]), msgpack.packb({"method": 5}), msgpack.packb({"method": "send_action", "args": 3})]
    errors = 0
    for i, payload in enumerate(payloads):
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 3000)
        sock.connect(addr)
        if i % 3 == 0:
            sock.send_multipart([payload, b"second frame"])
        else:
            sock.send(payload)
        rep = unpack(sock.recv())
        errors += "error" in rep
        sock.close()
    assert errors == len(payloads)
    # oversized: the connection is dropped, no reply; raw bytes on the TCP port: not even a handshake
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 500)
    sock.connect(addr)
    sock.send(b"x" * (1 << 20))
    with pytest.raises(zmq.Again):
        sock.recv()
    sock.close()
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(rng.bytes(5000))
    remote = RemoteRobot(addr, timeout_s=10)
    remote.connect()
    assert remote.get_observation()["observation.state"].shape == (8,)
    assert robot.commands == 0  # nothing malformed reached the arm


def test_curve_allow_list_keeps_strangers_out(tmp_path):
    import os
    import stat

    from real_robot.sim_robot import SimRealRobot
    from real_robot.transport import check_bind, make_keys, serve_robot
    from wmrl.commands.deploy import free_port

    keys = make_keys(tmp_path / "keys", clients=("lab",))
    assert stat.S_IMODE(os.stat(keys / "clients" / "lab.key_secret").st_mode) == 0o600
    stranger = make_keys(tmp_path / "other", clients=("lab",))  # a pair the server never allowed
    robot = SimRealRobot("reach-red", cameras=("front",), image_size=16, noise_std=0.0)
    addr = f"tcp://127.0.0.1:{free_port()}"
    ready = threading.Event()
    t = threading.Thread(target=serve_robot, args=(robot, addr), kwargs={"ready": ready, "keys": keys}, daemon=True)
    t.start()
    assert ready.wait(5)
    try:
        for bad in (RemoteRobot(addr, timeout_s=0.5), RemoteRobot(addr, timeout_s=0.5, keys=stranger, client="lab")):
            with pytest.raises(ConnectionError):
                bad.connect()
            with pytest.raises(ConnectionError):
                bad.shutdown_server()
            bad.close()
        assert t.is_alive() and robot.commands == 0
        good = RemoteRobot(addr, timeout_s=10, keys=keys, client="lab")
        good.connect()
        good.send_action(good.get_observation()["observation.state"][:5] * 0 + np.r_[robot._target[:4], -1.0])
        assert robot.commands == 1
        good.shutdown_server()
    finally:
        t.join(5)
    assert not t.is_alive()
    with pytest.raises(ValueError, match="loopback only"):
        check_bind("tcp://0.0.0.0:5599", keys, allow_remote=False)
    with pytest.raises(ValueError, match="without authentication"):
        check_bind("tcp://0.0.0.0:5599", None, allow_remote=True)
    check_bind("tcp://0.0.0.0:5599", keys, allow_remote=True)
    os.chmod(keys / "clients" / "lab.key_secret", 0o644)
    with pytest.raises(PermissionError, match="readable by others"):
        RemoteRobot(addr, keys=keys, client="lab")


@pytest.mark.timing
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
