import numpy as np
import pytest

from sim.tabletop.env import TabletopEnv
from sim.experts import ScriptedExpert
from policies.random_policy import RandomPolicy
from wmrl.eval import evaluate, wilson_interval


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(8, 10)
    assert np.isclose(lo, 0.4902, atol=1e-3) and np.isclose(hi, 0.9433, atol=1e-3)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0


def test_expert_beats_random_and_records_episodes(tmp_path):
    env = TabletopEnv("reach-blue")
    r = evaluate(ScriptedExpert(), env, 3, seed=0, record=True, video_dir=tmp_path, progress=False)
    rnd = evaluate(RandomPolicy(env.action_space), env, 3, seed=0, progress=False)
    assert r.pc_success == 100.0 and rnd.pc_success < 100.0
    assert r.avg_sum_reward > rnd.avg_sum_reward
    ep = r.episodes[0]
    T = r.per_episode[0]["length"]
    assert len(ep["action"]) == T + 1 and ep["is_last"][-1] and not ep["is_last"][:-1].any()
    assert ep["next.success"][T - 1] and ep["next.terminated"][T - 1]
    assert ep["qpos"].shape[0] == T + 1
    assert (tmp_path / "grid.gif").stat().st_size > 0 and (tmp_path / "episode_000.mp4").exists()


def test_policy_with_wrong_action_shape_is_refused():
    class Bad(RandomPolicy):
        def select_action(self, obs):
            return np.zeros((1, 3), np.float32)

    env = TabletopEnv("reach-red", cameras=())
    with pytest.raises(ValueError, match="action: policy returned shape"):
        evaluate(Bad(env.action_space), env, 1, progress=False)
