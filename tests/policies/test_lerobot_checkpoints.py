"""LeRobot ACT and Diffusion Policy checkpoints, read without lerobot. The checkpoints are tiny, randomly
initialised, and written in LeRobot's file layout by this test code (both the processor-file layout of
lerobot >= 0.4 and the older one with normalisation buffers inside the weights)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import sim
from policies.factory import make_policy
from policies.lerobot.act import ACTPolicy
from policies.lerobot.common import read_lerobot_checkpoint
from policies.lerobot.diffusion import DiffusionPolicy
from sim.tabletop.env import EE_STEP
from tests.helpers import ACTION_MEAN, lerobot_act_config as _act_config, lerobot_dp_config as _dp_config
from tests.helpers import lerobot_stats as _stats, write_tiny_lerobot as _write
from wmrl.eval.loop import chunk_steps, evaluate

def _obs(seed: int = 0, n: int = 2) -> dict:
    env = sim.make_env("push-red")
    obs, _ = env.reset(seed=seed)
    env.close()
    return {k: np.stack([obs[k]] * n) for k in obs if k != "task"} | {"task": [obs["task"]] * n}


def test_parameter_names_are_lerobots():
    """The modules carry LeRobot's names (IntermediateLayerGetter's resnet without fc, FrozenBatchNorm without
    num_batches_tracked, nn.Sequential indices in Diffusion's encoder, the U-Net's transposed conv in every up
    stage), so real checkpoints load strictly."""
    act = {k: tuple(v.shape) for k, v in ACTPolicy(_act_config(), _stats()).state_dict().items()}
    for k in ("model.backbone.conv1.weight", "model.backbone.bn1.running_var", "model.backbone.layer2.0.downsample.0.weight",
              "model.backbone.layer4.1.bn2.bias", "model.encoder.layers.0.self_attn.in_proj_weight",
              "model.decoder.layers.0.multihead_attn.out_proj.weight", "model.decoder.norm.weight",
              "model.vae_encoder_cls_embed.weight", "model.vae_encoder_robot_state_input_proj.weight",
              "model.encoder_1d_feature_pos_embed.weight", "model.decoder_pos_embed.weight", "model.action_head.bias"):
        assert k in act, k
    assert act["model.vae_encoder_pos_enc"] == (1, 1 + 1 + 8, 32)  # [cls, state, 8 actions]
    assert act["model.encoder_img_feat_input_proj.weight"] == (32, 512, 1, 1)
    assert act["model.encoder_1d_feature_pos_embed.weight"] == (2, 32)  # latent, state
    assert not any("fc." in k or "num_batches_tracked" in k or k.startswith("model.encoder.norm") for k in act)
    dp = {k: tuple(v.shape) for k, v in DiffusionPolicy(_dp_config(), _stats("MIN_MAX")).state_dict().items()}
    for k in ("diffusion.rgb_encoder.backbone.0.weight", "diffusion.rgb_encoder.backbone.4.0.conv1.weight",
              "diffusion.rgb_encoder.backbone.7.1.bn2.weight", "diffusion.rgb_encoder.pool.nets.weight",
              "diffusion.rgb_encoder.pool.pos_grid", "diffusion.rgb_encoder.out.weight",
              "diffusion.unet.diffusion_step_encoder.1.weight", "diffusion.unet.diffusion_step_encoder.3.weight",
              "diffusion.unet.down_modules.0.0.conv1.block.0.weight", "diffusion.unet.down_modules.0.0.cond_encoder.1.weight",
              "diffusion.unet.down_modules.0.0.residual_conv.weight", "diffusion.unet.down_modules.0.2.weight",
              "diffusion.unet.mid_modules.1.conv2.block.1.weight", "diffusion.unet.up_modules.0.2.weight",
              "diffusion.unet.final_conv.0.block.0.weight", "diffusion.unet.final_conv.1.weight"):
        assert k in dp, k
    assert "diffusion.unet.down_modules.1.2.weight" not in dp  # the last down stage has no downsampling
    assert dp["diffusion.rgb_encoder.pool.pos_grid"] == (4, 2)  # 56 px crop -> a 2x2 feature map
    assert dp["diffusion.unet.down_modules.0.0.cond_encoder.1.weight"] == (32, 8 + 2 * (8 + 2 * 8))  # FiLM scale+bias
    assert dp["diffusion.rgb_encoder.backbone.1.weight"] == (64,)  # GroupNorm(64 / 16, 64)


@pytest.mark.parametrize("legacy", [False, True], ids=["processor-files", "buffers-in-weights"])
@pytest.mark.parametrize("kind", ["act", "diffusion"])
def test_statistics_are_read_from_either_layout_and_unnormalise_the_output(tmp_path, kind, legacy):
    """A zeroed output layer predicts 0 in normalised space, so the actions are the statistics' centre: the mean
    (ACT, MEAN_STD) or the middle of [min, max] (Diffusion, MIN_MAX; its sampler's last DDPM step returns the
    predicted sample, 0). Wrong or missing statistics would give anything else."""
    cls, cfg, stats = (ACTPolicy, _act_config(), _stats()) if kind == "act" else (
        DiffusionPolicy, _dp_config(prediction_type="sample"), _stats("MIN_MAX"))
    path = _write(tmp_path, cls, cfg, stats, legacy=legacy, zero_output=True)
    assert (path / "policy_preprocessor.json").exists() != legacy
    _, weights, read = read_lerobot_checkpoint(path, kind)
    assert not any(k.startswith(("normalize_inputs.", "unnormalize_outputs.")) for k in weights)
    torch.testing.assert_close(read["observation.images.front"]["std"], stats["observation.images.front"]["std"])
    policy = cls.load(path)
    chunk = policy.predict_action_chunk(_obs())
    assert chunk.shape == (2, 4 if kind == "diffusion" else 8, 4)
    torch.testing.assert_close(chunk, ACTION_MEAN.expand_as(chunk), atol=1e-5, rtol=0)


def test_a_loaded_act_checkpoint_drives_the_simulated_arm_as_its_statistics_say(tmp_path):
    """End to end through the registry and the evaluation loop: `--policy.type act --policy.path DIR` in the true
    simulator. The zeroed head's action is the mean (+0.5 in x), so the end-effector moves +x at about half the
    controller's step per control step, and not sideways."""
    path = _write(tmp_path, ACTPolicy, _act_config(), _stats(), zero_output=True)
    env = sim.make_env("push-red", max_episode_steps=6)
    policy = make_policy("act", env.action_space, path=str(path), observation_space=env.observation_space)
    res = evaluate(policy, env, 1, seed=3, record=True, progress=False)
    env.close()
    ee = np.asarray(res.episodes[0]["observation.state"])[:, 5:8]
    dx, dy = np.diff(ee[:, 0]), np.diff(ee[:, 1])
    assert np.all(dx[1:] > 0.2 * EE_STEP) and np.all(np.abs(dy) < 0.2 * EE_STEP)


def test_diffusion_keeps_an_observation_history_and_replans_every_n_action_steps(tmp_path):
    path = _write(tmp_path, DiffusionPolicy, _dp_config(), _stats("MIN_MAX"))
    policy = DiffusionPolicy.load(path, seed=0)
    calls = []  # the images (B, n_obs_steps, cameras, C, H, W) each sampling is conditioned on
    orig = policy.diffusion.global_cond
    policy.diffusion.global_cond = lambda *a: calls.append(a[2].clone()) or orig(*a)
    a, b = _obs(seed=0), _obs(seed=5)  # two layouts: different images
    policy.reset()
    for t in range(5):
        policy.select_action(a if t == 0 else b)
    assert len(calls) == 2  # steps 0 and 4: one chunk of n_action_steps = 4 between
    first, second = calls[0], calls[1]
    torch.testing.assert_close(first[:, 0], first[:, 1])  # after a reset the first observation fills the history
    torch.testing.assert_close(second[:, 0], second[:, 1])  # steps 3 and 4 both saw b
    assert not torch.equal(first[:, 1], second[:, 1])
    # never stepped by whole chunks: the history needs every observation
    assert chunk_steps(policy, type("V", (), {"max_chunk": 8})()) == 1
    act = ACTPolicy.load(_write(tmp_path, ACTPolicy, _act_config(), _stats(), name="act"))
    assert chunk_steps(act, type("V", (), {"max_chunk": 8})()) == 4


@pytest.mark.parametrize("kind", ["act", "diffusion"])
def test_lerobots_training_loss_decreases(tmp_path, kind):
    """`forward` is LeRobot's loss (ACT: L1 + KL of the CVAE; Diffusion: noise MSE): a few Adam steps on one
    fixed batch, with the same noise draws every step, lower it."""
    torch.manual_seed(0)
    if kind == "act":
        policy = ACTPolicy(_act_config(images=False), _stats())
        obs = _obs(n=8)
        batch = {"observation.state": obs["observation.state"], "observation.environment_state": obs["observation.environment_state"]}
        H = 8
    else:
        policy = DiffusionPolicy(_dp_config(crop_shape=[48, 48]), _stats("MIN_MAX"))
        batch = {k: v for k, v in _obs(n=8).items() if k != "task"}
        H = 8
    # one chunk for the 8 identical observations: a target the network can fit
    batch["action"] = np.repeat(np.random.default_rng(0).uniform(-1, 1, (1, H, 4)).astype(np.float32), 8, 0)
    policy.train()
    opt = torch.optim.Adam(policy.parameters(), 3e-3)
    losses = []
    for _ in range(30):
        torch.manual_seed(1)  # the same latent / timesteps / noise / crop every step
        loss, info = policy(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    assert ("kld_loss" in info) == (kind == "act")


def test_bad_checkpoints_and_environments_are_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match="not a LeRobot checkpoint folder"):
        ACTPolicy.load(tmp_path)
    path = _write(tmp_path, ACTPolicy, _act_config(), _stats())
    with pytest.raises(ValueError, match="describes a 'act' policy, not 'diffusion'; use --policy.type act"):
        DiffusionPolicy.load(path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "n_encoder_layers": 2}))  # the weights have one layer
    with pytest.raises(ValueError, match=r"(?s)do not fit the act network.*missing: \['model.encoder.layers.1"):
        ACTPolicy.load(path)
    (path / "config.json").write_text(json.dumps(cfg))
    pre = json.loads((path / "policy_preprocessor.json").read_text())
    pre["steps"][-1]["state_file"] = "../elsewhere.safetensors"
    (path / "policy_preprocessor.json").write_text(json.dumps(pre))
    with pytest.raises(ValueError, match="leaves the checkpoint folder"):
        ACTPolicy.load(path)
    ok = _write(tmp_path, ACTPolicy, _act_config(images=False), _stats(), name="state-only")
    env = sim.make_env("push-red")  # 4-D actions, but the checkpoint wants a 7-D action space
    with pytest.raises(ValueError, match="checkpoint and environment do not match"):
        make_policy("act", __import__("gymnasium").spaces.Box(-1, 1, (7,)), path=str(ok), observation_space=env.observation_space)
    env.close()
    policy = ACTPolicy.load(ok)
    bad = _obs()
    bad["observation.state"] = bad["observation.state"][:, :5]
    with pytest.raises(ValueError, match=r"observation.state: expected \(B, 8\)"):
        policy.predict_action_chunk(bad)
    with pytest.raises(ValueError, match="needs a LeRobot checkpoint"):
        make_policy("diffusion", env.action_space)


def test_rl_in_imagination_refuses_a_lerobot_checkpoint_with_the_reason(tmp_path, lerobot_checkpoints):
    from wmrl.rl.imagine import ImagineConfig, imagine

    with pytest.raises(ValueError, match="LeRobot act checkpoint: grpo needs an exact action log-probability"):
        imagine(ImagineConfig(policy=lerobot_checkpoints["act"], world_model=tmp_path / "wm", out=tmp_path / "rl"),
                progress=False)
    assert not (tmp_path / "rl").exists()  # refused before a run folder was made
