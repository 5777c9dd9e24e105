"""`wmrl deploy`: run a policy on a robot arm through the safety layer and the action-chunk executor.

    wmrl deploy --robot sim-real --policy scripted --task reach-red --mode aligned --episodes 5
    wmrl deploy --robot tcp://10.0.0.7:5599 --policy vla --policy.path runs/bc --mode async
    wmrl deploy --robot sim-so101 --policy scripted --task reach-red

`--robot sim-so101` drives LeRobot's SO-101 arm in MuJoCo through the same stack a physical SO-101 uses in process:
`SafeRobot(LeRobotArm(driver), SO-101 limits, SO-101 kinematics)`, with `real_robot.so101.SimSO101Follower` as the
driver (on hardware: LeRobot's `SO101Follower`); policies see the SO-101 cell's observation layout
(`sim.so101`, `pip install 'wmrl[so101]'`).

`--robot sim-real` starts `SimRealRobot` (the `tabletop-real` cell with hidden parameters, paced to wall-clock time)
in its own process behind the ZeroMQ transport, exactly as a real arm's driver would be reached. Policies that act in
end-effector deltas are adapted to joint targets (`real_robot.adapters`). `--latency-ms` injects extra inference
time. Writes RUN/summary.json, RUN/episodes.jsonl (per-episode timing, discontinuity and safety numbers),
RUN/trips.jsonl (every safety trip) and RUN/dataset (LeRobot v3: what the robot saw and what was actually sent, with
the per-frame count of safety trips in `safety.trips`).
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from policies.factory import make_policy
from real_robot.adapters import EEDeltaChunkToJoint, SO101Arm
from real_robot.lerobot_adapter import LeRobotArm
from real_robot.executor import ExecutorConfig, run_episode
from real_robot.intervention import JointOperator, KeyboardOperator, ScriptedOperator
from real_robot.safety import SafeRobot, SafetyConfig
from real_robot.sim_robot import spawn_sim_robot
from real_robot.transport import RemoteRobot
import sim
from sim.tabletop.tasks import MAX_STEPS, parse_task
from wmrl.core import so101
from wmrl.commands.evaluate import PolicyConfig
from wmrl.core.episode import build_episode, features_for
from wmrl.core.features import OBS_ENV_STATE, OBS_STATE, TASK, image_key
from wmrl.core.io import write_json
from wmrl.core.run import start_run
from wmrl.datasets.lerobot_v3 import LeRobotV3Writer, write_episode


@dataclass
class DeployConfig:
    robot: str = "sim-real"
    """sim-real (a real-time SimRealRobot in its own process) | sim-so101 (LeRobot's SO-101 in MuJoCo behind its
    driver API, in process) | tcp://HOST:PORT (a running robot server)"""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    task: str = "reach-red"
    mode: str = "aligned"
    """sync | async | aligned"""
    control_hz: float = 10.0
    horizon: int = 8  # chunk length for single-step policies (kinematic look-ahead)
    latency_ms: float = 0.0  # injected extra inference time per chunk
    episodes: int = 3
    max_steps: int = 0  # 0: the task's own limit
    seed: int = 0
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    unsafe: bool = False
    """allow safety settings that disable a limit (logged)"""
    keys: Path | None = None
    """CURVE keys folder (`wmrl robot-keys`) for a tcp:// robot server that requires them"""
    client: str = "client"
    """which client key pair under KEYS/clients/ to use"""
    operator: str = "none"
    """none | scripted (takes over when the policy strays; recovery, then correction) | keyboard (terminal teleop)"""
    out: Path = Path("runs/deploy")
    overwrite: bool = False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deploy(cfg: DeployConfig) -> dict:
    ExecutorConfig(mode=cfg.mode, control_hz=cfg.control_hz).validate()
    if cfg.operator not in ("none", "scripted", "keyboard"):
        raise ValueError(f"operator: expected none, scripted or keyboard, got {cfg.operator!r}")
    if cfg.episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {cfg.episodes}")
    safety = SafetyConfig(**{**cfg.safety.__dict__, "control_hz": cfg.control_hz, "unsafe": cfg.unsafe or cfg.safety.unsafe})
    safety.validate()
    if not (cfg.robot in ("sim-real", "sim-so101") or cfg.robot.startswith("tcp://")):
        raise ValueError(f"robot: expected sim-real, sim-so101 or tcp://HOST:PORT, got {cfg.robot!r}")
    is_so101 = cfg.robot == "sim-so101"
    if is_so101 and cfg.operator != "none":
        raise ValueError("--operator drives the tabletop arm's joints; it is not available with --robot sim-so101 yet")
    if is_so101:
        from real_robot.so101 import so101_safety

        safety = so101_safety(safety)
    run = start_run(cfg)
    spaces_env = sim.make_env(f"so101-{cfg.task}" if is_so101 else cfg.task, cameras=("front", "wrist")).unwrapped
    policy = make_policy(cfg.policy.type, spaces_env.action_space, seed=cfg.seed, noise=cfg.policy.noise,
                         failure_prob=cfg.policy.failure_prob, path=cfg.policy.path, stochastic=cfg.policy.stochastic,
                         observation_space=spaces_env.observation_space)
    spaces_env.close()
    infer = EEDeltaChunkToJoint(policy, cfg.horizon, arm=SO101Arm() if is_so101 else None)
    steps = cfg.max_steps or MAX_STEPS[parse_task(cfg.task).family] * max(1, round(cfg.control_hz / 10))
    proc = None
    address = cfg.robot
    if is_so101:
        from real_robot.so101 import SimSO101Follower

        remote = LeRobotArm(SimSO101Follower(task=cfg.task, control_hz=cfg.control_hz, seed=cfg.seed))
        robot = SafeRobot(remote, safety, fk=so101.forward_kinematics)
    else:
        if cfg.robot == "sim-real":
            address = f"tcp://127.0.0.1:{free_port()}"
            # the server applies the same limits in front of the arm; this client's layer is the first line
            proc = spawn_sim_robot(address, safety=safety, task=cfg.task, control_hz=cfg.control_hz,
                                   obs_latency_s=0.03, seed=cfg.seed)
        remote = RemoteRobot(address, timeout_s=10.0, keys=cfg.keys, client=cfg.client)
        robot = SafeRobot(remote, safety)
    ecfg = ExecutorConfig(mode=cfg.mode, control_hz=cfg.control_hz)
    rows, writer = [], None
    operator = None
    if cfg.operator != "none":
        operator = JointOperator(ScriptedOperator() if cfg.operator == "scripted" else KeyboardOperator())
    n_server_trips = 0
    try:
        robot.connect()
        for ep in range(cfg.episodes):
            robot.reset_episode(cfg.seed + ep)
            n_trips = len(robot.trips)
            if operator is not None:
                operator.reset()
            res = run_episode(robot, infer, ecfg, steps, latency=(lambda: cfg.latency_ms / 1000) if cfg.latency_ms else None,
                              stop=lambda o: bool(o.get("success", False)), record=True, operator=operator)
            log = res["log"]
            final = res["final_observation"]
            row = {"episode": ep, "success": bool(final.get("success", False)), "intervention_steps": int(np.sum(np.array(log["phase"]) > 0)),
                   **{k: v for k, v in res.items() if k not in ("log", "final_observation")}}
            rows.append(row)
            # what the server's own layer limited, in front of the arm (an in-process driver has no second layer)
            server_trips = remote.trips(n_server_trips) if hasattr(remote, "trips") else []
            n_server_trips += len(server_trips)
            with open(run / "trips.jsonl", "a") as f:
                for t in robot.trips[n_trips:]:
                    f.write(json.dumps({"episode": ep, "side": "client", **t.__dict__}) + "\n")
                for t in server_trips:
                    f.write(json.dumps({"episode": ep, "side": "server", **t}, default=float) + "\n")
            if log["obs"]:
                keep = (image_key("front"), image_key("wrist"), OBS_STATE, OBS_ENV_STATE, TASK)
                obs = [{k: o[k] for k in keep if k in o} for o in log["obs"] + [final]]
                T = len(log["sent"])
                episode = build_episode(obs, log["sent"], [0.0] * T, [False] * (T - 1) + [row["success"]],
                                        [False] * (T - 1) + [not row["success"]],
                                        [False] * (T - 1) + [row["success"]], source="policy", policy_id=cfg.policy.type,
                                        intervention=[p > 0 for p in log["phase"]],
                                        extras={"safety.trips": [np.int32(len(t)) for t in log["trips"]] + [np.int32(0)],
                                                "layout_seed": [np.int64(cfg.seed + ep)] * (T + 1),
                                                "intervention.phase": [np.int8(p) for p in log["phase"]] + [np.int8(log["phase"][-1])],
                                                "action.commanded": [a.astype(np.float32) for a in log["action"]] + [log["action"][-1].astype(np.float32)]})
                episode["source"] = ["human" if p > 0 else "policy" for p in log["phase"] + log["phase"][-1:]]
                if writer is None:
                    writer = LeRobotV3Writer(run / "dataset", fps=int(round(cfg.control_hz)), features=features_for(episode),
                                             robot_type="so101_follower" if is_so101 else "wmrl_tabletop_real",
                                             extra_meta={"task": cfg.task, "mode": cfg.mode, "robot": cfg.robot})
                write_episode(writer, episode)
            with open(run / "episodes.jsonl", "a") as f:
                f.write(json.dumps(row, default=float) + "\n")
    finally:
        if writer is not None:
            writer.finalize()
        try:
            if proc is not None:
                remote.shutdown_server()
            elif is_so101:
                remote.disconnect()
            else:
                remote.close()
        except ConnectionError:
            pass
        if proc is not None:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    summary = {"run_dir": str(run), "mode": cfg.mode, "control_hz": cfg.control_hz, "episodes": len(rows),
               "success_rate": float(np.mean([r["success"] for r in rows])) if rows else float("nan"),
               "deadline_miss_rate": float(np.mean([r["deadline_miss_rate"] for r in rows])),
               "stall_rate": float(np.mean([r["stall_rate"] for r in rows])),
               "safety_trips": len(robot.trips),
               "server_safety_trips": n_server_trips, "estopped": robot.estopped, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_json(run / "summary.json", summary)
    return summary


__all__ = ["DeployConfig", "deploy"]
