"""Deployment on robot arms: the safety layer (`SafeRobot`), the action-chunk executor (sync / async / aligned),
the ZeroMQ + msgpack transport, and `SimRealRobot`, the MuJoCo-backed stand-in for a physical arm."""

from real_robot.executor import ChunkQueue, ExecutorConfig, run_episode
from real_robot.safety import SafeRobot, SafetyConfig

__all__ = ["SafeRobot", "SafetyConfig", "ChunkQueue", "ExecutorConfig", "run_episode"]
