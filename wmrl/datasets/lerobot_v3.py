"""LeRobotDataset v3.0 on disk, written and read with pyarrow and PyAV (the lerobot package is not a dependency).

Layout (LeRobot's):
    meta/info.json            codebase_version "v3.0", fps, features, path templates, totals
    meta/stats.json           normalisation statistics (min, max, mean, std, count); images per channel in [0, 1]
    meta/tasks.parquet        task string (index "task") -> task_index
    meta/episodes/chunk-000/file-NNN.parquet   one row per episode: length, tasks, data/video file and offsets
                                               (`episodes_per_meta_file` rows per file)
    data/chunk-XXX/file-YYY.parquet            frames (timestamp, frame_index, episode_index, index, task_index, ...)
    videos/<key>/chunk-XXX/file-YYY.mp4        one video per camera
    meta/wmrl.json            wmrl's own metadata (lerobot drops unknown keys of info.json)

Crash safety: every episode goes to its own data and video files, written to temporary names and renamed into
place; the episodes table is the commit point, rewritten atomically after the episode's files exist. Only its last
file is rewritten (a file holds `episodes_per_meta_file` rows), so recording does not slow down as the dataset grows
(1.15x over 2,000 episodes, `wmrl bench dataset`). A crash mid-episode loses that episode only. Files left behind by a crash between the data rename and the commit are
ignored by the reader and removed when the writer resumes. The reader also reads datasets written by lerobot itself,
with many episodes per file, image features (PNG in parquet) and AV1 or h264 videos.
"""

from __future__ import annotations

import json
import os
import re
import string
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from wmrl.core.features import TASK
from wmrl.core.io import atomic_path, remove_for_overwrite, write_json
from wmrl.datasets.video import decode_video, encode_video, video_info

CODEBASE_VERSION = "v3.0"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
EPISODES_PATH = "meta/episodes/" + CHUNK_FILE + ".parquet"
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
NUMERIC = ("float32", "float64", "int64", "int32", "int16", "uint8")


class DatasetError(ValueError):
    """A dataset file is missing, corrupt or inconsistent. The message names the file and what is wrong."""


# ---------------------------------------------------------------------- paths stay inside the root
TEMPLATE_FIELDS = ("chunk_index", "file_index", "video_key")


def check_relative(rel: str, what: str) -> str:
    """`rel` if it is a relative path that stays inside the dataset root (no absolute path, no '..')."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise DatasetError(f"{what}: {rel!r} is not a relative path")
    parts = PurePosixPath(rel).parts
    if rel.startswith(("/", "~")) or ".." in parts or (parts and parts[0].endswith(":")):
        raise DatasetError(f"{what}: {rel!r} leaves the dataset root (absolute or '..'); refused")
    return rel


def format_path(template: str, what: str, **values) -> str:
    """A path template (LeRobot's `data_path`/`video_path`) formatted with integer indices (and the video key) only:
    no attribute or item access, no conversions, integer format specs; the result must stay inside the root."""
    if not isinstance(template, str):
        raise DatasetError(f"{what}: path template must be a string, got {template!r}")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise DatasetError(f"{what}: malformed path template {template!r} ({e})") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in values or conversion is not None or not re.fullmatch(r"0?[0-9]{0,2}d?", spec or ""):
            raise DatasetError(f"{what}: path template {template!r} may only use "
                               f"{{{'}, {'.join(n for n in TEMPLATE_FIELDS if n in values)}}} with an integer format; "
                               f"got {{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}")
    for k, v in values.items():
        if k == "video_key":
            if not isinstance(v, str):
                raise DatasetError(f"{what}: video key must be a string, got {v!r}")
        elif not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise DatasetError(f"{what}: {k} must be a non-negative integer, got {v!r}")
    return check_relative(template.format(**values), what)


def _no_symlink_below(root: Path, path: Path) -> None:
    """Refuse a path any of whose components below `root` (the file itself included) is a symlink: the writer
    never writes or deletes through one (the user's root itself may be a link)."""
    p = root
    for part in path.relative_to(root).parts:
        p = p / part
        if p.is_symlink():
            raise DatasetError(f"{p}: is a symlink; the dataset writer never writes or deletes through a link")


def _arrow_type(ft: dict) -> pa.DataType:
    dtype, shape = ft["dtype"], tuple(ft["shape"])
    base = {"float32": pa.float32(), "float64": pa.float64(), "int64": pa.int64(), "int32": pa.int32(),
            "int16": pa.int16(), "uint8": pa.uint8(), "bool": pa.bool_(), "string": pa.string()}.get(dtype)
    if base is None:
        raise ValueError(f"feature dtype {dtype!r} is not supported; use one of float32, int64, bool, string, video")
    if shape == (1,):
        return base
    if len(shape) == 1:
        return pa.list_(base, shape[0])
    raise ValueError(f"non-image features must have shape (1,) or (N,); got {shape}")


def _column_to_numpy(col: pa.ChunkedArray | pa.Array, ft: dict) -> np.ndarray | list:
    """Numbers become arrays with a leading time axis; strings stay a list (the episode dict's convention)."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    shape = tuple(ft["shape"])
    if pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        flat = col.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(col), *shape).astype(np.dtype(ft["dtype"]), copy=False)
    if ft["dtype"] == "string":
        return [str(x) for x in col.to_pylist()]
    arr = col.to_numpy(zero_copy_only=False)
    return arr.astype(np.dtype(ft["dtype"]) if ft["dtype"] != "bool" else bool, copy=False)


class _RunningStats:
    """Aggregates per-episode statistics into dataset statistics (exact mean/std via sums)."""

    def __init__(self):
        self.n, self.s, self.ss, self.lo, self.hi = 0, 0.0, 0.0, None, None

    def update(self, x: np.ndarray, axes: tuple[int, ...]) -> dict:
        x = x.astype(np.float64)
        n = int(np.prod([x.shape[a] for a in axes]))
        s, ss = x.sum(axis=axes, keepdims=False), (x * x).sum(axis=axes)
        lo, hi = x.min(axis=axes), x.max(axis=axes)
        self.n += n
        self.s, self.ss = self.s + s, self.ss + ss
        self.lo = lo if self.lo is None else np.minimum(self.lo, lo)
        self.hi = hi if self.hi is None else np.maximum(self.hi, hi)
        return _stat_dict(n, s, ss, lo, hi)

    def result(self) -> dict:
        return _stat_dict(self.n, self.s, self.ss, self.lo, self.hi)


def _stat_dict(n, s, ss, lo, hi) -> dict:
    mean = s / max(n, 1)
    std = np.sqrt(np.maximum(ss / max(n, 1) - mean * mean, 0.0))
    return {"min": np.asarray(lo), "max": np.asarray(hi), "mean": mean, "std": std, "count": np.array([n])}


def _image_stats_layout(d: dict) -> dict:
    """LeRobot keeps image statistics per channel with shape (3, 1, 1), on frames scaled to [0, 1]."""
    out = {k: (np.asarray(v).reshape(3, 1, 1) / 255.0 if k in ("min", "max", "mean", "std") else v) for k, v in d.items()}
    return out


class LeRobotV3Writer:
    """Streaming writer: `add_frame(frame)` ... `save_episode()`, repeated; `finalize()` at the end.

    `features` are the user features (LeRobot's dict: dtype, shape, names); the per-frame bookkeeping columns are
    added automatically. Image features use dtype "video" and shape (H, W, 3).
    """

    def __init__(self, root: str | Path, fps: int, features: dict[str, dict], robot_type: str | None = None,
                 mode: str = "create", codec: str = "h264", crf: int = 12, chunks_size: int = 1000,
                 extra_meta: dict | None = None, episodes_per_meta_file: int = 100):
        self.root = Path(root)
        if mode not in ("create", "overwrite", "resume"):
            raise ValueError(f"mode: expected create, overwrite or resume; got {mode!r}")
        if fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        if episodes_per_meta_file < 1:
            raise ValueError(f"episodes_per_meta_file must be >= 1, got {episodes_per_meta_file}")
        self.episodes_per_meta_file = int(episodes_per_meta_file)
        exists = self.root.exists() and any(self.root.iterdir())
        if exists and mode == "create":
            raise FileExistsError(f"{self.root} already exists; pass overwrite (start again) or resume (append)")
        if exists and mode == "overwrite":
            remove_for_overwrite(self.root)  # only a dataset (or a run) is ever deleted
        self.fps, self.codec, self.crf, self.chunks_size = int(fps), codec, crf, chunks_size
        self.robot_type = robot_type
        self.extra_meta = extra_meta or {}
        for key in features:
            if "/" in key:
                raise ValueError(f"feature names must not contain '/': {key!r}")
            if key in DEFAULT_FEATURES:
                raise ValueError(f"{key!r} is added automatically; do not list it in features")
        self.user_features = {k: {**v, "shape": list(v["shape"])} for k, v in features.items()}
        for k, ft in self.user_features.items():
            if ft["dtype"] != "video":
                _arrow_type(ft)  # validates dtype and shape
        self.video_keys = [k for k, v in self.user_features.items() if v["dtype"] == "video"]
        self.episodes: list[dict] = []
        self.tasks: dict[str, int] = {}
        self.stats: dict[str, _RunningStats] = {}
        self.buffer: list[dict] = []
        if exists and mode == "resume":
            self._resume()
        self.root.mkdir(parents=True, exist_ok=True)

    def _target(self, rel: str) -> Path:
        """Where the writer may write `rel`: inside the root, through no symlink; parent folders made one by one."""
        path = self.root / check_relative(rel, str(self.root))
        _no_symlink_below(self.root, path)
        d = self.root
        for part in path.relative_to(self.root).parts[:-1]:
            d = d / part
            d.mkdir(exist_ok=True)
            _no_symlink_below(self.root, d)  # a link made between the check and the mkdir
        return path

    # ----------------------------------------------------------------- metadata
    @property
    def features(self) -> dict[str, dict]:
        feats = {}
        for k, ft in self.user_features.items():
            if ft["dtype"] == "video":
                h, w, _ = ft["shape"]
                feats[k] = {**ft, "names": ["height", "width", "channels"], "info": video_info(self.codec, self.fps, h, w)}
            else:
                feats[k] = ft
        return {**feats, **DEFAULT_FEATURES}

    @property
    def num_frames(self) -> int:
        return sum(e["length"] for e in self.episodes)

    def _resume(self) -> None:
        ds = LeRobotV3Dataset(self.root)
        theirs = {k: v for k, v in ds.features.items() if k not in DEFAULT_FEATURES}
        mine = {k: {kk: vv for kk, vv in v.items() if kk != "info"} for k, v in self.user_features.items()}
        theirs = {k: {kk: (list(vv) if kk == "shape" else vv) for kk, vv in v.items() if kk != "info"} for k, v in theirs.items()}
        if {k: (v["dtype"], list(v["shape"])) for k, v in mine.items()} != {k: (v["dtype"], list(v["shape"])) for k, v in theirs.items()}:
            raise DatasetError(f"{self.root}: cannot resume, its features differ from the requested ones")
        self.episodes = [dict(e) for e in ds.episodes]
        self.tasks = {t: i for i, t in enumerate(ds.tasks)}
        # Remove files a crash left behind after their rename but before the episodes table committed them.
        committed = {(e["data/chunk_index"], e["data/file_index"]) for e in self.episodes}
        for dirpath, dirnames, filenames in os.walk(self.root):  # os.walk does not descend into symlinked folders
            d = Path(dirpath)
            for name in filenames:
                p = d / name
                leftover = name.startswith(".") and name.endswith(".tmp")
                if d.parent == self.root / "data" and re.fullmatch(r"chunk-\d+", d.name) and re.fullmatch(r"file-\d+\.parquet", name):
                    leftover = (int(d.name[6:]), int(p.stem[5:])) not in committed
                if leftover and not p.is_symlink():
                    _no_symlink_below(self.root, p)
                    p.unlink()
        # Rebuild running stats from the per-episode stats stored in the episodes table.
        for e in self.episodes:
            for k in self._stat_keys():
                if f"stats/{k}/count" in e:
                    rs = self.stats.setdefault(k, _RunningStats())
                    n = int(np.asarray(e[f"stats/{k}/count"]).reshape(-1)[0])
                    mean = np.asarray(e[f"stats/{k}/mean"], dtype=np.float64)
                    std = np.asarray(e[f"stats/{k}/std"], dtype=np.float64)
                    lo, hi = np.asarray(e[f"stats/{k}/min"]), np.asarray(e[f"stats/{k}/max"])
                    if k in self.video_keys:
                        mean, std, lo, hi = (a.reshape(3) * 255.0 for a in (mean, std, lo, hi))
                    rs.n += n
                    rs.s = rs.s + mean * n
                    rs.ss = rs.ss + (std**2 + mean**2) * n
                    rs.lo = lo if rs.lo is None else np.minimum(rs.lo, lo)
                    rs.hi = hi if rs.hi is None else np.maximum(rs.hi, hi)
        self._write_meta()

    def _stat_keys(self) -> list[str]:
        return [k for k, v in self.user_features.items() if v["dtype"] in NUMERIC or v["dtype"] == "video"] + [
            "timestamp", "frame_index", "episode_index", "index", "task_index"]

    # ----------------------------------------------------------------- frames
    def add_frame(self, frame: dict[str, Any]) -> None:
        """Buffer one frame. Keys: every user feature and `task`. Shapes, dtypes and finiteness are checked."""
        expected = set(self.user_features) | {TASK}
        missing, extra = expected - set(frame), set(frame) - expected
        if missing or extra:
            raise ValueError(f"frame keys: missing {sorted(missing)}, unexpected {sorted(extra)}")
        if not isinstance(frame[TASK], str) or not frame[TASK]:
            raise ValueError(f"task: expected a non-empty string, got {frame[TASK]!r}")
        clean = {TASK: frame[TASK]}
        for k, ft in self.user_features.items():
            v = frame[k]
            if ft["dtype"] == "string":
                if not isinstance(v, str):
                    raise ValueError(f"{k}: expected a string, got {type(v).__name__}")
                clean[k] = v
                continue
            a = np.asarray(v)
            if ft["dtype"] == "video":
                if a.dtype != np.uint8 or a.shape != tuple(ft["shape"]):
                    raise ValueError(f"{k}: expected uint8 {tuple(ft['shape'])}, got {a.dtype} {a.shape}")
            else:
                a = a.reshape(-1) if a.size == int(np.prod(ft["shape"])) else a
                if a.shape != tuple(ft["shape"]):
                    raise ValueError(f"{k}: expected shape {tuple(ft['shape'])}, got {np.asarray(v).shape}")
                if ft["dtype"].startswith("float") and not np.all(np.isfinite(a)):
                    raise ValueError(f"{k}: contains NaN or inf")
                a = a.astype(bool if ft["dtype"] == "bool" else ft["dtype"])
            clean[k] = a
        self.buffer.append(clean)

    def clear_episode(self) -> None:
        self.buffer = []

    def save_episode(self) -> int:
        """Write the buffered frames as one episode, atomically. Returns its episode index."""
        if not self.buffer:
            raise ValueError("save_episode: no frames were added")
        ep, T = len(self.episodes), len(self.buffer)
        chunk, file = divmod(ep, self.chunks_size)
        start = self.num_frames
        for t in dict.fromkeys(f[TASK] for f in self.buffer):
            self.tasks.setdefault(t, len(self.tasks))
        row: dict[str, Any] = {"episode_index": ep, "tasks": list(dict.fromkeys(f[TASK] for f in self.buffer)),
                               "length": T, "data/chunk_index": chunk, "data/file_index": file,
                               "dataset_from_index": start, "dataset_to_index": start + T}

        columns: dict[str, np.ndarray] = {}
        for k, ft in self.user_features.items():
            if ft["dtype"] != "video":
                columns[k] = np.stack([f[k] for f in self.buffer]) if ft["dtype"] != "string" else [f[k] for f in self.buffer]
        columns["timestamp"] = (np.arange(T) / self.fps).astype(np.float32)
        columns["frame_index"] = np.arange(T, dtype=np.int64)
        columns["episode_index"] = np.full(T, ep, dtype=np.int64)
        columns["index"] = np.arange(start, start + T, dtype=np.int64)
        columns["task_index"] = np.array([self.tasks[f[TASK]] for f in self.buffer], dtype=np.int64)

        # 1. videos (not globbed by loaders; a leftover is harmless)
        for k in self.video_keys:
            frames = np.stack([f[k] for f in self.buffer])
            path = self._target(format_path(VIDEO_PATH, "video_path", video_key=k, chunk_index=chunk, file_index=file))
            with atomic_path(path) as tmp:
                encode_video(frames, tmp, self.fps, codec=self.codec, crf=self.crf)
            row.update({f"videos/{k}/chunk_index": chunk, f"videos/{k}/file_index": file,
                        f"videos/{k}/from_timestamp": 0.0, f"videos/{k}/to_timestamp": T / self.fps})
            st = _image_stats_layout(self.stats.setdefault(k, _RunningStats()).update(frames, axes=(0, 1, 2)))
            row.update({f"stats/{k}/{s}": v.tolist() for s, v in st.items()})
        # 2. per-episode stats of numeric features
        for k in self._stat_keys():
            if k in self.video_keys:
                continue
            x = np.asarray(columns[k], dtype=np.float64).reshape(T, -1)
            st = self.stats.setdefault(k, _RunningStats()).update(x, axes=(0,))
            row.update({f"stats/{k}/{s}": np.asarray(v).reshape(-1).tolist() for s, v in st.items()})
        row.update(self._next_meta_file())
        # 3. tasks (a superset is harmless), data, then the commit: the episodes table
        self._write_tasks()
        arrays, fields = [], []
        for k, ft in self.features.items():
            if ft["dtype"] == "video":
                continue
            typ = _arrow_type(ft)
            val = columns[k]
            if pa.types.is_fixed_size_list(typ):
                arr = pa.FixedSizeListArray.from_arrays(pa.array(np.asarray(val).reshape(-1), type=typ.value_type), typ.list_size)
            else:
                arr = pa.array(val if ft["dtype"] == "string" else np.asarray(val).reshape(T), type=typ)
            arrays.append(arr)
            fields.append(pa.field(k, typ))
        table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
        with atomic_path(self._target(format_path(DATA_PATH, "data_path", chunk_index=chunk, file_index=file))) as tmp:
            pq.write_table(table, tmp)
        self.episodes.append(row)
        self._write_episodes()
        self._write_meta()
        self.buffer = []
        return ep

    def _write_tasks(self) -> None:
        df = pd.DataFrame({"task_index": list(self.tasks.values())}, index=pd.Index(list(self.tasks), name="task"))
        with atomic_path(self._target("meta/tasks.parquet")) as tmp:
            df.to_parquet(tmp)

    META_FILE = ("meta/episodes/chunk_index", "meta/episodes/file_index")

    def _last_meta_file(self) -> tuple[tuple[int, int], list[dict]]:
        """The episodes-table file of the last row, (chunk, file), and its rows (the trailing ones), oldest first."""
        where = tuple(self.episodes[-1].get(k, 0) for k in self.META_FILE)
        rows = []
        for e in reversed(self.episodes):
            if tuple(e.get(k, 0) for k in self.META_FILE) != where:
                break
            rows.append(e)
        return where, rows[::-1]

    def _next_meta_file(self) -> dict[str, int]:
        """The episodes-table file the next row goes to: the last row's file while it holds fewer than
        `episodes_per_meta_file` rows (a dataset resumed from another layout included), else the next file."""
        if not self.episodes:
            return dict.fromkeys(self.META_FILE, 0)
        (chunk, file), rows = self._last_meta_file()
        return dict(zip(self.META_FILE, (chunk, file + (len(rows) >= self.episodes_per_meta_file))))

    def _write_episodes(self) -> None:
        """Rewrite the last row's file only: the files before it are complete and never change."""
        (chunk, file), rows = self._last_meta_file()
        with atomic_path(self._target(EPISODES_PATH.format(chunk_index=chunk, file_index=file))) as tmp:
            pq.write_table(pa.Table.from_pylist(rows), tmp)

    def _write_meta(self) -> None:
        stats = {}
        for k, rs in self.stats.items():
            d = rs.result()
            d = _image_stats_layout(d) if k in self.video_keys else {s: np.asarray(v).reshape(-1) for s, v in d.items()}
            stats[k] = {s: np.asarray(v).tolist() for s, v in d.items()}
        write_json(self._target("meta/stats.json"), stats)
        n_ep = len(self.episodes)
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": n_ep,
            "total_frames": self.num_frames,
            "total_tasks": len(self.tasks),
            "chunks_size": self.chunks_size,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": self.fps,
            "splits": {"train": f"0:{n_ep}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if self.video_keys else None,
            "features": self.features,
        }
        write_json(self._target("meta/info.json"), info)
        write_json(self._target("meta/wmrl.json"), {"writer": "wmrl", "codec": self.codec, "crf": self.crf, **self.extra_meta})

    def finalize(self) -> None:
        """Drop any unsaved frames and make sure the metadata is complete."""
        self.buffer = []
        self._write_meta()


class LeRobotV3Dataset:
    """Reader for LeRobot v3.0 datasets, ours or lerobot's. `episode(i)` returns whole episodes as numpy arrays
    (videos decoded to uint8 (T, H, W, 3)), which is what replay buffers and world-model trainers consume."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        info_path = self.root / "meta/info.json"
        if not info_path.exists():
            raise DatasetError(f"{info_path}: missing; {self.root} is not a LeRobot v3 dataset")
        try:
            self.info = json.loads(info_path.read_text())
        except json.JSONDecodeError as e:
            raise DatasetError(f"{info_path}: not valid JSON ({e})") from e
        version = self.info.get("codebase_version")
        if version != CODEBASE_VERSION:
            raise DatasetError(f"{info_path}: codebase_version is {version!r}; this reader reads {CODEBASE_VERSION!r}")
        for key in ("fps", "features"):
            if key not in self.info:
                raise DatasetError(f"{info_path}: missing the {key!r} field")
        if not isinstance(self.info["fps"], (int, float)) or not self.info["fps"] > 0:
            raise DatasetError(f"{info_path}: fps must be a positive number, got {self.info['fps']!r}")
        self.fps = int(self.info["fps"])
        feats = self.info["features"]
        if not isinstance(feats, dict) or not all(isinstance(v, dict) and "dtype" in v for v in feats.values()):
            raise DatasetError(f"{info_path}: features must map names to {{dtype, shape, ...}}")
        self.features: dict[str, dict] = feats
        # the templates are checked now, so a crafted dataset fails on opening with its file named
        self._data_path(0, 0)
        for k in self.camera_keys:
            if feats[k]["dtype"] == "video":
                format_path(self.info.get("video_path") or VIDEO_PATH, f"{info_path}: video_path", video_key=k,
                            chunk_index=0, file_index=0)
        self.tasks = self._read_tasks()
        self.episodes = self._read_episodes()
        self._tables: dict[Path, pa.Table] = {}

    # ----------------------------------------------------------------- metadata
    def _read_parquet(self, path: Path) -> pa.Table:
        if not path.exists():
            raise DatasetError(f"{path}: missing")
        try:
            return pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for truncated or garbage files
            raise DatasetError(f"{path}: cannot read parquet ({type(e).__name__}: {e})") from e

    def _read_tasks(self) -> list[str]:
        path = self.root / "meta/tasks.parquet"
        if not path.exists():
            raise DatasetError(f"{path}: missing")
        try:
            df = pd.read_parquet(path)
        except Exception as e:
            raise DatasetError(f"{path}: cannot read parquet ({type(e).__name__}: {e})") from e
        if "task_index" not in df.columns:
            raise DatasetError(f"{path}: no 'task_index' column (columns: {list(df.columns)})")
        names = df["task"].tolist() if "task" in df.columns else df.index.tolist()
        out = [""] * len(df)
        for name, idx in zip(names, df["task_index"].tolist()):
            out[int(idx)] = str(name)
        return out

    def _read_episodes(self) -> list[dict]:
        files = sorted((self.root / "meta/episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise DatasetError(f"{self.root / 'meta/episodes'}: no episode metadata files")
        rows = []
        for f in files:
            table = self._read_parquet(f)
            for col in ("episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index"):
                if col not in table.column_names:
                    raise DatasetError(f"{f}: missing the {col!r} column")
            rows += table.to_pylist()
        rows.sort(key=lambda r: r["episode_index"])
        return rows

    @property
    def num_episodes(self) -> int:
        return len(self.episodes)

    @property
    def num_frames(self) -> int:
        return sum(e["length"] for e in self.episodes)

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, v in self.features.items() if v["dtype"] in ("video", "image")]

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]]:
        path = self.root / "meta/stats.json"
        if not path.exists():
            return {}
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: not valid JSON ({e})") from e
        return {k: {s: np.asarray(v, dtype=np.float64) for s, v in d.items()} for k, d in raw.items()}

    # ----------------------------------------------------------------- data
    def _data_path(self, chunk, file) -> Path:
        return self.root / format_path(self.info.get("data_path") or DATA_PATH, f"{self.root / 'meta/info.json'}: data_path",
                                       chunk_index=chunk, file_index=file)

    def _data_table(self, chunk: int, file: int) -> pa.Table:
        path = self._data_path(chunk, file)
        if path not in self._tables:
            self._tables = {path: self._read_parquet(path)}  # keep one file cached: episodes are read in order
        return self._tables[path]

    def episode(self, i: int, decode: bool = True) -> dict[str, Any]:
        """All frames of episode i: every feature as a numpy array with a leading time axis, `task` as a list."""
        if not 0 <= i < self.num_episodes:
            raise IndexError(f"episode {i} out of range: the dataset has {self.num_episodes} episodes")
        meta = self.episodes[i]
        table = self._data_table(meta["data/chunk_index"], meta["data/file_index"])
        path = self._data_path(meta["data/chunk_index"], meta["data/file_index"])
        if "index" in table.column_names:
            index = table.column("index").to_numpy()
            first = int(np.searchsorted(index, meta["dataset_from_index"]))
        else:
            first = 0
        T = int(meta["length"])
        sl = table.slice(first, T)
        if sl.num_rows != T:
            raise DatasetError(f"{path}: episode {i} needs {T} rows from row {first}, the file has {table.num_rows}")
        out: dict[str, Any] = {}
        for k, ft in self.features.items():
            if ft["dtype"] == "video":
                continue
            if k not in sl.column_names:
                raise DatasetError(f"{path}: missing the {k!r} column named in meta/info.json")
            if ft["dtype"] == "image":
                out[k] = self._decode_images(sl.column(k), path, k) if decode else None
            else:
                out[k] = _column_to_numpy(sl.column(k), ft)
        if "episode_index" in out and not np.all(out["episode_index"] == meta["episode_index"]):
            raise DatasetError(f"{path}: rows {first}..{first + T} do not all belong to episode {i}")
        out[TASK] = [self.tasks[t] for t in out["task_index"]] if "task_index" in out else []
        if decode:
            for k in self.camera_keys:
                if self.features[k]["dtype"] == "video":
                    out[k] = self._decode_video(k, meta, T)
        return out

    def _decode_images(self, col: pa.ChunkedArray, path: Path, key: str) -> np.ndarray:
        import io

        from PIL import Image

        imgs = []
        for item in col.to_pylist():
            data = item.get("bytes") if isinstance(item, dict) else item
            if data is None and isinstance(item, dict) and item.get("path"):
                rel = check_relative(item["path"], f"{path}: image feature {key!r} path")
                try:
                    data = (self.root / rel).read_bytes()
                except OSError as e:
                    raise DatasetError(f"{self.root / rel}: cannot read image ({e.strerror})") from None
            if data is None:
                raise DatasetError(f"{path}: image feature {key!r} has a row with neither bytes nor path")
            imgs.append(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
        return np.stack(imgs)

    def _decode_video(self, key: str, meta: dict, T: int) -> np.ndarray:
        path = self.root / format_path(self.info.get("video_path") or VIDEO_PATH, f"{self.root / 'meta/info.json'}: video_path",
                                       video_key=key, chunk_index=meta[f"videos/{key}/chunk_index"],
                                       file_index=meta[f"videos/{key}/file_index"])
        if not path.exists():
            raise DatasetError(f"{path}: missing video for episode {meta['episode_index']}")
        try:
            frames = decode_video(path, float(meta[f"videos/{key}/from_timestamp"]),
                                  float(meta[f"videos/{key}/to_timestamp"]), num_frames=T)
        except Exception as e:
            raise DatasetError(f"{path}: cannot decode video ({type(e).__name__}: {e})") from e
        if len(frames) != T:
            raise DatasetError(f"{path}: episode {meta['episode_index']} has {T} frames but the video holds {len(frames)}")
        return frames

    def iter_episodes(self, decode: bool = True) -> Iterator[dict[str, Any]]:
        for i in range(self.num_episodes):
            yield self.episode(i, decode=decode)

    def __len__(self) -> int:
        return self.num_frames


def write_episode(writer: LeRobotV3Writer, episode: dict[str, Any]) -> int:
    """Append an episode dict (see `wmrl.core.episode`) as one dataset episode."""
    T = len(episode[TASK])
    for t in range(T):
        writer.add_frame({k: (v[t] if not isinstance(v, list) else v[t]) for k, v in episode.items()})
    return writer.save_episode()
