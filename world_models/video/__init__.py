from world_models.video.model import VideoWorldModel, WorldModelConfig

__all__ = ["VideoWorldModel", "WorldModelConfig"]
