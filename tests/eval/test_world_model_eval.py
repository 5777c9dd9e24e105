import numpy as np
import pytest

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
