"""The action-chunk executor: merge arithmetic against hand-computed timelines, and the control loop's deadline,
stall and delay bookkeeping against the MuJoCo-backed robot."""

import math

import numpy as np
import pytest

from real_robot.executor import ChunkQueue, ExecutorConfig, run_episode, summarise

PREV = np.arange(8.0)[:, None]  # chunk for steps 0..7: action value = step
NEW = (100 + np.arange(8.0))[:, None]  # requested at step 3 (steps 3..10), arriving at step 5: d = 2


def _timeline(strategy, **kw):
    q = ChunkQueue(strategy, **kw)
    q.add(PREV, start=0, now=0)
    for k in range(5):
        assert q.pop(k)[0] == k
    q.add(NEW, start=3, now=5)
    return {k: float(v[0]) for k, v in sorted(q.actions.items())}


def test_replace_drops_the_actions_that_passed_during_inference():
    assert _timeline("replace") == {5: 102, 6: 103, 7: 104, 8: 105, 9: 106, 10: 107}


def test_temporal_ensemble_weights_the_oldest_prediction_most():
    got = _timeline("temporal_ensemble", ensemble_m=0.5)
    w1 = math.exp(-0.5)
    for k in (5, 6, 7):  # both chunks predict these steps
        assert got[k] == pytest.approx((k + w1 * (100 + k - 3)) / (1 + w1))
    assert got[8] == 105  # only the new chunk does


def test_aligned_blends_from_the_previous_chunk_over_the_overlap():
    got = _timeline("aligned", blend=2)
    assert got[5] == pytest.approx(2 / 3 * 5 + 1 / 3 * 102)
    assert got[6] == pytest.approx(1 / 3 * 6 + 2 / 3 * 103)
    assert got[7] == 104 and got[10] == 107


def test_aligned_pads_a_previous_chunk_that_ran_out_with_its_last_real_action():
    q = ChunkQueue("aligned", blend=2)
    q.add(np.array([[1.0], [2.0], [3.0]]), start=0, now=0)
    for k in range(4):
        q.pop(k)  # step 3 starves: the queue is empty, last real action 3
    q.add(np.array([[10.0], [11.0], [12.0], [13.0]]), start=2, now=4)
    assert float(q.actions[4][0]) == pytest.approx(2 / 3 * 3.0 + 1 / 3 * 12.0)  # never blended toward zero
    assert float(q.actions[5][0]) == pytest.approx(1 / 3 * 3.0 + 2 / 3 * 13.0)


def test_bad_chunks_and_configs_are_refused():
    with pytest.raises(ValueError, match="finite"):
        ChunkQueue().add(np.array([[math.nan]]), 0, 0)
    with pytest.raises(ValueError, match="mode: expected one of sync, async, aligned"):
        ExecutorConfig(mode="fast").validate()
    with pytest.raises(ValueError, match="strategy"):
        ExecutorConfig(mode="async", strategy="average").validate()


def test_summary_counts_boundary_jumps_and_blocked_periods():
    log = {"sent": [np.array([0.0, 0, 9]), np.array([0.1, 0, 9]), np.array([0.5, 0, 9]), np.array([0.6, 0, 9])],
           "boundary": [True, False, True, False], "missed": [False, False, True, False],
           "starved": [False, False, False, False], "sent_at": [0.0, 0.1, 0.4, 0.5], "delays": [0.2], "trips": [[]] * 4}
    s = summarise(log, 0.1)
    assert s["boundary_jump"] == pytest.approx(0.4 / 2)  # mean |a_t - a_{t-1}| over the 2 joints (gripper excluded)
    assert s["within_chunk_jump"] == pytest.approx(0.1 / 2)
    assert s["deadline_miss_rate"] == 0.25
    assert s["stall_rate"] == pytest.approx(2 / 6)  # the 0.3 s gap skipped two periods


class _Chunker:
    """A chunk policy on the sim robot: move joint 0 by 0.01 rad per step from the observed pose."""

    def __call__(self, obs):
        s = np.asarray(obs["observation.state"], np.float64)
        base = np.concatenate([s[:4], [-1.0]])
        return np.stack([base + np.array([0.01 * (i + 1), 0, 0, 0, 0]) for i in range(6)])


@pytest.mark.timing
@pytest.mark.parametrize("mode", ["sync", "async", "aligned"])
def test_control_loop_with_injected_latency(mode):
    from real_robot.safety import SafeRobot, SafetyConfig
    from real_robot.sim_robot import SimRealRobot

    robot = SafeRobot(SimRealRobot("reach-red", cameras=("front",), image_size=32, control_hz=20), SafetyConfig(control_hz=20))
    robot.connect()
    try:
        res = run_episode(robot, _Chunker(), ExecutorConfig(mode=mode, control_hz=20, threshold=3), 30,
                          latency=lambda: 0.12)
    finally:
        robot.disconnect()
    assert res["steps"] == 30
    assert 0.11 < res["inference_delay_s"] < 0.3  # measured, not assumed
    if mode == "sync":  # the loop blocks for 0.12 s (2.4 periods) at every chunk
        assert res["deadline_miss_rate"] > 0.15 and res["stall_rate"] > 0.2
    else:  # inference overlaps execution: the loop keeps its deadlines
        assert res["deadline_miss_rate"] < 0.1
