"""Policy-guided diffusion: EDM preconditioning, episode-respecting windows, the guidance schedule, guidance raising
the target policy's likelihood, synthetic data tagged and mixed at the configured ratio, and bad input."""

import math

import numpy as np
import pytest
import torch

from world_models.trajectory_diffusion import (DivergedSamples, TrajectoryDiffusion, TrajectoryDiffusionConfig,
                                               guidance_schedule, window_starts)


def _cfg(**kw):
    base = dict(obs_dim=2, act_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0), horizon=8, widths=(16, 32),
                emb_dim=32, sampling_steps=8)
    return TrajectoryDiffusionConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def toy_model(point_data):
    """A small diffusion model trained briefly on the point task's windows."""
    from wmrl.rl.ravl import load_offline_data
    from world_models.trajectory_diffusion import fit_trajectory_diffusion

    real = load_offline_data(point_data[0])
    torch.manual_seed(0)
    model = TrajectoryDiffusion(_cfg())
    info = fit_trajectory_diffusion(model, real, steps=150, batch_size=64, lr=1e-3, progress=False)
    return model, real, info


def test_edm_preconditioning_of_the_trajectory_denoiser():
    from world_models.edm import edm_coefficients, edm_loss_weight

    torch.manual_seed(0)
    model = TrajectoryDiffusion(_cfg())
    seen = {}
    model.net.register_forward_hook(lambda mod, inp, out: seen.update(x=inp[0], c_noise=inp[1], F=out))
    x, sigma = torch.randn(3, 8, 6), torch.tensor([0.01, 1.0, 20.0])
    D = model.denoise(x, sigma)
    c_skip, c_out, c_in, c_noise = (c.reshape(3, 1, 1) for c in edm_coefficients(sigma, 1.0))
    torch.testing.assert_close(seen["x"], (c_in * x).transpose(1, 2))  # the network sees c_in x, channels first
    torch.testing.assert_close(seen["c_noise"], torch.log(sigma) / 4)
    torch.testing.assert_close(D, c_skip * x + c_out * seen["F"].transpose(1, 2))
    # lambda(sigma) c_out(sigma)^2 = 1: the effective regression target of F has unit weight at every noise level
    torch.testing.assert_close(edm_loss_weight(sigma, 1.0) * c_out.reshape(-1) ** 2, torch.ones(3))


def test_windows_never_cross_episodes_and_terminals_only_end_them(episode_factory):
    from wmrl.replay import EpisodeReplay
    from world_models.trajectory_diffusion import gather_windows

    rb = EpisodeReplay(200)
    rb.add_episode(episode_factory(9, image=False, terminal=False))  # 10 frames, time limit
    rb.add_episode(episode_factory(5, image=False, start=100, terminal=True))  # 6 frames, terminates
    rb.add_episode(episode_factory(3, image=False, start=200))  # 4 frames: shorter than a window
    starts = window_starts(rb, 5)
    assert len(starts) == (10 - 5 + 1) + (6 - 5 + 1)
    w = gather_windows(rb, starts, 5)
    idx = starts[:, None] + np.arange(5)
    assert (rb.frame_episode[idx] == rb.frame_episode[idx[:, :1]]).all()  # one episode per window
    term = w["next.terminated"]
    assert not term[:, :3].any()  # no terminal before a window's final transition
    assert term[:, 3].sum() == 1  # the terminating episode's last window ends on its terminal
    with pytest.raises(ValueError, match="no episode has 20 frames"):
        window_starts(rb, 20)


def test_generated_windows_end_at_their_first_terminal():
    model = TrajectoryDiffusion(_cfg())
    x = torch.zeros(2, 8, 6)
    x[0, 2, -1] = x[0, 5, -1] = 1.0  # standardised = raw here (mean 0, std 1)
    ro = model.decode(x)
    assert ro["length"].tolist() == [3, 7]  # through the first terminal; else T - 1 transitions


def test_guidance_schedule_matches_its_formula():
    n, lam, c = 10, 2.0, 0.3
    got = guidance_schedule(lam, n, c)
    want = [lam * ((1 - i / n) + c * math.sin(math.pi * (i + 1) / n)) for i in range(n)]
    np.testing.assert_allclose(got[:-1], want[:-1])
    assert got[-1] == 0.0 and got[0] == pytest.approx(lam * (1 + c * math.sin(math.pi / n)))


def test_guidance_raises_target_likelihood_monotonically(toy_model):
    from policies.state.networks import DeterministicActor
    from wmrl.rl.pgd import generate

    model, _, info = toy_model
    assert info["loss_last"] < info["loss_first"]
    target = DeterministicActor(2, 2, hidden=8)
    with torch.no_grad():  # pi(s) = 0.8 everywhere: a policy the random-heavy data rarely follows
        target.net[-1].weight.zero_()
        target.net[-1].bias.fill_(math.atanh(0.8))
    logp = []
    for lam in (0.0, 0.5, 2.0):
        _, gi = generate(model, target, 64, lam, generator=torch.Generator().manual_seed(0))
        logp.append(gi["target_logprob"])
    assert logp[0] < logp[1] < logp[2], logp


def test_unguided_sampling_is_deterministic_given_the_seed_and_samplers_differ(toy_model):
    model = toy_model[0]
    a = model.sample(4, generator=torch.Generator().manual_seed(1))
    b = model.sample(4, generator=torch.Generator().manual_seed(1))
    c = model.sample(4, generator=torch.Generator().manual_seed(1), sampler="euler")
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)


def test_synthetic_data_is_tagged_and_mixed_at_the_configured_ratio(toy_model):
    from policies.state.networks import DeterministicActor
    from wmrl.core.features import SOURCE
    from wmrl.replay import EpisodeReplay, MixedReplay
    from wmrl.rl.pgd import PGDConfig, SyntheticGenerator

    model, real, _ = toy_model
    cfg = PGDConfig(synthetic_windows=40, updates_per_epoch=10, regenerate_every=20, guidance=1.0)
    gen = SyntheticGenerator(model, cfg)
    synth = EpisodeReplay(gen.capacity)
    agent = type("Agent", (), {"actor": DeterministicActor(2, 2, hidden=8)})()
    first = gen.refresh(agent, synth, 0)
    assert first["guidance"] == 0.0 and first["synthetic_windows"] == 40  # the first buffer is unguided
    assert gen.refresh(agent, synth, 1) == {}  # not due: M = 2 epochs
    assert gen.refresh(agent, synth, 2)["guidance"] == 1.0
    assert synth.num_episodes == 40  # the refresh replaced the old windows (FIFO of exactly one refresh)
    assert set(synth.decode_strings(SOURCE, synth.data[SOURCE][: len(synth)])) == {"world_model"}
    batch = MixedReplay(real, synth, online_ratio=cfg.synthetic_ratio).sample(256, keys=[SOURCE, "observation.state"])
    tags = real.decode_strings(SOURCE, batch[SOURCE][~batch["is_online"]]).tolist()
    assert batch["is_online"].sum() == 240 and "world_model" not in tags
    assert set(synth.decode_strings(SOURCE, batch[SOURCE][batch["is_online"]])) == {"world_model"}


def test_bad_input_is_refused_and_diverged_batches_are_dropped(toy_model, monkeypatch):
    from policies.state.networks import DeterministicActor
    from wmrl.replay import EpisodeReplay
    from wmrl.rl.pgd import PGDConfig, SyntheticGenerator, generate

    model = toy_model[0]
    with pytest.raises(ValueError, match="action dims 2/3"):
        generate(model, DeterministicActor(2, 3, hidden=8), 4, 1.0)
    with pytest.raises(ValueError, match="guidance must be a finite number"):
        model.sample(2, DeterministicActor(2, 2, hidden=8), guidance=float("nan"))
    with pytest.raises(ValueError, match="agent: expected one of td3bc, iql"):
        PGDConfig(agent="sac").validate()
    # A coefficient that overflows float32: every batch diverges, is reported, and nothing reaches the buffer.
    gen = SyntheticGenerator(model, PGDConfig(synthetic_windows=8, updates_per_epoch=1, regenerate_every=1,
                                              guidance=1e39, normalise_guidance=False))
    buf = EpisodeReplay(gen.capacity)
    actor = type("Agent", (), {"actor": DeterministicActor(2, 2, hidden=8)})()
    gen.refresh(actor, buf, 0)  # unguided: fine
    before = {k: v.copy() for k, v in buf.data.items()}
    with pytest.warns(UserWarning, match="NaN or inf"), pytest.raises(DivergedSamples, match="all 1 generated batches"):
        gen.refresh(actor, buf, 1)
    assert all(np.array_equal(before[k], buf.data[k]) for k in before)
    # One diverging batch among three is dropped and counted; the others are kept.
    calls, original = [], model.sample

    def flaky(n, *a, **kw):
        calls.append(n)
        if len(calls) == 2:
            raise DivergedSamples("2 of 4 samples are NaN or inf")
        return original(n, *a, **kw)

    monkeypatch.setattr(model, "sample", flaky)
    with pytest.warns(UserWarning):
        ro, info = generate(model, None, 12, 0.0, batch=4)
    assert info["synthetic_dropped_batches"] == 1 and len(ro["length"]) == 8


def test_true_dynamics_error_is_zero_on_real_windows_and_sees_corruption(toy_model):
    from wmrl.rl.pgd import true_dynamics_error
    from world_models.trajectory_diffusion import gather_windows

    _, real, _ = toy_model
    w = gather_windows(real, window_starts(real, 8)[:50], 8)
    ro = {"obs": w["observation.state"], "act": w["action"], "length": np.full(50, 7)}
    err = true_dynamics_error("PointEdge-v0", ro, np.ones(2))
    assert err.shape == (7,) and err.max() < 1e-10
    ro["obs"] = ro["obs"] + np.array([0.1, 0.0], np.float32) * np.arange(8)[None, :, None]  # drift 0.1 per step
    ro["length"] = np.r_[np.full(49, 7), 0]  # and one rollout without a kept transition
    np.testing.assert_allclose(true_dynamics_error("PointEdge-v0", ro, np.ones(2)), 0.1**2 / 2, rtol=1e-4)
