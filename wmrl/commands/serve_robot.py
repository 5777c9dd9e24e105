"""`wmrl serve-robot`: serve a robot arm over the network with the safety layer where the arm is.

    wmrl serve-robot --robot sim-real --task reach-red                          (loopback, no keys: local use)
    wmrl serve-robot --keys keys --address tcp://0.0.0.0:5599 --allow-remote    (other machines, CURVE allow-list)

The server wraps the driver in its own `SafeRobot` (joint limits, step and velocity/acceleration limits, workspace,
gripper range and rate, finiteness, stale observations) and holds the arm when commands stop (watchdog), whatever
the client does. Without `--keys` it listens on the loopback interface only; `--allow-remote` without keys is
refused. `--robot sim-real` is the MuJoCo-backed stand-in; for a LeRobot arm, call
`real_robot.transport.serve_robot(LeRobotArm(...), address, SafetyConfig(...), keys=...)` from Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from real_robot.safety import SafetyConfig
from real_robot.sim_robot import SimRealRobot
from real_robot.transport import check_bind, serve_robot
from sim.tabletop.tasks import parse_task


@dataclass
class ServeRobotConfig:
    robot: str = "sim-real"
    """sim-real (the MuJoCo-backed arm, paced to wall-clock time)"""
    address: str = "tcp://127.0.0.1:5599"
    keys: Path | None = None
    """CURVE keys folder from `wmrl robot-keys`; needed to listen beyond loopback"""
    allow_remote: bool = False
    """listen on an address other than loopback (refused without --keys)"""
    task: str = "reach-red"
    control_hz: float = 10.0
    seed: int = 0
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    unsafe: bool = False


def serve_robot_command(cfg: ServeRobotConfig) -> dict:
    import logging


    if cfg.robot != "sim-real":
        raise ValueError(f"robot: expected sim-real, got {cfg.robot!r} (serve other arms from Python: see --help)")
    if not (cfg.control_hz > 0):
        raise ValueError(f"--control-hz must be > 0, got {cfg.control_hz}")
    parse_task(cfg.task)
    safety = SafetyConfig(**{**cfg.safety.__dict__, "control_hz": cfg.control_hz, "unsafe": cfg.unsafe or cfg.safety.unsafe})
    safety.validate()
    check_bind(cfg.address, cfg.keys, cfg.allow_remote)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    print(f"serving {cfg.robot} ({cfg.task}) at {cfg.address}{' with CURVE keys' if cfg.keys else ''}; "
          f"stop with a client's shutdown_server() or Ctrl-C", flush=True)
    robot = SimRealRobot(task=cfg.task, control_hz=cfg.control_hz, realtime=True, seed=cfg.seed)
    counts = serve_robot(robot, cfg.address, safety, keys=cfg.keys, allow_remote=cfg.allow_remote)
    return {"address": cfg.address, **counts}


__all__ = ["ServeRobotConfig", "serve_robot_command"]
