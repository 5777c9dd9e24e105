"""Helpers shared by test modules (fixtures live in conftest.py)."""

import numpy as np
import torch


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
                change_mask_steps=10, change_mask_windows=4,
                # the older recipe (each later option has its own test; the demo's runs the defaults): no blobs, no
                # object sources, no heads refitted on rollouts, no reflected episodes
                frame_blobs=False, change_objects=False, change_pose_layer=False, head_rollout_steps=0, mirror=False,
                log_every=1, ckpt_every=1000, videos=0, holdout=0.25, overwrite=True)
    return TrainWMConfig(**{**base, **kw})


def tiny_vla(head="gaussian", seed=0, **kw):
    """A small VLA with the same weights on every machine and in every test order (the global RNG is left alone)."""
    from policies.vla import VLAConfig, VLAPolicy

    cfg = VLAConfig(head=head, vision_width=8, hidden=32, text_dim=8, task_vocab=["push", "the", "red", "cube"],
                    state_mean=[0.5] * 8, state_std=[2.0] * 8, action_mean=[0.1, 0.0, 0.0, 0.0],
                    action_std=[0.5, 0.5, 0.5, 1.0], **kw)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return VLAPolicy(cfg)


def vla_obs(B=3, seed=0):
    rng = np.random.default_rng(seed)
    return {"observation.images.front": rng.integers(0, 255, (B, 64, 64, 3), dtype=np.uint8),
            "observation.images.wrist": rng.integers(0, 255, (B, 64, 64, 3), dtype=np.uint8),
            "observation.state": rng.normal(size=(B, 8)).astype(np.float32), "task": ["push the red cube"] * B}


# ---- tiny LeRobot checkpoints (ACT, Diffusion Policy) in LeRobot's file layout, for the push-red env's spaces
IMG = {"type": "VISUAL", "shape": [3, 64, 64]}
STATE = {"type": "STATE", "shape": [8]}
OUT = {"action": {"type": "ACTION", "shape": [4]}}
ACTION_MEAN = torch.tensor([0.5, 0.0, 0.0, 1.0])  # with a zeroed output layer: +x at half speed, gripper closed


def lerobot_stats(mode: str = "MEAN_STD") -> dict:
    img = {"mean": torch.full((3, 1, 1), 0.4), "std": torch.full((3, 1, 1), 0.25)}
    if mode == "MEAN_STD":
        act = {"mean": ACTION_MEAN, "std": torch.tensor([0.3, 0.3, 0.3, 0.9])}
    else:  # MIN_MAX: a zero output is the middle of the range
        act = {"min": ACTION_MEAN - torch.tensor([0.2, 0.1, 0.1, 0.05]), "max": ACTION_MEAN + torch.tensor([0.2, 0.1, 0.1, 0.05])}
    return {"observation.images.front": img, "observation.images.wrist": dict(img),
            "observation.state": {"mean": torch.zeros(8), "std": torch.ones(8), "min": -torch.ones(8), "max": torch.ones(8)},
            "action": act}


def lerobot_act_config(images: bool = True, **kw) -> dict:
    feats = {"observation.images.front": IMG, "observation.images.wrist": IMG} if images else {
        "observation.environment_state": {"type": "ENV", "shape": [13]}}
    return {"type": "act", "input_features": {**feats, "observation.state": STATE}, "output_features": OUT,
            "normalization_mapping": {"VISUAL": "MEAN_STD", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
            "chunk_size": 8, "n_action_steps": 4, "dim_model": 32, "n_heads": 2, "dim_feedforward": 64,
            "n_encoder_layers": 1, "n_decoder_layers": 1, "n_vae_encoder_layers": 1, "latent_dim": 4, **kw}


def lerobot_dp_config(**kw) -> dict:
    return {"type": "diffusion", "input_features": {"observation.images.front": IMG, "observation.images.wrist": IMG,
                                                    "observation.state": STATE}, "output_features": OUT,
            "normalization_mapping": {"VISUAL": "MEAN_STD", "STATE": "MIN_MAX", "ACTION": "MIN_MAX"},
            "n_obs_steps": 2, "horizon": 8, "n_action_steps": 4, "down_dims": [16, 32], "kernel_size": 3, "n_groups": 4,
            "crop_shape": [56, 56], "spatial_softmax_num_keypoints": 4, "diffusion_step_embed_dim": 8,
            "use_group_norm": True, "use_separate_rgb_encoder_per_camera": False, "num_inference_steps": 4, **kw}


def write_tiny_lerobot(tmp_path, cls, config: dict, stats: dict, legacy: bool = False, zero_output: bool = False, name: str = "ck"):
    """A randomly initialised `cls` (ACTPolicy / DiffusionPolicy) written as a LeRobot checkpoint folder."""
    from policies.lerobot.common import write_lerobot_checkpoint

    torch.manual_seed(0)
    net = cls(config, stats)
    weights = {k: v for k, v in net.state_dict().items() if not k.startswith("normalizer.")}
    if zero_output:  # the network's normalised output is exactly 0: the action is what the statistics say
        for k in weights:
            if k.startswith(("model.action_head.", "diffusion.unet.final_conv.1.")):
                weights[k] = torch.zeros_like(weights[k])
    return write_lerobot_checkpoint(tmp_path / name, config, weights, stats, legacy=legacy)
