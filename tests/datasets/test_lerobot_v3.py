import json
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wmrl.core.episode import features_for
from wmrl.datasets import DatasetError, LeRobotV3Dataset, LeRobotV3Writer, write_episode
from wmrl.datasets.video import encode_video


def _noisy_episode(make, T, seed):
    ep = make(T, tag=f"task {seed}")
    rng = np.random.default_rng(seed)
    ep["observation.images.front"] = rng.integers(0, 255, size=(T + 1, 8, 8, 3)).astype(np.uint8).repeat(8, 1).repeat(8, 2)
    ep["observation.state"] = rng.normal(size=(T + 1, 3)).astype(np.float32)
    return ep


def test_round_trip_is_exact_for_data_and_close_for_video(tmp_path, episode_factory):
    eps = [_noisy_episode(episode_factory, T, s) for s, T in enumerate([5, 9, 3])]
    w = LeRobotV3Writer(tmp_path / "ds", fps=10, features=features_for(eps[0]))
    for ep in eps:
        write_episode(w, ep)
    w.finalize()
    ds = LeRobotV3Dataset(tmp_path / "ds")
    assert ds.num_episodes == 3 and ds.num_frames == 6 + 10 + 4
    info = json.loads((tmp_path / "ds/meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_frames"] == 20
    assert info["features"]["observation.images.front"]["dtype"] == "video"
    for i, ep in enumerate(eps):
        back = ds.episode(i)
        for k, v in ep.items():
            if isinstance(v, list):
                assert list(back[k]) == v
            elif k.startswith("observation.images"):
                err = np.abs(back[k].astype(int) - v.astype(int))
                assert back[k].shape == v.shape and err.mean() < 3.0
            else:
                assert np.array_equal(back[k].reshape(v.shape), v), k
        assert np.array_equal(back["frame_index"], np.arange(len(ep["action"])))
    stats = ds.stats
    assert stats["observation.images.front"]["mean"].shape == (3, 1, 1)
    allstate = np.concatenate([e["observation.state"] for e in eps])
    assert np.allclose(stats["observation.state"]["mean"], allstate.mean(0), atol=1e-5)
    assert np.allclose(stats["observation.state"]["std"], allstate.std(0), atol=1e-5)
    tasks = pd.read_parquet(tmp_path / "ds/meta/tasks.parquet")
    assert tasks.index.name == "task" and list(tasks["task_index"]) == [0, 1, 2]


def test_existing_folder_is_refused_unless_overwrite_or_resume(tmp_path, episode_factory):
    ep = episode_factory(4)
    w = LeRobotV3Writer(tmp_path / "ds", fps=10, features=features_for(ep))
    write_episode(w, ep)
    with pytest.raises(FileExistsError, match="overwrite"):
        LeRobotV3Writer(tmp_path / "ds", fps=10, features=features_for(ep))
    w2 = LeRobotV3Writer(tmp_path / "ds", fps=10, features=features_for(ep), mode="resume")
    write_episode(w2, episode_factory(6))
    ds = LeRobotV3Dataset(tmp_path / "ds")
    assert ds.num_episodes == 2 and ds.episodes[1]["dataset_from_index"] == 5
    assert np.array_equal(ds.episode(1)["index"], np.arange(5, 12))


def test_bad_frames_get_named_errors(tmp_path, episode_factory):
    ep = episode_factory(3)
    w = LeRobotV3Writer(tmp_path / "ds", fps=10, features=features_for(ep))
    frame = {k: (v[0] if not isinstance(v, list) else v[0]) for k, v in ep.items()}
    with pytest.raises(ValueError, match="observation.state: contains NaN"):
        w.add_frame({**frame, "observation.state": np.array([np.nan, 0, 0], np.float32)})
    with pytest.raises(ValueError, match="action: expected shape"):
        w.add_frame({**frame, "action": np.zeros(5, np.float32)})
    with pytest.raises(ValueError, match="missing .*action"):
        w.add_frame({k: v for k, v in frame.items() if k != "action"})


def test_episodes_table_rolls_over_and_older_files_are_never_rewritten(tmp_path, episode_factory):
    """Recording rewrites only the last episodes-table file, so its cost does not grow with the dataset; a dataset
    resumed with another file size continues in its last file without duplicating rows."""
    root = tmp_path / "ds"
    eps = [episode_factory(3 + i % 4, start=10 * i) for i in range(7)]
    w = LeRobotV3Writer(root, fps=10, features=features_for(eps[0]), episodes_per_meta_file=3)
    for ep in eps[:3]:
        write_episode(w, ep)
    first = (root / "meta/episodes/chunk-000/file-000.parquet").read_bytes()
    for ep in eps[3:5]:
        write_episode(w, ep)
    assert (root / "meta/episodes/chunk-000/file-000.parquet").read_bytes() == first
    assert pq.read_table(root / "meta/episodes/chunk-000/file-001.parquet")["episode_index"].to_pylist() == [3, 4]
    w2 = LeRobotV3Writer(root, fps=10, features=features_for(eps[0]), mode="resume", episodes_per_meta_file=2)
    for ep in eps[5:]:
        write_episode(w2, ep)
    files = sorted((root / "meta/episodes/chunk-000").glob("*.parquet"))
    assert [pq.read_table(f)["episode_index"].to_pylist() for f in files] == [[0, 1, 2], [3, 4], [5, 6]]
    ds = LeRobotV3Dataset(root)
    assert ds.num_episodes == 7 and ds.num_frames == sum(3 + i % 4 + 1 for i in range(7))
    for i, ep in enumerate(eps):
        assert np.array_equal(ds.episode(i)["observation.state"], ep["observation.state"]), i
    with pytest.raises(ValueError, match="episodes_per_meta_file"):
        LeRobotV3Writer(tmp_path / "other", fps=10, features=features_for(eps[0]), episodes_per_meta_file=0)


def test_crash_mid_episode_loses_only_that_episode(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(tmp_path.parent)!r})
        from tests.conftest import make_episode
        from wmrl.core.episode import features_for
        from wmrl.datasets import LeRobotV3Writer, write_episode
        eps = [make_episode(6, start=10 * i) for i in range(3)]
        w = LeRobotV3Writer({str(tmp_path / 'ds')!r}, fps=10, features=features_for(eps[0]))
        write_episode(w, eps[0]); write_episode(w, eps[1])
        for t in range(4):  # half of the third episode, then the process dies without warning
            w.add_frame({{k: v[t] for k, v in eps[2].items()}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    import pathlib
    repo = pathlib.Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", script.replace(repr(str(tmp_path.parent)), repr(str(repo)))],
                          cwd=repo, capture_output=True)
    assert proc.returncode == -9
    ds = LeRobotV3Dataset(tmp_path / "ds")
    assert ds.num_episodes == 2
    assert np.array_equal(ds.episode(1)["observation.state"][:, 0], np.arange(10, 17))


def test_corrupt_files_get_errors_naming_the_file(tmp_path, episode_factory):
    ep = episode_factory(4)
    w = LeRobotV3Writer(tmp_path / "ds", fps=10, features=features_for(ep))
    write_episode(w, ep)
    data = tmp_path / "ds/data/chunk-000/file-000.parquet"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(DatasetError, match="file-000.parquet: cannot read parquet"):
        LeRobotV3Dataset(tmp_path / "ds").episode(0)
    (tmp_path / "ds/meta/info.json").write_text("{not json")
    with pytest.raises(DatasetError, match="info.json: not valid JSON"):
        LeRobotV3Dataset(tmp_path / "ds")
    with pytest.raises(DatasetError, match="not a LeRobot v3 dataset"):
        LeRobotV3Dataset(tmp_path / "nowhere")


def _lerobot_style_dataset(root, fps=10):
    """A dataset laid out as lerobot writes it: several episodes per data file and per AV1 video (addressed by
    from/to timestamps), an `image` feature stored as PNG bytes in parquet, tasks as a pandas index."""
    import io
    from PIL import Image

    lengths = [4, 6]
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, size=(sum(lengths), 8, 8, 3)).astype(np.uint8).repeat(4, 1).repeat(4, 2)
    state = rng.normal(size=(sum(lengths), 2)).astype(np.float32)
    (root / "videos/observation.images.top/chunk-000").mkdir(parents=True)
    encode_video(frames, root / "videos/observation.images.top/chunk-000/file-000.mp4", fps, codec="av1", crf=20)
    pngs = []
    for f in frames:
        b = io.BytesIO()
        Image.fromarray(f).save(b, format="PNG")
        pngs.append({"bytes": b.getvalue(), "path": None})
    ep_index = np.repeat([0, 1], lengths)
    table = pa.table({
        "observation.state": pa.array(state.tolist(), type=pa.list_(pa.float32())),  # variable-size lists
        "observation.images.side": pa.array(pngs, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "action": pa.array(state.tolist(), type=pa.list_(pa.float32())),
        "timestamp": np.concatenate([np.arange(n) / fps for n in lengths]).astype(np.float32),
        "frame_index": np.concatenate([np.arange(n) for n in lengths]),
        "episode_index": ep_index, "index": np.arange(sum(lengths)), "task_index": ep_index,
    })
    (root / "data/chunk-000").mkdir(parents=True)
    pq.write_table(table, root / "data/chunk-000/file-000.parquet")
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    eps = pa.Table.from_pylist([
        {"episode_index": i, "tasks": [f"t{i}"], "length": n, "data/chunk_index": 0, "data/file_index": 0,
         "dataset_from_index": int(sum(lengths[:i])), "dataset_to_index": int(sum(lengths[: i + 1])),
         "videos/observation.images.top/chunk_index": 0, "videos/observation.images.top/file_index": 0,
         "videos/observation.images.top/from_timestamp": sum(lengths[:i]) / fps,
         "videos/observation.images.top/to_timestamp": sum(lengths[: i + 1]) / fps}
        for i, n in enumerate(lengths)])
    pq.write_table(eps, root / "meta/episodes/chunk-000/file-000.parquet")
    pd.DataFrame({"task_index": [0, 1]}, index=pd.Index(["t0", "t1"], name="task")).to_parquet(root / "meta/tasks.parquet")
    feats = {
        "observation.state": {"dtype": "float32", "shape": [2], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
        "observation.images.top": {"dtype": "video", "shape": [32, 32, 3], "names": ["height", "width", "channels"]},
        "observation.images.side": {"dtype": "image", "shape": [32, 32, 3], "names": ["height", "width", "channels"]},
        **{k: {"dtype": "float32" if k == "timestamp" else "int64", "shape": [1], "names": None}
           for k in ("timestamp", "frame_index", "episode_index", "index", "task_index")}}
    (root / "meta/info.json").write_text(json.dumps({
        "codebase_version": "v3.0", "fps": fps, "features": feats, "total_episodes": 2,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"}))
    return frames, state, lengths


def test_reads_lerobot_written_layout(tmp_path):
    frames, state, lengths = _lerobot_style_dataset(tmp_path)
    ds = LeRobotV3Dataset(tmp_path)
    ep1 = ds.episode(1)
    sl = slice(lengths[0], None)
    assert ep1["task"] == ["t1"] * lengths[1]
    assert np.array_equal(ep1["observation.state"], state[sl])
    assert np.array_equal(ep1["observation.images.side"], frames[sl])  # PNG: lossless
    assert ep1["observation.images.top"].shape == frames[sl].shape  # AV1, second episode of a shared file
    assert np.abs(ep1["observation.images.top"].astype(int) - frames[sl].astype(int)).mean() < 12
    # the decoded frames are the second episode's, not the first's
    own = np.abs(ep1["observation.images.top"].astype(int) - frames[sl].astype(int)).mean()
    other = np.abs(ep1["observation.images.top"][:4].astype(int) - frames[:4].astype(int)).mean()
    assert own < other


@pytest.mark.parametrize("field,value,match", [
    ("data_path", "/etc/{chunk_index}.parquet", "leaves the dataset root"),
    ("data_path", "../../outside/file-{file_index:03d}.parquet", "leaves the dataset root"),
    ("data_path", "data/{file_index.__class__.__name__}.parquet", "may only use"),
    ("data_path", "data/{chunk_index!r}.parquet", "may only use"),
    ("data_path", "data/{video_key}.parquet", "may only use"),
    ("data_path", "data/{0}.parquet", "may only use"),
    ("data_path", "data/{chunk_index:>{file_index}}.parquet", "may only use"),
    ("video_path", "videos/{video_key}/../../../x-{chunk_index}-{file_index}.mp4", "leaves the dataset root"),
    ("video_path", "{video_key.__init__.__globals__}", "may only use"),
])
def test_crafted_templates_are_refused_with_one_line(tmp_path, field, value, match):
    frames, state, lengths = _lerobot_style_dataset(tmp_path)
    info = json.loads((tmp_path / "meta/info.json").read_text())
    (tmp_path / "meta/info.json").write_text(json.dumps({**info, field: value}))
    with pytest.raises(DatasetError, match=match) as e:
        LeRobotV3Dataset(tmp_path).episode(0)
    assert "\n" not in str(e.value) and "info.json" in str(e.value)


@pytest.mark.parametrize("column,value", [("data/chunk_index", "../../x"), ("data/file_index", -1),
                                          ("data/chunk_index", 1.5), ("videos/observation.images.top/file_index", "0/../..")])
def test_episodes_table_cannot_inject_path_parts(tmp_path, column, value):
    _lerobot_style_dataset(tmp_path)
    path = tmp_path / "meta/episodes/chunk-000/file-000.parquet"
    rows = pq.read_table(path).to_pylist()
    for r in rows:
        r[column] = value
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DatasetError, match="non-negative integer|leaves the dataset root"):
        LeRobotV3Dataset(tmp_path).episode(0)


@pytest.mark.parametrize("bad", ["/etc/passwd", "../secret.png", "images/../../secret.png", "~/x.png"])
def test_image_path_columns_cannot_point_outside(tmp_path, bad):
    _lerobot_style_dataset(tmp_path)
    (tmp_path.parent / "secret.png").write_bytes(b"not yours")
    path = tmp_path / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    col = [{"bytes": None, "path": bad} for _ in range(table.num_rows)]
    table = table.set_column(table.column_names.index("observation.images.side"), "observation.images.side",
                             pa.array(col, type=table.schema.field("observation.images.side").type))
    pq.write_table(table, path)
    with pytest.raises(DatasetError, match="leaves the dataset root"):
        LeRobotV3Dataset(tmp_path).episode(0)


def test_resume_never_writes_or_deletes_through_a_symlink(tmp_path, episode_factory):
    ep = episode_factory(4)
    root, outside = tmp_path / "ds", tmp_path / "outside"
    w = LeRobotV3Writer(root, fps=10, features=features_for(ep))
    write_episode(w, ep)
    # the user (or an attacker) moved the data folder elsewhere and left a link; a stale file sits there too
    outside.mkdir()
    (root / "data/chunk-000").rename(outside / "chunk-000")
    (root / "data/chunk-000").symlink_to(outside / "chunk-000")
    (outside / "chunk-000/file-007.parquet").write_bytes(b"sentinel")
    (outside / "chunk-000/.leftover.tmp").write_bytes(b"sentinel")
    before = sorted(p.name for p in (outside / "chunk-000").iterdir())
    assert LeRobotV3Dataset(root).episode(0)["action"].shape[0] == 5  # reading through the user's link is fine
    w2 = LeRobotV3Writer(root, fps=10, features=features_for(ep), mode="resume")
    with pytest.raises(DatasetError, match="is a symlink"):
        write_episode(w2, episode_factory(3))
    assert sorted(p.name for p in (outside / "chunk-000").iterdir()) == before  # nothing written or deleted there
    assert (outside / "chunk-000/file-007.parquet").read_bytes() == b"sentinel"


def test_the_same_rendered_frames_encode_to_the_same_file(tmp_path):
    """h264 as the writer configures it is reproducible: each rendered episode encoded 20 times gives one file.
    (x264's default psychovisual path gave 2-5 distinct files in 12-40 repeats of such an episode, 2 frames
    decoding up to 69 grey levels apart, so two same-seed collections differed in their pixels.)"""
    import hashlib

    import sim
    from policies.factory import make_policy
    from wmrl.eval import evaluate

    env = sim.make_vector_env("push-red", 2)
    policy = make_policy("scripted", env.single_action_space, seed=0, noise=0.05, failure_prob=0.3)
    frames = []
    evaluate(policy, env, 6, seed=0, progress=False,
             on_episode=lambda ep: frames.append(np.asarray(ep["observation.images.wrist"])))
    env.close()
    for k, f in enumerate(frames):
        digests = set()
        for i in range(20):
            encode_video(f, tmp_path / f"{k}-{i}.mp4", 10)
            digests.add(hashlib.md5((tmp_path / f"{k}-{i}.mp4").read_bytes()).hexdigest())
        assert len(digests) == 1, (k, len(digests))
