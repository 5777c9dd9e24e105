"""`wmrl pgd --data DIR --algo td3bc|iql`: policy-guided diffusion, an offline agent trained on synthetic trajectories
guided by its own policy plus real data. The algorithm is `wmrl.rl.pgd`."""

from wmrl.rl.pgd import PGDConfig, train_pgd

__all__ = ["PGDConfig", "train_pgd"]
