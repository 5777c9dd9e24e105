"""Contract tests, parametrised over every registered implementation (DreamerV3 style): registering a policy, a world
model or an offline agent is enough to hold it to its interface here."""

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import sim
from policies.factory import make_policy
from wmrl.core.protocols import Policy, WorldModel
from wmrl.core.registry import POLICIES, WORLD_MODELS
from wmrl.rl.agents import agent_kinds, load_agent, make_agent, save_agent
from world_models.env import WorldModelSingleEnv
from world_models.factory import make_world_model
from world_models.video.train import load_split


@pytest.fixture(scope="module")
def push_env():
    env = sim.make_vector_env("push-red", 2)
    yield env
    env.close()


def _policy(name, env, seed, tiny_policy, lerobot):
    kw = ({"path": str(tiny_policy[name])} if name in tiny_policy else {"path": str(lerobot[name])} if name in lerobot
          else {"noise": 0.3} if name == "scripted" else {})
    return make_policy(name, env.single_action_space, seed=seed, observation_space=env.single_observation_space, **kw)


@pytest.mark.parametrize("name", POLICIES.names())
def test_policy_contract(name, push_env, tiny_policy, tiny_estimated_state, lerobot_checkpoints):
    tiny_policy = {"vla": tiny_policy, "estimated-state": tiny_estimated_state}
    policy = _policy(name, push_env, 7, tiny_policy, lerobot_checkpoints)
    assert isinstance(policy, Policy)
    obs, _ = push_env.reset(seed=0)
    policy.reset()
    a = np.asarray(policy.select_action(obs))
    assert a.shape == (2, *push_env.single_action_space.shape) and np.isfinite(a).all()
    chunk = np.asarray(policy.predict_action_chunk(obs))
    assert chunk.ndim == 3 and chunk.shape[0] == 2 and chunk.shape[2] == a.shape[1] and chunk.shape[1] >= 1
    # two instances made with the same seed act the same on the same observations (evaluation is reproducible)
    first, second = (_policy(name, push_env, 7, tiny_policy, lerobot_checkpoints) for _ in range(2))
    first.reset(), second.reset()
    np.testing.assert_allclose(np.asarray(first.select_action(obs)), np.asarray(second.select_action(obs)), atol=1e-6)
    # the evaluation loop runs it and the true simulator accepts every action it chose
    from wmrl.eval import evaluate

    r = evaluate(policy, push_env, 2, seed=3, progress=False)
    assert len(r.per_episode) == 2 and all(e["length"] >= 1 for e in r.per_episode)


@pytest.mark.parametrize("kind", WORLD_MODELS.names())
def test_world_model_contract(kind, trained, tiny_data, push_env):
    model = make_world_model(kind, str(trained))
    assert isinstance(model, WorldModel)
    obs, _ = push_env.reset(seed=0)
    state = model.encode(obs)
    H = model.cfg.chunk
    torch.manual_seed(0)
    state, preds = model.step(state, torch.zeros(2, H, push_env.single_action_space.shape[0]))
    for k in ("reward", "success", "done"):
        assert tuple(preds[k].shape) == (2, H), k
    assert tuple(preds["observation.state"].shape[:2]) == (2, H)
    frames = model.decode(preds["latents"], state, preds["pose"])
    for key, f in frames.items():
        assert key.startswith("observation.images.") and f.dtype == np.uint8 and f.shape[:2] == (2, H) and f.shape[-1] == 3
    # the gymnasium view of the world model passes gymnasium's own checker
    _, _, held = load_split(tiny_data, 0.25)
    check_env(WorldModelSingleEnv(model, held, max_episode_steps=4), skip_render_check=True)


@pytest.mark.parametrize("kind", agent_kinds())
def test_agent_save_load_round_trip(kind, tmp_path):
    spaces = {"obs_dim": 5, "act_dim": 2, "action_low": (-1.0, -1.0), "action_high": (1.0, 1.0)}
    torch.manual_seed(0)
    agent = make_agent(kind, spaces, hidden=16)
    obs, act = torch.randn(8, 5), torch.rand(8, 2) * 2 - 1
    loaded = load_agent(save_agent(agent, tmp_path / kind))
    assert type(loaded) is type(agent) and loaded.cfg == agent.cfg
    torch.testing.assert_close(loaded.q_values(obs, act), agent.q_values(obs, act))
    for p, q in zip(agent.state_dict().values(), loaded.state_dict().values()):
        torch.testing.assert_close(p, q)
    with pytest.raises(ValueError, match="agent"):
        make_agent("no-such-agent", spaces)
