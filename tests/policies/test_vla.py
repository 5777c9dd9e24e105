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


def test_mirror_clones_every_episode_and_its_reflection_with_the_reflected_labels(tiny_data):
    from sim.tabletop.env import MIRROR_ACTION_SIGN, MIRROR_STATE_SIGN

    _, plain = load_replay([tiny_data], labels="expert")
    _, both = load_replay([tiny_data], labels="expert", mirror=True)
    assert both.num_episodes == 2 * plain.num_episodes and len(both) == 2 * len(plain)
    ids, pids = list(both.episodes), list(plain.episodes)
    for k, pid in enumerate(pids):
        ep, ref, want = both.get_episode(ids[2 * k]), both.get_episode(ids[2 * k + 1]), plain.get_episode(pid)
        np.testing.assert_array_equal(ep["action"], want["action"])  # the episode itself, as without --mirror
        np.testing.assert_array_equal(ref["observation.images.front"], want["observation.images.front"][:, :, ::-1])
        np.testing.assert_allclose(ref["observation.state"], want["observation.state"] * MIRROR_STATE_SIGN, rtol=0, atol=1e-6)
        # the expert's labels of the episode, reflected (the expert is exactly symmetric, README "mirror reflections")
        np.testing.assert_allclose(ref["action"], want["action"] * MIRROR_ACTION_SIGN, rtol=0, atol=1e-6)
        assert list(ref["task"]) == list(want["task"])


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


def test_temporal_ensembling_matches_acts_weights_on_a_hand_computed_queue():
    """ACT Sec. 3.3: a_t = sum_i w_i a^(s_i)_{t-s_i} / sum_i w_i, w_i = exp(-m i), i = 0 the oldest prediction."""
    from policies.vla.modeling import TemporalEnsembler

    m, H = 0.5, 3
    chunks = [torch.tensor([[[10.0 * s + j] for j in range(H)]]) for s in range(5)]  # a^(s)_j = 10 s + j
    ens = TemporalEnsembler(m, H)
    got = [ens.update(c).item() for c in chunks]
    w = np.exp(-m * np.arange(H))
    assert got[0] == pytest.approx(0.0)  # one prediction: a^(0)_0
    assert got[1] == pytest.approx((w[0] * 1 + w[1] * 10) / (w[0] + w[1]))  # a^(0)_1 (oldest), a^(1)_0
    assert got[2] == pytest.approx((w[0] * 2 + w[1] * 11 + w[2] * 20) / w.sum())
    assert got[4] == pytest.approx((w[0] * 22 + w[1] * 31 + w[2] * 40) / w.sum())  # a^(1) has run out
    # through the policy: a chunk is predicted every step, reset forgets the past predictions
    pol = _policy(n_action_steps=1, temporal_ensemble_coeff=m, chunk_size=H).eval()
    it = iter(chunks)
    pol.predict_action_chunk = lambda obs: next(it)
    assert [pol.select_action(_obs(1)).item() for _ in range(3)] == pytest.approx(got[:3])
    pol.reset()
    assert pol.select_action(_obs(1)).item() == pytest.approx(30.0)  # a^(3)_0 alone
    with pytest.raises(ValueError, match="needs n_action_steps=1"):
        _policy(n_action_steps=2, temporal_ensemble_coeff=0.01)


def test_random_shift_moves_the_coordinate_channels_with_the_image():
    """The augmentation keeps absolute positions consistent: a shifted image's CoordConv channels are shifted with it,
    so the encoder sees exactly the shifted concatenation (and nothing when the shift is 0)."""
    from policies.vla.modeling import random_shift

    enc = _policy().vision["front"]
    x = torch.rand(2, 3, 64, 64) * 2 - 1
    torch.manual_seed(3)
    got = enc(x, shift=4)
    torch.manual_seed(3)
    full = random_shift(torch.cat([x, enc.coords.expand(2, -1, -1, -1)], 1), 4)
    assert torch.allclose(got, enc.fc(enc.conv(full)))
    assert not torch.allclose(full[:, 3:], enc.coords.expand(2, -1, -1, -1))  # the coordinates did move
    assert torch.allclose(enc(x), enc.fc(enc.conv(torch.cat([x, enc.coords.expand(2, -1, -1, -1)], 1))))


def test_ema_and_learning_rate_schedule_by_hand():
    from policies.vla.bc import EMA, lr_factor

    lin = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(0.0)
    ema = EMA(lin, 0.9)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    ema.update(lin, 0)  # warm-up: d = min(0.9, 1/10) = 0.1
    assert ema.module.weight.item() == pytest.approx(0.9)
    ema.update(lin, 1000)  # d = 0.9
    assert ema.module.weight.item() == pytest.approx(0.9 * 0.9 + 0.1)
    assert [lr_factor(s, 10, 2, "cosine") for s in (0, 1, 2, 6, 10)] == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0])
    assert lr_factor(7, 10, 0, "constant") == 1.0
    with pytest.raises(ValueError, match="lr schedule"):
        lr_factor(0, 10, 0, "linear")
    with pytest.raises(ValueError, match="ema decay"):
        EMA(lin, 1.0)


def test_expert_labels_are_the_clean_experts_action_at_hand_checked_states():
    """Far above the cube the push expert rises/descends to hover height and travels to the point behind the cube
    (clipped to unit speed, gripper closed); the recorded (noisy) action is replaced, the rest is kept."""
    from sim.experts import expert_labels

    state = np.zeros((2, 8), np.float32)
    state[:, 5:8] = [[0.4, 0.3, 0.2], [0.4, 0.042, 0.031]]  # ee: far above / right behind the cube, low
    env_state = np.zeros((2, 13), np.float32)
    env_state[:, 0:3] = [0.4, 0.0, 0.02]  # red cube
    env_state[:, 9:13] = [0.4, -0.2, 0.6, 0.2]  # yellow zone straight ahead in -y, purple elsewhere
    ep = {"observation.state": state, "observation.environment_state": env_state,
          "task": ["push the red cube to the yellow zone"] * 2, "action": np.full((2, 4), 0.3, np.float32),
          "next.reward": np.array([0.0, 1.0], np.float32)}
    out = expert_labels(ep)
    assert out["action"][0] == pytest.approx([0.0, -1.0, -1.0, 1.0])
    # second: in contact behind the cube, pushes 1.5 cm along u = (0, -1) at grasp height (0.03): / EE_STEP 5 cm
    assert out["action"][1] == pytest.approx([0.0, -0.3, -0.02, 1.0], abs=1e-5)
    assert out["next.reward"] is ep["next.reward"] and ep["action"][0, 0] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="observation.environment_state"):
        expert_labels({k: v for k, v in ep.items() if k != "observation.environment_state"})


def test_dagger_records_the_learner_and_relabels_its_states_with_the_expert(tiny_data, tmp_path):
    import json

    from sim.tabletop.experts import expert_action
    from wmrl.datasets import LeRobotV3Dataset
    from wmrl.rl.dagger import DAggerConfig, round_dir

    base = dict(data=(tiny_data,), out=tmp_path / "run", steps=4, batch_size=4, ckpt_every=100, eval_episodes=0,
                num_envs=1, ema=0.9, warmup=2, schedule="cosine", n_action_steps=1,
                extra={"vision_width": 8, "hidden": 32, "text_dim": 8})
    r = train_policy(TrainPolicyConfig(**base, dagger=DAggerConfig(rounds=2, episodes=1, steps=3)), progress=False)
    assert r["steps"] == 10 and [d["round"] for d in r["dagger"]] == [0, 1]
    ds = LeRobotV3Dataset(round_dir(tmp_path / "run", 1))
    ep = ds.episode(0, decode=False)
    assert set(ep["policy_id"]) == {"dagger_round_1"}
    # the dataset keeps what the learner executed; the aggregate teaches the expert's action at those states
    _, replay = load_replay([round_dir(tmp_path / "run", 1)], labels="expert")
    got = replay.get_episode(0)
    want = np.stack([np.clip(expert_action(t, s, e, False), -1, 1) for t, s, e in
                     zip(got["task"], ep["observation.state"], ep["observation.environment_state"])])
    assert np.allclose(got["observation.state"], ep["observation.state"])
    assert np.allclose(got["action"], want, atol=1e-6)
    assert not np.allclose(ep["action"], want, atol=1e-3)  # the tiny learner is not the expert
    state = json.loads((tmp_path / "run/checkpoints/last/train_state.json").read_text())
    assert state["step"] == 10 and (tmp_path / "run/checkpoints/last/train_weights.safetensors").exists()
    with pytest.raises(ValueError, match="successful-only"):
        train_policy(TrainPolicyConfig(**{**base, "out": tmp_path / "r2"}, successful_only=True,
                                       dagger=DAggerConfig(rounds=1)), progress=False)


def test_privileged_auxiliary_loss_trains_a_head_that_acting_never_needs(tiny_data):
    torch.manual_seed(0)
    dss, replay = load_replay([tiny_data])
    cfg = VLAConfig.from_dataset(dss, vision_width=8, hidden=64, text_dim=8, aux_env_state=1.0)
    assert cfg.env_state_dim == 13 and len(cfg.env_state_std) == 13
    pol = VLAPolicy(cfg)
    batch = bc_batch(replay, 8, pol.cfg.chunk_size, pol.cfg.cameras)
    _, info0 = pol(batch)
    bc_train(pol, replay, steps=80, batch_size=16, lr=1e-3, progress=False)
    _, info1 = pol.train()(batch)
    assert info1["aux_env_state_mse"] < 0.5 * info0["aux_env_state_mse"]
    obs = {k: v for k, v in batch.items() if k not in ("action", "action_mask", "observation.environment_state")}
    assert pol.eval().predict_action_chunk(obs).shape == (8, 4, 4)  # acting reads no privileged state
    with pytest.raises(ValueError, match="observation.environment_state in the training batch"):
        pol.train()(obs | {"action": batch["action"]})
    with pytest.raises(ValueError, match="aux_env_state needs data"):
        _policy(aux_env_state=1.0)


def test_a_sampling_policy_acts_reproducibly_per_seed_whatever_else_drew_random_numbers(tiny_policy):
    """`make_policy(seed=...)` gives a stochastic VLA its own generator: two instances with the same seed sample the
    same actions even when torch's global generator was advanced in between (as an imagined evaluation before the
    true one does); another seed samples others."""
    import gymnasium as gym

    from policies.factory import make_policy
    from tests.helpers import vla_obs

    space = gym.spaces.Box(-1, 1, (4,))
    obs = vla_obs(B=2)
    a1 = make_policy("vla", space, path=str(tiny_policy), stochastic=True, seed=5).predict_action_chunk(obs)
    torch.randn(1000)
    a2 = make_policy("vla", space, path=str(tiny_policy), stochastic=True, seed=5).predict_action_chunk(obs)
    a3 = make_policy("vla", space, path=str(tiny_policy), stochastic=True, seed=6).predict_action_chunk(obs)
    torch.testing.assert_close(a1, a2)
    assert not torch.allclose(a1, a3)
    mean = make_policy("vla", space, path=str(tiny_policy), seed=5).predict_action_chunk(obs)
    assert not torch.allclose(a1, mean)  # it does sample


def test_action_noise_degrades_a_policy_on_the_translational_dims_only(tiny_policy):
    """`make_policy("vla", noise=s)` (rank spec FOLDER:noise=s): the mean action plus N(0, s^2) on the first three
    dims, clipped to the action box; the gripper and the noise-free policy are untouched; reproducible per seed."""
    import gymnasium as gym

    from policies.factory import make_policy
    from tests.helpers import vla_obs

    space = gym.spaces.Box(-1, 1, (4,))
    obs = vla_obs(B=64)
    mean = make_policy("vla", space, path=str(tiny_policy), seed=1).predict_action_chunk(obs)
    noisy = make_policy("vla", space, path=str(tiny_policy), seed=1, noise=0.2).predict_action_chunk(obs)
    again = make_policy("vla", space, path=str(tiny_policy), seed=1, noise=0.2).predict_action_chunk(obs)
    torch.testing.assert_close(noisy, again)
    torch.testing.assert_close(noisy[..., 3], mean[..., 3])
    inside = (mean[..., :3].abs() < 0.4)  # away from the box's edges, the clip does not bias the noise
    diff = (noisy[..., :3] - mean[..., :3])[inside]
    assert diff.numel() > 100 and abs(float(diff.std()) - 0.2) < 0.03 and abs(float(diff.mean())) < 0.03
    assert float(noisy[..., :3].abs().max()) <= 1.0  # clipped to the box
    with pytest.raises(ValueError, match="noise must be >= 0"):
        make_policy("vla", space, path=str(tiny_policy), noise=-0.1)
