import numpy as np
import pytest
import torch

from wmrl.core.features import image_key


def test_state_only_replay_follows_the_frame_path_and_reads_one_member(trained):
    """`replay_states` (no frames generated) gives, under the threshold gate (no draws), the same shaped reward per
    step as the frame-generating replay the world-model benchmark scores pairs with; with `member=m` it reports
    member m's state, which differs from the ensemble mean; a member outside the ensemble is refused."""
    from world_models.factory import make_world_model
    from world_models.video.train import load_split, world_model_data
    from wmrl.eval.world_model import held_episodes, imagine_recorded, replay_states

    model = make_world_model("video", trained, state_gate="hard")
    _, _, held = load_split(world_model_data(trained), 0.1)
    eps = held_episodes(held, [image_key(c) for c in model.cfg.cameras])
    assert eps and all(len(ep["action"]) == T for ep, (_, T) in zip(eps, held.episodes.values()))
    frames = imagine_recorded(model, eps)
    alone = replay_states(model, eps)
    for a, b in zip(frames["state_reward"], alone["reward"]):
        np.testing.assert_allclose(a, b, atol=1e-5)
    per = [replay_states(model, eps, member=m) for m in range(model.cfg.state_members)]
    np.testing.assert_allclose(np.mean([p["ee"][0] for p in per], 0), alone["ee"][0], atol=1e-5)  # no gate on the arm
    assert not np.allclose(per[0]["ee"][0], per[1]["ee"][0])
    with pytest.raises(ValueError, match="member"):
        replay_states(model, eps, member=model.cfg.state_members)
    # the consensus: the first step is the mean's (all members start alike), later ones are not
    cons = replay_states(model, eps, consensus=True)
    np.testing.assert_allclose(cons["ee"][0][0], alone["ee"][0][0], atol=1e-6)
    assert not np.allclose(cons["ee"][0][1:], alone["ee"][0][1:], atol=1e-6)
    with pytest.raises(ValueError, match="not both"):
        replay_states(model, eps, member=0, consensus=True)


def test_imagine_recorded_keeps_the_frames_and_decodes_them_again_at_the_recorded_points(trained, tiny_data, tmp_path):
    """`keep_frames` returns each episode's decoded frames, one per step and camera; `exact_points` decodes the same
    latents with the object patches at the recorded points, which differ from the state channel's (a tiny model's
    predictions are far off), so some pixels change; a model without object sources refuses it."""
    from tests.helpers import tiny_wm_config
    from world_models.factory import make_world_model
    from world_models.video.train import load_split, train_world_model, world_model_data
    from wmrl.eval.world_model import held_episodes, imagine_recorded

    run = tmp_path / "objects"  # the trained model with a mask with object sources fitted (no other phase)
    train_world_model(tiny_wm_config(tiny_data, run, init_from=trained, change_objects=True, ae_steps=0, state_steps=0,
                                     dyn_steps=0, unroll_steps=0, change_mask_steps=5), progress=False)
    model = make_world_model("video", run)
    assert model.cfg.change_objects and bool(model.change_mask_fitted)
    _, _, held = load_split(world_model_data(trained), 0.1)
    cams = [image_key(c) for c in model.cfg.cameras]
    eps = held_episodes(held, cams)[:2]
    for ep, (lo, T) in zip(eps, list(held.episodes.values())[:2]):  # held_episodes keeps the first frame only
        for c in cams:
            ep[c] = np.asarray(held.data[c][lo : lo + T])
    out = imagine_recorded(model, eps, keep_frames=True, exact_points=True)
    for ep, f, g in zip(eps, out["frames"], out["frames_recorded_points"]):
        for c in cams:
            assert f[c].shape == g[c].shape == (len(ep["action"]) - 1, *ep[c].shape[1:]) and f[c].dtype == np.uint8
    assert any((f[c] != g[c]).any() for f, g in zip(out["frames"], out["frames_recorded_points"]) for c in cams)
    with pytest.raises(ValueError, match="change_objects"):
        imagine_recorded(make_world_model("video", trained), eps, keep_frames=True, exact_points=True)


def test_the_state_oracle_puts_the_recorded_state_back_after_every_chunk(trained, monkeypatch):
    """`rollout(state_oracle=True)`: after each chunk but the last the state channel is set to the recorded state of
    the chunk's last frame (its objects' velocity from the frame before); the first chunk is the plain rollout's, the
    later ones start from the truth; `reanchor_state` on the encoded frame gives back encode's own channel state."""
    from wmrl.core.features import OBS_ENV_STATE, OBS_STATE
    from world_models.factory import make_world_model
    from world_models.video.evaluate import rollout, window_inputs
    from world_models.video.train import load_split, world_model_data

    model = make_world_model("video", trained, state_gate="hard")  # no contact draws: both rollouts comparable
    _, held, _ = load_split(world_model_data(trained), 0.0)  # every episode: the longer ones hold three chunks
    C = model.cfg.chunk
    H = 3 * C
    e, (lo, T) = next((e, v) for e, v in held.episodes.items() if v[1] > H + 2)
    calls, reanchor = [], model.reanchor_state
    monkeypatch.setattr(model, "reanchor_state", lambda st, p, env, prev: calls.append((p, env, prev)) or reanchor(st, p, env, prev))
    plain = rollout(model, held, [(e, 1)], H, steps=1, seed=0)
    assert not calls
    oracle = rollout(model, held, [(e, 1)], H, steps=1, seed=0, state_oracle=True)
    d = held.data
    assert len(calls) == H // C - 1
    for k, (p, env, prev) in enumerate(calls):  # the k-th chunk's last frame is C (k + 1) steps after the start (t0 = 1)
        t = lo + 1 + C * (k + 1)
        np.testing.assert_array_equal(p, d[OBS_STATE][t][None])
        np.testing.assert_array_equal(env, d[OBS_ENV_STATE][t][None])
        np.testing.assert_array_equal(prev, d[OBS_ENV_STATE][t - 1][None])
    np.testing.assert_array_equal(oracle["pred_env"][:, :C], plain["pred_env"][:, :C])
    assert not np.allclose(oracle["pred_env"][:, C:], plain["pred_env"][:, C:])
    start, _, _ = window_inputs(model, held, [(e, 1)], H)
    st = model.encode(start["obs"], anchor=start["anchor"])
    again = reanchor(st, start["obs"][OBS_STATE], start["obs"][OBS_ENV_STATE])
    assert torch.equal(again["x"], st["x"]) and torch.equal(again["pose"], st["pose"])
