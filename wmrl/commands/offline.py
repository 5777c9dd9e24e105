"""`wmrl offline --algo ravl|mopo|mbpo|sac-n|td3bc|iql --data DIR`: offline RL from a logged dataset (the edge-of-reach
family and model-free baselines). The trainer is `wmrl.rl.ravl`."""

from wmrl.rl.ravl import OfflineConfig, train_offline


def offline(cfg: OfflineConfig) -> dict:
    return {k: v for k, v in train_offline(cfg).items() if k != "curve"}  # the curve is in the run folder


__all__ = ["OfflineConfig", "offline"]
