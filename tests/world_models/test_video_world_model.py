import json
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import EDMEulerScheduler
from gymnasium.utils.env_checker import check_env

from policies.random_policy import RandomPolicy
from wmrl.commands.collect import CollectConfig, collect
from wmrl.eval import evaluate
from world_models.env import WorldModelEnv, WorldModelSingleEnv
from world_models.edm import edm_coefficients
from world_models.video.model import VideoWorldModel, WorldModelConfig
from tests.conftest import tiny_wm_config
from world_models.video.train import TrainWMConfig, load_split, train_world_model

VOCAB = ["push", "the", "red", "cube", "to", "yellow", "purple", "zone"]


@pytest.mark.parametrize("sigma", [0.002, 0.1, 0.7, 5.0])
@pytest.mark.parametrize("sigma_data", [0.5, 1.0])
def test_edm_coefficients_match_the_scheduler(sigma, sigma_data):
    sched = EDMEulerScheduler(sigma_data=sigma_data, prediction_type="epsilon")
    s = torch.tensor(sigma)
    x, f = torch.randn(5), torch.randn(5)
    c_skip, c_out, c_in, c_noise = edm_coefficients(s, sigma_data)
    assert torch.allclose(sched.precondition_outputs(x, f, s), c_skip * x + c_out * f)
    assert torch.allclose(sched.precondition_inputs(x, s), c_in * x)
    assert torch.allclose(sched.precondition_noise(s), c_noise)


def _cfg(data, out, **kw):
    return tiny_wm_config(data, out, **kw)


def _losses(run: Path, key: str) -> dict[int, float]:
    recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in recs if key in r and "step" in r}


def test_training_losses_go_down(trained):
    ae = list(_losses(trained, "ae_loss").values())
    dyn = list(_losses(trained, "dyn_loss").values())
    assert np.mean(ae[-5:]) < 0.7 * np.mean(ae[:5])
    assert np.mean(dyn[-5:]) < np.mean(dyn[:5])
    assert (trained / "videos" / "real_vs_imagined.gif").exists()
    assert (trained / "checkpoints/last/model.safetensors").exists()


def test_resume_reproduces_the_next_loss(tiny_data, tmp_path):
    full = tmp_path / "full"
    train_world_model(_cfg(tiny_data, full, ae_steps=6, dyn_steps=8, cls_steps=0), progress=False)
    part = tmp_path / "part"
    train_world_model(_cfg(tiny_data, part, ae_steps=6, dyn_steps=4, cls_steps=0), progress=False)  # "interrupted"
    train_world_model(_cfg(tiny_data, part, ae_steps=6, dyn_steps=8, cls_steps=0, overwrite=False, resume=True),
                      progress=False)
    a, b = _losses(full, "dyn_loss"), _losses(part, "dyn_loss")
    assert np.isclose(a[11], b[11], rtol=1e-5) and np.isclose(a[14], b[14], rtol=1e-4)


def test_checkpoint_from_another_config_is_refused(trained):
    cfg = VideoWorldModel.load(trained / "checkpoints/last").cfg
    other = WorldModelConfig(**{**cfg.__dict__, "chunk": cfg.chunk + 1})
    with pytest.raises(ValueError, match="checkpoint config differs.*chunk"):
        VideoWorldModel.load(trained / "checkpoints/last", expect=other)


def test_world_model_env_contract_and_kir(trained, tiny_data):
    model = VideoWorldModel.load(trained / "checkpoints/last")
    _, train, held = load_split(tiny_data, 0.25)
    env = WorldModelSingleEnv(model, held, max_episode_steps=6)
    check_env(env, skip_render_check=True)
    venv = WorldModelEnv(model, held, num_envs=3, keyframe_prob=1.0, max_episode_steps=8)
    obs, info = venv.reset(seed=0)
    assert info["keyframe"].all()
    for i, s in enumerate(venv.start_info):
        lo, T = held.episodes[s["episode"]]
        assert 0 < s["frame"] < T - 1 or s["frame"] == model.cfg.context - 1
        real = held.data["observation.images.front"][lo + s["frame"]]
        assert np.array_equal(obs["observation.images.front"][i], real)  # the start frame is the real keyframe
    assert obs["observation.images.front"].shape == (3, 64, 64, 3)
    o2, r, term, trunc, inf = venv.step(np.zeros((3, 2, 4), np.float32))  # a chunk of 2 actions
    assert r.shape == (3,) and inf["success_prob"].shape == (3,)
    venv._needs_reset[1] = True  # a finished env autoresets on the next step, the others continue
    venv.step(np.zeros((3, 4), np.float32))
    assert venv._t[1] == 0 and venv._t[0] == 3
    with pytest.raises(ValueError, match="actions: expected"):
        venv.step(np.zeros((3, model.cfg.chunk + 1, 4), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        venv.step(np.full((3, 4), np.nan, np.float32))
    res = evaluate(RandomPolicy(venv.single_action_space), WorldModelEnv(model, held, num_envs=2, max_episode_steps=8),
                   3, seed=1, progress=False)  # the evaluation loop runs in imagination unchanged
    assert len(res.per_episode) == 3 and all(r["length"] <= 8 for r in res.per_episode)


def test_dataset_without_cameras_is_refused(tmp_path):
    from wmrl.core.episode import build_episode, features_for
    from wmrl.datasets import LeRobotV3Writer, write_episode

    obs = [{"observation.state": np.zeros(8, np.float32), "task": "push the red cube"} for _ in range(4)]
    ep = build_episode(obs, [np.zeros(4, np.float32)] * 3, [0.0] * 3, [False] * 3, [False, False, True], [False] * 3)
    w = LeRobotV3Writer(tmp_path / "d", fps=10, features=features_for(ep))
    write_episode(w, ep)
    with pytest.raises(ValueError, match="lacks .*observation.images.front.*it has"):
        load_split(tmp_path / "d", 0.1)


def test_success_head_separates_success_from_near_success():
    """Toy latents: a success frame has a blob inside a target square, a near-success frame just outside it."""
    torch.manual_seed(0)
    cfg = WorldModelConfig(size="tiny", task_vocab=VOCAB)
    model = VideoWorldModel(cfg)
    opt = torch.optim.Adam(model.heads.parameters(), 3e-3)

    def batch(n):
        z = torch.randn(n, cfg.frame_channels, 16, 16) * 0.3
        succ = torch.rand(n) < 0.5
        for i in range(n):
            x = int(torch.randint(6, 10, ()).item()) if succ[i] else int(torch.randint(11, 14, ()).item())
            z[i, 0, 7:9, x : x + 2] += 3.0
        return z, succ.float()

    for _ in range(150):
        z, y = batch(64)
        labels = {"state": torch.zeros(64, 8), "success": y, "reward": y, "done": y}
        loss, _ = model.heads_loss(z, ["push the red cube to the yellow zone"] * 64, labels, torch.ones(64), noise=0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    z, y = batch(400)
    with torch.no_grad():
        p = torch.sigmoid(model.heads(z, model.task(["push the red cube to the yellow zone"] * 400))["success_logit"])
    pos, neg = p[y == 1], p[y == 0]
    auroc = (pos[:, None] > neg[None, :]).float().mean().item()
    assert auroc > 0.95


def test_action_chunk_validation():
    model = VideoWorldModel(WorldModelConfig(size="tiny", task_vocab=VOCAB))
    state = {"ctx": torch.zeros(2, 2, 8, 16, 16), "proprio": torch.zeros(2, 8), "task": ["push the red cube"] * 2}
    with pytest.raises(ValueError, match="action_chunk: expected"):
        model.step(state, torch.zeros(2, 5, 4))
    with pytest.raises(ValueError, match="action_chunk: expected"):
        model.step(state, torch.zeros(2, 2, 3))
    _, preds = model.step(state, torch.zeros(2, 3, 4), steps=1)
    assert preds["latents"].shape == (2, 3, 8, 16, 16) and preds["success"].shape == (2, 3)


def test_autoencoder_weights_favour_pixels_that_differ_from_the_mean_frame():
    from world_models.video.train import ae_weights

    x = -torch.ones(2 * 4, 3, 8, 8)  # 2 cameras x 4 frames of flat background
    x[1, :, 2, 3] = 1.0  # camera 0, frame 1: one bright "cube" pixel
    w = ae_weights(x, n_cameras=2, fg_weight=3.0)
    assert w.shape == (8, 1, 8, 8)
    assert abs(w.mean().item() - 1.0) < 1e-6
    assert w[1, 0, 2, 3] > 3 * w[1, 0, 0, 0]
    assert torch.allclose(w[4:], w[4, 0, 0, 0].expand_as(w[4:]))  # the other camera is all background
