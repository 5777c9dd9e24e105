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
    from real_robot.transport import RemoteRobot, spawn_sim_robot
    from sim.tabletop.experts import ScriptedExpert
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
        if kind == "uniform_wide":
            a = rng.uniform(-5, 5, 5)
        elif kind == "nan_inf":
            a = prev + rng.normal(0, 0.02, 5)
            a[rng.integers(5)] = rng.choice([math.nan, math.inf, -math.inf])
        elif kind == "huge":
            a = rng.normal(0, 1, 5) * 10.0 ** rng.integers(3, 30)
        elif kind == "out_of_range_joint":
            a = prev.copy()
            j = rng.integers(4)
            a[j] = (cfg.joint_high[j] if rng.random() < 0.5 else cfg.joint_low[j]) + rng.normal(0, 0.5)
        elif kind == "wrong_shape":
            a = rng.normal(0, 1, rng.choice([0, 3, 4, 6, 10]))
        else:
            a = prev + rng.normal(0, 0.03, 5)
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


def main(quick: bool = False, rates: str = "10,30", latencies_ms: str = "50,100,200", episodes: int = 3,
         seconds: float = 4.0, fuzz_commands: int = 10_000, stale_episodes: int = 20) -> dict:
    import logging

    logging.getLogger("wmrl.safety").setLevel(logging.ERROR)  # thousands of trips: recorded, not printed
    t0 = time.time()
    if quick:
        rates, latencies_ms, episodes, seconds, fuzz_commands, stale_episodes = "20", "100", 1, 1.0, 300, 2
    rate_list = [float(r) for r in rates.split(",")]
    lats = [float(x) / 1000 for x in latencies_ms.split(",")]
    control = _control(rate_list, lats, episodes, seconds, quick)
    out: dict = {"control": control, **_fuzz(fuzz_commands, stale_episodes)}
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
