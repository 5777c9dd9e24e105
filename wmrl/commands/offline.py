"""`wmrl offline --algo ravl|mopo|mbpo|sac-n|edac|td3bc|iql --data DIR`: offline RL from a logged dataset (the edge-of-reach
family and model-free baselines). The trainer is `wmrl.rl.ravl`."""

from wmrl.rl.ravl import OfflineConfig, train_offline

__all__ = ["OfflineConfig", "train_offline"]
