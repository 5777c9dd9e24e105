import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from diffusers import EDMEulerScheduler
from gymnasium.utils.env_checker import check_env

import sim
from policies.random_policy import RandomPolicy
from sim.experts import ScriptedExpert
from sim.tabletop.tasks import success_and_reward
from tests.helpers import tiny_wm_config
from wmrl.eval import evaluate
from wmrl.eval.world_model import error_split
from world_models.edm import edm_coefficients
from world_models.env import WorldModelEnv, WorldModelSingleEnv
from world_models.video import model as model_module
from world_models.video import train as wm_train
from world_models.video.camera import reproject_objects
from world_models.video.evaluate import auroc, held_level, bootstrap_ci, fixed_windows, matched_max, pair_auroc_ci, pair_auroc_difference, paired_difference
from world_models.video.model import FRAMES_PER_PASS, VideoWorldModel, WorldModelConfig, commanded_pose, integrate_poses
from world_models.video.state_channel import StateChannel, StateChannelConfig
from world_models.video.train import (TrainWMConfig, WindowSampler, load_split, resolve_mirror, train_world_model,
                                      unrolled_batch)

VOCAB = ["push", "the", "red", "cube", "to", "yellow", "purple", "zone"]
TASK = "push the red cube to the yellow zone"


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


def _state(model, B=2):
    C, S = model.cfg.frame_channels, model.cfg.latent_size
    return {"ctx": torch.randn(B, model.cfg.context, C, S, S), "anchor": torch.randn(B, C, S, S),
            "pose": torch.tensor([[0.3, 0.0, 0.2, -1.0]] * B), "proprio": torch.zeros(B, 8), "task": [TASK] * B}


def test_training_losses_go_down(trained):
    ae = list(_losses(trained, "ae_loss").values())
    dyn = list(_losses(trained, "dyn_loss").values())
    st = list(_losses(trained, "state_loss").values())
    assert np.mean(ae[-5:]) < 0.7 * np.mean(ae[:5])
    assert np.mean(dyn[-5:]) < np.mean(dyn[:5])
    assert np.mean(st[-5:]) < np.mean(st[:5])
    assert _losses(trained, "unroll_loss")  # the unrolled phase ran and logged
    assert (trained / "videos" / "real_vs_imagined.gif").exists()
    assert (trained / "checkpoints/last/model.safetensors").exists()


def test_fixed_window_losses_are_logged_per_phase_repeatable_and_leave_training_unchanged(trained, tiny_data, tmp_path):
    # the trained fixture evaluates at each phase's end: autoencoder, state channel, dynamics (both phases)
    for key, steps in (("ae_loss", {30}), ("state_loss", {50}), ("dyn_loss", {80, 86})):
        for split in ("val", "fit"):
            got = _losses(trained, f"{split}_{key}")
            assert set(got) == steps and all(np.isfinite(v) for v in got.values()), (split, key)
    assert (trained / "losses.png").exists()
    # the same windows and noise each call: a model evaluated twice gives the same numbers, and the global RNG
    # (which training draws from) is left where it was
    cfg = _cfg(tiny_data, tmp_path / "unused")
    model = VideoWorldModel.load(trained / "checkpoints/last")
    _, train, held = load_split(tiny_data, cfg.holdout)
    samplers = {"val": WindowSampler(held, "cpu", model.cfg, wm_train.encode_all(model, held)),
                "fit": WindowSampler(train, "cpu", model.cfg, wm_train.encode_all(model, train))}
    torch.manual_seed(7)
    a = wm_train.fixed_window_losses(model, samplers, 2, cfg)
    after = torch.rand(1)
    torch.manual_seed(7)
    assert wm_train.fixed_window_losses(model, samplers, 2, cfg) == a and torch.equal(torch.rand(1), after)
    assert a["val_dyn_loss"] != a["fit_dyn_loss"]  # different episodes
    # training with the evaluations gives the same losses as without them
    kw = dict(ae_steps=6, state_steps=4, dyn_steps=6, unroll_steps=2, eval_every=3)
    train_world_model(_cfg(tiny_data, tmp_path / "with", **kw), progress=False)
    train_world_model(_cfg(tiny_data, tmp_path / "without", **{**kw, "eval_every": 0}), progress=False)
    for key in ("ae_loss", "state_loss", "dyn_loss", "unroll_loss"):
        assert _losses(tmp_path / "with", key) == _losses(tmp_path / "without", key), key
    assert not _losses(tmp_path / "without", "val_dyn_loss") and set(_losses(tmp_path / "with", "val_dyn_loss")) == {12, 15, 16, 18}


def test_resume_reproduces_the_next_loss(tiny_data, tmp_path):
    kw = dict(ae_steps=6, state_steps=0, state_channel=False, unroll_steps=0)
    full = tmp_path / "full"
    train_world_model(_cfg(tiny_data, full, dyn_steps=8, **kw), progress=False)
    part = tmp_path / "part"
    train_world_model(_cfg(tiny_data, part, dyn_steps=4, **kw), progress=False)  # "interrupted"
    train_world_model(_cfg(tiny_data, part, dyn_steps=8, overwrite=False, resume=True, **kw), progress=False)
    a, b = _losses(full, "dyn_loss"), _losses(part, "dyn_loss")
    assert np.isclose(a[11], b[11], rtol=1e-5) and np.isclose(a[14], b[14], rtol=1e-4)
    # data with environment state, a model without the channel: imagination observes no (stale) environment state
    env = WorldModelSingleEnv(VideoWorldModel.load(full / "checkpoints/last"), load_split(tiny_data, 0.25)[2],
                              max_episode_steps=4)
    check_env(env, skip_render_check=True)
    assert "observation.environment_state" not in env.reset(seed=0)[0]


def test_a_run_without_the_unrolled_phase_is_the_full_runs_checkpoint_before_that_phase(tiny_data, tmp_path):
    """What lets a device run cut before its unrolled phase be measured as `bench world-model unroll=false`: a
    constant learning rate and per-step randomness make the two trainings identical up to that phase's start."""
    from safetensors.torch import load_file

    kw = dict(ae_steps=2, state_steps=2, dyn_steps=3, change_mask_steps=0)  # (the mask is fitted after every phase)
    train_world_model(_cfg(tiny_data, tmp_path / "full", unroll_steps=2, **kw), progress=False)
    train_world_model(_cfg(tiny_data, tmp_path / "cut", unroll_steps=0, **kw), progress=False)
    before = load_file(tmp_path / "full/checkpoints/ckpt-000000007/model.safetensors")  # the denoiser phase's end
    cut = load_file(tmp_path / "cut/checkpoints/last/model.safetensors")
    after = load_file(tmp_path / "full/checkpoints/last/model.safetensors")
    assert before.keys() == cut.keys() and all(torch.equal(before[k], cut[k]) for k in cut)
    assert not all(torch.equal(after[k], cut[k]) for k in cut)  # the unrolled phase did change weights


def test_checkpoint_from_another_config_is_refused(trained):
    cfg = VideoWorldModel.load(trained / "checkpoints/last").cfg
    other = WorldModelConfig(**{**cfg.__dict__, "chunk": cfg.chunk + 1})
    with pytest.raises(ValueError, match="checkpoint config differs.*chunk"):
        VideoWorldModel.load(trained / "checkpoints/last", expect=other)


def test_residual_path_reproduces_the_last_frame_exactly_at_zero_update():
    torch.manual_seed(0)
    model = VideoWorldModel(WorldModelConfig(size="tiny", task_vocab=VOCAB, deterministic=True, context_noise_sample=0.0))
    model.res_std.fill_(0.37)
    st = _state(model)
    last = st["ctx"][:, -1]
    assert torch.equal(model.from_residual(torch.zeros(2, 4 * 16, 16, 16), last), last[:, None].expand(-1, 4, -1, -1, -1))
    torch.nn.init.normal_(model.unet.out.weight)  # a non-zero network ...
    fut = model.sample_future(st["ctx"], st["anchor"], st["pose"], torch.zeros(2, 4, 4))
    assert not torch.allclose(fut, last[:, None].expand_as(fut))
    torch.nn.init.zeros_(model.unet.out.weight)  # ... and a zero update
    torch.nn.init.zeros_(model.unet.out.bias)
    fut = model.sample_future(st["ctx"], st["anchor"], st["pose"], torch.zeros(2, 4, 4))
    assert torch.equal(fut, last[:, None].expand_as(fut))
    r = model.to_residual(fut, last)
    assert torch.equal(r, torch.zeros_like(r))
    # and in pixels: latents equal to the start latent decode to the real start frame itself, not its reconstruction
    frames0 = {f"observation.images.{c}": np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
               for c in model.cfg.cameras}
    st.update(z0=last, frames0=frames0)
    out = model.decode(fut, st)
    for k, v in frames0.items():
        assert np.array_equal(out[k], np.repeat(v[:, None], 4, 1))
    assert not np.array_equal(model.decode(fut)["observation.images.front"][:, 0], frames0["observation.images.front"])
    # the same with a fitted change mask of any weights: an unchanged frame is the start frame
    for net in model.change_mask.values():
        torch.nn.init.normal_(net.net[-1].weight)
    model.change_mask_fitted.fill_(True)
    out = model.decode(fut, st)
    for k, v in frames0.items():
        assert np.array_equal(out[k], np.repeat(v[:, None], 4, 1))


def test_one_step_sampling_takes_the_trained_conditional_mean_path(monkeypatch, tmp_path):
    torch.manual_seed(0)
    model = VideoWorldModel(WorldModelConfig(size="tiny", task_vocab=VOCAB, context_noise_sample=0.0, mean_share=0.5))
    torch.nn.init.normal_(model.unet.out.weight)
    st = _state(model)
    poses = torch.zeros(2, 4, 4)
    draw = lambda seed, **k: model.sample_future(st["ctx"], st["anchor"], st["pose"], poses, steps=1,
                                                 generator=torch.Generator().manual_seed(seed), **k)
    # one step: D(0; sigma_max), the same for every noise seed; asked for a sample, it depends on the seed
    assert torch.equal(draw(0), draw(1))
    assert not torch.allclose(draw(0, mean=False), draw(1, mean=False))
    # a checkpoint saved before the path existed never trained it: it loads as pure EDM and keeps sampling
    model.save(tmp_path / "old")
    raw = json.loads((tmp_path / "old/config.json").read_text())
    del raw["mean_share"]
    (tmp_path / "old/config.json").write_text(json.dumps(raw))
    assert VideoWorldModel.load(tmp_path / "old").cfg.mean_share == 0.0
    old = dataclasses.replace(model.cfg, mean_share=0.0)
    assert VideoWorldModel.load(tmp_path / "old").cfg == old
    assert VideoWorldModel.load(tmp_path / "old", expect=old).cfg == old  # a resume from it matches its own config
    # training: the mean share sees exactly that input (zero at sigma_max), the rest noisy targets at other levels
    seen = []
    orig = VideoWorldModel._F
    monkeypatch.setattr(VideoWorldModel, "_F", lambda self, x, c_noise, *a: seen.append((x.clone(), c_noise.clone())) or orig(self, x, c_noise, *a))
    B, C, S = 256, model.cfg.frame_channels, model.cfg.latent_size
    ctx, fut = torch.randn(B, 2, C, S, S), torch.randn(B, 4, C, S, S)
    model.dynamics_loss(ctx, ctx[:, 0], fut, torch.zeros(B, 4), torch.zeros(B, 4, 4), torch.ones(B, 4))
    x, c_noise = seen[0]
    at_max = torch.isclose(c_noise, edm_coefficients(torch.tensor(model.cfg.sigma_max), 1.0)[3])
    zero = x.flatten(1).abs().amax(1) == 0
    assert torch.equal(at_max, zero) and 0.4 < zero.float().mean() < 0.6


def test_pose_conditioning_uses_the_simulators_action_space():
    import sim.tabletop.env as E
    import sim.tabletop.model as M

    cfg = WorldModelConfig(task_vocab=VOCAB)
    assert cfg.ee_step == E.EE_STEP and np.allclose(cfg.workspace_low, M.WORKSPACE_LOW)
    assert np.allclose(cfg.workspace_high, M.WORKSPACE_HIGH) and cfg.gripper_open == pytest.approx(2 * M.FINGER_MAX)
    assert cfg.ee_index == (5, 6, 7) and E.STATE_NAMES[cfg.gripper_index] == "gripper_opening"


def test_commanded_pose_integration_follows_the_simulators_end_effector():
    """Free-space trajectory (slow random segments, no contact): the integrated commanded pose stays within 2 cm
    of the end-effector the simulator reaches, and each one-step target is exactly the controller's target."""
    cfg = WorldModelConfig(task_vocab=VOCAB)
    env = sim.make_env("push-red", cameras=()).unwrapped
    rng = np.random.default_rng(1)
    obs, _ = env.reset(seed=1)
    ee0 = torch.tensor(obs["observation.state"][None, 5:8], dtype=torch.float64)
    acts, real = [], []
    for t in range(30):
        if t % 5 == 0:
            a = rng.uniform(-0.3, 0.3, 4)
        target = commanded_pose(torch.tensor(env.ee_pos()), torch.tensor(a), cfg)[:3].numpy()
        assert np.allclose(target, np.clip(env.ee_pos() + a[:3] * 0.05, [0.2, -0.28, 0.015], [0.62, 0.28, 0.3]))
        obs, *_ = env.step(a)
        acts.append(a)
        real.append(obs["observation.state"][5:8])
    poses = integrate_poses(ee0, torch.tensor(np.stack(acts))[None], cfg)[0].numpy()
    err = np.linalg.norm(poses[:, :3] - np.stack(real), axis=1)
    assert err.max() < 0.02 and err[0] < 0.005
    assert np.allclose(poses[:, 3], np.stack(acts)[:, 3])


def test_a_pose_layout_carries_each_frames_rotation_step_to_the_denoiser():
    """LIBERO's OSC_POSE actions [dx, dy, dz, drx, dry, drz, g]: each frame's commanded pose is [target, rot_step *
    rotation, g]; with no rotation it is the 4-D layout's pose with zeros between; the rotation changes the
    generated frames (the denoiser reads it); a gripper index outside the action is refused."""
    cfg7 = WorldModelConfig(task_vocab=VOCAB, size="tiny", action_dim=7, gripper_action=6, rot_step=0.5)
    cfg4 = WorldModelConfig(task_vocab=VOCAB, size="tiny")
    ee = torch.tensor([[0.4, 0.0, 0.1]])
    a4 = torch.tensor([[0.5, -0.2, 0.1, 0.7]])
    a7 = torch.tensor([[0.5, -0.2, 0.1, 0.0, 0.0, 0.0, 0.7]])
    p4, p7 = commanded_pose(ee, a4, cfg4), commanded_pose(ee, a7, cfg7)
    assert p7.shape == (1, 7) and torch.equal(p7[:, [0, 1, 2, 6]], p4) and torch.equal(p7[:, 3:6], torch.zeros(1, 3))
    turn = a7.clone()
    turn[:, 3:6] = torch.tensor([0.2, -1.0, 0.4])
    assert torch.allclose(commanded_pose(ee, turn, cfg7)[:, 3:6], torch.tensor([[0.1, -0.5, 0.2]]))

    torch.manual_seed(0)
    model = VideoWorldModel(dataclasses.replace(cfg7, state_dim=8, gripper_index=6, ee_index=(0, 1, 2),
                                                deterministic=True, env_state_dim=0)).eval()
    with torch.no_grad():  # the output layers start at zero (the identity path); give them weights to read through
        for w in model.unet.parameters():
            if not w.abs().sum():
                w.normal_(0, 0.1)
    rng = np.random.default_rng(0)
    obs = {f"observation.images.{c}": rng.integers(0, 255, (2, 64, 64, 3), dtype=np.uint8) for c in ("front", "wrist")}
    obs |= {"observation.state": rng.normal(0, 0.1, (2, 8)).astype(np.float32), "task": [VOCAB[0]] * 2}
    state = model.encode(obs)
    assert state["pose"].shape == (2, 7) and torch.equal(state["pose"][:, 3:6], torch.zeros(2, 3))
    still = torch.zeros(2, 4, 7)
    turning = still.clone()
    turning[..., 3:6] = 1.0
    _, p_still = model.step(state, still)
    _, p_turn = model.step(state, turning)
    assert p_still["pose"].shape == (2, 4, 7) and torch.allclose(p_turn["pose"][..., 3:6], torch.full((2, 4, 3), 0.5))
    assert not torch.allclose(p_still["latents"], p_turn["latents"])
    with pytest.raises(ValueError, match="gripper_action"):
        VideoWorldModel(dataclasses.replace(cfg7, gripper_action=5))
    with pytest.raises(ValueError, match="gripper_action"):
        VideoWorldModel(dataclasses.replace(cfg4, gripper_action=6))


def test_unrolled_phase_trains_on_generated_context(tiny_data, tmp_path, monkeypatch):
    generated, seen = [], []
    orig_sample, orig_loss = VideoWorldModel.sample_future, VideoWorldModel.dynamics_loss

    def sample(self, *a, **k):
        out = orig_sample(self, *a, **k)
        generated.append(out.clone())
        return out

    def loss(self, ctx, *a, **k):
        seen.append(ctx.clone())
        return orig_loss(self, ctx, *a, **k)

    monkeypatch.setattr(VideoWorldModel, "sample_future", sample)
    monkeypatch.setattr(VideoWorldModel, "dynamics_loss", loss)
    train_world_model(_cfg(tiny_data, tmp_path / "r", ae_steps=2, state_steps=0, state_channel=False, dyn_steps=0,
                           change_mask_steps=0,  # its rollouts would sample too
                           unroll_steps=2, eval_every=0), progress=False)  # no fixed-window losses: training's calls only
    assert len(generated) == 2 and len(seen) == 2
    for g, c in zip(generated, seen):  # K=2 <= H=4: the whole context is the model's own first chunk
        assert torch.equal(c, g[:, -2:])


def test_unrolled_batch_keeps_the_second_chunks_targets(tiny_data):
    _, train, _ = load_split(tiny_data, 0.25)
    model = VideoWorldModel(wm_train.model_config(TrainWMConfig(data=tiny_data, size="tiny"), load_split(tiny_data, 0.25)[0]))
    s = WindowSampler(train, "cpu", model.cfg)
    s.lat = wm_train.set_latent_statistics(model, train)
    g = torch.Generator().manual_seed(0)
    d = s.sample(6, 2, 8, g, min_future=5)
    assert (d["mask"][:, :4] == 1).all()  # the generated chunk is fully real data's continuation
    u = unrolled_batch(model, d, 4, g)
    assert torch.equal(u["future"], d["future"][:, 4:]) and torch.equal(u["poses"], d["poses"][:, 4:])
    assert torch.equal(u["pose0"], d["poses"][:, 3])
    assert torch.equal(u["ctx"], u["generated"][:, -2:])
    # the commanded pose of each future frame is the controller's target from the frame before it
    i = d["fut_idx"][:, 0] - 1
    ee = s.state[i][:, 5:8]
    assert torch.allclose(d["poses"][:, 0, :3], (ee + 0.05 * s.action[i][:, :3]).clamp(
        torch.tensor([0.2, -0.28, 0.015]), torch.tensor([0.62, 0.28, 0.3])))


def test_state_channel_rules_equal_the_tasks_definitions_on_real_states():
    """Success and reward read from observation-level state (what the state channel predicts) equal the
    simulator's own `success` / `reward` for every family, on real expert episodes with near-successes."""
    checked = {}
    for task in ("push-red", "reach-green", "lift-blue", "place-red"):
        env = sim.make_env(task, cameras=()).unwrapped
        for seed, failure in ((0, 0.0), (1, 1.0)):
            pol = ScriptedExpert(failure_prob=failure, seed=seed)
            obs, _ = env.reset(seed=seed)
            for _ in range(env.max_episode_steps):
                a = pol.select_action({k: v[None] if k != "task" else v for k, v in obs.items()})[0]
                obs, r, term, trunc, info = env.step(a)
                s = obs["observation.state"]
                ok, rew = success_and_reward(obs["task"], s[None, 5:8], s[None, 4], obs["observation.environment_state"][None])
                assert ok[0] == info["success"], (task, seed)
                if task.split("-")[0] in ("push", "reach"):  # lift/place rewards read contacts (approximated)
                    assert rew[0] == pytest.approx(r, abs=1e-5)
                checked[task] = checked.get(task, 0) + int(info["success"])
                if term or trunc:
                    break
        env.close()
    assert all(v > 0 for v in checked.values())  # every family reached success at least once


def test_state_channel_learns_multi_step_dynamics_and_keeps_untouched_cubes_still(tiny_data):
    torch.manual_seed(0)
    _, train, _ = load_split(tiny_data, 0.25)
    cfg = WorldModelConfig(task_vocab=VOCAB)
    s = WindowSampler(train, "cpu", cfg)
    sc = StateChannel(StateChannelConfig(members=3, hidden=64, n_rest=len(cfg.rest_index)))
    opt = torch.optim.Adam(sc.parameters(), 3e-3)
    g = torch.Generator().manual_seed(0)
    xs, a, m = s.state_sequences(3, 256, 8, torch.Generator().manual_seed(99))
    _, first_info = sc.unrolled_loss(xs, a, m)
    for _ in range(150):
        loss, _ = sc.unrolled_loss(*s.state_sequences(3, 64, 8, g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        last, info = sc.unrolled_loss(xs, a, m)
    arm_objects = lambda d: d["state_huber_cm"] + d["gate_bce"]
    assert arm_objects(info) < 0.25 * arm_objects(first_info)
    assert info["rest_huber"] < 0.6 * first_info["rest_huber"]  # the joint angles are learned too
    far = xs[:, :, 0].clone()  # hard gate: a cube far from the gripper does not move at all
    far[..., 4:7] = far[..., :3] + torch.tensor([0.2, 0.2, 0.0])
    far[..., 6] = 0.02  # resting on the table
    nxt, logit = sc.next(far, a[0, :, 0], gate="hard")
    still = (nxt[..., 4:7] == far[..., 4:7]).all(-1)
    assert torch.equal(still, logit[..., 0] <= 0)  # gate closed <=> exactly unchanged, not drifting a little
    assert still.float().mean() > 0.5
    mean, dis = sc.summary(nxt)
    assert mean.shape == (256, 13 + 4) and dis.shape == (256,) and (dis >= 0).all()


def test_matched_length_auroc_is_one_half_for_a_random_scorer_on_expert_pairs():
    """Success episodes end early (at success), near-successes run to the time limit: scored over whole episodes,
    a scorer of pure noise reads length and lands far below 0.5; scored over the same steps per pair, at 0.5."""
    env = sim.make_env("push-red", cameras=(), post_success_steps=3).unwrapped
    lens, truth = [], []
    for s in range(12):
        for failure in (0.0, 1.0):
            r = evaluate(ScriptedExpert(failure_prob=failure, seed=s), env, 1, seed=50_000 + s, progress=False)
            lens.append(r.per_episode[0]["length"])
            truth.append(r.per_episode[0]["success"])
    env.close()
    lens, truth = np.array(lens), np.array(truth)
    assert truth[0::2].mean() > 0.8 and not truth[1::2].any()
    matched = np.repeat(np.minimum(lens[0::2], lens[1::2]), 2)
    rng = np.random.default_rng(0)
    m, w, held = [], [], []
    for _ in range(200):
        rand = [rng.random(n) for n in lens]
        m.append(auroc(matched_max(rand, matched), truth))
        w.append(auroc(matched_max(rand, lens), truth))
        held.append(auroc(matched_max(rand, matched, hold=3), truth))
    assert abs(np.mean(m) - 0.5) < 0.1
    assert abs(np.mean(held) - 0.5) < 0.1  # the held readout too
    assert np.mean(w) < 0.35  # the old, length-reading metric


def test_held_level_is_the_running_minimum_over_the_last_hold_steps():
    p = np.array([[0.2, 0.95, 0.3, 0.96, 0.97, 0.99]])
    assert np.array_equal(held_level(p, 1), p)
    assert np.allclose(held_level(p, 2), [[0.0, 0.2, 0.3, 0.3, 0.96, 0.97]])  # an episode's start cannot hold
    assert np.allclose(held_level(p, 3), [[0.0, 0.0, 0.2, 0.3, 0.3, 0.96]])
    # a one-step spike scores its peak with hold 1 and nothing with hold 2; a held success keeps its level
    spike, kept = np.array([0.1, 0.99, 0.1, 0.1]), np.array([0.1, 0.1, 0.93, 0.95])
    assert np.allclose(matched_max([spike, kept], [4, 4]), [0.99, 0.95])
    assert np.allclose(matched_max([spike, kept], [4, 4], hold=2), [0.1, 0.93])
    for bad in (0, 1.5, -1):
        with pytest.raises(ValueError, match="hold"):
            held_level(p, bad)


def test_fixed_windows_are_identical_across_runs_and_split_by_motion(tiny_data):
    _, _, held = load_split(tiny_data, 0.25)
    a, b = fixed_windows(held, 12, 8, 2, seed=0), fixed_windows(held, 12, 8, 2, seed=0)
    assert a == b and len(a) == 12 and fixed_windows(held, 12, 8, 2, seed=1) != a
    # the suite's layout decides motion: with no objects in it, the hand alone
    hand = fixed_windows(held, 12, 8, 2, seed=0, object_xyz=())
    assert [(w["episode"], w["start"]) for w in hand] == [(w["episode"], w["start"]) for w in a]
    for w, h in zip(a, hand):
        lo, T = held.episodes[w["episode"]]
        assert 0 <= w["start"] and w["start"] + 8 <= T - 1
        s = held.data["observation.state"][lo + w["start"] : lo + w["start"] + 9, 5:8]
        env = held.data["observation.environment_state"][lo + w["start"] : lo + w["start"] + 9, :9].reshape(9, 3, 3)
        moved_hand = np.linalg.norm(s - s[0], axis=-1).max()
        assert w["motion"] == (max(moved_hand, np.linalg.norm(env - env[0], axis=-1).max()) > 0.02)
        assert h["motion"] == (moved_hand > 0.02)


def test_bootstrap_ci_covers_the_mean_and_shrinks_with_data():
    rng = np.random.default_rng(0)
    small, big = rng.normal(1.0, 1.0, 30), rng.normal(1.0, 1.0, 3000)
    lo, hi = bootstrap_ci(small)
    lo2, hi2 = bootstrap_ci(big)
    assert lo < small.mean() < hi and lo2 < 1.0 < hi2 and (hi2 - lo2) < 0.3 * (hi - lo)


def test_paired_difference_is_b_minus_a_with_wins_and_an_interval():
    a = np.array([1.0, 2.0, 3.0, np.nan, 5.0])
    b = np.array([2.0, 2.0, 5.0, 1.0, 4.0])
    p = paired_difference(a, b)
    assert p["n"] == 4 and p["mean"] == pytest.approx((1 + 0 + 2 - 1) / 4)
    assert p["wins"] == pytest.approx((1 + 0.5 + 1 + 0) / 4)  # a tie counts half
    assert p["ci"][0] <= p["mean"] <= p["ci"][1]
    sel = np.array([True, False, True, True, False])
    assert paired_difference(a, b, sel)["n"] == 2 and paired_difference(a, b, sel)["mean"] == pytest.approx(1.5)


def test_group_bootstrap_resamples_whole_episodes():
    # 8 episodes x 30 windows, each episode's windows sharing a large offset: 240 windows, but 8 independent draws
    rng = np.random.default_rng(0)
    ep = np.repeat(np.arange(8), 30)
    x = rng.normal(0.0, 2.0, 8)[ep] + rng.normal(0.0, 0.2, 240)
    lo, hi = bootstrap_ci(x)
    glo, ghi = bootstrap_ci(x, groups=ep)
    assert glo < x.mean() < ghi and (ghi - glo) > 4 * (hi - lo)
    # one window per group is the plain bootstrap; another statistic goes through the concatenating path
    assert bootstrap_ci(x[:50], groups=np.arange(50)) == pytest.approx(bootstrap_ci(x[:50]))
    mlo, mhi = bootstrap_ci(x, groups=ep, stat=np.median)
    assert mlo < np.median(x) < mhi
    with pytest.raises(ValueError, match="groups"):
        bootstrap_ci(x, groups=ep[:10])
    # paired: the episode interval, the share of episodes B wins (by its mean difference) and their number
    a, b = np.zeros(240), x
    sel = ep < 6
    p = paired_difference(a, b, sel, groups=ep)
    per = np.array([x[ep == k].mean() for k in range(6)])
    assert p["n"] == 180 and p["n_groups"] == 6 and p["group_wins"] == pytest.approx((per > 0).mean())
    assert p["ci_groups"] == pytest.approx(list(bootstrap_ci(x[sel], groups=ep[sel])))
    assert "ci_groups" not in paired_difference(a, b, sel)


def test_pair_auroc_interval_resamples_whole_pairs():
    truth = np.array([True, False] * 20)
    perfect = np.where(truth, 1.0, 0.0)
    assert pair_auroc_ci(perfect, truth) == [1.0, 1.0]  # every resample of pairs is still perfectly separated
    noise = np.random.default_rng(0).random(40)
    lo, hi = pair_auroc_ci(noise, truth)
    assert lo < auroc(noise, truth) < hi and hi - lo > 0.2
    with pytest.raises(ValueError, match="pairs"):
        pair_auroc_ci(noise[:39], truth[:39])


def test_pair_auroc_difference_compares_two_scorers_on_the_same_resampled_pairs():
    truth = np.array([True, False] * 20)
    noise = np.random.default_rng(0).random(40)
    assert pair_auroc_difference(noise, noise, truth) == {"mean": 0.0, "ci": [0.0, 0.0]}  # the same scorer: nothing
    d = pair_auroc_difference(noise, np.where(truth, 1.0, 0.0), truth)
    assert d["mean"] == pytest.approx(1 - auroc(noise, truth)) and 0 < d["ci"][0] <= d["mean"] <= d["ci"][1]
    with pytest.raises(ValueError, match="paired"):
        pair_auroc_difference(noise, noise[:38], truth)


def test_error_split_puts_each_pixels_error_inside_or_outside_the_region():
    real = {"c": np.zeros((2, 4, 4, 3), np.uint8)}
    pred = {"c": np.zeros((2, 4, 4, 3), np.uint8)}
    pred["c"][:, 0, 0] = 10  # the model errs on the region's pixel ...
    pred["c"][1, 3, 3, 0] = 2  # ... and, in the second (static) window, on one background value
    last = {"c": np.full((2, 4, 4, 3), 1, np.uint8)}  # copy-last is off by 1 everywhere
    region = np.zeros((4, 4), bool)
    region[0, 0] = True
    out = error_split(pred, last, real, {"c": [region, region]}, np.array([True, False]), ["cam"])
    m, s = out["cam"]["motion"], out["cam"]["static"]
    assert m["model_inside"] == 300 and m["model_outside"] == 0 and s["model_outside"] == 4
    assert m["copy_inside"] == 3 and m["copy_outside"] == 45 and m["inside_share"] == 1 / 16


def test_a_rollouts_decodes_reuse_its_start_frames_correction_and_a_reset_renews_it(trained, tiny_data):
    """`decode` computes frame0 - dec(z0) once per rollout and carries it in the state: the frames are those decoded
    without it, and an autoreset that writes a new start into an env drops it, so the next decode uses the new start."""
    model = VideoWorldModel.load(trained / "checkpoints/last")
    _, _, held = load_split(tiny_data, 0.25)
    venv = WorldModelEnv(model, held, num_envs=2, keyframe_prob=1.0, max_episode_steps=8, rules=success_and_reward)
    venv.reset(seed=0)
    venv.step(np.zeros((2, 2, 4), np.float32))
    st = venv._state
    assert torch.equal(st["base_correction"], model.base_correction(st["z0"], st["frames0"]))
    z = st["ctx"][:, -1]
    plain = model.decode_frames(z, (st["z0"], st["frames0"]), mask=False)
    memo = model.decode_frames(z, (st["z0"], st["frames0"], st["base_correction"]), mask=False)
    assert all(torch.equal(plain[k], memo[k]) for k in plain)
    z0 = st["z0"].clone()
    venv._needs_reset[1] = True
    venv.step(np.zeros((2, 2, 4), np.float32))  # env 1 restarts
    assert not torch.equal(venv._state["z0"][1], z0[1]) and torch.equal(venv._state["z0"][0], z0[0])
    venv.step(np.zeros((2, 2, 4), np.float32))
    st = venv._state
    assert torch.equal(st["base_correction"], model.base_correction(st["z0"], st["frames0"]))


def test_a_sampler_seed_draws_other_imagination_noise_from_the_same_starts(trained, tiny_data):
    """`sampler_seed` 0 is the reset seed's own draw (repeatable); another value keeps given starts (the paired
    ranking's) and draws other noise, so one model can be sampled several times on the same layouts."""
    model = VideoWorldModel.load(trained / "checkpoints/last")
    _, _, held = load_split(tiny_data, 0.25)
    starts, _ = WorldModelEnv(model, held, num_envs=2, max_episode_steps=8).reset(seed=5)

    def run(sampler_seed):
        venv = WorldModelEnv(model, held, num_envs=2, max_episode_steps=8, rules=success_and_reward,
                             sampler_seed=sampler_seed)
        first, _ = venv.reset(seed=3, options={"observations": starts})
        return first, venv.step(np.zeros((2, 2, 4), np.float32))[0]

    (a0, a1), (b0, b1), (c0, c1) = run(0), run(0), run(1)
    front = "observation.images.front"
    assert np.array_equal(a1[front], b1[front])  # the same seed, the same imagination
    assert np.array_equal(a0[front], c0[front]) and np.array_equal(a0[front], starts[front])  # the same starts
    assert not np.array_equal(a1[front], c1[front])  # other noise, other imagined frames
    with pytest.raises(ValueError, match="sampler_seed"):
        WorldModelEnv(model, held, num_envs=2, sampler_seed=-1)


def test_world_model_env_contract_state_channel_and_kir(trained, tiny_data):
    model = VideoWorldModel.load(trained / "checkpoints/last")
    assert model.success_source == "state"
    _, train, held = load_split(tiny_data, 0.25)
    env = WorldModelSingleEnv(model, held, max_episode_steps=6)
    check_env(env, skip_render_check=True)
    venv = WorldModelEnv(model, held, num_envs=3, keyframe_prob=1.0, max_episode_steps=8, rules=success_and_reward)
    assert venv.success_source == "state"
    obs, info = venv.reset(seed=0)
    assert info["keyframe"].all()
    for i, s in enumerate(venv.start_info):
        lo, T = held.episodes[s["episode"]]
        assert 0 < s["frame"] < T - 1 or s["frame"] == model.cfg.context - 1
        real = held.data["observation.images.front"][lo + s["frame"]]
        assert np.array_equal(obs["observation.images.front"][i], real)  # the start frame is the real keyframe
        assert np.allclose(obs["observation.environment_state"][i], held.data["observation.environment_state"][lo + s["frame"]])
    assert obs["observation.images.front"].shape == (3, 64, 64, 3)
    o2, r, term, trunc, inf = venv.step(np.zeros((3, 2, 4), np.float32))  # a chunk of 2 actions
    assert r.shape == (3,) and inf["success_prob"].shape == (3,) and inf["disagreement"].shape == (3,)
    assert np.allclose(o2["observation.environment_state"][:, 9:], obs["observation.environment_state"][:, 9:])  # zones
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


def test_imagined_success_comes_from_the_tasks_rules_on_predicted_state(trained, tiny_data):
    model = VideoWorldModel.load(trained / "checkpoints/last")
    _, _, held = load_split(tiny_data, 0.25)
    venv = WorldModelEnv(model, held, num_envs=2, max_episode_steps=8, rules=success_and_reward, decode_images=False)
    obs, _ = venv.reset(seed=0)
    # put the red cube in the yellow zone in every member's state: the next step must report success by the rules
    zones = venv._state["env"][:, 9:]
    x = venv._state["x"]
    x[:, :, 4:6] = zones[None, :, 0:2]
    venv._state["task"] = [TASK, TASK]
    _, _, term, _, info = venv.step(np.zeros((2, 4), np.float32))
    assert info["success"].all() and term.all()


def test_the_task_reward_reports_progress_on_predicted_state_whatever_the_reward_mode(trained, tiny_data):
    """info["task_reward"]: the task's dense reward on the predicted state (the best over a chunk), while the
    reward stays relative success; the evaluation loop's `progress` is its best over the episode."""
    from wmrl.eval import evaluate

    model = VideoWorldModel.load(trained / "checkpoints/last")
    _, _, held = load_split(tiny_data, 0.25)
    venv = WorldModelEnv(model, held, num_envs=2, max_episode_steps=8, rules=success_and_reward, decode_images=False)
    venv.reset(seed=0)
    venv._state["task"] = [TASK, TASK]
    seen = {}
    orig = model.step

    def spy(state, actions, **kw):
        out = orig(state, actions, **kw)
        seen["preds"] = out[1]
        return out

    model.step = spy
    _, r, _, _, info = venv.step(np.zeros((2, 3, 4), np.float32))  # a chunk of 3
    p = seen["preds"]
    hand = success_and_reward([TASK] * 6, p["ee"].numpy().reshape(6, 3), p["gripper_opening"].numpy().reshape(6),
                              p["observation.environment_state"].numpy().reshape(6, -1))[1].reshape(2, 3).max(1)
    np.testing.assert_allclose(info["task_reward"], hand)
    assert np.all(hand > 0) and np.all(r == 0)  # a dense reward where relative success (no success yet) gives 0
    model.step = orig

    class Still:  # holds still: the progress is the dense reward of the start, re-scored at every step
        def reset(self):
            pass

        def select_action(self, obs):
            return np.zeros((2, 4), np.float32)

    res = evaluate(Still(), venv, 2, seed=1, progress=False)
    for e in res.per_episode:
        assert e["max_reward"] == 0.0 and 0.0 < e["progress"] < 1.0


def test_a_state_only_rollout_skips_the_frames_and_follows_the_same_states(trained, tiny_data):
    """With no images to decode and success from the task's rules, `WorldModelEnv` steps the state channel alone
    (no latents generated); the states, rewards and ends are those of the rollout that generates frames."""
    model = VideoWorldModel.load(trained / "checkpoints/last")
    _, _, held = load_split(tiny_data, 0.25)
    assert model.frames_optional
    calls = {"n": 0}
    orig = model.sample_future

    def counting(*a, **kw):
        calls["n"] += 1
        return orig(*a, **kw)

    model.sample_future = counting
    acts = np.random.default_rng(0).uniform(-1, 1, (6, 3, 2, 4)).astype(np.float32)
    runs = {}
    for frames in (True, False):
        venv = WorldModelEnv(model, held, num_envs=3, max_episode_steps=8, rules=success_and_reward,
                             decode_images=False, state_readout="member")
        assert venv.frames is False
        venv.frames = frames  # the frame-generating rollout, for comparison
        obs, _ = venv.reset(seed=3)
        n0, out = calls["n"], [obs]
        for a in acts:
            out.append(venv.step(a))
        runs[frames] = (out, calls["n"] - n0)
    assert runs[True][1] == len(acts) and runs[False][1] == 0
    for got, want in zip(runs[False][0][1:], runs[True][0][1:]):
        for k in ("observation.state", "observation.environment_state"):
            np.testing.assert_allclose(got[0][k], want[0][k], atol=1e-6)
        for g, w in zip(got[1:4], want[1:4]):  # reward, terminated, truncated
            np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(got[4]["success"], want[4]["success"])
    model.sample_future = orig
    state = model.encode(runs[False][0][0] | {"observation.images." + c: np.zeros((3, model.cfg.image_size, model.cfg.image_size, 3), np.uint8)
                                               for c in model.cfg.cameras})
    state, preds = model.step(state, torch.zeros(3, 1, 4), frames=False)
    assert "latents" not in preds and preds["observation.state"].shape == (3, 1, model.cfg.state_dim)
    with pytest.raises(ValueError, match="stale"):  # frames cannot resume from a state-only rollout
        model.step(state, torch.zeros(3, 1, 4))


def test_the_imagined_hand_stays_in_the_workspace_the_controller_allows(trained, tiny_data):
    """An imagined hand put 1 m outside the workspace (where an unbounded channel's arm grows without end) comes
    back to the workspace's edge plus the margin, and the opening to the gripper's range; a hand inside is untouched."""
    from world_models.video.model import ARM_MARGIN, bound_arm

    model = VideoWorldModel.load(trained / "checkpoints/last")
    cfg = model.cfg
    x = torch.zeros(2, 3, model.state_channel.cfg.dim)
    x[..., :3] = torch.tensor([0.4, 0.0, 0.1])
    x[..., 3] = 0.05
    x[:, 0, :4] = torch.tensor([1.4, -1.0, -1.0, 1.0])
    out = bound_arm(x, cfg)
    lo, hi = np.array(cfg.workspace_low) - ARM_MARGIN, np.array(cfg.workspace_high) + ARM_MARGIN
    np.testing.assert_allclose(out[:, 0, :4].numpy(), np.tile([hi[0], lo[1], lo[2], cfg.gripper_open + ARM_MARGIN], (2, 1)),
                               atol=1e-6)
    assert torch.equal(out[:, 1:], x[:, 1:])
    _, _, held = load_split(tiny_data, 0.25)
    venv = WorldModelEnv(model, held, num_envs=2, max_episode_steps=8, rules=success_and_reward, decode_images=False)
    venv.reset(seed=0)
    venv._state["x"][:, :, :3] = torch.tensor([1.4, -1.0, -1.0])
    obs, *_ = venv.step(np.ones((2, 4), np.float32))
    ee = obs["observation.state"][:, list(cfg.ee_index)]
    assert np.all(ee >= lo - 1e-6) and np.all(ee <= hi + 1e-6)


def test_the_hallucination_flag_truncates_an_episode_and_its_success_does_not_count(trained, tiny_data):
    model = VideoWorldModel.load(trained / "checkpoints/last")
    _, _, held = load_split(tiny_data, 0.25)
    with pytest.raises(ValueError, match="stop_cm must be >= 0"):
        WorldModelEnv(model, held, num_envs=2, rules=success_and_reward, stop_cm=-1.0)
    outcomes = {}
    for stop in (0.0, 5.0):
        venv = WorldModelEnv(model, held, num_envs=2, max_episode_steps=8, rules=success_and_reward,
                             decode_images=False, stop_cm=stop)
        venv.reset(seed=0)
        x = venv._state["x"]
        x[:, :, 4:6] = venv._state["env"][None, :, 9:11]  # both envs: the red cube in the yellow zone (a success)
        x[0, 0, 10] += 0.2  # env 0: one member puts the blue cube 20 cm away (spread 8 cm)
        venv._state["task"] = [TASK, TASK]
        _, r, term, trunc, info = venv.step(np.zeros((2, 4), np.float32))
        assert info["disagreement"][0] > 7.0 and info["disagreement"][1] < 5.0
        outcomes[stop] = (info["success"].tolist(), term.tolist(), trunc.tolist(), info["flagged"].tolist(), r.tolist())
    assert outcomes[0.0][:4] == ([True, True], [True, True], [False, False], [False, False])
    success, term, trunc, flagged, r = outcomes[5.0]
    assert success == [False, True] and term == [False, True] and trunc == [True, False] and flagged == [True, False]
    assert r[0] == 0.0 and r[1] == outcomes[0.0][4][1]


def test_each_imagined_episode_follows_one_state_channel_member(trained, tiny_data):
    """state_readout='member' (PETS's TS-infinity): an episode reports its own member's state, drawn per episode;
    'mean' (the default) reports the members' average, which is none of them once they disagree."""
    model = VideoWorldModel.load(trained / "checkpoints/last")
    _, _, held = load_split(tiny_data, 0.25)
    with pytest.raises(ValueError, match="state_readout"):
        WorldModelEnv(model, held, num_envs=2, state_readout="median")
    M = model.cfg.state_members
    draws = WorldModelEnv(model, held, num_envs=64, max_episode_steps=8, decode_images=False, state_readout="member")
    draws.reset(seed=0)
    assert set(draws._state["member"].tolist()) == set(range(M))  # every member is drawn
    seen = {}
    for readout in ("member", "mean"):
        venv = WorldModelEnv(model, held, num_envs=2, max_episode_steps=8, rules=success_and_reward,
                             decode_images=False, state_readout=readout)
        venv.reset(seed=0)
        venv._state["task"] = [TASK, TASK]
        x = venv._state["x"]
        x[1:, :, 4:6] = venv._state["env"][None, :, 9:11] + 0.3  # every member but 0: the red cube 42 cm off the zone
        x[0, :, 4:6] = venv._state["env"][:, 9:11]  # member 0: in the yellow zone (a success)
        if readout == "member":
            venv._state["member"] = torch.tensor([0, 1])
        obs, _, term, _, info = venv.step(np.zeros((2, 4), np.float32))
        seen[readout] = (info["success"].tolist(), obs["observation.environment_state"][:, :2])
    assert seen["member"][0] == [True, False] and seen["mean"][0] == [False, False]
    zone = venv._state["env"][:, 9:11].numpy()
    # the mean sits (M - 1) / M of the way to the far cubes; the followed member's cube stays where it is
    np.testing.assert_allclose(seen["mean"][1] - zone, 0.3 * (M - 1) / M, atol=5e-3)
    assert np.abs(seen["member"][1][0] - zone[0]).max() < 5e-3


def test_the_consensus_readout_steps_every_member_from_the_mean(trained, tiny_data):
    """state_readout='consensus': every step starts all members from the members' mean, so the reported state is the
    mean of the members' one-step predictions from one shared state (for 'mean' it is the mean of members that each
    start from their own state); the members' spread after the step stays (the disagreement)."""
    model = VideoWorldModel.load(trained / "checkpoints/last")
    model.cfg.state_gate = "soft"  # no contact draws: the two paths below must see the same step
    model.cfg.state_settle = False  # the readouts alone (settling is its own test)

    def head(feats):  # a cube change nonlinear in the cube's offset, contact certain: the readouts must differ
        out = torch.zeros(*feats.shape[:-1], 4)
        out[..., :3] = feats[..., :3] ** 2 * (1 + 0.1 * torch.arange(len(feats)))[:, None, None]  # members differ
        out[..., 3] = 20.0
        return out

    model.state_channel.cube.forward = head
    _, _, held = load_split(tiny_data, 0.25)
    a = np.random.default_rng(0).uniform(-1, 1, (2, 4)).astype(np.float32)
    got = {}
    for readout in ("consensus", "mean"):
        venv = WorldModelEnv(model, held, num_envs=2, max_episode_steps=8, rules=success_and_reward,
                             decode_images=False, state_readout=readout)
        venv.reset(seed=0)
        venv._state["x"][1:, :, 4:6] += 0.05  # the members disagree on the red cube
        start = venv._state["x"].clone()
        obs, _, _, _, info = venv.step(a[:, None])
        got[readout] = (start, obs["observation.environment_state"][:, :9], info["disagreement"])
    start, env, dis = got["consensus"]
    step = lambda x: model.state_channel.rollout_step(x, torch.as_tensor(a), "soft")
    shared = step(start.mean(0, keepdim=True).expand_as(start)).mean(0)[:, 4:13].numpy()
    np.testing.assert_allclose(env, shared, atol=1e-5)
    np.testing.assert_allclose(got["mean"][1], step(start).mean(0)[:, 4:13].numpy(), atol=1e-5)
    assert np.abs(env - got["mean"][1]).max() > 2e-4  # the two readouts differ here (0.57 mm; equal to 1e-5 above)
    assert dis.max() > 0  # the members' one-step spread


def test_missing_environment_state_names_the_feature_and_the_flag(tiny_data, tmp_path):
    from wmrl.datasets import LeRobotV3Dataset, LeRobotV3Writer, write_episode
    from wmrl.core.episode import features_for

    src = LeRobotV3Dataset(tiny_data)
    w = None
    for ep in src.iter_episodes():
        ep = {k: v for k, v in ep.items() if k not in ("observation.environment_state", "timestamp", "frame_index",
                                                        "episode_index", "index", "task_index")}
        w = w or LeRobotV3Writer(tmp_path / "d", fps=10, features=features_for(ep))
        write_episode(w, ep)
    w.finalize()
    with pytest.raises(ValueError, match="observation.environment_state.*--no-state-channel"):
        train_world_model(_cfg(tmp_path / "d", tmp_path / "r"), progress=False)
    r = train_world_model(_cfg(tmp_path / "d", tmp_path / "r2", state_channel=False, ae_steps=2, dyn_steps=2,
                               unroll_steps=1), progress=False)
    assert r["success_source"] == "frames"


def test_mirror_trains_on_every_episode_and_its_reflection_and_refuses_other_data_before_any_run_folder(tiny_data, tmp_path):
    from sim.tabletop.env import MIRROR_ACTION_SIGN
    from wmrl.datasets import LeRobotV3Dataset, LeRobotV3Writer, write_episode
    from wmrl.core.episode import features_for

    _, train, held = load_split(tiny_data, 0.25)
    _, both, held_m = load_split(tiny_data, 0.25, mirror=True)
    assert both.num_episodes == 2 * train.num_episodes and len(both) == 2 * len(train)
    assert held_m.num_episodes == held.num_episodes and len(held_m) == len(held)  # held-out episodes never reflected
    eids = list(both.episodes)
    ep, m = both.get_episode(eids[2]), both.get_episode(eids[3])  # the second episode and its reflection
    np.testing.assert_array_equal(m["observation.images.wrist"], ep["observation.images.wrist"][:, :, ::-1])
    np.testing.assert_array_equal(m["action"], ep["action"] * MIRROR_ACTION_SIGN)
    np.testing.assert_array_equal(m["next.success"], ep["next.success"])
    # the default (None) reflects data that can be, and the run's config records that it did
    r = train_world_model(_cfg(tiny_data, tmp_path / "r", mirror=None, ae_steps=2, state_steps=2, dyn_steps=2,
                               unroll_steps=1, change_mask_steps=0, head_rollout_steps=0, videos=0), progress=False)
    assert r["train_episodes"] == 2 * train.num_episodes and r["mirror"] is True
    assert yaml.safe_load((tmp_path / "r/config.yaml").read_text())["mirror"] is True
    assert resolve_mirror(_cfg(tiny_data, tmp_path / "x", mirror=False)) is False
    # data from a robot (a real or twin cell need not be symmetric) is reflected only when asked for
    robot = tmp_path / "robot"
    shutil.copytree(tiny_data, robot)
    meta = json.loads((robot / "meta/wmrl.json").read_text())
    (robot / "meta/wmrl.json").write_text(json.dumps({**meta, "robot": "sim-real"}))
    assert resolve_mirror(_cfg(robot, tmp_path / "x", mirror=None)) is False
    assert resolve_mirror(_cfg(robot, tmp_path / "x", mirror=True)) is True
    # a dataset of another geometry (here: 7-D actions) has no known reflection: refused before its run folder
    w = None
    for ep in LeRobotV3Dataset(tiny_data).iter_episodes():
        ep = {k: v for k, v in ep.items() if k not in ("timestamp", "frame_index", "episode_index", "index", "task_index")}
        ep["action"] = np.concatenate([ep["action"], np.zeros((len(ep["action"]), 3), np.float32)], 1)
        w = w or LeRobotV3Writer(tmp_path / "d7", fps=10, features=features_for(ep))
        write_episode(w, ep)
    w.finalize()
    with pytest.raises(ValueError, match="--mirror .*actions 7"):
        train_world_model(_cfg(tmp_path / "d7", tmp_path / "r7", mirror=True), progress=False)
    assert not (tmp_path / "r7").exists()
    assert resolve_mirror(_cfg(tmp_path / "d7", tmp_path / "r7", mirror=None)) is False  # the default: as recorded
    with pytest.raises(ValueError, match=r"--mirror .*actions 7"):  # extra data are checked too
        resolve_mirror(_cfg(tiny_data, tmp_path / "r7", mirror=True, extra_data=(tmp_path / "d7",)))


def test_an_unknown_compile_mode_is_refused_before_any_run_folder(tiny_data, tmp_path):
    with pytest.raises(ValueError, match="--compile must be one of default, reduce-overhead, max-autotune, got 'fast'"):
        train_world_model(_cfg(tiny_data, tmp_path / "r", compile="fast"), progress=False)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("weight", [0.0, float("nan")])
def test_a_change_mask_static_weight_that_is_not_positive_is_refused_before_any_run_folder(tiny_data, tmp_path, weight):
    with pytest.raises(ValueError, match="--change-mask-static-weight must be > 0"):
        train_world_model(_cfg(tiny_data, tmp_path / "r", change_mask_static_weight=weight), progress=False)
    assert not (tmp_path / "r").exists()


def test_the_fits_after_training_run_the_uncompiled_losses(trained):
    """`compile_losses` wraps the losses and the autoencoder; `uncompile_losses` (before the heads', the change
    mask's and the videos' fits, whose shapes differ from training's) gives the class's own methods back."""
    from world_models.video.train import compile_losses, uncompile_losses

    model = VideoWorldModel.load(trained / "checkpoints/last")
    compile_losses(model, "default")  # lazy: nothing compiles until called
    assert "heads_loss" in vars(model) and "dynamics_loss" in vars(model)  # the compiled wrappers
    assert model.ae._compiled_call_impl is not None and "unrolled_loss" in vars(model.state_channel)
    uncompile_losses(model)
    assert model.heads_loss.__func__ is VideoWorldModel.heads_loss
    assert model.dynamics_loss.__func__ is VideoWorldModel.dynamics_loss
    assert model.ae._compiled_call_impl is None and "unrolled_loss" not in vars(model.state_channel)


def test_nan_loss_stops_training_and_names_the_last_checkpoint(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setattr(VideoWorldModel, "dynamics_loss", lambda self, *a, **k: torch.tensor(float("nan"), requires_grad=True))
    with pytest.raises(RuntimeError, match="loss became non-finite.*last good checkpoint is in .*checkpoints/last"):
        train_world_model(_cfg(tiny_data, tmp_path / "r", ae_steps=2, state_steps=0, state_channel=False), progress=False)


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
        loss, _ = model.heads_loss(z, [TASK] * 64, labels, torch.ones(64), noise=0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    z, y = batch(400)
    with torch.no_grad():
        p = torch.sigmoid(model.heads(z, model.task([TASK] * 400))["success_logit"])
    assert auroc(p.numpy(), y.numpy() == 1) > 0.95


def test_action_chunk_validation():
    model = VideoWorldModel(WorldModelConfig(size="tiny", task_vocab=VOCAB))
    state = _state(model)
    with pytest.raises(ValueError, match="action_chunk: expected"):
        model.step(state, torch.zeros(2, 5, 4))
    with pytest.raises(ValueError, match="action_chunk: expected"):
        model.step(state, torch.zeros(2, 2, 3))
    with pytest.raises(ValueError, match="NaN"):
        model.step(state, torch.full((2, 2, 4), float("nan")))
    new, preds = model.step(state, torch.zeros(2, 3, 4), steps=1)
    assert preds["latents"].shape == (2, 3, 16, 16, 16) and preds["success"].shape == (2, 3)
    assert preds["pose"].shape == (2, 3, 4) and torch.equal(new["pose"], preds["pose"][:, -1])


def test_autoencoder_weights_favour_pixels_that_differ_from_the_mean_frame():
    from world_models.video.train import ae_weights

    x = -torch.ones(2 * 4, 3, 8, 8)  # 2 cameras x 4 frames of flat background
    x[1, :, 2, 3] = 1.0  # camera 0, frame 1: one bright "cube" pixel
    w = ae_weights(x, n_cameras=2, fg_weight=3.0)
    assert w.shape == (8, 1, 8, 8)
    assert abs(w.mean().item() - 1.0) < 1e-6
    assert w[1, 0, 2, 3] > 3 * w[1, 0, 0, 0]
    assert torch.allclose(w[4:], w[4, 0, 0, 0].expand_as(w[4:]))  # the other camera is all background


def test_inside_a_rollout_all_proprioception_comes_from_the_state_channel(trained, tiny_data, monkeypatch):
    """The policy's observation.state in imagination is the state channel's (ee, opening and the joint angles), not
    read back from frame heads on generated latents; a checkpoint from before the rest head keeps the heads' joints."""
    model = VideoWorldModel.load(trained / "checkpoints/last")
    assert model.cfg.state_rest and model.cfg.rest_index == [0, 1, 2, 3]
    _, _, held = load_split(tiny_data, 0.25)
    obs = first_observation(held)
    orig = model.heads.forward

    def garbage_state(*a, **k):  # frame heads that read proprioception wrongly by a mile
        out = dict(orig(*a, **k))
        out["state"] = torch.full_like(out["state"], 1e3)
        return out

    monkeypatch.setattr(model.heads, "forward", garbage_state)
    state = model.encode(obs)
    x0 = state["x"].mean(0)
    _, preds = model.step(state, torch.zeros(1, 2, 4))
    s = preds["observation.state"]
    assert (s.abs() < 10).all()  # nothing of the heads' state got through
    assert torch.allclose(s[..., model.cfg.rest_index], preds["rest"])
    assert torch.allclose(s[:, 0, :4], x0[:, -4:], atol=0.5)  # joint angles (rad) near the start's after one step
    old = VideoWorldModel(dataclasses.replace(model.cfg, state_rest=False))
    old.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("state_channel.rest.")})
    monkeypatch.setattr(old.heads, "forward", garbage_state)
    _, preds = old.step(old.encode(obs), torch.zeros(1, 2, 4))
    assert (preds["observation.state"][..., :4] == 1e3).all() and (preds["observation.state"][..., 4:] < 10).all()


def test_init_from_keeps_the_frames_model_and_trains_a_new_state_channel(trained, tiny_data, tmp_path):
    """A new state channel on an existing world model: every weight but the channel's comes from the source."""
    src = VideoWorldModel.load(trained / "checkpoints/last")
    train_world_model(tiny_wm_config(tiny_data, tmp_path / "new", init_from=trained, ae_steps=0, dyn_steps=0,
                                     unroll_steps=0, state_steps=3, state_members=2), progress=False)
    new = VideoWorldModel.load(tmp_path / "new/checkpoints/last")
    assert new.cfg.state_members == 2 and new.state_channel.rest is not None
    theirs, ours = src.state_dict(), new.state_dict()
    # (the change mask is refitted after any training: it corrects the decode of the model as it now predicts)
    kept = [k for k in ours if not k.startswith(("state_channel.", "change_mask"))]
    assert kept and all(torch.equal(ours[k], theirs[k]) for k in kept)
    assert ours["state_channel.arm.l1.weight"].shape[0] == 2
    assert not torch.equal(ours["change_mask.front.net.0.weight"], theirs["change_mask.front.net.0.weight"])


def test_init_from_without_its_state_channel_trains_the_channel_anew(trained, tiny_data, tmp_path):
    """`init_state_channel` False: the same recipe (which would fine-tune every weight) takes all but the channel, which
    starts from a fresh initialisation (a channel seed of the source's recipe); True (default) fine-tunes the source's."""
    src = VideoWorldModel.load(trained / "checkpoints/last").state_dict()
    chans = {}
    for keep in (True, False):
        train_world_model(tiny_wm_config(tiny_data, tmp_path / str(keep), init_from=trained, ae_steps=0, dyn_steps=0,
                                         unroll_steps=0, state_steps=1, change_mask_steps=0, init_state_channel=keep),
                          progress=False)
        chans[keep] = VideoWorldModel.load(tmp_path / str(keep) / "checkpoints/last").state_dict()
    k = "state_channel.cube.l1.weight"
    kept, fresh = ((chans[keep][k] - src[k]).abs().max().item() for keep in (True, False))
    # one Adam step (lr 2e-3) from the source's, against the seed's initial draw: the source's training apart
    assert kept <= 2.5e-3 and fresh > 10 * kept
    frames = [k for k in src if k.startswith(("ae.", "net."))]
    assert frames and all(torch.equal(chans[False][k], src[k]) for k in frames)  # the frames model is the source's


def test_the_rest_head_leaves_the_arm_and_cube_training_unchanged(tiny_data, tmp_path):
    """The joints' head reads the arm detached and is clipped apart: the arm and cube heads train exactly as without it."""
    runs = {}
    for rest in (False, True):
        train_world_model(tiny_wm_config(tiny_data, tmp_path / str(rest), ae_steps=0, dyn_steps=0, unroll_steps=0,
                                         state_steps=30, state_rest=rest), progress=False)
        runs[rest] = VideoWorldModel.load(tmp_path / str(rest) / "checkpoints/last").state_channel.state_dict()
    shared = [k for k in runs[False]]
    assert shared and all(torch.allclose(runs[True][k], runs[False][k], atol=1e-6) for k in shared)
    assert any(k.startswith("rest.") for k in runs[True])


def test_nearest_other_cube_feature_and_the_pairs_head():
    """`nearest_other` gives each cube its offset to the closest other cube (clipped, never itself); with `pairs`
    the cube head reads it, so moving a far cube next to another changes that cube's prediction, while without it
    the prediction is blind to the other cubes."""
    from world_models.video.state_channel import PAIR_RANGE, nearest_other

    cubes = torch.tensor([[0.0, 0.0, 0.02], [0.05, 0.0, 0.02], [0.0, 2.0, -5.0]])
    off = nearest_other(cubes)
    assert torch.allclose(off[0], torch.tensor([0.05, 0.0, 0.0])) and torch.allclose(off[1], torch.tensor([-0.05, 0.0, 0.0]))
    assert torch.allclose(off[2], torch.tensor([0.0, -PAIR_RANGE, PAIR_RANGE]))  # a fallen cube: clipped
    assert torch.equal(nearest_other(cubes[:1]), torch.zeros(1, 3))
    torch.manual_seed(0)
    for pairs in (False, True):
        sc = StateChannel(StateChannelConfig(members=2, hidden=16, pairs=pairs))
        torch.nn.init.normal_(sc.cube.out.weight)  # zero-initialised outputs would hide every input
        x = torch.tensor([0.4, 0.0, 0.05, 0.05, 0.4, 0.03, 0.02, 0.5, 0.2, 0.02, 0.3, -0.2, 0.02])
        y = x.clone()
        y[10:13] = torch.tensor([0.42, 0.0, 0.02])  # the third cube moved next to the first
        a = torch.tensor([[0.5, 0.0, 0.0, -1.0]])
        out_x, logit_x = sc.next(x[None, None].expand(2, 1, -1), a, gate="soft")
        out_y, logit_y = sc.next(y[None, None].expand(2, 1, -1), a, gate="soft")
        assert torch.equal(logit_x[..., 1], logit_y[..., 1])  # the second cube's nearest stays the first
        assert (not torch.equal(logit_x[..., 0], logit_y[..., 0])) == pairs


@pytest.mark.parametrize("pairs", [False, True])
def test_the_hand_frame_cube_head_is_equivariant_to_rotations_about_the_vertical(pairs):
    """With `hand_frame`, turning the whole scene (hand, cubes, the action's horizontal part) about the vertical turns
    every cube's predicted position the same way and leaves the contact gates unchanged; the world-frame head does
    not. A hand right above a cube (no horizontal offset) gets the x axis, not NaN."""
    from world_models.video.state_channel import hand_frame_axes

    torch.manual_seed(0)
    th = 0.7
    R = torch.tensor([[math.cos(th), -math.sin(th)], [math.sin(th), math.cos(th)]])
    for hand_frame in (True, False):
        sc = StateChannel(StateChannelConfig(members=2, hidden=16, hand_frame=hand_frame, pairs=pairs))
        for p in sc.cube.parameters():
            torch.nn.init.normal_(p, std=0.3)  # zero-initialised outputs would be trivially equivariant
        P = sc.cfg.n_arm_objects
        x, a = torch.randn(2, 5, sc.cfg.dim) * 0.1, torch.randn(5, 4)

        def turn(v, starts):
            v = v.clone()
            for o in starts:
                v[..., o : o + 2] = v[..., o : o + 2] @ R.T
            return v

        out, logit = sc.next(x, a, gate="soft")
        out_r, logit_r = sc.next(turn(x, [0, *range(4, P, 3)]), turn(a, [0]), gate="soft")
        cube_err = (turn(out, range(4, P, 3)) - out_r)[..., 4:P].abs().max().item()
        if hand_frame:
            assert cube_err < 1e-6 and torch.allclose(logit, logit_r, atol=1e-5)
        else:
            assert cube_err > 1e-3
    axes = hand_frame_axes(torch.tensor([[0.0, 0.0], [0.0, 0.2]]))
    assert torch.equal(axes[0], torch.eye(2)) and torch.allclose(axes[1], torch.tensor([[0.0, 1.0], [-1.0, 0.0]]))


def test_the_velocity_state_is_each_cubes_last_displacement_in_data_and_in_rollouts(tiny_data):
    """With `state_velocity` the sampler's x ends with each cube's displacement since the frame before (zero at an
    episode's first frame); the channel's next x ends with the difference of its own predicted and current cube
    positions; the cube head reads it, and it is no target of the loss (only positions are)."""
    from world_models.video.model import channel_state, channel_states

    _, train, _ = load_split(tiny_data, 0.25)
    cfg = WorldModelConfig(task_vocab=VOCAB, state_velocity=True)
    s = WindowSampler(train, "cpu", cfg)
    xs, a, m = s.state_sequences(2, 64, 6, torch.Generator().manual_seed(0))
    n_c, R = cfg.n_objects, 4 + 3 * cfg.n_objects + len(cfg.rest_index)
    assert xs.shape[-1] == R + 3 * n_c
    assert torch.allclose(xs[:, :, 1:, R:], (xs[:, :, 1:, 4 : 4 + 3 * n_c] - xs[:, :, :-1, 4 : 4 + 3 * n_c]) * m[..., None],
                          atol=1e-6)  # past an episode's end the frame repeats: no displacement
    firsts = s.seq["first"][s.seq["starts"]] == s.seq["starts"]  # windows that start at an episode's first frame
    x0 = channel_state(cfg, s.seq["state"][s.seq["starts"][firsts]], s.seq["env"][s.seq["starts"][firsts]])
    assert firsts.any() and torch.equal(x0[:, R:], torch.zeros_like(x0[:, R:]))
    seq = channel_states(cfg, s.seq["state"][:5], s.seq["env"][:5])
    assert torch.equal(seq[0, R:], torch.zeros(3 * n_c)) and torch.allclose(seq[1:, R:], seq[1:, 4 : 4 + 3 * n_c] - seq[:-1, 4 : 4 + 3 * n_c])

    torch.manual_seed(0)
    sc = StateChannel(StateChannelConfig(members=2, hidden=16, n_rest=len(cfg.rest_index), hand_frame=True, velocity=True))
    torch.nn.init.normal_(sc.cube.out.weight)
    nxt, _ = sc.next(xs[:, :, 0], a[:, :, 0], gate="hard")
    assert torch.allclose(nxt[..., R:], nxt[..., 4 : 4 + 3 * n_c] - xs[:, :, 0, 4 : 4 + 3 * n_c], atol=1e-7)
    kicked = xs.clone()
    kicked[:, :, 0, R:] += 0.03  # every cube sliding 3 cm a step: the head reads it
    assert not torch.equal(sc.next(kicked[:, :, 0], a[:, :, 0], gate="soft")[0], sc.next(xs[:, :, 0], a[:, :, 0], gate="soft")[0])
    wrong = xs.clone()
    wrong[:, :, 1:, R:] += 0.03  # wrong displacements in the targets: no target, same loss
    assert sc.unrolled_loss(wrong, a, torch.ones_like(m))[0].item() == pytest.approx(sc.unrolled_loss(xs, a, torch.ones_like(m))[0].item())


def _drop_config_key(checkpoint, key: str) -> None:
    """Make a saved checkpoint look like one from before `key` existed."""
    cfg_file = next(f for f in checkpoint.iterdir() if f.suffix == ".json" and "config" in f.name)
    cfg = json.loads(cfg_file.read_text())
    cfg.pop(key)
    cfg_file.write_text(json.dumps(cfg))


def test_a_checkpoint_from_before_the_hand_frame_loads_with_the_world_frame(tmp_path):
    """Checkpoints saved before `state_hand_frame` existed trained a world-frame cube head; they load as such."""
    m = VideoWorldModel(WorldModelConfig(size="tiny", task_vocab=VOCAB, env_state_dim=13, state_members=2,
                                         state_hand_frame=False))
    m.save(tmp_path / "m")
    _drop_config_key(tmp_path / "m", "state_hand_frame")
    loaded = VideoWorldModel.load(tmp_path / "m")
    assert loaded.cfg.state_hand_frame is False and loaded.state_channel.cfg.hand_frame is False
    assert WorldModelConfig(task_vocab=VOCAB).state_hand_frame is True  # new models: the hand frame


def test_the_motion_weight_scales_the_loss_where_the_target_moves_and_reaches_the_model(tiny_data):
    """`motion_weight` w: a target equal to the last context frame keeps the plain loss; one that moves by >= 0.5
    everywhere gets (1 + w) times it. `wmrl train-wm --motion-weight` sets it in the model's config."""
    from wmrl.datasets.lerobot_v3 import LeRobotV3Dataset
    from world_models.video.train import model_config

    torch.manual_seed(0)
    plain = VideoWorldModel(WorldModelConfig(size="tiny", task_vocab=VOCAB, deterministic=True, context_noise_max=0.0,
                                             motion_weight=0.0))
    weighted = VideoWorldModel(dataclasses.replace(plain.cfg, motion_weight=3.0))
    weighted.load_state_dict(plain.state_dict())
    B, C, S = 4, plain.cfg.frame_channels, plain.cfg.latent_size
    ctx = torch.randn(B, 2, C, S, S)
    args = (torch.zeros(B, 4), torch.zeros(B, 4, 4), torch.ones(B, 4))
    still = ctx[:, -1:].expand(-1, 4, -1, -1, -1).clone()
    moved = still + 1.0
    loss = lambda m, fut: m.dynamics_loss(ctx, ctx[:, 0], fut, *args).item()
    assert loss(weighted, still) == pytest.approx(loss(plain, still))
    assert loss(weighted, moved) == pytest.approx(4.0 * loss(plain, moved))
    ds = LeRobotV3Dataset(tiny_data)
    assert model_config(TrainWMConfig(data=tiny_data, motion_weight=0.0), ds).motion_weight == 0.0
    assert model_config(TrainWMConfig(data=tiny_data), ds).motion_weight == 3.0


def test_contact_gate_modes_hard_soft_and_sampled():
    """The cube head predicts the change given contact and the gate p the chance of contact. `soft` moves a cube by
    p times the change, `hard` by all of it when p > 0.5, `sample` by all of it with probability p (so on average as
    `soft`), and a contact less likely than GATE_FLOOR never moves the cube."""
    from world_models.video.state_channel import GATE_FLOOR

    sc = StateChannel(StateChannelConfig(n_cubes=2, members=1, hidden=8))
    change, logits = torch.tensor([2.0, -1.0, 0.5]), torch.tensor([0.4, 0.8, torch.logit(torch.tensor(GATE_FLOOR / 2))])

    def head(feats):  # cube 0: p = 0.4 / 0.8 by the batch entry; cube 1: always below the floor
        out = torch.zeros(*feats.shape[:-1], 4)
        out[..., :3] = change
        p = torch.tensor([[0.4, GATE_FLOOR / 2], [0.8, GATE_FLOOR / 2]]).repeat(feats.shape[1] // 4, 1).reshape(-1)
        out[..., 3] = torch.logit(p)
        return out

    sc.cube.forward = head
    N = 4000
    x = torch.zeros(1, N, sc.cfg.dim)
    x[..., 2] = 0.1  # hand above the table, cubes at the origin and beside it
    x[..., 4:7] = torch.tensor([0.05, 0.0, 0.02])
    x[..., 7:10] = torch.tensor([0.3, 0.3, 0.02])
    a = torch.zeros(N, 4)
    p = torch.tensor([0.4, 0.8]).repeat(N // 2)
    moved = {g: (sc.next(x, a, gate=g)[0] - x)[0, :, 4:10] for g in ("hard", "soft", "sample")}
    full = change / 100
    assert torch.allclose(moved["hard"][:, :3], (p > 0.5).float()[:, None] * full, atol=1e-6)
    assert torch.allclose(moved["soft"][:, :3], p[:, None] * full, atol=1e-6)
    drawn = moved["sample"][:, 0] != 0
    assert torch.allclose(moved["sample"][drawn, :3], full.expand(int(drawn.sum()), 3), atol=1e-6)  # all or nothing
    for q in (0.4, 0.8):
        share = drawn[p == q].float().mean()
        assert abs(share - q) < 0.04, (q, share)  # 2,000 draws each: 4 points is ~2.6 standard errors at p = 0.5
    assert (moved["sample"][:, 3:] == 0).all() and (moved["hard"][:, 3:] == 0).all()  # below the floor: still
    draw = lambda s: sc.next(x, a, gate="sample", generator=torch.Generator().manual_seed(s))[0]
    assert torch.equal(draw(1), draw(1)) and not torch.equal(draw(1), draw(2))  # a rollout's generator decides
    with pytest.raises(ValueError, match="gate"):
        sc.next(x, a, gate="maybe")
    with pytest.raises(ValueError, match="state_gate"):
        VideoWorldModel(WorldModelConfig(task_vocab=VOCAB, state_gate="maybe"))


def test_the_shared_gate_draws_one_contact_for_all_members():
    """`shared`: members that agree on p push together on the same steps (one draw per rollout, cube and step), so
    their mean cube moves all of a push or none of it; under `sample` each member draws alone and the mean moves a
    fraction. Members with different p still contact on the share of steps their own p says."""
    M, N = 4, 4000
    sc = StateChannel(StateChannelConfig(n_cubes=1, members=M, hidden=8))
    p_member = torch.tensor([0.6, 0.6, 0.6, 0.3])

    def head(feats):  # the same change for every member; member m's contact probability p_member[m]
        out = torch.zeros(*feats.shape[:-1], 4)
        out[..., 0] = 2.0
        out[..., 3] = torch.logit(p_member)[:, None].expand(M, feats.shape[1])
        return out

    sc.cube.forward = head
    x = torch.zeros(M, N, sc.cfg.dim)
    x[..., 2] = 0.1
    x[..., 4:7] = torch.tensor([0.05, 0.0, 0.02])
    a = torch.zeros(N, 4)
    moved = {g: (sc.next(x, a, gate=g, generator=torch.Generator().manual_seed(0))[0] - x)[..., 4] != 0
             for g in ("sample", "shared")}
    agree = moved["shared"][:3]
    assert (agree == agree[0]).all()  # the three members with p = 0.6 move on exactly the same steps
    assert not (moved["sample"][:3] == moved["sample"][0]).all()
    assert (moved["shared"][3] <= moved["shared"][0]).all()  # one draw u: u < 0.3 implies u < 0.6
    for m in range(M):
        assert abs(moved["shared"][m].float().mean() - p_member[m]) < 0.04


def test_the_arm_head_reads_the_joints_only_with_arm_rest(tmp_path):
    """`arm_rest`: the arm head's prediction depends on the joint angles (two arms with the same hand move apart),
    the arm's loss does not train the rest's prediction through that input, a channel without a rest refuses it,
    and checkpoints saved before the option existed load without it."""
    n_rest = 4
    D = 4 + 9 + n_rest
    torch.manual_seed(0)
    x = torch.randn(2, 3, D) * 0.1
    a = torch.rand(3, 4) * 2 - 1
    bent = x.clone()
    bent[..., 13:] += 0.5  # the same hand, the joints elsewhere
    for arm_rest in (False, True):
        sc = StateChannel(StateChannelConfig(members=2, hidden=16, n_rest=n_rest, arm_rest=arm_rest))
        torch.nn.init.normal_(sc.arm.out.weight)
        moved = not torch.allclose(sc.next(x, a)[0][..., :4], sc.next(bent, a)[0][..., :4])
        assert moved is arm_rest
    xr = x.clone().requires_grad_(True)
    sc.next(xr, a)[0][..., :4].sum().backward()
    assert torch.equal(xr.grad[..., 13:], torch.zeros_like(xr.grad[..., 13:]))
    with pytest.raises(ValueError, match="n_rest is 0"):
        StateChannelConfig(arm_rest=True)
    assert VideoWorldModel(WorldModelConfig(size="tiny", task_vocab=VOCAB, env_state_dim=13, state_members=2,
                                            state_arm_rest=True)).state_channel.cfg.arm_rest
    m = VideoWorldModel(WorldModelConfig(size="tiny", task_vocab=VOCAB, env_state_dim=13, state_members=2))
    m.save(tmp_path / "m")
    _drop_config_key(tmp_path / "m", "state_arm_rest")
    loaded = VideoWorldModel.load(tmp_path / "m")
    assert loaded.cfg.state_arm_rest is False and loaded.state_channel.cfg.arm_rest is False


def test_a_hand_commanded_past_the_workspace_edge_stays_there_with_arm_target(tmp_path):
    """`arm_target`: the heads read the command clipped to the workspace, and the arm predicts the hand's deviation
    from the target scaled by the commanded displacement. With any weights, a hand on the edge pushed further out
    stays exactly where it is, while one pushed back in moves; untrained, the hand lands on the target. Without it,
    the same weights move the pinned hand (the demo's failed episodes: hand pinned at y = -0.28 while the policy
    pushed on, and the imagined hand drifted by centimetres)."""
    lo, hi = (0.2, -0.28, 0.015), (0.62, 0.28, 0.3)
    torch.manual_seed(0)
    x = torch.zeros(2, 3, 13)
    x[..., :3] = torch.tensor([0.4, -0.28, 0.09])  # on the y edge
    x[..., 3] = 0.02
    x[..., 4:13] = 0.1  # cubes far away
    out = torch.tensor([[0.0, -1.0, 0.0, 1.0]] * 3)  # pushes on past the edge
    back = torch.tensor([[0.0, 1.0, 0.0, 1.0]] * 3)
    fresh = StateChannel(StateChannelConfig(members=2, hidden=16, arm_target=True, workspace_low=lo, workspace_high=hi))
    assert torch.allclose(fresh.next(x, back)[0][..., :3], x[..., :3] + torch.tensor([0.0, 0.05, 0.0]), atol=1e-7)
    for arm_target in (True, False):
        sc = StateChannel(StateChannelConfig(members=2, hidden=16, arm_target=arm_target, workspace_low=lo, workspace_high=hi))
        torch.nn.init.normal_(sc.arm.out.weight)
        still = torch.equal(sc.next(x, out)[0][..., :3], x[..., :3])
        assert still is arm_target
        assert (sc.next(x, back)[0][..., 1] - x[..., 1]).abs().min() > 1e-3  # pushed back in: it moves
    with pytest.raises(ValueError, match="no workspace"):
        StateChannelConfig(arm_target=True)
    m = VideoWorldModel(WorldModelConfig(size="tiny", task_vocab=VOCAB, env_state_dim=13, state_members=2,
                                         state_arm_target=True))
    assert m.state_channel.cfg.arm_target and m.state_channel.cfg.workspace_low == m.cfg.workspace_low
    m.save(tmp_path / "m")
    _drop_config_key(tmp_path / "m", "state_arm_target")
    assert VideoWorldModel.load(tmp_path / "m").state_channel.cfg.arm_target is False


def test_detach_hand_keeps_the_cube_loss_off_the_arm():
    """`detach_hand`: the cubes' prediction still moves with the hand, but no gradient of it reaches the hand's
    position (the arm is trained by its own loss only); without it, it does."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 13) * 0.05
    x[..., 4:13] = x[..., :3].repeat(1, 1, 3) + 0.03  # cubes next to the hand, so the head sees contact-range inputs
    a = torch.rand(3, 4) * 2 - 1
    for detach in (False, True):
        sc = StateChannel(StateChannelConfig(members=2, hidden=16, detach_hand=detach))
        torch.nn.init.normal_(sc.cube.out.weight)
        xr = x.clone().requires_grad_(True)
        sc.next(xr, a, gate="soft")[0][..., 4:13].sum().backward()
        hand_grad = xr.grad[..., :3].abs().sum().item()
        assert (hand_grad == 0.0) is detach
        shifted = x.clone()
        shifted[..., :3] += 0.01
        assert not torch.allclose(sc.next(x, a, gate="soft")[0][..., 4:13], sc.next(shifted, a, gate="soft")[0][..., 4:13])


def test_pixel_major_convolutions_give_the_same_outputs_and_gradients():
    """The autoencoder and the change mask run their convolutions on channels-last inputs (faster on a CPU): the
    outputs and the weights' gradients are those of the plain layout, and callers get contiguous tensors back."""
    from world_models.video.networks import ChangeMask, FrameAutoencoder

    torch.manual_seed(0)
    ae, x = FrameAutoencoder(latent_channels=4, width=16), torch.rand(4, 3, 64, 64) * 2 - 1
    z = ae.encode(x)
    y = ae.decode(z)
    assert z.is_contiguous() and y.is_contiguous()
    assert torch.allclose(z, ae.enc(x.contiguous()), atol=1e-5) and torch.allclose(y, ae.dec(z), atol=1e-5)
    y.square().mean().backward()
    fast = [p.grad.clone() for p in ae.parameters()]
    ae.zero_grad()
    ae.dec(ae.enc(x)).square().mean().backward()  # the plain layout: neither the input nor the weights pixel-major
    assert all(torch.allclose(a, p.grad, atol=1e-5, rtol=1e-4) for a, p in zip(fast, ae.parameters()))
    assert all(p.is_contiguous() for p in ae.parameters())  # safetensors saves only contiguous tensors

    net = ChangeMask(refine=True)
    torch.nn.init.normal_(net.net[-1].weight, std=0.1)
    pred, f0 = torch.rand(2, 3, 64, 64) * 2 - 1, torch.rand(2, 3, 64, 64) * 2 - 1
    o = net.net(torch.cat([pred, f0, pred - f0], 1))
    plain = f0 + torch.sigmoid(o[:, :1]) * (pred - f0) + 0.1 * o[:, 1:]
    out = net(pred, f0)
    assert out.is_contiguous() and torch.allclose(out, plain, atol=1e-5)

    # the pose layer likewise: its output and gradients are the plain layout's
    from world_models.video import networks

    layer, hands = networks.PoseLayer(), torch.rand(2, 6) * 2 - 1
    fast_out = layer(hands, f0)
    fast_out.square().mean().backward()
    fast = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    default = networks.CHANNELS_LAST
    networks.CHANNELS_LAST = False
    try:
        slow_out = layer(hands, f0)
        slow_out.square().mean().backward()
    finally:
        networks.CHANNELS_LAST = default
    assert fast_out.is_contiguous() and torch.allclose(fast_out, slow_out, atol=1e-5)
    assert all(torch.allclose(a, p.grad, atol=1e-5, rtol=1e-4) for a, p in zip(fast, layer.parameters()))


def test_the_change_mask_blends_each_pixel_between_the_start_frame_and_the_decode():
    from world_models.video.networks import ChangeMask

    torch.manual_seed(0)
    net = ChangeMask()
    torch.nn.init.normal_(net.net[-1].weight)
    f0, pred = torch.rand(3, 3, 64, 64) * 2 - 1, torch.rand(3, 3, 64, 64) * 2 - 1
    out = net(pred, f0)
    lo, hi = torch.minimum(f0, pred), torch.maximum(f0, pred)
    assert bool(((out >= lo - 1e-6) & (out <= hi + 1e-6)).all())  # a convex blend, pixel by pixel
    m = (out - f0) / (pred - f0)
    assert torch.allclose(m[:, 0], m[:, 1], atol=1e-3) and m.std() > 0.01  # one weight per pixel, not one per frame
    assert torch.equal(net(f0, f0), f0)


def test_the_refining_change_mask_starts_as_the_blend_and_learns_a_correction_the_blend_cannot_make():
    from world_models.video.networks import ChangeMask

    torch.manual_seed(0)
    blend, refine = ChangeMask(), ChangeMask(refine=True)
    with torch.no_grad():  # the same blend weights: at the start the correction is zero
        for (_, p), (_, q) in zip(blend.named_parameters(), refine.named_parameters()):
            q[: len(p)] = p
    f0, pred = torch.rand(4, 3, 16, 16) * 2 - 1, torch.rand(4, 3, 16, 16) * 2 - 1
    assert torch.allclose(refine(pred, f0), blend(pred, f0), atol=1e-6)
    # a target outside [frame0, pred] per pixel (a brighter frame): the blend cannot reach it, the correction can
    real = (torch.maximum(f0, pred) + 0.2).clamp(max=1)
    errs = {}
    for name, net in (("blend", blend), ("refine", refine)):
        opt = torch.optim.Adam(net.parameters(), 1e-2)
        for _ in range(150):
            loss = ((net(pred, f0) - real) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        errs[name] = float(((net(pred, f0) - real) ** 2).mean())
    assert errs["refine"] < 0.5 * errs["blend"]


def _wrist_view_batch(n: int, gen: torch.Generator):
    """A wrist-like camera: the whole 32x32 view of a smooth scene shifts with the hand (1 px per 0.01 of pose
    change). Returns the start frames, the real frames, each frame's pose and the start pose."""
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, 32), torch.linspace(-1, 1, 32), indexing="ij")
    scene = torch.stack([torch.sin(5 * xx + 2 * yy), torch.cos(4 * yy - xx), torch.sin(3 * xx * yy + 1)])
    pose0 = torch.rand(n, 2, generator=gen) * 2 - 1
    pose = pose0 + 0.1 * (torch.rand(n, 2, generator=gen) * 2 - 1)
    theta = torch.eye(2, 3).repeat(n, 1, 1)
    theta[:, :, 2] = 2 / 32 * 100 * (pose - pose0)
    f0 = scene.expand(n, -1, -1, -1)
    grid = torch.nn.functional.affine_grid(theta, [n, 3, 32, 32], align_corners=False)
    return f0, torch.nn.functional.grid_sample(f0, grid, padding_mode="border", align_corners=False), pose, pose0


def test_the_warping_change_mask_starts_at_the_identity_and_learns_a_shift_that_follows_the_pose():
    from world_models.video.change_mask import frame_log_mse
    from world_models.video.networks import ChangeMask

    torch.manual_seed(0)
    net = ChangeMask(warp_pose_dim=2)
    gen = torch.Generator().manual_seed(0)
    batch = lambda n: _wrist_view_batch(n, gen)

    f0, real, pose, pose0 = batch(8)
    assert torch.allclose(net.warp_frame(f0, pose, pose0), f0, atol=1e-5)  # the identity warp at the start
    with pytest.raises(ValueError, match="pose"):
        net(f0, f0)
    opt = torch.optim.Adam(net.warp.parameters(), 3e-3)
    for _ in range(300):
        f0, real, pose, pose0 = batch(32)
        loss = frame_log_mse(net.warp_frame(f0, pose, pose0), real)
        opt.zero_grad()
        loss.backward()
        opt.step()
    f0, real, pose, pose0 = batch(64)  # poses it has not seen
    with torch.no_grad():
        warped = float(((net.warp_frame(f0, pose, pose0) - real) ** 2).mean())
    assert warped < 0.2 * float(((f0 - real) ** 2).mean())


def test_the_three_source_change_mask_keeps_what_the_pose_does_not_move():
    """Half the view moves with the hand (a wrist camera's table), half stays (its fingers, a fixed camera's
    background); the decode is noisy. Two sources must carry the still half along with the warp or take the noisy
    decode; the third source, the unwarped start frame, keeps it exact."""
    from world_models.video.change_mask import frame_log_mse
    from world_models.video.networks import ChangeMask

    with pytest.raises(ValueError, match="warp_pose_dim"):
        ChangeMask(keep_unwarped=True)
    gen = torch.Generator().manual_seed(0)

    def batch(n):
        f0, real, pose, pose0 = _wrist_view_batch(n, gen)
        real[..., 16:] = f0[..., 16:]
        return real + 0.3 * torch.randn(real.shape, generator=gen), f0, real, pose, pose0

    errs = {}
    for three in (False, True):
        torch.manual_seed(0)
        net = ChangeMask(refine=True, warp_pose_dim=2, keep_unwarped=three)
        pred, f0, real, pose, pose0 = batch(4)
        with torch.no_grad():  # it starts near the plain decode
            assert ((net(pred, f0, pose, pose0) - pred) ** 2).mean() < 0.25 * ((f0 - pred) ** 2).mean()
        opt = torch.optim.Adam(net.parameters(), 2e-3)
        for _ in range(300):
            pred, f0, real, pose, pose0 = batch(16)
            loss = frame_log_mse(net(pred, f0, pose, pose0), real) + frame_log_mse(net.warp_frame(f0, pose, pose0), real)
            opt.zero_grad()
            loss.backward()
            opt.step()
        pred, f0, real, pose, pose0 = batch(64)
        with torch.no_grad():
            errs[three] = float(((net(pred, f0, pose, pose0) - real)[..., 16:] ** 2).mean())
    assert errs[True] < 0.5 * errs[False]


def test_a_change_mask_with_coordinates_keeps_the_start_frame_where_the_image_says():
    """Where the start frame stays right depends only on where in the image a pixel is (the wrist camera's fingers):
    the left half of every frame is the start frame, the right half changes, and nothing in the images tells the
    halves apart away from the borders. The mask that reads the pixel's coordinates learns to copy the left half;
    the one without cannot (it blends the same way on both halves' interiors)."""
    from world_models.video.change_mask import frame_log_mse
    from world_models.video.networks import ChangeMask

    gen = torch.Generator().manual_seed(0)

    def batch(n):
        f0 = torch.rand(n, 3, 1, 1, generator=gen).expand(n, 3, 32, 32) * 2 - 1
        real = torch.rand(n, 3, 1, 1, generator=gen).expand(n, 3, 32, 32) * 2 - 1
        real = torch.cat([f0[..., :16], real[..., 16:]], -1)
        return real + 0.3 * torch.randn(real.shape, generator=gen), f0, real

    errs = {}
    for coords in (False, True):
        torch.manual_seed(0)
        net = ChangeMask(coords=coords)
        opt = torch.optim.Adam(net.parameters(), 2e-3)
        for _ in range(300):
            pred, f0, real = batch(16)
            loss = frame_log_mse(net(pred, f0), real)
            opt.zero_grad()
            loss.backward()
            opt.step()
        pred, f0, real = batch(64)
        with torch.no_grad():
            errs[coords] = float(((net(pred, f0) - real)[..., 4:12] ** 2).mean())  # the left half's interior
    assert errs[True] < 0.5 * errs[False]


def test_a_change_mask_that_reads_the_pose_keeps_the_start_frame_where_the_hand_stayed():
    """The decode shows a change (random texture) in every frame; it is real only where the commanded hand moved.
    The images cannot tell which; the pose change can. (The warp is left at the identity: trained, it can smuggle the
    pose change into the warped frame.)"""
    from world_models.video.networks import ChangeMask

    with pytest.raises(ValueError, match="warp_pose_dim"):
        ChangeMask(read_pose=True)
    gen = torch.Generator().manual_seed(0)

    def batch(n):
        f0 = torch.rand(n, 3, 16, 16, generator=gen) * 2 - 1
        pred = torch.rand(n, 3, 16, 16, generator=gen) * 2 - 1
        moved = torch.rand(n, generator=gen) < 0.5
        pose0 = torch.rand(n, 2, generator=gen) * 2 - 1
        pose = pose0 + moved[:, None] * (0.05 + 0.05 * torch.rand(n, 2, generator=gen))
        return pred, f0, torch.where(moved[:, None, None, None], pred, f0), pose, pose0

    errs = {}
    for read in (False, True):
        torch.manual_seed(0)
        net = ChangeMask(warp_pose_dim=2, read_pose=read)
        opt = torch.optim.Adam(net.net.parameters(), 2e-3)
        for _ in range(150):
            pred, f0, real, pose, pose0 = batch(16)
            loss = ((net(pred, f0, pose, pose0) - real) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        pred, f0, real, pose, pose0 = batch(64)
        with torch.no_grad():
            errs[read] = float(((net(pred, f0, pose, pose0) - real) ** 2).mean())
    assert errs[True] < 0.01 * errs[False]


def test_a_warping_change_mask_decodes_only_with_the_frames_poses(trained, tiny_data):
    src = VideoWorldModel.load(trained / "checkpoints/last")
    model = VideoWorldModel(dataclasses.replace(src.cfg, change_warp=True)).eval()
    model.load_state_dict({k: v for k, v in src.state_dict().items() if not k.startswith("change_mask")}, strict=False)
    model.change_mask_fitted.fill_(True)
    _, _, held = load_split(tiny_data, 0.25)
    obs = {f"observation.images.{c}": held.data[f"observation.images.{c}"][:2] for c in model.cfg.cameras}
    obs.update({"observation.state": held.data["observation.state"][:2],
                "task": [held.vocab["task"][t] for t in held.data["task"][:2]],
                "observation.environment_state": held.data["observation.environment_state"][:2]})
    state = model.encode(obs)
    state, preds = model.step(state, torch.zeros(2, model.cfg.chunk, model.cfg.action_dim), steps=1)
    with pytest.raises(ValueError, match="commanded poses"):
        model.decode(preds["latents"], state)
    frames = model.decode(preds["latents"], state, preds["pose"])
    assert frames["observation.images.front"].shape == (2, model.cfg.chunk, 64, 64, 3)
    with pytest.raises(ValueError, match="poses: expected"):
        model.decode_frames(preds["latents"].flatten(0, 1), (state["z0"], state["frames0"]),
                            poses=(state["pose0"], preds["pose"][:, :1].flatten(0, 1)))


def test_the_change_mask_is_fitted_on_the_frames_mean_psnr_not_their_pooled_error():
    from world_models.video.change_mask import LOG_EPS, frame_log_mse

    real = torch.zeros(2, 3, 4, 4)
    x = torch.stack([torch.full((3, 4, 4), 0.1), torch.full((3, 4, 4), 0.03)])  # MSE 1e-2 (motion), 9e-4 (static)
    want = (math.log(1e-2 + LOG_EPS) + math.log(9e-4 + LOG_EPS)) / 2
    assert frame_log_mse(x, real).item() == pytest.approx(want, rel=1e-5)
    # halving either frame's error gains about the same (3 dB on that frame), unlike the pooled MSE (11x apart)
    half = 2 ** -0.5
    gain_large = frame_log_mse(x, real) - frame_log_mse(torch.stack([x[0] * half, x[1]]), real)
    gain_small = frame_log_mse(x, real) - frame_log_mse(torch.stack([x[0], x[1] * half]), real)
    assert gain_large.item() == pytest.approx(math.log(2) / 2, rel=0.01)
    assert gain_small.item() == pytest.approx(gain_large.item(), rel=0.03)


def test_an_unfitted_change_mask_is_never_applied(trained, tiny_data):
    model = VideoWorldModel(dataclasses.replace(VideoWorldModel.load(trained / "checkpoints/last").cfg))
    assert model.change_mask is not None and not bool(model.change_mask_fitted)
    _, _, held = load_split(tiny_data, 0.25)
    key = "observation.images.front"
    frames = {f"observation.images.{c}": held.data[f"observation.images.{c}"][:2] for c in model.cfg.cameras}
    z = model.encode_frames(frames)
    z1 = z + 0.3 * torch.randn_like(z)
    pose = model.observed_pose(torch.as_tensor(held.data["observation.state"][:2]))
    with torch.no_grad():
        plain = model.decode_frames(z1, (z, frames), mask=False)[key]
        assert torch.equal(model.decode_frames(z1, (z, frames), poses=(pose, pose))[key], plain)
        model.change_mask_fitted.fill_(True)
        assert not torch.equal(model.decode_frames(z1, (z, frames), poses=(pose, pose))[key], plain)


def test_training_fits_the_change_mask_on_the_models_rollouts_and_it_lowers_their_error(trained, tiny_data):
    from world_models.video.change_mask import fit_change_mask, mask_pairs

    model = VideoWorldModel.load(trained / "checkpoints/last")
    assert bool(model.change_mask_fitted)  # fitted at the end of `train_world_model`
    rows = [json.loads(x) for x in (trained / "metrics.jsonl").read_text().splitlines()]
    assert any("change_mask_mse_masked_front" in r for r in rows)
    _, train, _ = load_split(tiny_data, 0.25)
    torch.manual_seed(0)
    info = fit_change_mask(model, train, windows=4, steps=50)  # 0.78x / 0.58x the plain decode's error at 40 steps
    for cam in model.cfg.cameras:  # on the pairs it was fitted on: better than the plain decode
        assert info[f"change_mask_mse_masked_{cam}"] < info[f"change_mask_mse_plain_{cam}"]
    # the pairs are the plain decode's (the mask learns on what it corrects), whatever the flag was
    pred, f0, real, pose, pose0, moves, _, _ = mask_pairs(model, train, 2)[f"observation.images.{model.cfg.cameras[0]}"]
    assert pred.shape == f0.shape == real.shape and bool(model.change_mask_fitted)
    assert pose.shape == pose0.shape == (len(pred), model.cfg.pose_dim)


def test_the_change_masks_fit_draws_static_windows_as_often_as_asked(trained, tiny_data, monkeypatch):
    """`static_weight` w: a static window's frames are drawn w times as often as a motion window's (here window 0 of
    four is marked static, so at w=30 it fills 30/33 of the draws); a weight <= 0 or NaN is refused."""
    import world_models.video.change_mask as cm

    model = VideoWorldModel.load(trained / "checkpoints/last")
    _, train, _ = load_split(tiny_data, 0.25)
    original = cm._fit_windows

    def one_static(*a, **k):
        horizon, wins = original(*a, **k)
        return horizon, [dict(w, motion=i > 0) for i, w in enumerate(wins)]

    drawn = []
    multinomial = torch.multinomial

    def record(*a, **k):
        drawn.append(multinomial(*a, **k))
        return drawn[-1]

    monkeypatch.setattr(cm, "_fit_windows", one_static)
    monkeypatch.setattr(torch, "multinomial", record)
    horizon, _ = original(model, train, 4, 0)
    info = cm.fit_change_mask(model, train, windows=4, steps=40, batch=32, static_weight=30.0)
    assert info["change_mask_static_share"] == 0.25
    share = float((torch.cat(drawn) < horizon).float().mean())
    assert abs(share - 30 / 33) < 0.03, share
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="static_weight"):
            cm.fit_change_mask(model, train, windows=4, steps=1, static_weight=bad)


def test_the_masks_fit_in_bf16_computes_its_convolutions_in_bf16_keeps_float32_weights_and_fits_as_well(trained, tiny_data):
    """`fit_change_mask(bf16=True)`: the network's convolutions compute in bf16 (autocast), its weights and the Adam
    state stay float32, and the fit reaches about the float32 fit's error from the same start (same seed); without
    the flag nothing runs in bf16. `native_bf16` says whether this machine computes bf16 natively."""
    import world_models.video.change_mask as cm

    _, train, _ = load_split(tiny_data, 0.25)
    fits = {}
    for bf16 in (False, True):
        model = VideoWorldModel.load(trained / "checkpoints/last")
        net = model.change_mask["front"]
        seen = []
        hook = net.net[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        fits[bf16] = cm.fit_change_mask(model, train, windows=4, steps=30, batch=16, bf16=bf16)
        hook.remove()
        step_dtypes = set(seen[:30])  # the fit's steps (the final evaluation runs in float32)
        assert step_dtypes == ({torch.bfloat16} if bf16 else {torch.float32}), step_dtypes
        assert all(q.dtype == torch.float32 for q in net.parameters())
    for cam in ("front", "wrist"):
        plain, half = fits[False][f"change_mask_mse_masked_{cam}"], fits[True][f"change_mask_mse_masked_{cam}"]
        assert half < fits[True][f"change_mask_mse_plain_{cam}"] and abs(half - plain) < 0.1 * plain, (cam, plain, half)
    assert isinstance(cm.native_bf16("cpu"), bool)


def test_amp_trains_the_denoiser_in_bf16_where_asked_or_native_and_keeps_float32_weights(tiny_data, tmp_path, monkeypatch):
    """`--amp`: the autoencoder's and the denoiser's forward passes in their training phases compute in bf16
    (autocast), the weights stay float32; False keeps float32; None follows `native_bf16` (patched here both ways).
    The choice is logged (`amp_bf16`)."""
    import world_models.video.change_mask as cm
    from world_models.video.networks import FrameAutoencoder, UNet

    seen, seen_ae = [], []
    original, original_decode = UNet.forward, FrameAutoencoder.decode

    def forward(self, x, *a, **k):
        out = original(self, x, *a, **k)
        if torch.is_grad_enabled():  # a training step's pass (the fixed-window losses run without gradients)
            seen.append(out.dtype)
        return out

    def decode(self, z):
        out = original_decode(self, z)
        if torch.is_grad_enabled() and z.requires_grad:  # the autoencoder phase (later phases decode frozen latents)
            seen_ae.append(out.dtype)
        return out

    monkeypatch.setattr(UNet, "forward", forward)
    monkeypatch.setattr(FrameAutoencoder, "decode", decode)
    for amp, native, want in ((True, False, torch.bfloat16), (False, True, torch.float32), (None, True, torch.bfloat16),
                              (None, False, torch.float32)):
        monkeypatch.setattr(cm, "native_bf16", lambda device, native=native: native)
        seen.clear(), seen_ae.clear()
        run = tmp_path / f"amp-{amp}-{native}"
        train_world_model(tiny_wm_config(tiny_data, run, ae_steps=2, state_steps=2, dyn_steps=2, unroll_steps=2,
                                         change_mask_steps=0, eval_every=0, amp=amp), progress=False)
        assert seen and set(seen) == {want}, (amp, native, set(seen))
        assert seen_ae and set(seen_ae) == {want}, (amp, native, set(seen_ae))
        model = VideoWorldModel.load(run / "checkpoints/last")
        assert all(p.dtype == torch.float32 for m in (model.unet, model.ae) for p in m.parameters())
        logged = [json.loads(x)["amp_bf16"] for x in (run / "metrics.jsonl").read_text().splitlines() if "amp_bf16" in x]
        assert logged == [float(want == torch.bfloat16)]


def test_the_fits_after_training_read_the_calibration_data_and_other_tasks_data_is_refused(trained, tiny_data, tmp_path,
                                                                                           monkeypatch):
    """--calibration-data: the change mask's and the rollout heads' fits see that dataset's episodes (hooked: their
    states), not the training ones, even when nothing else trains; a dataset of another task is refused, naming it,
    before any run folder."""
    import world_models.video.change_mask as cm
    import world_models.video.rollout_heads as rh
    from wmrl.commands.collect import CollectConfig, collect

    fresh, reach = tmp_path / "fresh", tmp_path / "reach"
    collect(CollectConfig(task="push-red", episodes=3, out=fresh, failures=0.5, num_envs=1, seed=500), progress=False)
    seen = {}
    for mod, name in ((cm, "fit_change_mask"), (rh, "fit_heads_on_rollouts")):
        fit = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda model, replay, *a, _f=fit, _n=name, **k:
                            (seen.setdefault(_n, replay), _f(model, replay, *a, **k))[1])
    train_world_model(tiny_wm_config(tiny_data, tmp_path / "r", init_from=trained, ae_steps=0, state_steps=0, dyn_steps=0,
                                     unroll_steps=0, change_mask_steps=2, head_rollout_steps=2, head_rollout_episodes=3,
                                     calibration_data=fresh), progress=False)
    _, want, _ = load_split(fresh, 0.0)
    assert sorted(seen) == ["fit_change_mask", "fit_heads_on_rollouts"]
    for replay in seen.values():
        assert replay.num_episodes == want.num_episodes == 3
        assert np.array_equal(replay.data["observation.state"], want.data["observation.state"])
    collect(CollectConfig(task="reach-red", episodes=2, out=reach, num_envs=1), progress=False)
    with pytest.raises(ValueError, match="--calibration-data .*reach"):
        train_world_model(tiny_wm_config(tiny_data, tmp_path / "r2", calibration_data=reach), progress=False)
    assert not (tmp_path / "r2").exists()


def test_a_checkpoint_from_before_the_change_mask_loads_without_one(tmp_path):
    m = VideoWorldModel(WorldModelConfig(size="tiny", task_vocab=VOCAB, change_mask=False))
    m.save(tmp_path / "m")
    _drop_config_key(tmp_path / "m", "change_mask")
    loaded = VideoWorldModel.load(tmp_path / "m")
    assert loaded.cfg.change_mask is False and loaded.change_mask is None


def test_frame_state_conditions_every_frame_on_the_state_channels_prediction(trained, tiny_data, tmp_path, monkeypatch):
    """With `frame_state` the frames read their own state: the recorded one in training windows ([i, future frames]),
    the state channel's readout inside a rollout (hooked), and another state changes the generated frames. The
    init-from path keeps the source's autoencoder and state channel; without a state channel it is refused."""
    run = tmp_path / "fs"
    train_world_model(tiny_wm_config(tiny_data, run, init_from=trained, frame_state=True, ae_steps=0, state_steps=0,
                                     dyn_steps=4, unroll_steps=2, change_mask_steps=2), progress=False)
    src, model = (VideoWorldModel.load(r / "checkpoints/last") for r in (trained, run))
    assert model.cfg.frame_state and model.cfg.frame_state_dim == 13
    theirs, ours = src.state_dict(), model.state_dict()
    kept = [k for k in ours if k.startswith(("ae.", "state_channel."))]
    assert kept and all(torch.equal(ours[k], theirs[k]) for k in kept)
    # training windows carry the recorded [hand, opening, cubes] of the last context frame and every future frame
    _, train, held = load_split(tiny_data, 0.25)
    s = WindowSampler(train, "cpu", model.cfg)
    d = s.sample(5, 2, 4, torch.Generator().manual_seed(0))
    idx = torch.cat([d["i"][:, None], d["fut_idx"]], 1)
    assert torch.equal(d["states"][..., :3], s.state[idx][..., 5:8]) and torch.equal(d["states"][..., 3], s.state[idx][..., 4])
    assert torch.equal(d["states"][..., 4:7], s.env[idx][..., 0:3])
    # inside a rollout the frames are conditioned on the state channel's readout, frame by frame
    obs = first_observation(held)
    seen, orig = [], VideoWorldModel.sample_future

    def sample(self, *a, **k):
        seen.append(k["states"].clone())
        return orig(self, *a, **k)

    monkeypatch.setattr(VideoWorldModel, "sample_future", sample)
    state = model.encode(obs)
    x0 = state["x"].mean(0)
    new, preds = model.step(state, torch.full((1, 4, 4), 0.5), generator=torch.Generator().manual_seed(0))
    st = seen[-1]
    assert st.shape == (1, 5, 13) and torch.allclose(st[:, 0], x0[:, :13])
    assert torch.allclose(st[:, 1:, :3], preds["ee"]) and torch.allclose(st[:, 1:, 3], preds["gripper_opening"])
    assert torch.allclose(st[:, -1], new["x"].mean(0)[:, :13])
    monkeypatch.setattr(VideoWorldModel, "sample_future", orig)
    # the conditioning is read: the same noise and context with the cubes elsewhere generate other latents
    ctx, anc = state["ctx"], state["anchor"]
    poses = torch.tensor([[[0.4, 0.0, 0.1, -1.0]] * 4])
    draw = lambda states: model.sample_future(ctx, anc, state["pose"], poses, steps=1, states=states)
    moved = st.clone()
    moved[..., 4:7] += 0.1
    assert not torch.allclose(draw(st), draw(moved))
    with pytest.raises(ValueError, match="frame_state"):
        model.sample_future(ctx, anc, state["pose"], poses, steps=1)
    with pytest.raises(ValueError, match="state channel"):
        VideoWorldModel(dataclasses.replace(model.cfg, state_members=0))
    with pytest.raises(ValueError, match="--frame-state"):
        train_world_model(tiny_wm_config(tiny_data, tmp_path / "no", frame_state=True, state_channel=False), progress=False)


def test_camera_geometry_projects_a_cube_onto_its_segmentation():
    """The pinhole models (`camera.project`) put the red cube's centre on the centroid of its pixels in MuJoCo's own
    segmentation render: the fixed front camera and the wrist camera placed by the hand (hand_yaw), over a scripted
    push that brings the hand over the cube and turns its yaw."""
    from world_models.video.camera import project

    env = sim.make_env("push-red").unwrapped
    env.reset(seed=3)
    geo = env.camera_geometry()
    assert geo["front"]["mount"] == "world" and geo["wrist"]["mount"] == "hand_yaw"
    expert, errs = ScriptedExpert(seed=0), {c: [] for c in env.cameras}
    obs, _ = env.reset(seed=3)
    env.moving_mask_at(env.data.qpos.copy())  # makes the segmentation renderer
    for _ in range(25):
        obs, *_ = env.step(expert.select_action(obs)[0])
        for cam in env.cameras:
            env._seg_renderer.update_scene(env.data, camera=cam)
            r, c = np.nonzero(env._seg_renderer.render()[..., 0] == env._cube_geom["red"])
            if len(r) < 20:  # hidden or at the image's edge: its pixels' centroid is not its centre's image
                continue
            S = env.height - 1
            uv, front = project(torch.tensor(env.cube_pos("red"), dtype=torch.float32)[None],
                                torch.tensor(env.ee_pos(), dtype=torch.float32), geo[cam])
            assert bool(front[0])
            errs[cam].append(np.abs(uv[0].numpy() - [c.mean() / S * 2 - 1, r.mean() / S * 2 - 1]).max())
    env.close()
    assert len(errs["front"]) >= 20 and len(errs["wrist"]) >= 5
    # a latent cell is 2 / 15 = 0.13 grid units wide: both land within a fraction of one
    assert np.median(errs["front"]) < 0.03 and np.median(errs["wrist"]) < 0.08


def test_reprojected_objects_land_on_the_cubes_pixels_in_a_render():
    """`camera.reproject_objects` on MuJoCo's renders of a scripted push: the cubes drawn from the start frame where
    they now are (the arm given as the cover) cover their pixels in the segmentation render (IoU >= 0.8), as
    `camera.cube_pixels` finds them, and their colours are the render's, far closer than the start frame's own pixels
    there; in the fixed camera and in the wrist camera as it comes down over the cube."""
    from sim.tabletop.env import CUBE_COLOURS
    from world_models.video.camera import cube_pixels

    env = sim.make_env("push-red").unwrapped
    obs, _ = env.reset(seed=3)
    geo, half = env.camera_geometry(), env.twin.cube_half_size

    def points() -> torch.Tensor:
        return torch.tensor(np.stack([env.ee_pos()] + [env.cube_pos(c) for c in CUBE_COLOURS]), dtype=torch.float32)[None]

    start, p0, qpos0 = obs, points(), env.data.qpos.copy()
    expert, seen_at = ScriptedExpert(seed=0), []
    for t in range(20):
        obs, *_ = env.step(expert.select_action(obs)[0])
        if t in (9, 19):
            seen_at.append((obs, points(), env.data.qpos.copy()))
    assert float((seen_at[-1][1] - p0)[0, 1].norm()) > 0.05  # the red cube was pushed
    cover = lambda m: torch.as_tensor(m, dtype=torch.float32)[None, None]  # noqa: E731
    arm0 = env.part_masks_at(qpos0)["arm"]
    checked = 0
    for o, p, qpos in seen_at:
        parts = env.part_masks_at(qpos)
        for cam in env.cameras:
            key = f"observation.images.{cam}"
            cubes, arm = parts["objects"][key], parts["arm"][key]
            if cubes.sum() < 50:  # the wrist camera before it is over the cube
                continue
            f0 = torch.as_tensor(start[key]).permute(2, 0, 1)[None].float()
            img, a = reproject_objects(f0, p0, p, geo[cam], half, cover(arm), cover(arm0[key]))
            drawn = a[0, 0].numpy() > 0.5
            found = cube_pixels(p, geo[cam], half, 64, 64)[0, 0].numpy() & ~arm  # the arm hides some
            assert (drawn & cubes).sum() / (drawn | cubes).sum() >= 0.8 and (found & cubes).sum() / (found | cubes).sum() >= 0.8
            err = np.abs(img[0].permute(1, 2, 0).numpy() - o[key]).mean(-1)[drawn].mean()
            assert err < 0.4 * np.abs(start[key].astype(float) - o[key]).mean(-1)[drawn].mean()
            checked += cam == "wrist"
    env.close()
    assert checked >= 1


def test_frame_blobs_draw_each_point_where_the_camera_sees_it(trained, tiny_data, tmp_path, monkeypatch):
    """`frame_blobs`: train-wm records the simulator's camera geometry; each input map peaks at its point's
    projection (camera-major, then frame, then point); refusals without frame_state or a camera's geometry; the
    option brings the frame state and is off where no camera geometry is given."""
    import world_models.video.train as train_mod
    from world_models.video.camera import project

    run = tmp_path / "blobs"
    train_world_model(tiny_wm_config(tiny_data, run, init_from=trained, frame_state=True, frame_blobs=True, ae_steps=0,
                                     state_steps=0, dyn_steps=2, unroll_steps=0, change_mask_steps=0), progress=False)
    model = VideoWorldModel.load(run / "checkpoints/last")
    env = sim.make_env("push-red").unwrapped
    env.reset(seed=0)
    assert model.cfg.frame_blobs and model.cfg.camera_geometry == env.camera_geometry()
    env.close()
    H, n = model.cfg.chunk, 1 + model.cfg.n_objects
    assert model.cfg.blob_channels == 2 * (H + 1) * n
    states = torch.tensor([[0.35, 0.05, 0.12, 0.05, 0.42, 0.0, 0.02, 0.5, 0.15, 0.02, 0.3, -0.12, 0.02]]).repeat(1, H + 1, 1)
    maps = model.blobs(states)
    assert maps.shape == (1, model.cfg.blob_channels, model.cfg.latent_size, model.cfg.latent_size)
    points = torch.cat([states[0, 0, :3], states[0, 0, 4:]]).reshape(n, 3)
    checked = 0
    for ci, cam in enumerate(model.cfg.cameras):
        uv, front = project(points, states[0, 0, :3], model.cfg.camera_geometry[cam])
        for k in range(n):
            if not (bool(front[k]) and bool((uv[k].abs() < 0.9).all())):
                continue  # outside the image: the blob's peak sits at the edge
            m = maps[0, ci * (H + 1) * n + k]  # camera-major, then frame, then point: frame 0's point k
            row, col = divmod(int(m.argmax()), m.shape[-1])
            S = model.cfg.latent_size - 1
            assert abs(col / S * 2 - 1 - uv[k, 0]) <= 1 / S and abs(row / S * 2 - 1 - uv[k, 1]) <= 1 / S
            checked += 1
    assert checked >= n + 1  # every point in the front camera, some in the wrist's
    with pytest.raises(ValueError, match="frame_blobs"):
        VideoWorldModel(dataclasses.replace(model.cfg, frame_state=False))
    with pytest.raises(ValueError, match="wrist"):
        VideoWorldModel(dataclasses.replace(model.cfg, camera_geometry={"front": model.cfg.camera_geometry["front"]}))
    # the blobs bring the frame state they draw; where no simulator gives the cameras' geometry, neither applies
    for name, geometry in (("implied", train_mod.camera_geometry), ("no-geometry", lambda ds: None)):
        monkeypatch.setattr(train_mod, "camera_geometry", geometry)
        train_world_model(tiny_wm_config(tiny_data, tmp_path / name, init_from=trained, frame_blobs=True, ae_steps=0,
                                         state_steps=0, dyn_steps=1, unroll_steps=0, change_mask_steps=0), progress=False)
        cfg = VideoWorldModel.load(tmp_path / name / "checkpoints/last").cfg
        assert (cfg.frame_state, cfg.frame_blobs) == ((True, True) if name == "implied" else (False, False))


def test_object_sources_carry_the_start_frames_patch_by_the_objects_shift():
    """`ChangeMask(n_objects)`: the translated start frame puts a patch's pixels where the shift says, and an object's
    window is centred on where it now is; a mask with object sources refuses to run without them."""
    from world_models.video.networks import ChangeMask

    net = ChangeMask(warp_pose_dim=4, keep_unwarped=True, read_pose=True, n_objects=2)
    f0 = -torch.ones(1, 3, 16, 16)
    f0[:, :, 4:6, 4:6] = 1.0  # a 2x2 patch at pixels 4-5
    # object 0 moves 4 px right (a pixel is 2/16 wide), object 1 stays; [shift xy, centre xy, window]
    objects = torch.tensor([[[0.5, 0.0, 0.125, -0.375, 0.1], [0.0, 0.0, -0.375, -0.375, 0.1]]])
    moved, win = net.object_sources(f0, objects)
    assert moved.shape == (1, 2, 3, 16, 16) and win.shape == (1, 2, 16, 16)
    assert torch.allclose(moved[0, 0, :, 4:6, 8:10], torch.ones(3, 2, 2)) and bool((moved[0, 0, :, 4:6, 4:6] < 0).all())
    assert torch.allclose(moved[0, 1], f0[0], atol=1e-5)
    r, c = divmod(int(win[0, 0].argmax()), 16)
    assert (r, c) in {(4, 8), (4, 9), (5, 8), (5, 9)}  # the window sits on the moved patch
    pose = torch.zeros(1, 4)
    assert net(f0, f0, pose, pose, objects).shape == f0.shape
    with pytest.raises(ValueError, match="objects"):
        net(f0, f0, pose, pose)
    with pytest.raises(ValueError, match="keep_unwarped"):
        ChangeMask(warp_pose_dim=4, n_objects=2)


def test_change_objects_fits_a_mask_that_reads_the_state_channels_points(trained, tiny_data, tmp_path):
    """train-wm --change-objects on a finished model (no other phase): every weight but the mask's is kept, the
    mask's pairs carry each object's move from the rollout's own state channel, and decoding needs the points."""
    from world_models.video.change_mask import mask_pairs

    run = tmp_path / "objects"
    train_world_model(tiny_wm_config(tiny_data, run, init_from=trained, change_objects=True, ae_steps=0, state_steps=0,
                                     dyn_steps=0, unroll_steps=0, change_mask_steps=5), progress=False)
    src, model = (VideoWorldModel.load(r / "checkpoints/last") for r in (trained, run))
    assert model.cfg.change_objects and bool(model.change_mask_fitted)
    theirs, ours = src.state_dict(), model.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in ours.items() if not k.startswith("change_mask"))
    _, train, held = load_split(tiny_data, 0.25)
    pairs = mask_pairs(model, train, 2)
    pred, f0, real, pose, pose0, moves, real_moves, hands = pairs[f"observation.images.{model.cfg.cameras[0]}"]
    assert hands is None  # no pose layer asked for
    assert moves.shape == (len(pred), model.cfg.n_objects, 5) and bool((moves[..., 4] > 0).all())
    # the focus windows sit on the recorded objects' projections, now and at the start
    from world_models.video.change_mask import fit_change_mask, focus_maps

    assert real_moves.shape == moves.shape and not torch.equal(real_moves, moves)  # the recorded points, not the channel's
    seen = real_moves[:, 0, 4] > 0.01
    fm = focus_maps(real_moves[seen][:1], 64, 64)[0]
    cx, cy = real_moves[seen][0, 0, 2:4].tolist()
    r, c = int((cy + 1) / 2 * 64 - 0.5), int((cx + 1) / 2 * 64 - 0.5)
    assert fm[min(max(r, 0), 63), min(max(c, 0), 63)] > 0.8 and fm.min() < 0.05
    info = fit_change_mask(model, train, windows=2, steps=3, focus=1.0)
    assert info["change_mask_mse_masked_front"] > 0
    with pytest.raises(ValueError, match="geometry"):  # the source model has no cameras' geometry
        fit_change_mask(src, train, windows=2, steps=1, focus=1.0)
    obs = first_observation(held)
    state = model.encode(obs)
    new, preds = model.step(state, torch.zeros(1, 4, 4), generator=torch.Generator().manual_seed(0))
    assert preds["points"].shape == (1, 4, 1 + model.cfg.n_objects, 3)
    assert torch.allclose(preds["points"][..., 0, :], preds["ee"])
    frames = model.decode(preds["latents"], new, preds["pose"], preds["points"])
    assert frames["observation.images.front"].shape == (1, 4, 64, 64, 3)
    with pytest.raises(ValueError, match="points"):
        model.decode(preds["latents"], new, preds["pose"])
    # the benchmark's split of the masked gain, and the recorded points it decodes the same latents with
    from world_models.video.evaluate import fixed_windows, recorded_points, window_inputs
    from wmrl.eval.world_model import window_fidelity

    _, _, held = load_split(tiny_data, 0.25, keep=("qpos",))
    fid = window_fidelity(model, held, "push-red", 6, 16, controllability=False)
    assert fid["per_window"]["episode"].tolist() == [w[0] for w in fid["windows"]]
    lo, hi = fid["motion_psnr_gain_h16_ci_episodes"]  # whole episodes resampled: the mean lies inside
    assert fid["n_motion_episodes"] >= 1 and lo <= fid["motion_psnr_gain_h16"] <= hi
    for part in ("arm", "objects"):
        assert fid["per_window"][f"masked_gain_{part}"].shape == (fid["n_windows"],)
        for cam in ("", "_front", "_wrist"):
            for n in ("recorded_points", "rigid_objects", "rigid_objects_recorded_points"):
                assert f"masked_psnr_gain_h16_{part}{cam}_{n}" in fid
    wins = fixed_windows(held, 6, 16, model.cfg.context, ee_index=model.cfg.ee_index, object_xyz=model.cfg.object_xyz)
    _, _, real = window_inputs(model, held, [(w["episode"], w["start"]) for w in wins], 16)
    pts = recorded_points(model, real).numpy()
    np.testing.assert_allclose(pts[..., 0, :], real["observation.state"][..., list(model.cfg.ee_index)], atol=1e-6)
    for j, o in enumerate(model.cfg.object_xyz):
        np.testing.assert_allclose(pts[..., 1 + j, :], real["observation.environment_state"][..., o : o + 3], atol=1e-6)
    # without a state channel there is nothing to place: the mask has no object sources
    train_world_model(tiny_wm_config(tiny_data, tmp_path / "no", change_objects=True, state_channel=False, ae_steps=2,
                                     dyn_steps=2, unroll_steps=0, change_mask_steps=2), progress=False)
    assert not VideoWorldModel.load(tmp_path / "no/checkpoints/last").cfg.change_objects


def first_observation(held) -> dict:
    """The first frame of `held`'s first episode as a batch of one observation (images, state, env state, task)."""
    lo, _ = next(iter(held.episodes.values()))
    obs = {k: held.data[k][lo : lo + 1] for k in ("observation.images.front", "observation.images.wrist",
                                                 "observation.state", "observation.environment_state")}
    obs["task"] = [held.vocab["task"][held.data["task"][lo]]]
    return obs


def _square_frames(hands: torch.Tensor, background: torch.Tensor) -> torch.Tensor:
    """64x64 frames: `background` with a bright 8x8 square where the hand's normalised x, y (hands[:, :2]) put it."""
    out = background.expand(len(hands), -1, -1, -1).clone()
    for n, (x, y) in enumerate(((hands[:, :2] + 1) / 2 * 48).long().tolist()):
        out[n, :, y : y + 8, x : x + 8] = 1.0
    return out


def test_the_pose_layer_draws_the_arm_where_the_hand_is_and_paints_over_where_it_was():
    """`PoseLayer` on a synthetic fixed camera: a square (the arm) at the hand's position over a fixed background.
    Trained on pairs (start frame with the square at hand0, frame with it at hand), it draws the square at the new
    place and the background over the old one: far closer to the real frame than the start frame is."""
    from world_models.video.networks import ChangeMask, PoseLayer

    gen = torch.Generator().manual_seed(0)
    background = torch.linspace(-1, 0, 64)[None, None, :, None].expand(1, 3, 64, 64)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        layer = PoseLayer(width=16)
    opt = torch.optim.Adam(layer.parameters(), 3e-3)

    def batch(n):
        h, h0 = torch.rand(n, 3, generator=gen) * 2 - 1, torch.rand(n, 3, generator=gen) * 2 - 1
        return torch.cat([h, h0], -1), _square_frames(h0, background), _square_frames(h, background)

    for _ in range(200):
        hands, f0, real = batch(16)
        loss = ((layer(hands, f0) - real) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    hands, f0, real = batch(64)
    with torch.no_grad():
        x = layer(hands, f0)
    copy, drawn = ((f0 - real) ** 2).mean(), ((x - real) ** 2).mean()
    assert drawn < 0.35 * copy, (float(drawn), float(copy))  # 0.21 here
    with pytest.raises(ValueError, match="hands"):
        layer(hands[:, :3], f0)
    # in the change mask it is one more source, and the mask asks for the hands
    net = ChangeMask(warp_pose_dim=4, keep_unwarped=True, read_pose=True, n_objects=1, pose_layer=True)
    pose, objects = torch.zeros(2, 4), torch.zeros(2, 1, 5) + 0.1
    out = net(f0[:2], f0[:2], pose, pose, objects, hands[:2])
    assert net.n_logits == 5 and out.shape == (2, 3, 64, 64)
    # the layer's frame drawn beforehand (as the mask's fit does, once per pair) gives the same blend
    with torch.no_grad():
        drawn = net.layer(hands[:2], f0[:2])
    torch.testing.assert_close(net(f0[:2], f0[:2], pose, pose, objects, rendered=drawn), out)
    with pytest.raises(ValueError, match="rendered"):
        net(f0[:2], f0[:2], pose, pose, objects, rendered=drawn[:, :2])
    with pytest.raises(ValueError, match="hands"):
        net(f0[:2], f0[:2], pose, pose, objects)
    with pytest.raises(ValueError, match="keep_unwarped"):
        ChangeMask(warp_pose_dim=4, pose_layer=True)


def test_a_pose_layer_is_trained_on_real_frames_for_the_fixed_camera_and_frozen_while_the_mask_fits(trained, tiny_data,
                                                                                                   tmp_path, monkeypatch):
    """train-wm --change-pose-layer on a finished model: the front camera (fixed to the world) gets a layer, the wrist
    camera (on the hand) none; `fit_pose_layers` trains the layer on recorded hands and changes no other weight; the
    mask's fit reads the rollout's hands and leaves the layer as trained; decoding works with the points; a fine-tune
    of the model keeps the layer."""
    from world_models.video import change_mask as cm

    trained_layers = []
    fit = cm.fit_pose_layers

    def spy(model, replay, steps, **kw):
        assert kw["bf16"] is cm.native_bf16("cpu")  # change_bf16=None: where this machine computes bf16 natively
        before = {k: v.clone() for k, v in model.state_dict().items()}
        info = fit(model, replay, steps, **kw)
        changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
        trained_layers.append((changed, {k: v.clone() for k, v in model.change_mask["front"].layer.state_dict().items()}))
        return info

    monkeypatch.setattr(cm, "fit_pose_layers", spy)
    run = tmp_path / "layer"
    train_world_model(tiny_wm_config(tiny_data, run, init_from=trained, change_objects=True, change_pose_layer=True,
                                     change_layer_steps=4, ae_steps=0, state_steps=0, dyn_steps=0, unroll_steps=0,
                                     change_mask_steps=3), progress=False)
    model = VideoWorldModel.load(run / "checkpoints/last")
    assert model.cfg.layer_cameras == ["front"]
    assert model.change_mask["front"].layer is not None and model.change_mask["wrist"].layer is None
    (changed, layer_after_training), = trained_layers
    assert changed and all(k.startswith("change_mask.front.layer.") for k in changed)
    assert all(torch.equal(v, layer_after_training[k]) for k, v in model.change_mask["front"].layer.state_dict().items())
    _, train, held = load_split(tiny_data, 0.25)
    pairs = cm.mask_pairs(model, train, 2)
    assert pairs["observation.images.front"][7].shape == (len(pairs["observation.images.front"][0]), 6)
    assert pairs["observation.images.wrist"][7] is None
    # the mask's fit runs no backward pass through the frozen layer, and leaves it trainable afterwards; it draws each
    # pair's frame once (in passes of FRAMES_PER_PASS frames), not once per step
    grads, calls = [], []
    hook = model.change_mask["front"].layer.head.weight.register_hook(grads.append)
    counter = model.change_mask["front"].layer.register_forward_hook(lambda *a: calls.append(1))
    cm.fit_change_mask(model, train, windows=2, steps=3)
    hook.remove()
    counter.remove()
    assert not grads and all(q.requires_grad for q in model.change_mask["front"].layer.parameters())
    assert len(calls) == -(-len(pairs["observation.images.front"][0]) // FRAMES_PER_PASS)
    obs = first_observation(held)
    state = model.encode(obs)
    new, preds = model.step(state, torch.zeros(1, 4, 4), generator=torch.Generator().manual_seed(0))
    assert model.decode(preds["latents"], new, preds["pose"], preds["points"])["observation.images.front"].shape == (1, 4, 64, 64, 3)
    # frames decode in passes of FRAMES_PER_PASS frames (a pass holding frames of two starts): the frames of one pass
    obs = {k: v * 2 if isinstance(v, list) else np.concatenate([v, v // 2 if v.dtype == np.uint8 else v])
           for k, v in obs.items()}
    state = model.encode(obs)
    new, preds = model.step(state, torch.randn(2, 4, 4, generator=torch.Generator().manual_seed(1)) * 0.5,
                            generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(model_module, "FRAMES_PER_PASS", 3)
    passes = model.decode(preds["latents"], dict(new), preds["pose"], preds["points"])
    monkeypatch.setattr(model_module, "FRAMES_PER_PASS", 10**6)
    whole = model.decode(preds["latents"], dict(new), preds["pose"], preds["points"])

    def start(i: int, x, k=""):  # start i's part of a batched state entry (the channel's members come first in x)
        return {kk: start(i, v, kk) for kk, v in x.items()} if isinstance(x, dict) else x[:, i : i + 1] if k == "x" else x[i : i + 1]

    alone = [model.decode(preds["latents"][i : i + 1], start(i, new), preds["pose"][i : i + 1], preds["points"][i : i + 1])
             for i in range(2)]
    for k, v in whole.items():
        assert v.shape == (2, 4, 64, 64, 3) and np.abs(v.astype(int) - passes[k]).max() <= 1
        assert all(np.abs(v[i].astype(int) - alone[i][k][0]).max() <= 1 for i in range(2))  # each from its own start
    # the reprojected object layer (changes no weight): each camera's frames change from the blend only where a ray
    # meets a cube at the state channel's points, and change there
    model.cfg = dataclasses.replace(model.cfg, object_layer="reproject")  # the model as refitted above
    drawn = model.decode(preds["latents"], dict(new), preds["pose"], preds["points"])
    model.cfg = dataclasses.replace(model.cfg, object_layer="blend")
    assert VideoWorldModel.load(run / "checkpoints/last", object_layer="reproject").cfg.object_layer == "reproject"
    q = torch.as_tensor(preds["points"]).reshape(-1, 1 + model.cfg.n_objects, 3)
    q0 = new["points0"].repeat_interleave(4, 0)
    for cam in model.cfg.cameras:
        key = f"observation.images.{cam}"
        _, hit = reproject_objects(torch.zeros(len(q), 3, 64, 64), q0, q, model.cfg.camera_geometry[cam],
                                   model.cfg.object_radius)
        inside = hit[:, 0].reshape(2, 4, 64, 64).numpy() > 0
        diff = np.abs(drawn[key].astype(int) - whole[key]).max(-1)
        assert (diff[~inside] <= 1).all()
        if cam == "front":  # the fixed camera sees every cube
            assert inside.any() and (diff[inside] > 1).any()
    with pytest.raises(ValueError, match="object_layer"):
        VideoWorldModel.load(run / "checkpoints/last", object_layer="glued")
    with pytest.raises(ValueError, match="object sources"):
        VideoWorldModel.load(trained / "checkpoints/last", object_layer="reproject")
    # a fine-tune of it (as co-evolution's) refits the mask and keeps the layer: it reads real frames only
    train_world_model(tiny_wm_config(tiny_data, tmp_path / "tuned", init_from=run, change_objects=True, change_pose_layer=True,
                                     change_layer_steps=4, ae_steps=0, state_steps=0, dyn_steps=1, unroll_steps=0,
                                     change_mask_steps=2), progress=False)
    tuned = VideoWorldModel.load(tmp_path / "tuned/checkpoints/last")
    assert len(trained_layers) == 1 and bool(tuned.change_mask_fitted)
    assert all(torch.equal(v, layer_after_training[k]) for k, v in tuned.change_mask["front"].layer.state_dict().items())
    # so does a new state channel of another recipe on it (the channel-only path)
    train_world_model(tiny_wm_config(tiny_data, tmp_path / "chan", init_from=run, change_objects=True, change_pose_layer=True,
                                     change_layer_steps=4, ae_steps=0, state_steps=1, dyn_steps=0, unroll_steps=0,
                                     change_mask_steps=2, state_cube_huber_cm=5.0), progress=False)
    chan = VideoWorldModel.load(tmp_path / "chan/checkpoints/last")
    assert len(trained_layers) == 1 and chan.cfg.state_cube_huber_cm == 5.0 and bool(chan.change_mask_fitted)
    assert all(torch.equal(v, layer_after_training[k]) for k, v in chan.change_mask["front"].layer.state_dict().items())
    with pytest.raises(ValueError, match="change-layer-steps"):
        train_world_model(tiny_wm_config(tiny_data, tmp_path / "bad", change_layer_steps=-1), progress=False)


def test_init_from_a_checkpoint_saved_before_the_latent_statistics_computes_them(tiny_data, tmp_path):
    """A source saved in its autoencoder phase holds the statistics' defaults: the new run computes them (as any
    first run does) instead of training its denoiser on unstandardised latents."""
    train_world_model(tiny_wm_config(tiny_data, tmp_path / "ae", ae_steps=5, state_steps=0, dyn_steps=0, unroll_steps=0,
                                     change_mask_steps=0), progress=False)
    src = VideoWorldModel.load(tmp_path / "ae/checkpoints/last")
    assert not wm_train.latent_statistics_set(src)
    train_world_model(tiny_wm_config(tiny_data, tmp_path / "dyn", init_from=tmp_path / "ae", ae_steps=0, state_steps=0,
                                     dyn_steps=2, unroll_steps=0, change_mask_steps=0), progress=False)
    new = VideoWorldModel.load(tmp_path / "dyn/checkpoints/last")
    _, train, _ = load_split(tiny_data, 0.25)
    ref = VideoWorldModel.load(tmp_path / "ae/checkpoints/last")
    wm_train.set_latent_statistics(ref, train)
    assert wm_train.latent_statistics_set(new)
    assert all(torch.allclose(getattr(new, b), getattr(ref, b), atol=1e-5) for b in ("lat_mean", "lat_std", "res_std"))


def test_heads_refitted_on_rollouts_change_only_the_heads_and_keep_a_fitted_mask(trained, tiny_data, tmp_path, monkeypatch):
    """train-wm --head-rollout-steps on a finished model (no other phase): the heads are fitted on the model's own
    rollouts from each training episode's first frame, every other weight is kept (the change mask too: nothing it
    reads changed, so it is not refitted), and the labels are the episodes' recorded ones, step by step."""
    from world_models.video.rollout_heads import rollout_latents

    _, train, _ = load_split(tiny_data, 0.25)
    src = VideoWorldModel.load(trained / "checkpoints/last")
    r = rollout_latents(src, train, horizon=12, episodes=3, seed=0)
    lo, T = next(iter(train.episodes.values()))
    assert r["latents"].shape[:2] == r["mask"].shape == (3, 12) and len(r["tasks"]) == 3
    spans = list(train.episodes.values())
    picked = [spans[i] for i in sorted(np.random.default_rng(0).choice(len(spans), 3, replace=False))]
    (lo, T) = picked[0]
    t = min(12, T - 1)
    assert r["mask"][0].sum() == t
    np.testing.assert_allclose(r["labels"]["success"][0, :t], train.data["next.success"][lo : lo + t])
    np.testing.assert_allclose(r["labels"]["state"][0, :t], train.data["observation.state"][lo + 1 : lo + 1 + t])
    calls = []
    monkeypatch.setattr("world_models.video.change_mask.fit_change_mask", lambda *a, **k: calls.append(1) or {})
    run = tmp_path / "heads"
    train_world_model(tiny_wm_config(tiny_data, run, init_from=trained, ae_steps=0, state_steps=0, dyn_steps=0,
                                     unroll_steps=0, head_rollout_steps=20, head_rollout_horizon=8,
                                     head_rollout_episodes=4), progress=False)
    assert not calls  # the source's fitted mask is kept as it is
    model = VideoWorldModel.load(run / "checkpoints/last")
    theirs, ours = src.state_dict(), model.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in ours.items() if not k.startswith("heads."))
    assert not all(torch.equal(v, theirs[k]) for k, v in ours.items() if k.startswith("heads."))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(row.get("rollout_heads_episodes") == 4 for row in rows)
    with pytest.raises(ValueError, match="head-rollout-horizon"):
        train_world_model(tiny_wm_config(tiny_data, tmp_path / "bad", head_rollout_horizon=0), progress=False)
    from world_models.video.rollout_heads import fit_heads_on_rollouts

    with pytest.raises(ValueError, match="pos_weight"):  # a given positive weight must be a weight
        fit_heads_on_rollouts(src, train, horizon=8, steps=2, episodes=2, pos_weight=0.0)


def test_a_cube_the_hand_does_not_hold_rests_at_its_height_and_a_held_one_moves_with_the_head():
    """`settle`: every cube the hand does not hold is put at its resting height (its horizontal change kept); a held
    cube (hand within a half extent horizontally and two vertically, fingers stopped by it: opening within 1 cm of
    its width) keeps the head's change. Without `rest_z` nothing is put back (training)."""
    sc = StateChannel(StateChannelConfig(n_cubes=2, members=1, hidden=8))

    def head(feats):  # every cube: contact (p ~ 1), +1 cm up and +2 cm along the hand->cube axis
        out = torch.zeros(*feats.shape[:-1], 4)
        out[..., 0], out[..., 2], out[..., 3] = 2.0, 1.0, 20.0
        return out

    sc.cube.forward = head
    x = torch.zeros(1, 3, sc.cfg.dim)
    x[..., :3] = torch.tensor([[0.40, 0.0, 0.045], [0.40, 0.0, 0.045], [0.40, 0.0, 0.045]])  # hand over cube 0
    x[..., 3] = torch.tensor([0.04, 0.0, 0.09])  # fingers on a 4 cm cube; closed on nothing; open
    x[..., 4:7] = torch.tensor([0.405, 0.0, 0.035])  # cube 0 1.5 cm above its rest, under the hand
    x[..., 7:10] = torch.tensor([0.20, 0.20, 0.025])  # cube 1 far away, 0.5 cm above its rest
    a, rest = torch.zeros(3, 4), torch.full((3, 2), 0.02)
    nxt = sc.next(x, a, gate="hard", rest_z=rest, hold_radius=0.02)[0][0]
    assert nxt[0, 6].item() == pytest.approx(0.045)  # held: lifted by the head's 1 cm
    assert nxt[1, 6].item() == pytest.approx(0.02) and nxt[2, 6].item() == pytest.approx(0.02)  # fingers not on it
    assert nxt[:, 9].tolist() == pytest.approx([0.02] * 3)  # far from the hand: on the table
    assert nxt[1, 7].item() != pytest.approx(0.20)  # its horizontal change is the head's
    assert sc.next(x, a, gate="hard")[0][0, 1, 6].item() == pytest.approx(0.045)  # no rest_z: the head's change


def test_rollouts_settle_cubes_at_their_start_height_as_the_model_says(trained, tiny_data, tmp_path):
    """A rollout remembers each cube's height at its start (`rest_z`) and, with `state_settle`, a cube the hand does
    not hold put 2 cm above it comes back; without, it stays. Checkpoints from before the option load without it."""
    model = VideoWorldModel.load(trained / "checkpoints/last")
    assert model.cfg.state_settle is True
    _, _, held = load_split(tiny_data, 0.25)
    obs = first_observation(held)
    state = model.encode(obs)
    z0 = state["rest_z"].clone()
    assert torch.allclose(z0, torch.as_tensor(obs["observation.environment_state"][:, [2, 5, 8]], dtype=torch.float32))
    state["x"][..., [6, 9, 12]] += 0.02
    model.state_channel.cube.forward = lambda f: torch.cat([torch.zeros(*f.shape[:-1], 3),
                                                             torch.full((*f.shape[:-1], 1), -20.0)], -1)
    _, preds = model.step(dict(state), torch.zeros(1, 1, 4), frames=False)
    assert torch.allclose(preds["observation.environment_state"][:, 0, [2, 5, 8]], z0, atol=1e-6)
    model.cfg = dataclasses.replace(model.cfg, state_settle=False)
    _, preds = model.step(dict(state), torch.zeros(1, 1, 4), frames=False)
    assert torch.allclose(preds["observation.environment_state"][:, 0, [2, 5, 8]], z0 + 0.02, atol=1e-6)
    model.save(tmp_path / "m")
    _drop_config_key(tmp_path / "m", "state_settle")
    assert VideoWorldModel.load(tmp_path / "m").cfg.state_settle is False
    assert VideoWorldModel.load(tmp_path / "m", state_settle=True).cfg.state_settle is True


def test_the_unrolled_loss_settles_cubes_the_hand_does_not_hold_only_with_settle_unroll():
    """`settle_unroll`: the unrolled loss puts a cube the hand does not hold back at its height at the window's start,
    as rollouts with the rule do. A head that lifts every cube 1 cm per step, a cube that stays on the table: without
    the option the loss charges the 1 cm (Huber 0.5 over 7 entries), with it nothing."""
    from world_models.video.state_channel import OUT_SCALE

    losses = {}
    for on in (False, True):
        sc = StateChannel(StateChannelConfig(n_cubes=1, members=1, hidden=8, settle_unroll=on))
        with torch.no_grad():
            sc.cube.out.bias[..., 2] = 0.01 * OUT_SCALE  # +1 cm of height per step
            sc.cube.out.bias[..., 3] = 20.0  # the contact gate open
        x = torch.zeros(1, 1, 2, sc.cfg.dim)
        x[..., 2] = 0.1  # the hand 30 cm away and 8 cm up: it holds nothing
        x[..., 4:7] = torch.tensor([0.3, 0.0, 0.02])
        a, mask = torch.zeros(1, 1, 1, 4), torch.ones(1, 1, 1)
        losses[on] = sc.unrolled_loss(x, a, mask)[1]["state_huber_cm"].item()
    assert losses[False] == pytest.approx(0.5 / 7, rel=1e-4) and losses[True] == pytest.approx(0.0, abs=1e-6)


def test_the_height_loss_l1_fits_the_cubes_height_by_its_absolute_error():
    """`height_loss`: with l1 the cubes' z entries of the unrolled loss are |error| in cm (the median change), every
    other entry keeps the Huber loss; a 0.5 cm height error costs 0.5 instead of Huber's 0.125."""
    losses = {}
    for kind in ("huber", "l1"):
        sc = StateChannel(StateChannelConfig(n_cubes=1, members=1, hidden=8, height_loss=kind))
        x = torch.zeros(1, 1, 2, sc.cfg.dim)
        x[..., 2] = 0.1
        x[..., 4:7] = torch.tensor([0.3, 0.0, 0.02])
        x[0, 0, 1, 6] = 0.025  # the cube's centre rises 0.5 cm; the zero-initialised head predicts no change
        x[0, 0, 1, 5] = 0.005  # and it moves 0.5 cm sideways (Huber in both)
        a, mask = torch.zeros(1, 1, 1, 4), torch.ones(1, 1, 1)
        _, info = sc.unrolled_loss(x, a, mask)
        losses[kind] = info["state_huber_cm"].item()
    n = 7  # entries of x[..., :P] averaged: ee (3), opening, one cube (3)
    assert losses["huber"] == pytest.approx((0.125 + 0.125) / n, rel=1e-5)
    assert losses["l1"] == pytest.approx((0.125 + 0.5) / n, rel=1e-5)
    with pytest.raises(ValueError, match="height_loss"):
        StateChannelConfig(height_loss="l2")


def test_the_cubes_huber_threshold_applies_to_their_horizontal_change_only():
    """`cube_huber_cm`: the cubes' x and y entries of the unrolled loss use their own Huber threshold, every other
    entry keeps 1 cm. A cube kicked 4 cm sideways and a hand 2 cm off, a head that predicts no change: at 1 cm the cube
    costs 3.5 (linear: near the median of heavy-tailed pushes), at 5 cm 8.0 (quadratic: the mean); the hand 1.5 in both."""
    losses = {}
    for delta in (1.0, 5.0):
        sc = StateChannel(StateChannelConfig(n_cubes=1, members=1, hidden=8, cube_huber_cm=delta))
        x = torch.zeros(1, 1, 2, sc.cfg.dim)
        x[..., 2] = 0.1
        x[..., 4:7] = torch.tensor([0.3, 0.0, 0.02])
        x[0, 0, 1, 5] = 0.04  # the cube 4 cm sideways
        x[0, 0, 1, 0] = 0.02  # the hand 2 cm along x
        a, mask = torch.zeros(1, 1, 1, 4), torch.ones(1, 1, 1)
        losses[delta] = sc.unrolled_loss(x, a, mask)[1]["state_huber_cm"].item()
    n = 7  # entries of x[..., :P] averaged: ee (3), opening, one cube (3)
    assert losses[1.0] == pytest.approx((1.5 + 3.5) / n, rel=1e-5)
    assert losses[5.0] == pytest.approx((1.5 + 8.0) / n, rel=1e-5)
    with pytest.raises(ValueError, match="cube_huber_cm"):
        StateChannelConfig(cube_huber_cm=0.0)


def test_settling_is_on_by_default_only_where_the_objects_are_the_tabletops_cubes(tiny_data, tmp_path):
    """`TrainWMConfig.state_settle` None: on for tabletop data (cubes rest on the table unless held), off for data
    whose objects are another suite's (they may end on or in other objects); an explicit value wins."""
    from world_models.video.train import resolve_settle

    assert resolve_settle(TrainWMConfig(data=tiny_data)) is True
    assert resolve_settle(TrainWMConfig(data=tiny_data, state_settle=False)) is False
    other = tmp_path / "other"
    shutil.copytree(tiny_data, other)
    meta = json.loads((other / "meta" / "wmrl.json").read_text())
    meta["control"]["object_state"] = "libero"
    (other / "meta" / "wmrl.json").write_text(json.dumps(meta))
    assert resolve_settle(TrainWMConfig(data=tiny_data, extra_data=(other,))) is False
