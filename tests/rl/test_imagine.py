import json
import math

import numpy as np
import pytest
import torch

from wmrl.rl.grpo import grpo_advantages, rollout_mean
from wmrl.rl.imagine import ImagineConfig, imagine
from wmrl.rl.ppo import clipped_surrogate, gae, ppo_loss
from world_models.env import require_success_head


def test_grpo_advantages_are_group_standardised_and_uninformative_groups_dropped():
    returns = torch.tensor([1, 0, 0.5, 0.5, 1, 1, 1, 1, 0, 0, 0, 0], dtype=torch.float32)
    success = torch.tensor([1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0], dtype=torch.bool)
    adv, keep = grpo_advantages(returns, success, group_size=4)
    assert torch.allclose(adv[:4], torch.tensor([math.sqrt(2), -math.sqrt(2), 0, 0]), atol=1e-4)
    assert keep.tolist() == [True] * 4 + [False] * 8  # all-success and all-failure groups carry no signal
    with pytest.raises(ValueError, match="groups of 5"):
        grpo_advantages(returns, success, group_size=5)


def test_rollout_mean_averages_only_valid_steps():
    x = torch.tensor([[1.0, 4.0], [2.0, 5.0], [3.0, 100.0]])
    valid = torch.tensor([[1, 1], [1, 1], [1, 0]], dtype=torch.bool)
    assert torch.allclose(rollout_mean(x, valid), torch.tensor([2.0, 4.5]))
    # the GRPO objective ignores whatever the policy does after termination
    old = torch.zeros(3, 2)
    adv = torch.ones(3, 2)
    a = rollout_mean(clipped_surrogate(torch.zeros(3, 2), old, adv, 0.2, 0.28), valid)
    logp = torch.zeros(3, 2)
    logp[2, 1] = 5.0  # an invalid step
    assert torch.allclose(rollout_mean(clipped_surrogate(logp, old, adv, 0.2, 0.28), valid), a)


def test_grpo_binary_reward_and_token_level_masked_mean_on_a_hand_example():
    """Outcome reward: a success outranks a failure whatever their progress sums; the surrogate is averaged over all
    valid steps of the minibatch (DAPO), so a 3-step rollout's steps weigh as much as a 1-step rollout's."""
    from types import SimpleNamespace

    from wmrl.rl import grpo
    from wmrl.rl.grpo import masked_mean
    from wmrl.rl.rollouts import Rollouts

    # rollout 0 succeeds with little progress, rollout 1 fails after climbing further
    rewards = torch.tensor([[0.1, 0.5], [0.0, 0.3], [0.0, 0.0]])
    valid = torch.tensor([[1, 1], [0, 1], [0, 1]], dtype=torch.bool)
    ro = Rollouts(obs=[], actions=torch.zeros(3, 2, 1, 1), logp=torch.zeros(3, 2), rewards=rewards,
                  terminal=torch.zeros(3, 2, dtype=torch.bool), valid=valid, success=torch.tensor([True, False]))
    cfg = SimpleNamespace(group_size=2, reward="success", clip_low=0.2, clip_high=0.28)
    targets, keep, _ = grpo.prepare(None, ro, cfg)
    assert targets["adv"][0].tolist() == pytest.approx([1.0, -1.0], abs=1e-5) and keep.tolist() == [0, 1]
    targets_p, _, _ = grpo.prepare(None, ro, SimpleNamespace(**{**cfg.__dict__, "reward": "progress"}))
    assert targets_p["adv"][0].tolist() == pytest.approx([-1.0, 1.0], abs=1e-5)  # progress ranks them the wrong way
    with pytest.raises(ValueError, match="reward: expected"):
        grpo.prepare(None, ro, SimpleNamespace(**{**cfg.__dict__, "reward": "dense"}))
    # masked mean: (1 + 2 + 3 + 4) / 4 valid steps, not mean(1, mean(2, 3, 4)) = 2
    x = torch.tensor([[1.0, 2.0], [99.0, 3.0], [99.0, 4.0]])
    assert masked_mean(x, valid).item() == pytest.approx(2.5)
    # the loss at ratio 1 is minus the masked mean of the advantages
    assert grpo.loss(None, ro, np.arange(2), torch.zeros(3, 2), targets, cfg).item() == pytest.approx(-(1 - 3) / 4, abs=1e-5)


def test_grpo_shuffled_placebo_keeps_the_groups_and_their_counts_but_not_who_succeeded():
    """The control reward: the same groups are kept and each group's advantages are the same multiset, but over
    many draws a successful rollout's advantage averages zero (its label is a random member's)."""
    from types import SimpleNamespace

    from wmrl.rl import grpo
    from wmrl.rl.rollouts import Rollouts

    success = torch.tensor([True, False, False, False, True, True, True, True])  # one mixed group, one not
    ro = Rollouts(obs=[], actions=torch.zeros(1, 8, 1, 1), logp=torch.zeros(1, 8), rewards=torch.zeros(1, 8),
                  terminal=torch.zeros(1, 8, dtype=torch.bool), valid=torch.ones(1, 8, dtype=torch.bool), success=success)
    cfg = SimpleNamespace(group_size=4, reward="success")
    true_adv, keep, _ = grpo.prepare(None, ro, cfg)
    torch.manual_seed(0)
    draws = [grpo.prepare(None, ro, SimpleNamespace(group_size=4, reward="shuffled")) for _ in range(400)]
    for targets, kept, _ in draws:
        assert kept.tolist() == keep.tolist() == [0, 1, 2, 3]
        assert sorted(targets["adv"][0, :4].tolist()) == pytest.approx(sorted(true_adv["adv"][0, :4].tolist()), abs=1e-5)
    mean_adv_of_the_success = np.mean([t["adv"][0, 0].item() for t, _, _ in draws])
    assert true_adv["adv"][0, 0].item() == pytest.approx(3 ** 0.5, abs=1e-4) and abs(mean_adv_of_the_success) < 0.2


def test_clipped_fraction_counts_only_steps_whose_gradient_the_clip_removed():
    from wmrl.rl.ppo import clipped_fraction

    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.0])
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0])
    # 1.5 with A > 0 and 0.5 with A < 0 are clipped; 1.5 with A < 0 and 0.5 with A > 0 keep their gradient
    assert clipped_fraction(ratio, adv, 0.2, 0.28).item() == pytest.approx(2 / 5)


def test_clip_is_asymmetric():
    old, adv = torch.zeros(2), torch.tensor([1.0, -1.0])
    s = clipped_surrogate(torch.log(torch.tensor([2.0, 0.1])), old, adv, 0.2, 0.28)
    assert torch.allclose(s, torch.tensor([1.28, -0.8]))


def test_an_overflowing_ratio_on_a_padded_step_leaves_the_loss_and_gradient_finite():
    """A step whose log-probability moved by 100 nats (a narrow gripper sigma) would make rho = inf, and inf times
    its zero mask NaN; the clamped log-ratio keeps the loss and the gradient of the real steps finite and as before."""
    logp = torch.tensor([0.1, 100.0], requires_grad=True)
    valid = torch.tensor([True, False])
    loss, _ = ppo_loss(logp, torch.zeros(2), torch.tensor([-1.0, -1.0]), torch.zeros(2), torch.zeros(2), valid,
                       clip=0.2, vf_coef=0.5)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert loss.item() == pytest.approx(np.exp(0.1)) and logp.grad[0].item() == pytest.approx(np.exp(0.1))


def test_ppo_loss_matches_a_hand_computed_example():
    logp = torch.log(torch.tensor([1.0, 1.5, 0.5]))
    loss, info = ppo_loss(logp, torch.zeros(3), torch.tensor([1.0, 1.0, -1.0]), torch.tensor([0.5, 0.0, 0.0]),
                          torch.tensor([1.0, 1.0, 0.0]), torch.ones(3, dtype=torch.bool), clip=0.2, vf_coef=0.5)
    # surrogate: min(1, 1) = 1; min(1.5, 1.2) = 1.2; min(-0.5, -0.8) = -0.8; value error (0.25 + 1 + 0) / 3
    assert info["pg_loss"] == pytest.approx(-(1 + 1.2 - 0.8) / 3, abs=1e-6)
    assert loss.item() == pytest.approx(-(1 + 1.2 - 0.8) / 3 + 0.5 * 1.25 / 3, abs=1e-6)


def test_gae_bootstraps_on_truncation_but_not_on_termination():
    r = torch.tensor([[1.0], [2.0]])
    v = torch.tensor([[0.5], [0.25], [10.0]])
    valid = torch.ones(2, 1, dtype=torch.bool)
    adv, ret = gae(r, v, torch.tensor([[False], [True]]), valid, gamma=0.9, lam=0.8)
    assert adv[:, 0].tolist() == pytest.approx([0.725 + 0.72 * 1.75, 1.75])
    assert ret[:, 0].tolist() == pytest.approx([0.725 + 0.72 * 1.75 + 0.5, 2.0])
    adv_t, _ = gae(r, v, torch.tensor([[False], [False]]), valid, gamma=0.9, lam=0.8)
    assert adv_t[1, 0].item() == pytest.approx(2 + 0.9 * 10 - 0.25)
    adv_m, _ = gae(r, v, torch.tensor([[True], [False]]), torch.tensor([[True], [False]]), gamma=0.9, lam=0.8)
    assert adv_m[:, 0].tolist() == pytest.approx([0.5, 0.0])  # nothing leaks back from after the end


def _toy_rollouts(success, policy):
    from tests.helpers import vla_obs as _obs
    from wmrl.rl.rollouts import Rollouts, step_logp

    N = len(success)
    torch.manual_seed(0)
    ro = Rollouts(obs=[_obs(N, seed=t) for t in range(3)], actions=torch.randn(2, N, 4, 4), logp=torch.full((2, N), -20.0),
                    rewards=torch.tensor([[0.1 * i for i in range(N)], [0.5] * N]), terminal=torch.zeros(2, N, dtype=torch.bool),
                    valid=torch.ones(2, N, dtype=torch.bool), success=torch.tensor(success))
    with torch.no_grad():  # behaviour log-probs = the current policy's, as right after collection
        ro.logp = step_logp(policy, ro, np.arange(N))
    return ro


def test_grpo_update_learns_only_from_groups_with_mixed_outcomes():
    from tests.helpers import tiny_vla as _policy
    from wmrl.rl.imagine import update

    cfg = ImagineConfig(group_size=2, epochs=1, minibatch_rollouts=4)
    pol = _policy()
    before = [p.detach().clone() for p in pol.parameters()]
    opt = torch.optim.SGD(pol.parameters(), lr=0.1)
    info = update(pol, opt, _toy_rollouts([True, True, False, False], pol), cfg)
    assert info["updates"] == 0 and info["kept_groups"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, pol.parameters()))
    info = update(pol, opt, _toy_rollouts([True, False, False, False], pol), cfg)
    assert info["updates"] == 1 and info["kept_groups"] == 0.5
    assert any(not torch.equal(a, b) for a, b in zip(before, pol.parameters()))


def test_target_kl_stops_an_iterations_updates_once_the_policy_has_moved_too_far():
    from tests.helpers import tiny_vla as _policy
    from wmrl.rl.imagine import update

    ro_args = ([True, False, True, False, True, False, True, False],)
    # without a target every minibatch of every epoch steps: 3 epochs x 2 minibatches (lr 0.1: six steps of lr 1
    # drove a quarter of random initialisations to NaN)
    pol = _policy()
    info = update(pol, torch.optim.SGD(pol.parameters(), lr=0.1), _toy_rollouts(*ro_args, pol),
                  ImagineConfig(group_size=2, epochs=3, minibatch_rollouts=4))
    assert info["updates"] == 6 and info["kl_stopped"] is False
    # with one: the first minibatch starts at KL 0 and steps; a step of lr 0.1 moves the policy past 1.5 x 1e-3
    # (for 40 of 40 initialisations tried), so the next minibatch is refused and the iteration ends
    pol = _policy()
    cfg = ImagineConfig(group_size=2, epochs=3, minibatch_rollouts=4, target_kl=1e-3)
    info = update(pol, torch.optim.SGD(pol.parameters(), lr=0.1), _toy_rollouts(*ro_args, pol), cfg)
    assert info["updates"] == 1 and info["kl_stopped"] is True
    # a tiny step stays inside the target: every minibatch runs
    pol = _policy()
    info = update(pol, torch.optim.SGD(pol.parameters(), lr=1e-9), _toy_rollouts(*ro_args, pol), cfg)
    assert info["updates"] == 6 and info["kl_stopped"] is False


def test_a_world_model_without_success_head_is_refused():
    with pytest.raises(ValueError, match="no success head"):
        require_success_head(object())


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_imagine_runs_with_zero_true_environment_steps_and_resumes(trained, tiny_data, tiny_policy, tmp_path, algo):
    base = dict(policy=tiny_policy, world_model=trained, data=tiny_data, out=tmp_path / algo, algo=algo, iterations=2,
                groups=2, group_size=2, max_steps=8, minibatch_rollouts=2, epochs=1, lr=1e-3, ckpt_every=1)
    r = imagine(ImagineConfig(**base), progress=False)
    assert r["true_env_steps_during_rl"] == 0
    recs = [json.loads(l) for l in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
    its = [x for x in recs if "iteration" in x]
    assert [x["iteration"] for x in its] == [1, 2]
    assert all(x["true_env_steps"] == 0 and 0 <= x["imagined_success"] <= 1 for x in its)
    if algo == "ppo":
        assert all(x["updates"] > 0 for x in its)
    else:  # GRPO updates exactly when some group had mixed outcomes
        assert all((x["updates"] > 0) == (x["kept_groups"] > 0) for x in its)
    assert (tmp_path / algo / "learning_curves.png").exists()
    r2 = imagine(ImagineConfig(**{**base, "iterations": 3, "resume": True}), progress=False)
    recs = [json.loads(l) for l in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in recs if "iteration" in x] == [1, 2, 3] and r2["true_env_steps_during_rl"] == 0


def test_imagined_episodes_last_the_tasks_own_horizon_unless_told(tiny_data, tmp_path):
    """RL in imagination rewards success within the horizon the policy is evaluated on (push: 80 steps), not a
    fixed 40 that Meta-World's 50-75-step pushes would never fit in."""
    from wmrl.rl.imagine import imagined_horizon

    assert imagined_horizon(tiny_data) == 80
    assert imagined_horizon(tiny_data, 12) == 12
    with pytest.raises(ValueError, match="max_steps must be positive"):
        imagine(ImagineConfig(policy=tmp_path / "p", world_model=tmp_path / "wm", out=tmp_path / "x", max_steps=0),
                progress=False)
    assert not (tmp_path / "x").exists()


def test_imagine_passes_the_gate_settling_and_object_layer_to_the_world_model(trained, tiny_data, tiny_policy, tmp_path,
                                                                              monkeypatch):
    import wmrl.rl.imagine as im

    seen = {}
    load = im.make_world_model
    monkeypatch.setattr(im, "make_world_model", lambda *a, **kw: (seen.update(kw), load(*a, **kw))[1])
    imagine(ImagineConfig(policy=tiny_policy, world_model=trained, data=tiny_data, out=tmp_path / "r", iterations=1,
                          groups=2, group_size=2, max_steps=4, minibatch_rollouts=2, epochs=1, state_gate="hard",
                          state_settle=False, object_layer="blend"), progress=False)
    assert (seen["state_gate"], seen["state_settle"], seen["object_layer"]) == ("hard", False, "blend")
    with pytest.raises(ValueError, match="object_layer"):  # refused before anything is written
        imagine(ImagineConfig(policy=tiny_policy, world_model=trained, data=tiny_data, out=tmp_path / "bad",
                              object_layer="glued"), progress=False)
    assert not (tmp_path / "bad").exists()


def test_imagine_refuses_a_flow_policy(trained, tiny_data, tmp_path):
    from wmrl.commands.train_policy import TrainPolicyConfig, train_policy

    train_policy(TrainPolicyConfig(data=(tiny_data,), out=tmp_path / "flow", head="flow", steps=1, batch_size=2,
                                   eval_episodes=0, extra={"vision_width": 8, "hidden": 16, "text_dim": 8}), progress=False)
    with pytest.raises(ValueError, match="gaussian head"):
        imagine(ImagineConfig(policy=tmp_path / "flow", world_model=trained, data=tiny_data, out=tmp_path / "x"),
                progress=False)



class _FlagEnv:
    """Three envs: env 0 succeeds at chunk 1; env 1 is truncated by the world model's hallucination flag at chunk 1;
    env 2 runs out of time at chunk 2."""

    num_envs, max_episode_steps = 3, 12

    def reset(self, seed=None, options=None):
        self.t = 0
        return {"x": torch.zeros(3, 1)}, {}

    def step(self, a):
        t, self.t = self.t, self.t + 1
        success, flagged = np.array([t == 1, False, False]), np.array([False, t == 1, False])
        trunc = flagged | (t == 2)
        return {"x": torch.zeros(3, 1)}, success.astype(float), success, trunc, {"success": success, "flagged": flagged}


class _ConstPolicy:
    class cfg:
        chunk_size = 4

    def sample(self, obs):
        return torch.zeros(3, 4, 4), torch.zeros(3)


def test_rollouts_record_which_episodes_the_hallucination_flag_stopped():
    from wmrl.rl.rollouts import collect_rollouts

    ro = collect_rollouts(_ConstPolicy(), _FlagEnv(), 1, seed=0)
    assert ro.success.tolist() == [True, False, False] and ro.flagged.tolist() == [False, True, False]
    assert ro.valid.T.tolist() == [[True, True, False], [True, True, False], [True, True, True]]


def test_imagine_trains_an_estimated_state_actor_on_the_state_channel(trained, tiny_data, tmp_path, monkeypatch):
    """An estimated-state policy learns in imagination from the state channel's objects (no frames decoded), with
    the estimator's error added by the env to what it observes, and is evaluated as deployed (cameras)."""
    from policies.estimated_state import EstimatedStatePolicy
    from policies.estimated_state.train import train_estimated_state
    from world_models.env import make_imagination_env
    from world_models.factory import make_world_model

    policy, _ = train_estimated_state([tiny_data], estimator_steps=2, actor_steps=20, holdout_episodes=2, width=8,
                                      hidden=32, layers=2, progress=False)
    assert len(policy.cfg.estimate_noise) == 13 and all(v > 0 for v in policy.cfg.estimate_noise)
    policy.save(tmp_path / "pol")
    seen = []
    features = EstimatedStatePolicy.features

    def spy(self, obs):
        seen.append((self.read_object_channel, sorted(obs)))
        return features(self, obs)

    monkeypatch.setattr(EstimatedStatePolicy, "features", spy)
    r = imagine(ImagineConfig(policy=tmp_path / "pol", policy_type="estimated-state", world_model=trained, data=tiny_data,
                              out=tmp_path / "rl", iterations=1, groups=2, group_size=2, max_steps=4, minibatch_rollouts=2,
                              epochs=1, eval_episodes=1), progress=False)
    assert r["true_env_steps_during_rl"] == 0
    imagined = [keys for on, keys in seen if on]
    true = [keys for on, keys in seen if not on]
    assert imagined and all("observation.environment_state" in k and not any("images" in x for x in k) for k in imagined)
    assert true and all("observation.images.front" in k for k in true)  # before and after: the cameras
    assert EstimatedStatePolicy.load(tmp_path / "rl" / "checkpoints" / "last").read_object_channel is False
    # the env perturbs what the policy observes by the estimator's error, never the model's own state
    model = make_world_model("video", str(trained))
    env = make_imagination_env(model, tiny_data, 4, 8, decode_images=False, object_noise=[0.01] * 13)
    obs, _ = env.reset(seed=0)
    diff = obs["observation.environment_state"] - env.predicted_environment_state
    assert 0.005 < diff.std() < 0.02 and "observation.images.front" not in obs
    assert np.array_equal(env.predicted_environment_state, env._env_state)  # the noise-free prediction, a copy
    with pytest.raises(ValueError, match="object_noise: expected 13"):
        make_imagination_env(model, tiny_data, 4, 8, object_noise=[0.01] * 3)
    with pytest.raises(ValueError, match="policy_type"):
        imagine(ImagineConfig(policy=tmp_path / "pol", policy_type="act", world_model=trained, out=tmp_path / "x"),
                progress=False)
    assert not (tmp_path / "x").exists()
    # ResiP: RL trains a zero-initialised residual on the frozen start; the checkpoint carries both
    imagine(ImagineConfig(policy=tmp_path / "pol", policy_type="estimated-state", world_model=trained, data=tiny_data,
                          out=tmp_path / "res", iterations=1, groups=2, group_size=2, max_steps=4, minibatch_rollouts=2,
                          epochs=1, lr=1e-2, algo="ppo", residual_hidden=8), progress=False)
    start, res = EstimatedStatePolicy.load(tmp_path / "pol"), EstimatedStatePolicy.load(tmp_path / "res" / "checkpoints" / "last")
    assert res.cfg.residual_hidden == 8 and start.cfg.residual_hidden == 0
    for k, v in start.actor.state_dict().items():
        torch.testing.assert_close(res.actor.state_dict()[k], v, rtol=0, atol=0)
    assert res.residual.net[-1].weight.abs().sum() > 0  # the residual learned
    with pytest.raises(ValueError, match="residual_hidden"):
        imagine(ImagineConfig(policy=tmp_path / "pol", world_model=trained, out=tmp_path / "z", residual_hidden=8),
                progress=False)
    assert not (tmp_path / "z").exists()
    with pytest.raises(ValueError, match="state_readout"):  # the readout reaches the imagination env
        imagine(ImagineConfig(policy=tmp_path / "pol", policy_type="estimated-state", world_model=trained, data=tiny_data,
                              out=tmp_path / "y", state_readout="median", groups=1, group_size=2), progress=False)
