"""LeRobot v3.0 datasets: reader and streaming writer (pyarrow + PyAV), no lerobot dependency."""

from wmrl.datasets.lerobot_v3 import DatasetError, LeRobotV3Dataset, LeRobotV3Writer, write_episode

__all__ = ["DatasetError", "LeRobotV3Dataset", "LeRobotV3Writer", "write_episode"]
