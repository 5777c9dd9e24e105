"""Human corrections (RaC): a scripted operator takes over from a policy that strays, recovers to the last
on-track state, corrects to success, and every frame is labelled and survives a LeRobot v3 round trip."""

import numpy as np


class _StrayingPolicy:
    """The scripted expert for 6 steps, then a steady drift to +y: what the operator must catch."""

    chunk_size = 1

    def __init__(self):
        from sim.experts import ScriptedExpert

        self.expert, self.t = ScriptedExpert(), 0

    def reset(self):
        self.t = 0

    def select_action(self, obs):
        self.t += 1
        if self.t <= 6:
            return self.expert.select_action(obs)
        return np.array([[0.0, 1.0, 0.3, -1.0]], np.float32)


def test_operator_recovers_then_corrects_and_frames_are_labelled(tmp_path):
    from real_robot.intervention import ScriptedOperator, rollout_with_operator
    from sim.tabletop.env import TabletopEnv
    from wmrl.core.episode import features_for
    from wmrl.datasets import LeRobotV3Dataset
    from wmrl.datasets.lerobot_v3 import LeRobotV3Writer, write_episode

    env = TabletopEnv("push-red", cameras=("front",), image_size=32)
    ep = rollout_with_operator(env, _StrayingPolicy(), ScriptedOperator(patience=2), seed=3, max_steps=80)
    env.close()
    phase = ep["intervention.phase"][:-1].tolist()
    assert phase[:6] == [0] * 6  # the policy acts while on track
    first = phase.index(1)
    assert set(phase[first:]) == {1, 2} and phase[first:] == sorted(phase[first:])  # recovery, then correction
    assert bool(ep["next.success"][-1])  # the correction completed the task
    assert (ep["intervention"][:-1] == (np.array(phase) > 0)).all()
    assert [s == "human" for s in ep["source"][:-1]] == [p > 0 for p in phase]
    # the recovery returned the hand to the last on-track position before correcting
    ee = ep["observation.state"][:, 5:8]
    assert np.linalg.norm(ee[phase.index(2)] - ee[first - 2]) < 0.03
    w = LeRobotV3Writer(tmp_path / "d", fps=10, features=features_for(ep), extra_meta={"intervention.phase": {"0": "policy", "1": "recovery", "2": "correction"}})
    write_episode(w, ep)
    w.finalize()
    back = LeRobotV3Dataset(tmp_path / "d").episode(0)
    np.testing.assert_array_equal(back["intervention.phase"], ep["intervention.phase"])
    np.testing.assert_array_equal(back["intervention"], ep["intervention"])


def test_correction_frames_can_be_upweighted_for_fine_tuning(tmp_path):
    import pytest

    from real_robot.intervention import ScriptedOperator, rollout_with_operator
    from sim.tabletop.env import TabletopEnv
    from policies.vla.bc import load_replay, weight_interventions
    from wmrl.core.episode import features_for
    from wmrl.datasets.lerobot_v3 import LeRobotV3Writer, write_episode

    env = TabletopEnv("push-red", cameras=("front",), image_size=32)
    ep = rollout_with_operator(env, _StrayingPolicy(), ScriptedOperator(patience=2), seed=3, max_steps=80)
    env.close()
    w = LeRobotV3Writer(tmp_path / "d", fps=10, features=features_for(ep))
    write_episode(w, ep)
    w.finalize()
    _, replay = load_replay([tmp_path / "d"])
    assert weight_interventions(replay, 1.0) == 0
    n = weight_interventions(replay, 5.0)
    assert n == int(ep["intervention"].sum())
    starts, p = replay.sampling_probabilities()
    iv = replay.data["intervention"][starts].astype(bool)
    assert p[iv].mean() == pytest.approx(5 * p[~iv].mean())  # a correction frame is drawn 5x as often
    with pytest.raises(ValueError, match="finite number > 0"):
        weight_interventions(replay, 0.0)
