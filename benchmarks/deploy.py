"""Deployment: the control loop under injected inference latency, and safety fuzzing.

Part 1 (control loop). `SimRealRobot` (`tabletop-real`, hidden parameters, 30 ms observation latency, sensor noise)
runs in its own process, paced to wall-clock time, reached over ZeroMQ, behind `SafeRobot`. The policy is the
scripted expert as a joint-space chunker with 0.8 s chunks (8 steps at 10 Hz, 24 at 30 Hz; `real_robot.adapters`). For each control rate and injected
inference latency, every mode runs `episodes` fixed-length episodes on reach tasks (success = the hand reached the
cube at some point): deadline-miss rate, stall rate, mean |a_t - a_{t-1}| of the commanded arm joints at chunk
boundaries and within chunks, success. The peer is `sync` (inference inside the loop) and, for discontinuity,
`replace`; ratios are taken in the same run.

Part 2 (safety fuzzing). `fuzz_commands` random, NaN/inf, huge, out-of-range, wrong-shape and plausible commands
through `SafeRobot` to the MuJoCo robot, each sent command audited independently (`real_robot.safety.violations`),
and stale-observation episodes on a fake clock (observations stop arriving; every later command must be held).

Part 3 (the robot server, attacked directly). `serve_robot` in front of a MuJoCo robot, no client-side layer:
`direct_commands` random, out-of-limit, too-fast, NaN/inf, huge and wrong-shape commands sent straight to the server,
each audited against the limits *at the arm* (`server_unsafe_commands_applied`, goal 0); `malformed_messages` (random
bytes, several frames, oversized, pickles, object arrays, unknown msgpack extensions, raw TCP garbage), after each of
which the server must still answer a good request (`server_crashes`, goal 0); and, on a CURVE server with an
allow-list, clients with no key or an unlisted key trying to connect, move the arm and shut the server down
(`unauthenticated_accepted`, goal 0).
"""

from __future__ import annotations

import math
import time

import numpy as np

from wmrl.benchutil import finish

MODES = (("sync", "sync", ""), ("async", "async", "replace"), ("async_te", "async", "temporal_ensemble"), ("aligned", "aligned", ""))


def _control(rates, latencies, episodes, seconds, quick) -> dict:
    from real_robot.adapters import EEDeltaChunkToJoint
    from real_robot.executor import ExecutorConfig, run_episode
    from real_robot.safety import SafeRobot, SafetyConfig
    from real_robot.sim_robot import spawn_sim_robot
    from real_robot.transport import RemoteRobot
    from sim.experts import ScriptedExpert
    from wmrl.commands.deploy import free_port

    out = {}
    for hz in rates:
        infer = EEDeltaChunkToJoint(ScriptedExpert(), horizon=int(round(0.8 * hz)))  # chunks of 0.8 s at every rate
        addr = f"tcp://127.0.0.1:{free_port()}"
        proc = spawn_sim_robot(addr, task="reach-red", control_hz=hz, obs_latency_s=0.03, seed=0,
                               cameras=("front",), image_size=32 if quick else 64)
        remote = RemoteRobot(addr, timeout_s=10)
        robot = SafeRobot(remote, SafetyConfig(control_hz=hz))
        robot.connect()
        try:
            for lat in latencies:
                for name, mode, strategy in MODES:
                    rows = []
                    for ep in range(episodes):
                        robot.reset_episode(1000 + ep)  # the same layouts for every mode
                        res = run_episode(robot, infer, ExecutorConfig(mode=mode, strategy=strategy, control_hz=hz),
                                          int(seconds * hz), latency=lambda: lat, record=True)
                        ever = any(bool(o["success"]) for o in res["log"]["obs"] + [res["final_observation"]])
                        rows.append({**{k: v for k, v in res.items() if k not in ("log", "final_observation")},
                                     "success": ever})
                    out[f"{hz}hz_{int(lat * 1000)}ms_{name}"] = {
                        k: float(np.nanmean([r[k] for r in rows])) for k in
                        ("deadline_miss_rate", "stall_rate", "boundary_jump", "within_chunk_jump", "boundary_jump_sent",
                         "inference_delay_s", "success")}
        finally:
            remote.shutdown_server()
            proc.join(10)
    return out


def _fuzz(n: int, stale_episodes: int) -> dict:
    from real_robot.safety import SafeRobot, SafetyConfig, violations
    from real_robot.sim_robot import SimRealRobot
    from sim.tabletop.model import forward_kinematics

    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock = Clock()
    cfg = SafetyConfig(stale_obs_s=0.5)
    robot = SimRealRobot("reach-red", cameras=("front",), image_size=16, noise_std=0.0)
    safe = SafeRobot(robot, cfg, clock=clock)
    safe.connect()
    rng = np.random.default_rng(0)
    kinds = ("uniform_wide", "nan_inf", "huge", "out_of_range_joint", "wrong_shape", "plausible")
    counts = {k: 0 for k in kinds}
    unsafe, unrecorded, changed, refused = 0, 0, 0, 0
    prev = safe._last_sent.copy()
    for i in range(n):
        clock.t += 0.1
        if i % 10 == 0:
            safe.get_observation()  # frames keep arriving: the stale check stays quiet in this part
        kind = kinds[rng.integers(len(kinds))]
        counts[kind] += 1
        a = _command(kind, prev, cfg, rng)
        sent = safe.send_action(a).astype(np.float64)
        unsafe += bool(violations(prev, sent, cfg, forward_kinematics, tol=1e-4))
        same_shape = np.shape(a) == sent.shape and np.all(np.isfinite(a))
        was_changed = not same_shape or np.max(np.abs(np.asarray(a, np.float64) - sent)) > 1e-4
        changed += was_changed
        refused += not same_shape
        unrecorded += bool(was_changed and not safe.step_trips)
        prev = sent
    # Stale-observation episodes: observations stop after 10 steps; every later command must be held and recorded.
    stale_cmds, stale_moved, stale_unrecorded = 0, 0, 0
    for ep in range(stale_episodes):
        safe.reset_episode(ep)
        for k in range(40):
            clock.t += 0.1
            if k < 10:
                safe.get_observation()
            a = safe._last_sent + rng.normal(0, 0.03, 5)
            before = safe._last_sent.copy()
            sent = safe.send_action(a).astype(np.float64)
            if k >= 16:  # more than 0.5 s after the last new frame
                stale_cmds += 1
                stale_moved += bool(np.max(np.abs(sent - before)) > 1e-6)
                stale_unrecorded += "stale_observation" not in safe.step_trips
    robot.disconnect()
    res = {"fuzz_commands": n, "unsafe_commands_sent": unsafe, "commands_changed": changed, "commands_refused": refused,
           "changes_without_trip": unrecorded, "trips_recorded": len(safe.trips), "stale_episodes": stale_episodes,
           "stale_commands": stale_cmds, "stale_commands_that_moved": stale_moved,
           "stale_commands_unrecorded": stale_unrecorded}
    return {**{k: int(v) for k, v in res.items()}, "fuzz_by_kind": {k: int(v) for k, v in counts.items()}}


def _command(kind: str, prev: np.ndarray, cfg, rng) -> np.ndarray:
    """One fuzz command of `kind` around the last sent target `prev` (shared by the client and server parts)."""
    if kind == "uniform_wide":
        return rng.uniform(-5, 5, 5)
    if kind == "nan_inf":
        a = prev + rng.normal(0, 0.02, 5)
        a[rng.integers(5)] = rng.choice([math.nan, math.inf, -math.inf])
        return a
    if kind == "huge":
        return rng.normal(0, 1, 5) * 10.0 ** rng.integers(3, 30)
    if kind == "out_of_range_joint":
        a = prev.copy()
        j = rng.integers(4)
        a[j] = (cfg.joint_high[j] if rng.random() < 0.5 else cfg.joint_low[j]) + rng.normal(0, 0.5)
        return a
    if kind == "too_fast":
        return prev + rng.choice([-1, 1], 5) * rng.uniform(0.2, 1.6, 5)
    if kind == "wrong_shape":
        return rng.normal(0, 1, rng.choice([0, 3, 4, 6, 10]))
    return prev + rng.normal(0, 0.03, 5)


def _malformed(rng, i: int) -> list[bytes]:
    import pickle

    import msgpack

    k = i % 8
    if k == 0:
        return [rng.bytes(int(rng.integers(1, 400)))]
    if k == 1:
        return [msgpack.packb({"method": "send_action", "args": [[0.0] * 5]}), b"second frame"]
    if k == 2:
        return [pickle.dumps({"method": "send_action", "args": [[9.0] * 5]})]
    if k == 3:
        return [msgpack.packb({"method": "send_action", "args": [msgpack.ExtType(int(rng.integers(2, 127)), b"x")]})]
    if k == 4:
        return [msgpack.packb({"method": "send_action", "args": [msgpack.ExtType(1, msgpack.packb(["|O8", [1], b"\0" * 8]))]})]
    if k == 5:
        return [b"\x00" * (1 << 17)]  # over the server's 64 KiB request limit
    if k == 6:
        return [msgpack.packb({"method": "__init__", "args": []})]
    return [msgpack.packb({"method": "send_action", "args": "not a list"})]


def _server(direct: int, malformed: int, unauth: int) -> dict:
    import socket
    import tempfile
    import threading

    import zmq

    from real_robot.safety import SafetyConfig, violations
    from real_robot.sim_robot import SimRealRobot
    from real_robot.transport import RemoteRobot, RobotService, make_keys, serve, unpack
    from sim.tabletop.model import forward_kinematics
    from wmrl.commands.deploy import free_port

    def start(keys=None):
        robot = SimRealRobot("reach-red", cameras=("front",), image_size=16, noise_std=0.0)
        service = RobotService(robot, SafetyConfig(stale_obs_s=1e3))
        addr, ready = f"tcp://127.0.0.1:{free_port()}", threading.Event()

        def run():  # the renderer belongs to this thread: the robot connects and closes here
            try:
                serve(service, addr, ready=ready, keys=keys, tick=service.tick)
            finally:
                service.disconnect()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        ready.wait(10)
        return addr, service, robot, t

    cfg = SafetyConfig()
    rng = np.random.default_rng(1)
    addr, service, robot, thread = start()
    remote = RemoteRobot(addr, timeout_s=10)
    remote.connect()
    remote.get_observation()
    kinds = ("uniform_wide", "nan_inf", "huge", "out_of_range_joint", "too_fast", "wrong_shape", "plausible")
    unsafe, prev = 0, robot._target.astype(np.float64).copy()
    for i in range(direct):
        a = _command(kinds[rng.integers(len(kinds))], prev, cfg, rng)
        try:
            remote.call("send_action", np.asarray(a, np.float64))  # float64 on the wire: no client-side rounding
        except RuntimeError:
            pass  # refused with an error reply: nothing moved
        at_arm = robot._target.astype(np.float64).copy()
        unsafe += bool(violations(prev, at_arm, cfg, forward_kinematics, tol=1e-5))
        prev = at_arm
    server_trips = len(service.safe.trips)
    ctx = zmq.Context.instance()
    crashes = 0
    for i in range(malformed):
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 300)
        sock.connect(addr)
        sock.send_multipart(_malformed(rng, i))
        try:
            unpack(sock.recv())
        except zmq.Again:
            pass  # dropped (oversized): fine, as long as the server lives
        sock.close()
        if i % 8 == 7:
            host, port = addr[len("tcp://"):].split(":")
            with socket.create_connection((host, int(port))) as raw:
                raw.sendall(rng.bytes(2000))
        try:
            remote.get_observation()
        except (ConnectionError, RuntimeError):
            crashes += 1
            remote = RemoteRobot(addr, timeout_s=10)
    crashes += not thread.is_alive()
    remote.shutdown_server()
    thread.join(10)
    # unauthenticated clients against a CURVE server with an allow-list
    with tempfile.TemporaryDirectory() as tmp:
        keys, stranger = make_keys(f"{tmp}/keys", ("lab",)), make_keys(f"{tmp}/stranger", ("lab",))
        addr, service, robot, thread = start(keys)
        accepted = 0
        for i in range(unauth):
            bad = RemoteRobot(addr, timeout_s=0.3, **({"keys": stranger, "client": "lab"} if i % 2 else {}))
            for call in (lambda: bad.call("send_action", np.array([1.6, 1.6, 2.8, 2.8, 1.0])), bad.shutdown_server):
                try:
                    call()
                    accepted += 1
                except ConnectionError:
                    pass
            bad.close()
        accepted += robot.commands > 0 or not thread.is_alive()
        good = RemoteRobot(addr, timeout_s=10, keys=keys, client="lab")
        good.connect()
        allowed_ok = good.get_observation()["observation.state"].shape == (8,)
        good.shutdown_server()
        thread.join(10)
    return {"direct_commands": direct, "server_unsafe_commands_applied": int(unsafe),
            "server_trips_recorded": server_trips, "malformed_messages": malformed,
            "server_crashes": int(crashes), "unauthenticated_attempts": 2 * unauth,
            "unauthenticated_accepted": int(accepted), "allowed_client_served": bool(allowed_ok)}


def main(quick: bool = False, rates: str = "10,30", latencies_ms: str = "50,100,200", episodes: int = 3,
         seconds: float = 4.0, fuzz_commands: int = 10_000, stale_episodes: int = 20, direct_commands: int = 2000,
         malformed_messages: int = 400, unauthenticated: int = 20) -> dict:
    import logging

    logging.getLogger("wmrl.safety").setLevel(logging.ERROR)  # thousands of trips: recorded, not printed
    t0 = time.time()
    if quick:
        rates, latencies_ms, episodes, seconds, fuzz_commands, stale_episodes = "20", "100", 1, 1.0, 300, 2
        direct_commands, malformed_messages, unauthenticated = 150, 40, 3
    rate_list = [float(r) for r in rates.split(",")]
    lats = [float(x) / 1000 for x in latencies_ms.split(",")]
    control = _control(rate_list, lats, episodes, seconds, quick)
    out: dict = {"control": control, **_fuzz(fuzz_commands, stale_episodes),
                 **_server(direct_commands, malformed_messages, unauthenticated)}
    for name, *_ in MODES:  # per mode and rate: worst case over latencies
        for hz in rate_list:
            keys = [k for k in control if k.startswith(f"{hz}hz_") and k.endswith(f"_{name}")]
            out.setdefault("deadline_miss_rate", {})[f"{name}_{hz:g}hz"] = max(control[k]["deadline_miss_rate"] for k in keys)
        out.setdefault("stall_rate", {})[name] = max(control[k]["stall_rate"] for k in control if k.endswith(f"_{name}"))
        out.setdefault("success_rate", {})[name] = float(np.mean([control[k]["success"] for k in control if k.endswith(f"_{name}")]))
    ratios = [control[k]["boundary_jump"] / control[k.replace("_aligned", "_async")]["boundary_jump"]
              for k in control if k.endswith("_aligned") and control[k.replace("_aligned", "_async")]["boundary_jump"] > 0]
    out["boundary_jerk_ratio_aligned_vs_replace"] = float(np.median(ratios)) if ratios else math.nan
    out["budgets"] = {"rates_hz": rate_list, "latencies_s": lats, "episodes": episodes, "seconds_per_episode": seconds,
                      "tasks": "reach-red (layout seeds 1000..)", "policy": "scripted expert, 0.8 s joint chunks",
                      "miss_tolerance": "half a control period", "robot": "SimRealRobot in its own process, ZeroMQ"}
    out["minutes"] = (time.time() - t0) / 60
    return finish("deploy", out, quick)
