"""Helpers shared by test modules (fixtures live in conftest.py)."""

import numpy as np


def make_episode(T: int, tag: str = "task", image: bool = True, start: int = 0, terminal: bool = True):
    """A synthetic episode whose frame values encode their time index (so tests can check alignment)."""
    from wmrl.core.episode import build_episode

    obs = []
    for i in range(T + 1):
        o = {"observation.state": np.full(3, start + i, np.float32), "task": tag}
        if image:
            o["observation.images.front"] = np.full((8, 8, 3), (start + i) % 256, np.uint8)
        obs.append(o)
    return build_episode(obs, [np.full(2, start + i, np.float32) for i in range(T)], [float(i) for i in range(T)],
                         [terminal and i == T - 1 for i in range(T)], [(not terminal) and i == T - 1 for i in range(T)],
                         [terminal and i == T - 1 for i in range(T)], source="expert")


def tiny_wm_config(data, out, **kw):
    from world_models.video.train import TrainWMConfig

    base = dict(data=data, out=out, size="tiny", ae_steps=30, state_steps=20, dyn_steps=30, unroll_steps=6, batch_size=8,
                log_every=1, ckpt_every=1000, videos=0, holdout=0.25, overwrite=True)
    return TrainWMConfig(**{**base, **kw})


def tiny_vla(head="gaussian", **kw):
    from policies.vla import VLAConfig, VLAPolicy

    cfg = VLAConfig(head=head, vision_width=8, hidden=32, text_dim=8, task_vocab=["push", "the", "red", "cube"],
                    state_mean=[0.5] * 8, state_std=[2.0] * 8, action_mean=[0.1, 0.0, 0.0, 0.0],
                    action_std=[0.5, 0.5, 0.5, 1.0], **kw)
    return VLAPolicy(cfg)


def vla_obs(B=3, seed=0):
    rng = np.random.default_rng(seed)
    return {"observation.images.front": rng.integers(0, 255, (B, 64, 64, 3), dtype=np.uint8),
            "observation.images.wrist": rng.integers(0, 255, (B, 64, 64, 3), dtype=np.uint8),
            "observation.state": rng.normal(size=(B, 8)).astype(np.float32), "task": ["push the red cube"] * B}
