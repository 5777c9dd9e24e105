"""`wmrl pgd --data DIR --algo td3bc|iql`: policy-guided diffusion, an offline agent trained on synthetic trajectories
guided by its own policy plus real data. The algorithm is `wmrl.rl.pgd`."""

from wmrl.rl.pgd import PGDConfig, train_pgd


def pgd(cfg: PGDConfig) -> dict:
    return {k: v for k, v in train_pgd(cfg).items() if k != "curve"}  # the curve is in the run folder


__all__ = ["PGDConfig", "pgd"]
