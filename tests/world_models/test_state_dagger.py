"""DAgger for the state channel (`world_models/video/state_dagger.py`) and the simulator's `place`."""

import dataclasses
import json

import numpy as np
import pytest
import torch

import sim
from tests.helpers import tiny_wm_config
from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE
from world_models.video import state_dagger as sd
from world_models.video.train import WindowSampler, load_split, model_config, train_world_model


def _scene(seed=3, ee=(0.40, 0.05, 0.10), red=(0.45, 0.12, 0.02)):
    env = sim.make_env("push-red", cameras=()).unwrapped
    obs, _ = env.reset(seed=seed)
    state, env_state = obs[OBS_STATE].copy(), obs[OBS_ENV_STATE].copy()
    state[5:8], env_state[0:3] = ee, red
    return env, state, env_state


def test_place_puts_the_hand_and_the_cubes_where_the_observation_says():
    env, state, env_state = _scene()
    obs = env.place(state, env_state)
    np.testing.assert_allclose(obs[OBS_STATE][5:8], state[5:8], atol=2e-3)  # inverse kinematics of the hand
    np.testing.assert_allclose(obs[OBS_ENV_STATE][:9], env_state[:9], atol=1e-6)
    assert obs[OBS_STATE][4] == pytest.approx(state[4], abs=1e-6) and not env.data.qvel.any()
    far = state.copy()
    far[5:8] = (2.0, 0.0, 0.1)  # outside the workspace: clipped, not refused
    assert env.place(far, env_state)[OBS_STATE][5] < 0.63
    with pytest.raises(ValueError, match="expected state"):
        env.place(state[:5], env_state)
    bad = env_state.copy()
    bad[0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        env.place(state, bad)
    env.close()


def test_true_continuations_follow_the_expert_and_refuse_violent_placements():
    env, state, env_state = _scene()
    env.close()
    eps, refused = sd.true_continuations("push-red", [(3, state, env_state)], noise=0.0, length=5, seed=0)
    assert refused == 0 and len(eps) == 1
    ep = eps[0]
    assert len(ep[OBS_STATE]) == len(ep[OBS_ENV_STATE]) == len(ep[ACTION]) == 6
    assert not ep[ACTION][-1].any()  # the last frame's action leads nowhere
    np.testing.assert_allclose(ep[OBS_ENV_STATE][0, :3], env_state[:3], atol=1e-6)  # starts in the placed scene
    # the noiseless expert's first action, by hand, from the placed scene
    from sim.tabletop.experts import expert_action

    np.testing.assert_allclose(ep[ACTION][0], expert_action(env.task_text, ep[OBS_STATE][0], ep[OBS_ENV_STATE][0], False),
                               atol=1e-6)
    # the red cube placed inside the green one: the solver throws them apart
    inside = env_state.copy()
    inside[0:3] = env_state[3:6]
    eps, refused = sd.true_continuations("push-red", [(3, state, inside)], noise=0.0, length=3, seed=0)
    assert refused == 1 and eps == []


def test_round_episodes_survive_a_save_and_load(tmp_path):
    rng = np.random.default_rng(0)
    eps = [{OBS_STATE: rng.normal(size=(T, 8)).astype(np.float32), OBS_ENV_STATE: rng.normal(size=(T, 13)).astype(np.float32),
            ACTION: rng.normal(size=(T, 4)).astype(np.float32)} for T in (3, 7)]
    sd.save_episodes(tmp_path / "r.npz", eps)
    back = sd.load_episodes(tmp_path / "r.npz")
    assert len(back) == 2 and all(np.array_equal(a[k], b[k]) for a, b in zip(eps, back) for k in sd.KEYS)
    sd.save_episodes(tmp_path / "empty.npz", [])
    assert sd.load_episodes(tmp_path / "empty.npz") == []


def test_added_episodes_are_drawn_by_the_state_channel_only(tiny_data):
    ds, train, _ = load_split(tiny_data, 0.25)
    mcfg = model_config(tiny_wm_config(tiny_data, "unused"), ds)
    s = WindowSampler(train, "cpu", mcfg)
    n_frames = len(s.starts)
    T = 5
    ep = {OBS_STATE: np.zeros((T, 8), np.float32), OBS_ENV_STATE: np.zeros((T, 13), np.float32),
          ACTION: np.tile(np.float32([[0.5, 0, 0, 0]]), (T, 1))}
    ep[OBS_STATE][:, 5] = np.arange(T) * 0.01  # ee x: 0, 1, 2, 3, 4 cm
    s.add_state_episodes([ep])
    assert len(s.starts) == n_frames  # frame windows are untouched
    s.seq["starts"] = s.seq["starts"][-(T - 1):]  # draw only from the added episode
    x, a, mask = s.state_sequences(1, 64, 3, torch.Generator().manual_seed(0))
    for row, m in zip(x[0, :, :, 0].numpy(), mask[0].numpy()):
        j = round(row[0] / 0.01)  # the start frame; real frames follow, then the episode's last frame is held
        np.testing.assert_allclose(row, np.minimum(0.01 * (j + np.arange(4)), 0.01 * (T - 1)), atol=1e-6)
        assert m.sum() == min(3, T - 1 - j)
    assert torch.all(a[..., 0] == 0.5)


def test_train_wm_runs_dagger_rounds_and_a_resume_reuses_their_episodes(tiny_data, tmp_path, monkeypatch):
    calls = []
    real = sd.dagger_round

    def spy(model, replay, tasks, cfg, r, seed):
        if crash and r == 1:
            raise RuntimeError("interrupted while collecting round 1")
        out = real(model, replay, tasks, cfg, r, seed)
        calls.append((r, len(out[0])))
        return out

    monkeypatch.setattr("world_models.video.train.dagger_round", spy)
    cfg = tiny_wm_config(tiny_data, tmp_path / "run", ae_steps=4, state_steps=2, dyn_steps=2, unroll_steps=0,
                         state_dagger_rounds=2, state_dagger_starts=2, state_dagger_steps=2)
    run = cfg.out
    crash = True
    with pytest.raises(RuntimeError, match="interrupted"):
        train_world_model(cfg, progress=False)
    assert [r for r, _ in calls] == [0] and calls[0][1] > 0  # round 0's true continuations were recorded
    assert len(sd.load_episodes(run / "state_dagger/round_00.npz")) == calls[0][1]
    recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    info = [r for r in recs if "dagger_round" in r]
    assert info[0]["dagger_episodes"] == calls[0][1] and 0 <= info[0]["dagger_imagined_success"] <= 1
    assert max(r["step"] for r in recs if "state_loss" in r and "step" in r) == 10  # 4 + 2 + 2 + 0, then round 0's 2
    crash = False
    train_world_model(dataclasses.replace(cfg, overwrite=False, resume=True), progress=False)
    assert [r for r, _ in calls] == [0, 1]  # round 0's episodes were loaded from its file, not collected again
    assert (run / "state_dagger/round_01.npz").exists()


def test_bad_dagger_settings_are_refused_in_one_line(tiny_data, tmp_path):
    with pytest.raises(ValueError, match="starts must be >= 1"):
        train_world_model(tiny_wm_config(tiny_data, tmp_path / "a", state_dagger_rounds=1, state_dagger_starts=0),
                          progress=False)
    with pytest.raises(ValueError, match="needs the dataset's"):
        train_world_model(tiny_wm_config(tiny_data, tmp_path / "b", state_dagger_rounds=1, state_channel=False),
                          progress=False)


def test_a_learned_actor_samples_its_own_continuations_and_alternates_with_the_expert(tmp_path, monkeypatch):
    """`actors=("expert", POLICY)`: round r's actor is actors[r % 2], in imagination and in the true continuations;
    a policy's continuation records its own seeded samples (re-drawn by hand from a fresh copy with the same seed),
    not the expert's actions."""
    from policies.estimated_state import EstimatedStateConfig, EstimatedStatePolicy

    pol = tmp_path / "actor"
    EstimatedStatePolicy(EstimatedStateConfig(cameras=(), hidden=32, layers=2)).save(pol)
    env, state, env_state = _scene()
    env.close()
    eps, refused = sd.true_continuations("push-red", [(3, state, env_state)], noise=0.0, length=3, seed=5, actor=str(pol))
    assert refused == 0 and len(eps) == 1
    by_hand = sd.dagger_actor(str(pol), seed=5, noise=0.0)
    ep = eps[0]
    for t in range(3):  # the same generator, drawn in the same order, on the recorded states
        a = by_hand.select_action({OBS_STATE: ep[OBS_STATE][t][None], OBS_ENV_STATE: ep[OBS_ENV_STATE][t][None],
                                   "task": ["push the red cube to the green zone"]})[0]
        np.testing.assert_allclose(ep[ACTION][t], a, atol=1e-6)
    mean = EstimatedStatePolicy.load(pol).select_action({OBS_STATE: ep[OBS_STATE][:1], OBS_ENV_STATE: ep[OBS_ENV_STATE][:1],
                                                         "task": ["x"]})[0]
    assert np.abs(ep[ACTION][0] - mean).max() > 1e-3  # sampled, as RL's rollouts act, not the actor's mean
    expert, _ = sd.true_continuations("push-red", [(3, state, env_state)], noise=0.0, length=3, seed=5)
    assert np.abs(expert[0][ACTION][0] - ep[ACTION][0]).max() > 1e-3

    seen = []
    monkeypatch.setattr(sd, "imagined_visits", lambda *a, actor, **k: (seen.append(("imagined", actor)), ([(3, state, env_state)], 0.5))[1])
    monkeypatch.setattr(sd, "true_continuations", lambda *a, actor, **k: (seen.append(("true", actor)), ([], 0))[1])
    cfg = sd.StateDaggerConfig(rounds=3, starts=2, actors=("expert", str(pol)))
    infos = [sd._round(None, None, ["push-red"], cfg, r, 0)[1] for r in range(3)]
    assert seen == [(w, a) for a in ("expert", str(pol), "expert") for w in ("imagined", "true")]
    assert [i["dagger_actor"] for i in infos] == ["expert", str(pol), "expert"]


def test_a_dagger_actor_that_cannot_act_on_state_is_refused_in_one_line(tmp_path):
    from policies.estimated_state import EstimatedStateConfig, EstimatedStatePolicy

    EstimatedStatePolicy(EstimatedStateConfig(cameras=("front",), width=8, hidden=32, layers=2)).save(tmp_path / "seeing")
    with pytest.raises(ValueError, match="reads cameras"):
        sd.StateDaggerConfig(rounds=1, actors=("expert", str(tmp_path / "seeing"))).validate()
    with pytest.raises(ValueError, match="expected 'expert' or an estimated-state policy folder"):
        sd.StateDaggerConfig(rounds=1, actors=(str(tmp_path / "nowhere"),)).validate()
    with pytest.raises(ValueError, match="at least one actor"):
        sd.StateDaggerConfig(rounds=1, actors=()).validate()
