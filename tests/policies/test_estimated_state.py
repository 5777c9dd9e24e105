"""The two-stage pixel policy: the estimator learns positions from pixels, the actor acts from its estimate only,
the checkpoint round-trips, `wmrl train-policy --type estimated-state` trains and refuses what it cannot do."""

import numpy as np
import pytest
import torch

from policies.estimated_state import EstimatedStateConfig, EstimatedStatePolicy
from policies.estimated_state.train import dataset_frames, fit_actor, fit_estimator, position_error_cm


def _marker_frames(n, rng):
    """A bright square whose image position is the red cube's xy (everything else zero)."""
    E = np.zeros((n, 13), np.float32)
    E[:, :2] = rng.uniform(-0.2, 0.2, (n, 2))
    img = np.zeros((n, 64, 64, 3), np.uint8)
    for i, (x, y) in enumerate(E[:, :2]):
        r, c = int(32 + 120 * y), int(32 + 120 * x)
        img[i, r - 3 : r + 3, c - 3 : c + 3] = 255
    return {"images": {"front": img}, "observation.state": rng.normal(size=(n, 8)).astype(np.float32),
            "observation.environment_state": E}


def _tiny(**kw):
    return EstimatedStatePolicy(EstimatedStateConfig(cameras=("front",), width=8, hidden=32, layers=2, **kw))


def test_estimator_reads_positions_from_pixels_and_the_actor_learns_from_its_estimate():
    rng = np.random.default_rng(0)
    train, held = _marker_frames(600, rng), _marker_frames(100, rng)
    torch.manual_seed(0)
    policy = _tiny()
    policy.estimator.set_statistics(train["observation.state"], train["observation.environment_state"])
    log = fit_estimator(policy.estimator, train, held, steps=300, log_every=150)
    before = position_error_cm(np.zeros((100, 13), np.float32), held["observation.environment_state"])
    assert [x["step"] for x in log] == [150, 300]
    assert log[-1]["cubes_xy_cm"] < 0.4 * before["cubes_xy_cm"]  # 3 cubes averaged: only one moves here
    # the actor: a label that is a function of the cube's position, learned from the estimate
    est = policy.estimator.estimate(train["images"], train["observation.state"])
    labels = np.zeros((600, 4), np.float32)
    labels[:, :2] = np.clip(4 * train["observation.environment_state"][:, :2], -1, 1)
    mse = fit_actor(policy, train["observation.state"], est, None, labels, steps=400)
    assert mse < 0.5 * labels.var(0).sum() / 4
    obs = {"observation.state": held["observation.state"][:3], "observation.images.front": held["images"]["front"][:3]}
    a = policy.select_action(obs)
    np.testing.assert_allclose(a, policy.act_from_estimate(obs["observation.state"], policy.estimator.estimate(
        {"front": held["images"]["front"][:3]}, held["observation.state"][:3]), None), atol=1e-6)
    # acting never reads the object channel: a wrong one changes nothing
    np.testing.assert_array_equal(policy.select_action({**obs, "observation.environment_state": np.full((3, 13), 9.0)}), a)
    assert policy.predict_action_chunk(obs).shape == (3, 1, 4)
    # forward: both stages' losses on one batch; the actor's gradient does not reach the estimator through the estimate
    batch = {**obs, "observation.environment_state": held["observation.environment_state"][:3], "action": labels[:3]}
    policy.zero_grad()
    loss, info = policy(batch)
    assert torch.isclose(loss, torch.tensor(info["estimator_mse"] + info["actor_mse"]), rtol=1e-5)
    loss.backward()
    assert all(p.grad is not None for p in policy.actor.parameters())
    both = [p.grad.clone() for p in policy.estimator.parameters()]
    policy.zero_grad()
    policy.estimator.loss({"front": torch.as_tensor(obs["observation.images.front"])},
                          torch.as_tensor(obs["observation.state"]),
                          torch.as_tensor(batch["observation.environment_state"])).backward()
    for a, b in zip(both, (p.grad for p in policy.estimator.parameters())):
        torch.testing.assert_close(a, b)  # the estimator's gradient is its own loss's alone


def test_checkpoint_round_trip_and_bad_input(tmp_path):
    rng = np.random.default_rng(1)
    frames = _marker_frames(8, rng)
    policy = _tiny()
    policy.estimator.set_statistics(frames["observation.state"], frames["observation.environment_state"])
    policy.save(tmp_path / "ck")
    loaded = EstimatedStatePolicy.load(tmp_path / "ck")
    obs = {"observation.state": frames["observation.state"][:2], "observation.images.front": frames["images"]["front"][:2]}
    np.testing.assert_allclose(loaded.select_action(obs), policy.eval().select_action(obs), atol=1e-6)
    torch.testing.assert_close(loaded.estimator.env_std, policy.estimator.env_std)  # the statistics travel in the config
    with pytest.raises(ValueError, match="observation lacks"):
        loaded.select_action({"observation.state": obs["observation.state"]})
    with pytest.raises(ValueError, match="do not match"):
        import gymnasium as gym

        loaded.check_spaces(gym.spaces.Dict({"observation.state": gym.spaces.Box(-1, 1, (8,))}), gym.spaces.Box(-1, 1, (4,)))
    with pytest.raises(ValueError, match="estimate_noise: expected 13"):
        EstimatedStateConfig(estimate_noise=[0.01] * 3).validate()
    (tmp_path / "ck" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError):
        EstimatedStatePolicy.load(tmp_path / "ck")


def test_train_policy_estimated_state_on_a_dataset(tiny_data, tiny_estimated_state, tmp_path):
    from policies.factory import make_policy
    from wmrl.commands.train_policy import TrainPolicyConfig, train_policy

    frames, held, tasks = dataset_frames([tiny_data], holdout_episodes=2)
    assert held is not None and len(held["observation.state"]) > 0 and tasks
    # DART labels: the clean expert's action at each recorded frame, not the noisy recorded one
    from sim.experts import expert_action

    i = int(np.flatnonzero(frames["has_action"])[3])
    want = expert_action(frames["task"][i], frames["observation.state"][i], frames["observation.environment_state"][i], False)
    np.testing.assert_allclose(frames["action"][i], want, atol=1e-5)
    import gymnasium as gym

    policy = make_policy("estimated-state", gym.spaces.Box(-1, 1, (4,), np.float32), path=str(tiny_estimated_state))
    assert policy.cfg.tasks == ["push-red"] and policy.cfg.width == 8
    assert {"purple", "yellow"} <= set(policy.cfg.task_vocab)  # the words that name the zone reach the actor
    assert (tiny_estimated_state / "metrics.jsonl").exists()
    for bad, match in ((dict(successful_only=True), "successful-only"), (dict(estimator_steps=0), "estimator-steps"),
                       (dict(extra={"mirror": "1.5"}), r"mirror.*\[0, 1\]"),
                       (dict(extra={"mirror_actor": "maybe"}), "mirror_actor: expected true or false"),
                       (dict(mirror=True), "--extra mirror SHARE")):
        with pytest.raises(ValueError, match=match):
            train_policy(TrainPolicyConfig(data=(tiny_data,), out=tmp_path / "x", type="estimated-state", **bad),
                         progress=False)
        assert not (tmp_path / "x").exists()  # refused before a run folder is made
    r = train_policy(TrainPolicyConfig(data=(tiny_data,), out=tmp_path / "m", type="estimated-state", steps=2,
                                       estimator_steps=2, eval_episodes=0,
                                       extra={"width": 8, "hidden": 16, "layers": 1, "holdout_episodes": 2,
                                              "mirror": "0.5", "mirror_actor": "true"}), progress=False)
    assert (r["mirror"], r["mirror_actor"]) == (0.5, True)
    assert r["instructions"] == dataset_frames([tiny_data])[2]  # the data's instructions, once each (what is evaluated)
    with pytest.raises(ValueError, match="--type"):
        train_policy(TrainPolicyConfig(data=(tiny_data,), out=tmp_path / "y", type="act"), progress=False)


def test_gaussian_actor_sigma_is_the_residual_rms_and_log_prob_is_exact():
    """fit_actor sets sigma to the per-dimension RMS of the residual (labels = a learnable mean + known noise);
    `sample`'s log-probability equals `log_prob` and the Normal density written out by hand."""
    rng = np.random.default_rng(0)
    n = 4000
    state, env = rng.normal(size=(n, 8)).astype(np.float32), rng.normal(size=(n, 13)).astype(np.float32)
    noise_std = np.array([0.05, 0.1, 0.2, 0.02], np.float32)
    labels = (0.3 * np.tanh(state[:, :4]) + rng.normal(size=(n, 4)) * noise_std).astype(np.float32)
    policy = EstimatedStatePolicy(EstimatedStateConfig(cameras=(), hidden=64, layers=2))
    fit_actor(policy, state, env, None, labels, steps=1500)
    with torch.no_grad():
        resid = policy.actor.mu(torch.as_tensor(policy.actor_input(state, env, None))) - torch.as_tensor(labels)
    torch.testing.assert_close(policy.log_std.detach(), 0.5 * torch.log((resid**2).mean(0)))
    # where the noise dominates the fit's own error, sigma recovers it
    np.testing.assert_allclose(policy.log_std.exp().detach().numpy()[:3], noise_std[:3], rtol=0.25)
    obs = {"observation.state": state[:5], "observation.environment_state": env[:5]}
    torch.manual_seed(0)
    a, lp = policy.sample(obs)
    assert a.shape == (5, 1, 4) and lp.shape == (5,)
    torch.testing.assert_close(policy.log_prob(obs, a), lp)
    mu = torch.as_tensor(policy.select_action(obs))  # acting: the mean
    sd = policy.log_std.exp()
    hand = (-0.5 * ((a[:, 0] - mu) / sd) ** 2 - torch.log(sd) - 0.5 * np.log(2 * np.pi)).sum(-1)
    torch.testing.assert_close(lp.detach(), hand.detach(), atol=1e-4, rtol=1e-5)
    policy.stochastic = True
    assert not np.allclose(policy.select_action(obs), mu.numpy())
    policy.zero_grad(set_to_none=True)
    v = policy.value(obs)  # PPO's baseline: one value per observation, trained through its own parameters only
    v.sum().backward()
    assert v.shape == (5,) and all(p.grad is not None for p in policy.critic.parameters())
    assert all(p.grad is None for p in policy.actor.parameters())


def test_residual_actor_starts_as_the_base_learns_alone_and_round_trips(tmp_path):
    """ResiP's residual: zero-initialised, so the policy acts exactly as before; RL steps move the residual (and
    sigma) toward better actions while the behaviour-cloned base stays bit for bit; the checkpoint keeps it."""
    torch.manual_seed(0)
    policy = EstimatedStatePolicy(EstimatedStateConfig(cameras=(), hidden=32, layers=2))
    rng = np.random.default_rng(0)
    obs = {"observation.state": rng.normal(size=(64, 8)).astype(np.float32),
           "observation.environment_state": rng.normal(size=(64, 13)).astype(np.float32)}
    before = policy.select_action(obs)
    base = {k: v.clone() for k, v in policy.actor.state_dict().items()}
    policy.add_residual(hidden=16, scale=0.2)
    np.testing.assert_array_equal(policy.select_action(obs), before)
    with pytest.raises(ValueError, match="already has a residual"):
        policy.add_residual()
    # policy-gradient-like steps toward a target action: only the residual and sigma learn
    target = torch.as_tensor(before + np.array([0.1, -0.1, 0.05, 0.0], np.float32))[:, None]
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], 1e-2)
    for _ in range(200):
        loss = -policy.log_prob(obs, target).mean()
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is None for p in policy.actor.parameters())
        opt.step()
    for k, v in policy.actor.state_dict().items():
        torch.testing.assert_close(v, base[k], rtol=0, atol=0)
    moved = policy.select_action(obs) - before
    np.testing.assert_allclose(moved.mean(0), [0.1, -0.1, 0.05, 0.0], atol=0.02)
    policy.save(tmp_path / "res")
    again = EstimatedStatePolicy.load(tmp_path / "res")
    assert again.cfg.residual_hidden == 16 and again.cfg.residual_scale == 0.2
    np.testing.assert_array_equal(again.select_action(obs), policy.select_action(obs))
    assert not any(p.requires_grad for p in again.actor.parameters())  # loaded for more RL: the base stays frozen
    with pytest.raises(ValueError, match="residual"):
        EstimatedStatePolicy(EstimatedStateConfig(cameras=(), residual_hidden=8, residual_scale=0.0))


def test_what_the_actor_reads_without_cameras_and_in_imagination():
    """No cameras: the actor reads the object channel. A camera policy reads its cameras, unless set to act in
    imagination (`read_object_channel`), where it reads the world model's object channel and needs no images."""
    import gymnasium as gym

    rng = np.random.default_rng(2)
    frames = _marker_frames(4, rng)
    obs = {"observation.state": frames["observation.state"], "observation.images.front": frames["images"]["front"],
           "observation.environment_state": frames["observation.environment_state"]}
    moved = {**obs, "observation.environment_state": obs["observation.environment_state"] + 0.5}
    blind = EstimatedStatePolicy(EstimatedStateConfig(cameras=(), hidden=32, layers=2))
    assert not np.allclose(blind.select_action(obs), blind.select_action(moved))
    with pytest.raises(ValueError, match="observation.environment_state"):
        blind.select_action({"observation.state": obs["observation.state"]})
    box = gym.spaces.Box(-1, 1, (4,))
    with pytest.raises(ValueError, match="do not match"):  # a camera-only env lacks what it reads
        blind.check_spaces(gym.spaces.Dict({"observation.state": gym.spaces.Box(-1, 1, (8,)),
                                            "observation.images.front": gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)}), box)
    seeing = _tiny()
    np.testing.assert_array_equal(seeing.select_action(obs), seeing.select_action(moved))
    seeing.read_object_channel = True
    no_images = {k: v for k, v in obs.items() if not k.startswith("observation.images")}
    assert not np.allclose(seeing.select_action(no_images), seeing.select_action(
        {**no_images, "observation.environment_state": moved["observation.environment_state"]}))


def test_built_by_name_it_acts_with_noise_and_sampling_from_its_own_seeded_generator(tmp_path):
    """`make_policy("estimated-state", noise=X, stochastic=..., seed=...)`: the ranking population's degraded copies.
    Noise moves only the translational dims (clamped to the action box), by about X; the same seed gives the same
    actions whatever drew from torch's global generator in between."""
    import gymnasium as gym

    from policies.factory import make_policy

    EstimatedStatePolicy(EstimatedStateConfig(cameras=(), hidden=32, layers=2)).save(tmp_path / "p")
    space = gym.spaces.Dict({"observation.state": gym.spaces.Box(-9, 9, (8,)),
                             "observation.environment_state": gym.spaces.Box(-9, 9, (13,))})
    box = gym.spaces.Box(-1, 1, (4,))
    rng = np.random.default_rng(0)
    obs = {"observation.state": rng.normal(size=(2000, 8)).astype(np.float32) * 0.1,
           "observation.environment_state": rng.normal(size=(2000, 13)).astype(np.float32) * 0.1}

    def build(**kw):
        return make_policy("estimated-state", box, path=tmp_path / "p", observation_space=space, **kw)

    clean = build().select_action(obs)
    noisy = build(noise=0.2, seed=3).select_action(obs)
    d = noisy - clean
    np.testing.assert_array_equal(d[:, 3], 0.0)  # the gripper is left alone
    assert np.abs(noisy).max() <= 1.0
    inside = np.all(np.abs(clean[:, :3]) < 0.4, 1)  # away from the box's edges, the noise is the std asked for
    np.testing.assert_allclose(d[inside, :3].std(0), 0.2, rtol=0.1)
    torch.manual_seed(123)
    again = build(noise=0.2, seed=3).select_action(obs)
    np.testing.assert_array_equal(again, noisy)
    assert not np.allclose(build(noise=0.2, seed=4).select_action(obs), noisy)
    s1, s2 = build(stochastic=True, seed=5).select_action(obs), build(stochastic=True, seed=5).select_action(obs)
    np.testing.assert_array_equal(s1, s2)
    assert not np.allclose(s1, clean)
    with pytest.raises(ValueError, match=">= 0"):
        build(noise=-0.1)


def test_actor_reads_only_its_state_dims_and_the_checkpoint_keeps_them(tmp_path):
    """With `actor_state_dims` the actor ignores the other proprioceptive dimensions (the joint angles a world model
    reads back from generated frames) and still reacts to the ones it keeps; bad indices are refused."""
    rng = np.random.default_rng(3)
    obs = {"observation.state": rng.normal(size=(4, 8)).astype(np.float32),
           "observation.environment_state": rng.normal(size=(4, 13)).astype(np.float32)}
    joints = {**obs, "observation.state": obs["observation.state"] + np.r_[np.ones(4), np.zeros(4)].astype(np.float32)}
    ee = {**obs, "observation.state": obs["observation.state"] + np.r_[np.zeros(5), np.ones(3)].astype(np.float32)}
    torch.manual_seed(0)
    ee_only = EstimatedStatePolicy(EstimatedStateConfig(cameras=(), hidden=32, layers=2, actor_state_dims=[4, 5, 6, 7]))
    np.testing.assert_array_equal(ee_only.select_action(obs), ee_only.select_action(joints))
    assert not np.allclose(ee_only.select_action(obs), ee_only.select_action(ee))
    torch.manual_seed(0)
    every = EstimatedStatePolicy(EstimatedStateConfig(cameras=(), hidden=32, layers=2))
    assert not np.allclose(every.select_action(obs), every.select_action(joints))
    ee_only.save(tmp_path / "p")
    back = EstimatedStatePolicy.load(tmp_path / "p")
    assert back.cfg.actor_state_dims == [4, 5, 6, 7]
    np.testing.assert_array_equal(back.select_action(joints), ee_only.select_action(obs))
    with pytest.raises(ValueError, match="actor_state_dims"):
        EstimatedStateConfig(actor_state_dims=[8]).validate()


def test_the_estimate_noise_scale_ignores_the_frames_where_a_cube_left_the_table():
    """`robust_std`: the std of Gaussian errors, unmoved by a few huge ones (a cube off the table reads z ~ -1 m)."""
    from policies.estimated_state.train import robust_std

    rng = np.random.default_rng(0)
    err = rng.normal(0.0, 0.01, (4000, 2))
    assert robust_std(err) == pytest.approx([0.01, 0.01], rel=0.05)
    err[:80, 1] = -1.0  # 2% of frames: the cube fell off the table
    assert err[:, 1].std() > 0.1  # the plain std is ruled by them
    assert robust_std(err)[1] == pytest.approx(0.01, rel=0.1)


def test_a_cube_fallen_off_the_table_is_neither_regressed_nor_scaled_by_nor_counted():
    """A pushed cube that leaves the table falls without end (z metres below it within seconds, unseen): the
    estimator's statistics, its loss, its held-out error and its noise scale ignore that cube's values, and the
    actor reads it at the table's edge."""
    from policies.estimated_state.train import robust_std
    from wmrl.core.arm import OFF_TABLE_Z, clip_to_table, cubes_on_table, on_table_mask

    rng = np.random.default_rng(0)
    E = np.zeros((200, 13), np.float32)
    E[:, :9] = rng.normal(0, 0.1, (200, 9))
    E[:, 0:9:3] += 0.35  # x, y well inside the table's extent
    E[:, 2:9:3] = 0.02  # every cube resting on the table
    E[:4, :3] = [[-3.0, 5.0, -40.0]]  # the red cube fell in 4 frames
    E[4, 5] = OFF_TABLE_Z  # exactly at the threshold: off
    assert cubes_on_table(E[:6]).tolist() == [[False, True, True]] * 4 + [[True, False, True], [True, True, True]]
    mask = on_table_mask(E)
    assert mask[:4, :3].sum() == 0 and mask[4, 3:6].sum() == 0 and mask.sum() == 200 * 13 - 4 * 3 - 3
    np.testing.assert_allclose(clip_to_table(E[:1])[0, :3], [-0.1, 0.45, OFF_TABLE_Z])
    np.testing.assert_array_equal(clip_to_table(E[5:]), E[5:])  # on the table: unchanged

    est = _tiny().estimator
    est.set_statistics(rng.normal(size=(200, 8)), E)
    keep = np.arange(4, 200)  # the red cube is on the table from frame 4
    np.testing.assert_allclose(est.env_mean[:2].numpy(), E[keep, :2].mean(0), atol=1e-6)
    np.testing.assert_allclose(est.env_std[0].numpy(), E[keep, 0].std(ddof=1) + 1e-3, rtol=1e-5)
    # the loss: where the fallen cube is does not matter, the cubes on the table do
    pred = torch.zeros(6, 13)
    loss = est.standardised_loss(pred, torch.as_tensor(E[:6]))
    far = E[:6].copy()
    far[:4, :3] = [[9.0, -9.0, -500.0]]
    assert est.standardised_loss(pred, torch.as_tensor(far)).item() == pytest.approx(loss.item(), rel=1e-6)
    moved = E[:6].copy()
    moved[:4, 3] += 0.1
    assert est.standardised_loss(pred, torch.as_tensor(moved)).item() > loss.item()
    # ablation: the earlier estimator regressed the fall
    est.mask_off_table = False
    assert est.standardised_loss(pred, torch.as_tensor(far)).item() > 100 * loss.item()
    # held-out error and noise scale: the fallen cube is not counted
    pred_np = E.copy()
    pred_np[:, :9:3] += 0.01  # 1 cm off in x everywhere
    pred_np[:4, :3] = 0.5  # a guess where the cube fell
    assert position_error_cm(pred_np, E)["cubes_xy_cm"] == pytest.approx(1.0, rel=1e-4)
    assert robust_std(pred_np - E, mask)[0] == pytest.approx(0.0, abs=1e-6)  # the 1 cm offset is constant
    assert robust_std(pred_np - E)[2] == pytest.approx(0.0, abs=1e-6) and robust_std(pred_np - E, mask)[2] == 0


def test_the_mirror_augmentation_reflects_images_and_both_channels_together():
    """With mirror=1 every frame the loss sees is the reflected scene: images flipped left-right, the base's yaw, the
    hand's and every object's y negated; with 0 nothing changes; a camera off the plane of symmetry is refused."""
    from sim.tabletop.env import MIRROR_ENV_STATE_SIGN, MIRROR_STATE_SIGN

    rng = np.random.default_rng(0)
    frames = _marker_frames(8, rng)
    frames["images"]["front"][:, :, :10] = 7  # a left-right asymmetric image
    seen = {}
    for share in (0.0, 1.0):
        est = _tiny().estimator
        est.set_statistics(frames["observation.state"], frames["observation.environment_state"])
        est.loss = lambda im, s, e: seen.setdefault(share, (im, s, e)) and est.standardised_loss(est(im, s), e)
        fit_estimator(est, frames, None, steps=1, batch=8, mirror=share)
    (im0, s0, e0), (im1, s1, e1) = seen[0.0], seen[1.0]  # same seed: the same frames drawn
    torch.testing.assert_close(im1["front"], im0["front"].flip(2))
    torch.testing.assert_close(s1, s0 * torch.as_tensor(MIRROR_STATE_SIGN))
    torch.testing.assert_close(e1, e0 * torch.as_tensor(MIRROR_ENV_STATE_SIGN))
    assert (s1[:, 0] == -s0[:, 0]).all() and (e1[:, 1] == -e0[:, 1]).all() and (e1[:, 0] == e0[:, 0]).all()
    side = EstimatedStatePolicy(EstimatedStateConfig(cameras=("side",), width=8, hidden=32, layers=2)).estimator
    with pytest.raises(ValueError, match="plane of symmetry"):
        fit_estimator(side, {**frames, "images": {"side": frames["images"]["front"]}}, None, steps=1, mirror=0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fit_estimator(_tiny().estimator, frames, None, steps=1, mirror=1.5)


def test_the_actor_also_learns_every_frames_reflection(monkeypatch):
    """mirror_actor: the actor's data is every frame and its reflection: the reflected state and label, and the
    estimator's reading of the flipped images (not the reflected estimate: the actor meets the estimator's own errors)."""
    import policies.estimated_state.train as T
    from sim.tabletop.env import MIRROR_ACTION_SIGN, MIRROR_STATE_SIGN

    rng = np.random.default_rng(0)
    frames = _marker_frames(12, rng)
    frames.update({"action": rng.uniform(-1, 1, (12, 4)).astype(np.float32), "task": np.array(["push the red cube"] * 12),
                   "has_action": np.arange(12) != 5})  # an episode's last frame carries no action
    seen = {}
    monkeypatch.setattr(T, "fit_actor", lambda policy, *args, **kw: seen.setdefault("args", (policy, *args)) and 0.0)
    T.train_on_frames(frames, None, ["push the red cube"], estimator_steps=2, actor_steps=1, width=8, hidden=16,
                      layers=1, progress=False, mirror_actor=True)
    policy, state, estimate, tasks, labels = seen["args"][:5]
    act = frames["has_action"]
    np.testing.assert_array_equal(state, np.concatenate([frames["observation.state"][act],
                                                         frames["observation.state"][act] * MIRROR_STATE_SIGN]))
    np.testing.assert_array_equal(labels, np.concatenate([frames["action"][act], frames["action"][act] * MIRROR_ACTION_SIGN]))
    assert len(tasks) == 22 and labels[11 + 0, 1] == -labels[0, 1]
    flipped = {"front": frames["images"]["front"][act][:, :, ::-1].copy()}
    np.testing.assert_allclose(estimate[11:], policy.estimator.estimate(flipped, state[11:]), atol=1e-5)
    assert not np.allclose(estimate[11:], policy.estimator.estimate(frames["images"], frames["observation.state"])[act])
    side = {**frames, "images": {"side": frames["images"]["front"]}}  # a camera off the plane of symmetry
    with pytest.raises(ValueError, match="mirror_actor: only for the tabletop"):
        T.train_on_frames(side, None, ["push the red cube"], estimator_steps=2, actor_steps=1, width=8, hidden=16,
                          layers=1, progress=False, mirror_actor=True)
