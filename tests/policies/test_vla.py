import numpy as np
import pytest
import torch

from policies.vla import VLAConfig, VLAPolicy
from policies.vla.bc import bc_batch, bc_train, load_replay
from tests.helpers import tiny_vla as _policy
from tests.helpers import vla_obs as _obs
from wmrl.commands.train_policy import TrainPolicyConfig, train_policy


def test_gaussian_log_prob_is_the_exact_density_in_environment_units():
    torch.manual_seed(0)
    pol = _policy()
    obs = _obs()
    a, lp = pol.sample(obs)
    assert a.shape == (3, 4, 4) and lp.shape == (3,)
    assert torch.allclose(pol.log_prob(obs, a), lp, atol=1e-4)  # recomputation matches the sampling-time value
    # by hand: N(mu, std) in normalised units, plus the Jacobian of the normalisation
    d = pol.dist(pol.features(obs))
    z = (a - pol.action_mean) / pol.action_std
    by_hand = (-0.5 * ((z - d.mean) / d.stddev) ** 2 - torch.log(d.stddev) - 0.5 * np.log(2 * np.pi)).sum((-1, -2))
    by_hand = by_hand - 4 * torch.log(pol.action_std).sum()
    assert torch.allclose(lp, by_hand, atol=1e-4)
    mask = torch.tensor([[1, 1, 0, 0]] * 3, dtype=torch.float32)
    assert torch.all(pol.log_prob(obs, a, mask) != lp)


def test_select_action_executes_chunks_from_a_queue():
    pol = _policy(n_action_steps=2).eval()
    obs = _obs()
    chunk = pol.predict_action_chunk(obs)
    a0, a1 = pol.select_action(obs), pol.select_action(obs)
    assert torch.allclose(a0, chunk[:, 0]) and torch.allclose(a1, chunk[:, 1])
    obs2 = _obs(seed=1)
    assert torch.allclose(pol.select_action(obs2), pol.predict_action_chunk(obs2)[:, 0])  # queue refilled
    pol.reset()
    assert len(pol._queue) == 0


@pytest.mark.parametrize("head", ["gaussian", "flow"])
def test_bc_loss_goes_down_and_checkpoint_round_trips(tiny_data, tmp_path, head):
    torch.manual_seed(0)
    dss, replay = load_replay([tiny_data])
    pol = VLAPolicy(VLAConfig.from_dataset(dss, head=head, vision_width=8, hidden=64, text_dim=8))
    batch = bc_batch(replay, 4, pol.cfg.chunk_size, pol.cfg.cameras)
    assert batch["action"].shape == (4, 4, 4) and batch["action_mask"].shape == (4, 4)
    r = bc_train(pol, replay, steps=120, batch_size=16, lr=1e-3, progress=False)
    assert r["loss_last"] < r["loss_first"] - (0.5 if head == "gaussian" else 0.1)
    pol.save(tmp_path / "ck")
    back = VLAPolicy.load(tmp_path / "ck").eval()
    obs = {k: v for k, v in batch.items() if k not in ("action", "action_mask")}
    assert torch.allclose(back.predict_action_chunk(obs), pol.eval().predict_action_chunk(obs))


def test_flow_head_has_no_log_prob_and_bad_spaces_are_refused():
    import gymnasium as gym

    pol = _policy(head="flow")
    with pytest.raises(ValueError, match="needs the gaussian head"):
        pol.log_prob(_obs(), torch.zeros(3, 4, 4))
    obs_space = gym.spaces.Dict({"observation.images.front": gym.spaces.Box(0, 255, (64, 64, 3), np.uint8),
                                 "observation.state": gym.spaces.Box(-1, 1, (8,))})
    with pytest.raises(ValueError, match="(?s)policy expects .* environment gives"):
        pol.check_spaces(obs_space, gym.spaces.Box(-1, 1, (4,)))
    with pytest.raises(ValueError, match="head: expected"):
        _policy(head="diffusion")


def test_unknown_instruction_words_are_warned_about():
    pol = _policy()
    with pytest.warns(UserWarning, match="outside the training vocabulary.*'blue'"):
        pol.features({**_obs(1), "task": ["push the blue cube"]})


def test_train_policy_resume_continues_from_the_checkpoint(tiny_data, tmp_path):
    base = dict(data=(tiny_data,), out=tmp_path / "run", steps=6, batch_size=4, ckpt_every=3, eval_episodes=0,
                extra={"vision_width": 8, "hidden": 32, "text_dim": 8})
    r = train_policy(TrainPolicyConfig(**base), progress=False)
    assert (tmp_path / "run/checkpoints/last/model.safetensors").exists() and r["steps"] == 6
    r2 = train_policy(TrainPolicyConfig(**{**base, "steps": 9, "resume": True}), progress=False)
    import json

    steps = [json.loads(l).get("step") for l in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert r2["steps"] == 9 and json.loads((tmp_path / "run/checkpoints/last/train_state.json").read_text())["step"] == 9
    assert 9 in steps
