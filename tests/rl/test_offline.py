"""Offline and offline-to-online RL: dynamics ensemble, oracle, EDAC, RAVL's target, WSRL's warm-up, trajectory
weighting, and every agent beating the random policy on the 2-D point task."""

import json

import numpy as np
import pytest
import torch

ENV = "PointEdge-v0"


def test_dataset_has_simulator_state_and_references(point_data):
    from wmrl.datasets import LeRobotV3Dataset

    data, res = point_data
    ds = LeRobotV3Dataset(data)
    ep = ds.episode(0)
    assert {"observation.state", "action", "next.reward", "next.terminated", "next.truncated", "qpos", "qvel"} <= set(ep)
    np.testing.assert_allclose(ep["qpos"], ep["observation.state"], atol=1e-6)  # the point's state is its position
    meta = json.loads((data / "meta" / "wmrl.json").read_text())
    assert meta["env"] == ENV and meta["kind"] == "mixed"
    assert meta["reference_returns"]["expert"] > meta["reference_returns"]["random"]
    assert res["transitions"] >= 3000


def test_ensemble_bootstrap_and_elite_selection():
    from world_models.dynamics import EnsembleConfig, GaussianEnsemble, fit_ensemble
    from world_models.dynamics.ensemble import bootstrap_indices

    boot = bootstrap_indices(np.arange(100, 200), 5, np.random.default_rng(0))
    assert boot.shape == (5, 100) and boot.min() >= 100 and boot.max() < 200
    assert all(len(np.unique(row)) < 100 for row in boot)  # with replacement: duplicates
    assert len({tuple(row) for row in boot}) == 5  # a different resample per member

    rng = np.random.default_rng(0)
    s = rng.normal(size=(2000, 3)).astype(np.float32)
    a = rng.uniform(-1, 1, (2000, 2)).astype(np.float32)
    s2 = s + 0.1 * np.concatenate([a, a[:, :1]], 1)
    r = a.sum(1)
    cfg = EnsembleConfig(obs_dim=3, act_dim=2, members=4, elites=2, hidden=32, layers=2,
                         weight_decay=(0, 0, 0), max_epochs=40, patience=40)
    model = GaussianEnsemble(cfg)
    before = model.holdout_mse(torch.as_tensor(s[:200]), torch.as_tensor(a[:200]),
                               torch.as_tensor(np.concatenate([s2 - s, r[:, None]], 1)[:200])).mean().item()
    info = fit_ensemble(model, s, a, s2, r, progress=False)
    mse = np.array(info["holdout_mse"])
    assert mse.mean() < 0.05 * before
    assert sorted(info["elites"]) == sorted(np.argsort(mse)[:2].tolist())  # the best members by hold-out MSE
    # rollouts only ever use elites: ruin a non-elite member and predictions stay good
    bad = next(i for i in range(4) if i not in info["elites"])
    with torch.no_grad():
        model.out.bias[bad] += 100.0
    nxt, rew, term, state, extra = model.step(s[:500], a[:500], rng=np.random.default_rng(1))
    assert np.abs(nxt - s2[:500]).mean() < 0.1 and np.abs(rew - r[:500]).mean() < 0.3
    assert state is None and extra["uncertainty"].shape == (500,) and not term.any()


def test_true_dynamics_reproduce_halfcheetah_exactly():
    from sim.locomotion import make_state_env
    from world_models.dynamics import TrueDynamics

    env = make_state_env("HalfCheetah-v5")
    obs, info = env.reset(seed=3)
    rng = np.random.default_rng(0)
    S, Q, V, A, N, R = [], [], [], [], [], []
    for _ in range(40):
        a = rng.uniform(-1, 1, 6).astype(np.float32)
        S.append(obs["observation.state"]), Q.append(info["qpos"]), V.append(info["qvel"]), A.append(a)
        obs, r, term, trunc, info = env.step(a)
        N.append(obs["observation.state"]), R.append(r)
    oracle = TrueDynamics("HalfCheetah-v5")
    nxt, rew, term, state, extra = oracle.step(np.stack(S), np.stack(A), {"qpos": np.stack(Q), "qvel": np.stack(V)})
    np.testing.assert_allclose(nxt, np.stack(N), atol=1e-9)
    np.testing.assert_allclose(rew, np.array(R, np.float32), atol=1e-6)
    assert not term.any() and (extra["uncertainty"] == 0).all()
    with pytest.raises(ValueError, match="qpos, qvel"):
        oracle.step(np.stack(S), np.stack(A), None)


def test_edac_diversity_on_a_hand_example():
    """Linear critics Q_i(s, a) = w_i . a have grad_a Q_i = w_i, so EDAC's term is known in closed form."""
    from wmrl.rl.sac import edac_diversity

    grads = lambda w: torch.tensor(w, dtype=torch.float32)[:, None, :].expand(-1, 5, -1)  # (N, B=5, A)
    # two critics at 45 degrees: sum over i != j of cos = 2 cos(45) and 1/(N-1) = 1
    assert edac_diversity(grads([[1, 0], [1, 1]])).item() == pytest.approx(2 ** 0.5, abs=1e-5)
    # three critics: pairs (1,2) 0, (1,3) -1, (2,3) 0, each counted twice, divided by N-1 = 2
    assert edac_diversity(grads([[1, 0], [0, 1], [-1, 0]])).item() == pytest.approx(-1.0, abs=1e-5)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_one_forward_gives_the_q_and_action_gradients_of_two(layer_norm):
    """`q_and_action_grad` (one forward for the TD loss and EDAC's term) against a forward for Q and a second one for
    grad_a Q: the same Q, the same action gradients and, through both losses, the same weight gradients."""
    from policies.state.networks import CriticEnsemble
    from wmrl.rl.sac import edac_diversity

    torch.manual_seed(0)
    critic = CriticEnsemble(5, 3, n=4, hidden=16, layers=3, layer_norm=layer_norm)
    obs, act = torch.randn(32, 5), torch.rand(32, 3) * 2 - 1
    a = act.unsqueeze(0).expand(4, -1, -1).clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(critic(obs.unsqueeze(0).expand(4, -1, -1), a).sum(), a, create_graph=True)
    q_ref = critic(obs, act)
    q, g = critic.q_and_action_grad(obs, act)
    torch.testing.assert_close(q, q_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-6)
    loss = lambda q, g: (q ** 2).mean() + edac_diversity(g)
    w_ref = torch.autograd.grad(loss(q_ref, g_ref), list(critic.parameters()))
    w = torch.autograd.grad(loss(q, g), list(critic.parameters()))
    for x, y in zip(w, w_ref):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)


def test_the_batched_ensemble_equals_n_separate_networks():
    """`CriticEnsemble` (one batched product per layer for all N critics) against N ordinary MLPs holding the same
    weights: the same Q-values and the same weight gradients, to 1e-5."""
    from policies.state.networks import CriticEnsemble, VectorizedLinear

    torch.manual_seed(0)
    N, critic = 5, CriticEnsemble(7, 3, n=5, hidden=32, layers=3)
    lins = [m for m in critic.body if isinstance(m, VectorizedLinear)] + [critic.head]
    nets = []
    for i in range(N):
        mods = []
        for lin in lins:
            layer = torch.nn.Linear(*lin.weight.shape[1:])
            with torch.no_grad():
                layer.weight.copy_(lin.weight[i].T)
                layer.bias.copy_(lin.bias[i, 0])
            mods += [layer, torch.nn.ReLU()]
        nets.append(torch.nn.Sequential(*mods[:-1]))
    obs, act = torch.randn(64, 7), torch.randn(64, 3)
    q = critic(obs, act)
    q_sep = torch.stack([net(torch.cat([obs, act], -1)).squeeze(-1) for net in nets])
    torch.testing.assert_close(q, q_sep, rtol=1e-5, atol=1e-5)
    (q ** 2).sum().backward()
    (q_sep ** 2).sum().backward()
    for j, lin in enumerate(lins):
        for i in range(N):
            torch.testing.assert_close(lin.weight.grad[i].T, nets[i][2 * j].weight.grad, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(lin.bias.grad[i, 0], nets[i][2 * j].bias.grad, rtol=1e-5, atol=1e-5)


def test_the_actor_step_keeps_the_critics_trainable():
    from wmrl.rl.sac import SAC, SACConfig

    torch.manual_seed(0)
    agent = SAC(SACConfig(obs_dim=3, act_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0), num_critics=3, eta=1.0,
                          hidden=8, layers=2, batch_size=16))
    b = {"obs": torch.randn(16, 3), "act": torch.rand(16, 2) * 2 - 1, "rew": torch.randn(16),
         "next_obs": torch.randn(16, 3), "term": torch.zeros(16)}
    before = [p.detach().clone() for p in agent.critic.parameters()]
    agent.update(b)
    assert all(p.requires_grad for p in agent.critic.parameters())
    assert all(not torch.equal(p, q) for p, q in zip(agent.critic.parameters(), before))  # the critic step still trains


def test_ravl_target_is_min_over_the_ensemble_minus_entropy():
    from wmrl.rl.agents import make_agent
    from wmrl.rl.sac import spaces_of

    agent = make_agent("sac", spaces_of(ENV), num_critics=3, eta=1.0, hidden=16, gamma=0.9, init_alpha=0.5)
    qs = torch.tensor([[1.0, 5.0], [3.0, -2.0], [2.0, 0.0]])  # (N=3, B=2)
    a2, logp2 = torch.zeros(2, 2), torch.tensor([-1.0, 2.0])

    class Fixed(torch.nn.Module):
        def forward(self, obs, act):
            return qs

    agent.target = Fixed()
    agent.actor.sample = lambda obs: (a2, logp2)
    rew, term = torch.tensor([0.5, 1.0]), torch.tensor([0.0, 1.0])
    y = agent.target_q(rew, torch.zeros(2, 2), term)
    # y = r + gamma (1 - d) [min_i Q_i - alpha log pi]; the second transition terminated
    assert torch.allclose(y, torch.tensor([0.5 + 0.9 * (1.0 - 0.5 * -1.0), 1.0]))
    agent.cfg.backup_entropy = False
    assert torch.allclose(agent.target_q(rew, torch.zeros(2, 2), term), torch.tensor([0.5 + 0.9 * 1.0, 1.0]))


def test_trajectory_weights_set_sampling_probabilities(episode_factory):
    from wmrl.replay import EpisodeReplay
    from wmrl.replay.weighting import apply_weighting, trajectory_weights

    b = EpisodeReplay(200)
    for T, scale in ((4, 0.0), (4, 1.0), (4, 2.0)):
        ep = episode_factory(T, image=False)
        ep["next.reward"] = np.full(T + 1, scale, np.float32)  # returns 0, 4, 8 (the final frame is not a step)
        b.add_episode(ep)
    w = trajectory_weights(b, "return", alpha=0.5)
    np.testing.assert_allclose([w[0], w[1], w[2]], np.exp((np.array([0.0, 0.5, 1.0]) - 1) / 0.5))
    apply_weighting(b, "return", alpha=0.5)
    starts, p = b.sampling_probabilities()
    per_ep = np.array([p[b.frame_episode[starts] == e].sum() for e in range(3)])
    np.testing.assert_allclose(per_ep, np.array([w[0], w[1], w[2]]) / sum(w.values()))
    # identical start states: the advantage is the return minus its mean, so AW equals RW here
    wa = trajectory_weights(b, "advantage", alpha=0.5)
    assert wa[0] < wa[1] < wa[2]
    with pytest.raises(ValueError, match="weighting"):
        trajectory_weights(b, "rank")


def test_wsrl_warmup_makes_no_updates_and_keeps_no_offline_data(point_data, tmp_path):
    from wmrl.rl.agents import make_agent, save_agent
    from wmrl.rl.sac import spaces_of
    from wmrl.rl.wsrl import FinetuneConfig, finetune

    agent = make_agent("sac", spaces_of(ENV), num_critics=4, hidden=16)
    save_agent(agent, tmp_path / "agent")
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    res = finetune(FinetuneConfig(agent=tmp_path / "agent", env=ENV, out=tmp_path / "ft", steps=120, warmup=120,
                                  eval_every=120, eval_episodes=1, progress=False))
    assert res["updates"] == 0 and res["online_transitions"] == 120
    from wmrl.rl.agents import load_agent

    after = load_agent(tmp_path / "ft" / "checkpoints" / "last")
    assert all(torch.equal(before[k], v) for k, v in after.state_dict().items() if k in before)
    assert after.cfg.utd == 4 and after.cfg.target_subsample == 2 and not after.cfg.backup_entropy
    res = finetune(FinetuneConfig(agent=tmp_path / "agent", env=ENV, out=tmp_path / "ft2", steps=400, warmup=300,
                                  utd=2, eval_every=400, eval_episodes=1, progress=False))
    assert res["updates"] == 400 - 300  # the warm-up filled a batch; then one (UTD-2) update per env step
    with pytest.raises(ValueError, match="--data"):
        finetune(FinetuneConfig(agent=tmp_path / "agent", env=ENV, algo="naive-retain", out=tmp_path / "x"))


@pytest.mark.parametrize("algo", ["mbpo", "mopo", "ravl", "sac-n", "edac", "td3bc", "iql"])
def test_every_agent_beats_the_random_policy_on_the_point_task(algo, point_data, tmp_path):
    from wmrl.rl.ravl import OfflineConfig, train_offline

    data, res = point_data
    random_return = res["reference_returns"]["random"]
    diversified = algo in ("ravl", "edac")
    epochs = 14 if diversified else 8  # pessimistic critics learn more slowly at first
    critics = 5 if diversified else None  # 10 critics cost 4x a SAC-2 update; 5 keep the test's time in line
    out = train_offline(OfflineConfig(data=data, out=tmp_path / algo, algo=algo, epochs=epochs, updates_per_epoch=150,
                                      num_critics=critics,
                                      rollout_batch=300, hidden=64, eval_every=epochs, eval_episodes=10,
                                      dynamics="learned" if algo == "mopo" else "true", ensemble_members=3,
                                      ensemble_elites=2, ensemble_hidden=32, ensemble_max_epochs=60, progress=False))
    assert out["final_return"] > random_return + 3.0, (algo, out["final_return"], random_return)
    rows = [json.loads(line) for line in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == epochs and all(np.isfinite(r["q_dataset"]) for r in rows)


def test_offline_refuses_true_dynamics_without_simulator_state_and_mismatched_dims(point_data, tmp_path):
    from wmrl.replay import EpisodeReplay
    from wmrl.replay.buffer import BOOKKEEPING
    from wmrl.rl.ravl import OfflineConfig, train_offline

    data, _ = point_data
    _, stripped, _ = EpisodeReplay.from_datasets([data], drop=BOOKKEEPING | {"qpos", "qvel"})
    stripped.to_lerobot(tmp_path / "noqpos", fps=10)
    (tmp_path / "noqpos" / "meta" / "wmrl.json").write_text(json.dumps({"env": ENV}))
    with pytest.raises(ValueError, match="qpos, qvel"):
        train_offline(OfflineConfig(data=tmp_path / "noqpos", out=tmp_path / "r", algo="ravl", dynamics="true",
                                    epochs=1, progress=False))
    with pytest.raises(ValueError, match="do not match"):
        train_offline(OfflineConfig(data=data, env="HalfCheetah-v5", out=tmp_path / "r2", algo="iql", epochs=1,
                                    progress=False))
    with pytest.raises(ValueError, match="algo"):
        train_offline(OfflineConfig(data=data, out=tmp_path / "r3", algo="cql", epochs=1, progress=False))


def test_a_diverging_run_stops_with_a_clear_message_and_keeps_its_last_checkpoint(point_data, tmp_path, monkeypatch):
    from wmrl.rl.agents import load_agent
    from wmrl.rl.ravl import OfflineConfig, train_offline
    from wmrl.rl.sac import SAC

    data, _ = point_data
    real_update, calls = SAC.update, {"n": 0}

    def update(self, b):
        calls["n"] += 1
        if calls["n"] > 20:  # epoch 3 of 10 updates each: the critic blows up
            b = {**b, "rew": b["rew"] * float("nan")}
        return real_update(self, b)

    monkeypatch.setattr(SAC, "update", update)
    cfg = OfflineConfig(data=data, out=tmp_path / "run", algo="sac-n", num_critics=2, epochs=5, updates_per_epoch=10,
                        hidden=16, eval_every=1, eval_episodes=1, progress=False)
    with pytest.raises(FloatingPointError, match="diverged at epoch 3.*last good checkpoint"):
        train_offline(cfg)
    ck = tmp_path / "run" / "checkpoints" / "last"
    assert json.loads((ck / "train_state.json").read_text())["step"] == 2
    agent = load_agent(ck)
    assert all(torch.isfinite(p).all() for p in agent.parameters())


def test_a_made_dataset_does_not_depend_on_what_ran_before(tmp_path):
    """The SAC that defines 'expert' is seeded before its weights are drawn, so the same config gives the same
    dataset whatever consumed the torch RNG earlier in the process."""
    import torch

    from wmrl.rl.d4rl import MakeDatasetConfig, make_dataset

    refs = []
    for i in range(2):
        torch.rand(i + 1)  # a different history of the global generator
        make_dataset(MakeDatasetConfig(env=ENV, kind="expert", out=tmp_path / f"d{i}", transitions=100, sac_steps=200,
                                       sac_hidden=16, cache=tmp_path / f"cache{i}", progress=False, reference_episodes=2))
        refs.append(json.loads((tmp_path / f"d{i}" / "meta" / "make.json").read_text())["reference_returns"])
    assert refs[0] == refs[1]


@pytest.mark.parametrize("algo,dynamics", [("ravl", "true"), ("mopo", "learned")])
def test_a_resumed_run_continues_exactly_as_one_never_stopped(algo, dynamics, point_data, tmp_path):
    """Paper-scale runs span sessions: stopped at a checkpoint and resumed with a longer budget, a run gives the
    same losses, Q-values and weights as one trained straight through (the model buffer of past rollouts, the
    rollout RNG, the dataset sampler's RNG and the optimisers all come back)."""
    from wmrl.rl.agents import load_agent
    from wmrl.rl.ravl import OfflineConfig, train_offline

    data, _ = point_data
    base = dict(data=data, algo=algo, dynamics=dynamics, num_critics=3, updates_per_epoch=15, rollout_batch=60,
                retain_epochs=3, hidden=16, eval_every=2, eval_episodes=1, ensemble_members=3, ensemble_elites=2,
                ensemble_hidden=16, ensemble_max_epochs=5, dynamics_dir=tmp_path / "dyn", progress=False)
    straight = train_offline(OfflineConfig(out=tmp_path / "straight", epochs=6, **base))
    first = train_offline(OfflineConfig(out=tmp_path / "split", epochs=2, **base))
    assert len(first["curve"]) == 2
    resumed = train_offline(OfflineConfig(out=tmp_path / "split", epochs=6, resume=True, **base))
    keys = ("q_dataset", "q_rollout_end", "critic_loss", "model_transitions", "return")
    assert [r["epoch"] for r in resumed["curve"]] == list(range(1, 7))  # the whole curve, not only the new epochs
    for a, b in zip(straight["curve"], resumed["curve"]):
        assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}, a["epoch"]
    wa, wb = (load_agent(tmp_path / r / "checkpoints" / "last") for r in ("straight", "split"))
    assert all(torch.equal(x, y) for x, y in zip(wa.parameters(), wb.parameters()))
    # a checkpoint whose saved rollouts were changed is refused, not resumed from
    buf = next((tmp_path / "split" / "checkpoints" / "last" / "model_buffer").glob("observation.state.npy"))
    arr = np.load(buf)
    np.save(buf, arr + 1)
    with pytest.raises(ValueError, match="model_buffer.*hash mismatch"):
        train_offline(OfflineConfig(out=tmp_path / "split", epochs=8, resume=True, **base))
