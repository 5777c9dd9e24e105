"""Twin-guided exploration: the allocation rule favours configurations the twin says are failure-prone but not
hopeless, and a tiny run produces a real-success curve indexed by real demonstration steps."""

import numpy as np


def test_guided_allocation_prefers_low_but_nonzero_success():
    from real_robot.twinrl import allocate

    p = np.array([0.0, 1.0, 0.5, 0.3, 1.0, 0.0, 1.0, 1.0])
    rng = np.random.default_rng(0)
    picks = np.concatenate([allocate(p, 8, 2, rng) for _ in range(2000)])
    freq = np.bincount(picks, minlength=8) / len(picks)
    assert freq[2] > 3 * freq[0] and freq[3] > 3 * freq[1]  # p(1-p) weights: 0.27, 0.23 vs the 0.02 floor
    uni = np.concatenate([allocate(None, 8, 2, rng) for _ in range(2000)])
    assert np.allclose(np.bincount(uni, minlength=8) / len(uni), 1 / 8, atol=0.02)
    assert all(len(set(allocate(p, 8, 3, rng))) == 3 for _ in range(50))  # without replacement


def test_tiny_run_counts_real_steps_and_measures_real_success():
    from real_robot.twinrl import TwinRLConfig, run, steps_to_reach

    r = run(TwinRLConfig(pool=4, twin_demos=1, rounds=2, per_round=1, twin_rollouts=1, bc_steps=50, hidden=32), None, "guided")
    steps = [c["real_steps"] for c in r["curve"]]
    assert steps[0] == 0 and steps[1] > 0 and steps[2] > steps[1]  # every round spends real demonstration steps
    assert all(0.0 <= c["real_success"] <= 1.0 for c in r["curve"])
    assert steps_to_reach([{"real_steps": 0, "real_success": 0.1}, {"real_steps": 7, "real_success": 0.6}], 0.5) == 7
    assert steps_to_reach(r["curve"][:1], 2.0) == float("inf")


def test_corrections_keep_only_operator_frames_and_count_every_step():
    """RaC data: a policy that always drives the hand away gets taken over; only recovery/correction frames become
    training data, but the whole rollout counts as robot time."""
    from real_robot.intervention import ScriptedOperator
    from real_robot.twinrl import correct, make_env

    class Away:
        def reset(self):
            pass

        def select_action(self, batch):
            return np.array([[-1.0, -1.0, 1.0, -1.0]], np.float32)

    env = make_env("reach-red", "real")
    xs, acts, steps = correct(env, Away(), 3, ScriptedOperator(patience=2))
    env.close()
    assert 0 < len(xs) == len(acts) < steps  # the first `patience` policy steps are not data
    assert all(x.shape == xs[0].shape for x in xs) and len(xs[0]) > 8
    assert not any(np.allclose(a, [-1.0, -1.0, 1.0, -1.0]) for a in acts)  # no policy action is kept as a label
