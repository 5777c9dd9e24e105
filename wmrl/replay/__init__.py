from wmrl.replay.buffer import EpisodeReplay, MixedReplay

__all__ = ["EpisodeReplay", "MixedReplay"]
