"""`wmrl train-wm --data DIR --out RUN`: train the video world model (and its state channel) on a LeRobot v3 dataset.
The training loop is `world_models.video.train`."""

from world_models.video.train import TrainWMConfig, train_world_model

__all__ = ["TrainWMConfig", "train_world_model"]
