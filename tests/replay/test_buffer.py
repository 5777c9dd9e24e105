import numpy as np
import pytest

from wmrl.replay import EpisodeReplay, MixedReplay


def _filled(make, lengths, capacity=1000, terminal=True):
    b = EpisodeReplay(capacity, seed=0)
    start = 0
    for T in lengths:
        b.add_episode(make(T, start=start, terminal=terminal))
        start += 1000
    return b


def test_transitions_pair_each_frame_with_its_successor(episode_factory):
    b = _filled(episode_factory, [5, 12, 7])
    s = b.sample(2000)
    assert np.all(s["next.observation.state"][:, 0] == s["observation.state"][:, 0] + 1)
    assert np.all(s["next.observation.images.front"][:, 0, 0, 0] == (s["observation.state"][:, 0] + 1) % 256)
    assert np.all(s["action"][:, 0] == s["observation.state"][:, 0])
    assert not s["is_last"].any()  # the final observation is never a transition start
    assert s["next.terminated"].any() and not s["next.truncated"].any()


def test_terminated_and_truncated_stay_distinct(episode_factory):
    b = _filled(episode_factory, [6, 6], terminal=False)
    s = b.sample(500)
    assert s["next.truncated"].any() and not s["next.terminated"].any()


def test_frames_are_stored_once(episode_factory):
    b = _filled(episode_factory, [10, 20])
    assert len(b) == 11 + 21
    assert b.data["observation.images.front"].shape == (1000, 8, 8, 3)  # no next-observation copy
    assert "next.observation.images.front" not in b.data


def test_windows_never_cross_episodes(episode_factory):
    b = _filled(episode_factory, [3, 9, 4, 15])
    w = b.sample_windows(3000, 8)
    ep_of = w["observation.state"][:, :, 0] // 1000
    assert np.all(ep_of == ep_of[:, :1])
    t = w["observation.state"][:, :, 0] % 1000
    valid = w["mask"]
    # inside the mask, frames are consecutive; beyond it they repeat the last frame
    assert np.all(np.diff(t, axis=1)[valid[:, 1:]] == 1)
    assert np.all(np.diff(t, axis=1)[~valid[:, 1:]] == 0)
    assert np.all(w["action_mask"] <= valid) and (~w["action_mask"] & valid).any()


def test_fifo_capacity_evicts_oldest_whole_episodes(episode_factory):
    b = EpisodeReplay(30)
    ids = [b.add_episode(episode_factory(9, start=100 * i)) for i in range(5)]
    assert len(b) <= 30
    assert ids[0] not in b.episodes and ids[-1] in b.episodes
    s = b.sample(500)
    assert np.all(s["next.observation.state"][:, 0] == s["observation.state"][:, 0] + 1)


def test_mixing_ratio_holds(episode_factory):
    off = _filled(episode_factory, [20] * 5)
    on = _filled(episode_factory, [20] * 2)
    m = MixedReplay(off, on, online_ratio=0.25)
    s = m.sample(256)
    assert s["is_online"].sum() == 64
    w = m.sample_windows(40, 5)
    assert w["is_online"].sum() == 10 and w["observation.state"].shape == (40, 5, 3)
    empty = MixedReplay(off, EpisodeReplay(10), online_ratio=0.5)
    assert not empty.sample(32)["is_online"].any()


def test_episode_weights_set_sampling_probabilities(episode_factory):
    b = _filled(episode_factory, [10, 10])
    b.set_episode_weights({0: 3.0, 1: 1.0})
    idx, p = b.sampling_probabilities()
    ep = b.frame_episode[idx]
    assert np.isclose(p[ep == 0].sum(), 0.75) and np.isclose(p[ep == 1].sum(), 0.25)
    s = b.sample(20000)
    frac0 = np.mean(b.frame_episode[s["index"]] == 0)
    assert abs(frac0 - 0.75) < 0.02
    with pytest.raises(ValueError):
        b.set_episode_weights({0: -1.0})


def test_bad_episodes_are_refused(episode_factory):
    b = _filled(episode_factory, [4])
    ep = episode_factory(4)
    ep["observation.state"] = ep["observation.state"].copy()
    ep["observation.state"][1, 0] = np.nan
    with pytest.raises(ValueError, match="observation.state: contains NaN"):
        b.add_episode(ep)
    with pytest.raises(ValueError, match="does not fit"):
        EpisodeReplay(3).add_episode(episode_factory(4))
    with pytest.raises(ValueError, match="nothing to sample"):
        EpisodeReplay(3).sample(1) if False else EpisodeReplay(10)._draw(np.zeros(0, int), None, 1)


def test_save_load_round_trip_and_interrupted_save(tmp_path, episode_factory):
    b = _filled(episode_factory, [5, 8])
    b.save(tmp_path / "rb")
    b2 = EpisodeReplay.load(tmp_path / "rb")
    assert b2.episodes == b.episodes and len(b2) == len(b)
    for k in b.data:
        assert np.array_equal(b.data[k][: b.high_water], b2.data[k][: b.high_water])
    # a crash between the two renames of a later save leaves the previous save under .old
    (tmp_path / "rb").rename(tmp_path / "rb.old")
    b3 = EpisodeReplay.load(tmp_path / "rb")
    assert b3.episodes == b.episodes


def test_lerobot_export_import_round_trip(tmp_path, episode_factory):
    b = _filled(episode_factory, [5, 8])
    assert b.to_lerobot(tmp_path / "ds", fps=10) == 2
    b2 = EpisodeReplay.from_lerobot(tmp_path / "ds")
    assert b2.num_episodes == 2 and len(b2) == len(b)
    e1, e2 = b.get_episode(1), b2.get_episode(1)
    assert np.array_equal(e1["observation.state"], e2["observation.state"])
    assert e1["task"] == e2["task"] and e1["source"] == e2["source"]
    assert np.array_equal(e1["is_last"], e2["is_last"])


def test_kept_batches_are_never_overwritten_and_dropped_ones_are_recycled(episode_factory):
    b = _filled(episode_factory, [10, 20])
    first = b.sample(64)
    kept = first["observation.state"].copy()
    view = first["observation.images.front"][:3]
    for _ in range(10):
        b.sample(64)
    assert np.array_equal(first["observation.state"], kept)
    assert np.array_equal(view, first["observation.images.front"][:3])
    addr = b.sample(64)["observation.state"].__array_interface__["data"][0]
    assert b.sample(64)["observation.state"].__array_interface__["data"][0] == addr  # dropped, then recycled
    w = b.sample_windows(8, 4)
    assert w["observation.images.front"].shape == (8, 4, 8, 8, 3)


def test_from_datasets_holds_out_the_first_datasets_last_episodes_and_filters(tmp_path, episode_factory):
    _filled(episode_factory, [3, 4, 5, 6]).to_lerobot(tmp_path / "a", fps=10)
    _filled(episode_factory, [7]).to_lerobot(tmp_path / "b", fps=10)
    dss, train, held = EpisodeReplay.from_datasets([tmp_path / "a", tmp_path / "b"], holdout=0.5)
    length = lambda r: sorted(len(r.get_episode(e)["action"]) for e in r.episodes)
    assert len(dss) == 2 and length(held) == [6, 7] and length(train) == [4, 5, 8]  # a's last two held; all of b trains
    assert "frame_index" not in train.data and "observation.state" in train.data  # bookkeeping dropped
    _, only, _ = EpisodeReplay.from_datasets([tmp_path / "a"], keys=lambda d: {"action", "is_last"},
                                             where=lambda ep: len(ep["action"]) > 5)
    assert set(only.data) == {"action", "is_last"} and length(only) == [6, 7]
    with pytest.raises(ValueError, match="lacks \\['observation.environment_state'\\]"):
        EpisodeReplay.from_datasets([tmp_path / "a"], require=("observation.environment_state",))
    with pytest.raises(ValueError, match="holdout"):
        EpisodeReplay.from_datasets([tmp_path / "a"], holdout=1.0)
