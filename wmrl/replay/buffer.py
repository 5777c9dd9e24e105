"""The common replay buffer: whole episodes, every frame stored once as it came (images as uint8).

Transitions (s, a, r, s', terminated) are sampled by index arithmetic: s' is the next frame of the same episode,
so no `next` observation is ever stored twice. Windows of L frames (world-model sequences, action chunks) never cross
an episode: indices past the episode end are clamped to its last frame and masked out. `next.terminated` and
`next.truncated` stay distinct, so value targets bootstrap through a time limit but not through a termination.

Storage is a ring of `capacity` frames with FIFO eviction of whole episodes (an episode is never split across the
wrap). Optional per-episode weights (trajectory weighting, Hong et al. 2023) and per-frame priorities change the
sampling distribution; `MixedReplay` mixes an offline and an online buffer at a fixed ratio.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from wmrl.core.episode import features_for
from wmrl.core.features import INDEX_FEATURES, IS_LAST
from wmrl.core.io import write_json
from wmrl.datasets import LeRobotV3Dataset, LeRobotV3Writer, write_episode

BOOKKEEPING = frozenset(INDEX_FEATURES)  # per-frame indices: rebuilt by any writer

class EpisodeReplay:
    def __init__(self, capacity: int, seed: int = 0):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = int(capacity)
        self.rng = np.random.default_rng(seed)
        self._data: dict[str, np.ndarray] = {}
        self._vocab: dict[str, list[str]] = {}  # string features (task, source, ...) are stored as int32 codes
        self._frame_episode = np.full(self.capacity, -1, np.int64)  # episode id per slot, -1 = empty
        self.frame_end = np.zeros(self.capacity, np.int64)  # slot of the last frame of the slot's episode
        self.priority = np.ones(self.capacity, np.float64)
        self._episodes: dict[int, tuple[int, int]] = {}  # episode id -> (start slot, length), insertion ordered
        self.episode_weight: dict[int, float] = {}
        self.ptr = 0
        self._high_water = 0  # slots [0, high_water) have ever been written
        self.next_episode_id = 0
        self._weighted = False
        self._dirty = True
        self._trans_starts = np.zeros(0, np.int64)
        self._live = np.zeros(0, np.int64)
        self._out: dict[tuple, list[np.ndarray]] = {}  # recycled sample outputs, see _take

    # ------------------------------------------------------------------ read-only views (the public state)
    @property
    def data(self) -> Mapping[str, np.ndarray]:
        """Feature name -> its storage column (`capacity` rows; strings as int32 codes, see `vocab`). A read-only
        mapping of the stored arrays themselves (no copy, so torch can share them): read them, never write them."""
        return MappingProxyType(self._data)

    @property
    def episodes(self) -> Mapping[int, tuple[int, int]]:
        """Episode id -> (first slot, length), oldest first. Read-only."""
        return MappingProxyType(self._episodes)

    @property
    def vocab(self) -> Mapping[str, list[str]]:
        """String feature -> the strings its int32 codes index; read them, never write them (no copy: it is read
        per step in imagination)."""
        return MappingProxyType(self._vocab)

    @property
    def frame_episode(self) -> np.ndarray:
        """Episode id per slot (-1: empty); read it, never write it."""
        return self._frame_episode

    @property
    def high_water(self) -> int:
        """Slots [0, high_water) have ever been written."""
        return self._high_water

    @property
    def nbytes(self) -> int:
        """Memory held by the storage (frames once each, plus the per-slot bookkeeping)."""
        return (sum(v.nbytes for v in self._data.values()) + self._frame_episode.nbytes + self.frame_end.nbytes
                + self.priority.nbytes)

    def live_frames(self) -> np.ndarray:
        """Slots holding a frame of a stored episode, ascending."""
        return np.flatnonzero(self._frame_episode[: self._high_water] >= 0)

    def __contains__(self, key: str) -> bool:
        return key in self._data

    # ------------------------------------------------------------------ writing
    def _allocate(self, ep: dict[str, Any]) -> None:
        for k, v in ep.items():
            if isinstance(v, list):
                self._vocab[k] = []
                self._data[k] = np.zeros(self.capacity, np.int32)
            else:
                v = np.asarray(v)
                self._data[k] = np.zeros((self.capacity, *v.shape[1:]), v.dtype)

    def add_episode(self, episode: dict[str, Any], weight: float = 1.0) -> int:
        """Store an episode dict (see `wmrl.core.episode`); returns its id. Evicts the oldest episodes in the way."""
        lengths = {k: len(v) for k, v in episode.items()}
        T = next(iter(lengths.values()))
        if any(n != T for n in lengths.values()):
            raise ValueError(f"episode fields have different lengths: {lengths}")
        if T > self.capacity:
            raise ValueError(f"episode of {T} frames does not fit a replay of capacity {self.capacity}")
        if not self._data:
            self._allocate(episode)
        if set(episode) != set(self._data):
            raise ValueError(f"episode keys {sorted(episode)} differ from the buffer's {sorted(self._data)}")
        for k, v in episode.items():
            if not isinstance(v, list):
                v = np.asarray(v)
                if v.shape[1:] != self._data[k].shape[1:]:
                    raise ValueError(f"{k}: expected per-frame shape {self._data[k].shape[1:]}, got {v.shape[1:]}")
                if np.issubdtype(v.dtype, np.floating) and not np.all(np.isfinite(v)):
                    raise ValueError(f"{k}: contains NaN or inf")
        if self.ptr + T > self.capacity:
            self.ptr = 0  # wrap: episodes stay contiguous
        lo, hi = self.ptr, self.ptr + T
        for eid in np.unique(self._frame_episode[lo:hi]):
            if eid >= 0:
                self._evict(int(eid))
        for k, v in episode.items():
            if isinstance(v, list):
                voc = self._vocab[k]
                codes = []
                for s in v:
                    if s not in voc:
                        voc.append(s)
                    codes.append(voc.index(s))
                self._data[k][lo:hi] = codes
            else:
                self._data[k][lo:hi] = v
        if IS_LAST not in episode:  # data without RLDS's flag: the last frame has no successor
            self._data.setdefault(IS_LAST, np.zeros(self.capacity, bool))
            self._data[IS_LAST][lo:hi] = np.arange(T) == T - 1
        eid = self.next_episode_id
        self.next_episode_id += 1
        self._frame_episode[lo:hi] = eid
        self.frame_end[lo:hi] = hi - 1
        self.priority[lo:hi] = 1.0
        self._episodes[eid] = (lo, T)
        self.episode_weight[eid] = float(weight)
        self._weighted |= weight != 1.0
        self.ptr = hi
        self._high_water = max(self._high_water, hi)
        self._dirty = True
        return eid

    def _evict(self, eid: int) -> None:
        lo, T = self._episodes.pop(eid)
        self.episode_weight.pop(eid, None)
        self._frame_episode[lo : lo + T] = -1

    # ------------------------------------------------------------------ weights
    def set_episode_weights(self, weights: dict[int, float]) -> None:
        """Trajectory weighting: sampling probability of every frame of episode i is proportional to weights[i]."""
        for eid, w in weights.items():
            if eid not in self._episodes:
                raise KeyError(f"episode {eid} is not in the buffer")
            if not np.isfinite(w) or w < 0:
                raise ValueError(f"episode weight must be finite and >= 0, got {w}")
            self.episode_weight[eid] = float(w)
        self._weighted = True
        self._dirty = True

    def update_priorities(self, idx: np.ndarray, priority: np.ndarray) -> None:
        """Per-frame priorities (e.g. TD errors), multiplied with the episode weight."""
        p = np.asarray(priority, dtype=np.float64)
        if np.any(~np.isfinite(p)) or np.any(p < 0):
            raise ValueError("priorities must be finite and >= 0")
        self.priority[np.asarray(idx)] = p
        self._weighted = True
        self._dirty = True

    # ------------------------------------------------------------------ sampling
    def __len__(self) -> int:
        return int(sum(T for _, T in self._episodes.values()))

    @property
    def num_episodes(self) -> int:
        return len(self._episodes)

    def _refresh(self) -> None:
        if not self._dirty:
            return
        hw = self._high_water
        live = self._frame_episode[:hw] >= 0
        starts = live & ~self._data[IS_LAST][:hw]
        starts[:-1] &= self._frame_episode[1:hw] == self._frame_episode[: hw - 1]
        if hw:
            starts[hw - 1] = False  # the last written slot has no successor
        self._live = np.flatnonzero(live)
        self._trans_starts = np.flatnonzero(starts)
        if self._weighted:
            w_ep = np.zeros(hw)
            for eid, (lo, T) in self._episodes.items():
                w_ep[lo : lo + T] = self.episode_weight[eid]
            w = w_ep * self.priority[:hw]
            self._p_trans = np.cumsum(w[self._trans_starts])
            self._p_live = np.cumsum(w[self._live])
        self._dirty = False

    def _draw(self, pool: np.ndarray, cdf: np.ndarray | None, n: int) -> np.ndarray:
        if len(pool) == 0:
            raise ValueError("the replay buffer has nothing to sample yet")
        if cdf is None:
            return pool[self.rng.integers(0, len(pool), n)]
        if cdf[-1] <= 0:
            raise ValueError("all sampling weights are zero")
        return pool[np.searchsorted(cdf, self.rng.random(n) * cdf[-1], side="right").clip(0, len(pool) - 1)]

    def sampling_probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """(transition start slots, their sampling probabilities); for tests and diagnostics."""
        self._refresh()
        if not self._weighted:
            return self._trans_starts, np.full(len(self._trans_starts), 1.0 / max(len(self._trans_starts), 1))
        return self._trans_starts, np.diff(self._p_trans, prepend=0.0) / self._p_trans[-1]

    def _take(self, key: str, idx: np.ndarray, tag: str = "") -> np.ndarray:
        """Gather rows into a recycled output array.

        A fresh multi-MB array costs a page fault per 4 KiB, which dominates sampling of image batches. So outputs
        come from a small pool, and an array is reused only when nothing outside the pool refers to it any more (a
        batch, a view or a tensor made with torch.from_numpy all hold a reference): a batch you keep is never
        overwritten. mode="clip" keeps numpy off its slow buffered path (indices are always in range here)."""
        src = self._data[key]
        shape = (*idx.shape, *src.shape[1:])
        pool = self._out.setdefault((tag + key, shape), [])
        buf = None
        for i in range(len(pool)):
            if sys.getrefcount(pool[i]) == 2:  # only the pool (and this call's argument) refer to it
                buf = pool[i]
                break
        if buf is None:
            buf = np.empty(shape, src.dtype)
            if len(pool) < 4:
                pool.append(buf)
        return np.take(src, idx, axis=0, mode="clip", out=buf)

    def sample(self, batch_size: int, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Transitions: every stored key at s, `next.<key>` for observation keys at s', plus `index` (slot of s)."""
        self._refresh()
        idx = self._draw(self._trans_starts, self._p_trans if self._weighted else None, batch_size)
        out = {k: self._take(k, idx) for k in (keys or self._data)}
        nxt = idx + 1
        for k in (keys or self._data):
            if k.startswith("observation."):
                out[f"next.{k}"] = self._take(k, nxt, tag="next.")
        out["index"] = idx
        return out

    def transitions(self, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Every stored transition at once, in slot order, laid out like `sample` (a D4RL-style dict in LeRobot's
        names): what dynamics models train on. Fresh arrays, never recycled."""
        self._refresh()
        idx = self._trans_starts
        out = {k: self._data[k][idx] for k in (keys or self._data)}
        for k in (keys or self._data):
            if k.startswith("observation."):
                out[f"next.{k}"] = self._data[k][idx + 1]
        out["index"] = idx.copy()
        return out

    def sample_windows(self, batch_size: int, length: int, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Windows of `length` frames (B, L, ...) inside one episode each; `mask` marks real frames, `action_mask`
        real frames that also carry a real action (not the final observation's padding)."""
        if length <= 0:
            raise ValueError(f"window length must be positive, got {length}")
        self._refresh()
        start = self._draw(self._live, self._p_live if self._weighted else None, batch_size)
        raw = start[:, None] + np.arange(length)[None, :]
        end = self.frame_end[start][:, None]
        mask = raw <= end
        idx = np.minimum(raw, end)
        out = {k: self._take(k, idx) for k in (keys or self._data)}
        out["mask"] = mask
        out["action_mask"] = mask & ~self._data[IS_LAST][idx]
        out["index"] = idx
        return out

    def decode_strings(self, key: str, codes: np.ndarray) -> np.ndarray:
        return np.asarray(self._vocab[key], dtype=object)[codes]

    def get_episode(self, eid: int) -> dict[str, Any]:
        lo, T = self._episodes[eid]
        return {k: (self.decode_strings(k, v[lo : lo + T]).tolist() if k in self._vocab else v[lo : lo + T].copy())
                for k, v in self._data.items()}

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Crash-safe save: written to a sibling folder, then swapped in. A crash at any point leaves either the
        old or the new save complete (`load` picks up a swap interrupted half way)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        old = path.with_name(path.name + ".old")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        hw = self._high_water
        for k, v in self._data.items():
            np.save(tmp / f"{k}.npy", v[:hw])
        np.save(tmp / "_frame_episode.npy", self._frame_episode[:hw])
        np.save(tmp / "_frame_end.npy", self.frame_end[:hw])
        np.save(tmp / "_priority.npy", self.priority[:hw])
        write_json(tmp / "manifest.json", {
            "capacity": self.capacity, "ptr": self.ptr, "high_water": hw, "next_episode_id": self.next_episode_id,
            "episodes": {str(e): list(v) for e, v in self._episodes.items()},
            "episode_weight": {str(e): w for e, w in self.episode_weight.items()}, "weighted": self._weighted,
            "vocab": self._vocab, "keys": list(self._data), "rng": self.rng.bit_generator.state})
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)

    @classmethod
    def load(cls, path: str | Path) -> "EpisodeReplay":
        path = Path(path)
        if not (path / "manifest.json").exists():
            old = path.with_name(path.name + ".old")
            if (old / "manifest.json").exists():
                path = old  # a save was interrupted between its two renames
            else:
                raise FileNotFoundError(f"{path}: no replay save here (manifest.json missing)")
        try:
            m = json.loads((path / "manifest.json").read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path / 'manifest.json'}: not valid JSON ({e})") from e
        buf = cls(m["capacity"])
        hw = m["high_water"]
        for k in m["keys"]:
            arr = np.load(path / f"{k}.npy", allow_pickle=False)
            buf._data[k] = np.zeros((buf.capacity, *arr.shape[1:]), arr.dtype)
            buf._data[k][:hw] = arr
        buf._frame_episode[:hw] = np.load(path / "_frame_episode.npy")
        buf.frame_end[:hw] = np.load(path / "_frame_end.npy")
        buf.priority[:hw] = np.load(path / "_priority.npy")
        buf.ptr, buf._high_water, buf.next_episode_id = m["ptr"], hw, m["next_episode_id"]
        buf._episodes = {int(e): tuple(v) for e, v in m["episodes"].items()}
        buf.episode_weight = {int(e): w for e, w in m["episode_weight"].items()}
        buf._weighted, buf._vocab = m["weighted"], m["vocab"]
        buf.rng.bit_generator.state = m["rng"]
        return buf

    # ------------------------------------------------------------------ LeRobot v3
    @classmethod
    def from_datasets(cls, paths, *, keys: Callable[[Any], set[str]] | None = None, drop: set[str] = BOOKKEEPING,
                      require: tuple[str, ...] = (), holdout: float = 0.0, where: Callable[[dict], bool] | None = None,
                      transform: Callable[[dict], dict] | None = None, augment: Callable[[dict], dict] | None = None,
                      seed: int = 0) -> tuple[list, "EpisodeReplay", "EpisodeReplay"]:
        """The one way from LeRobot v3 datasets to replays: `(datasets, train, held)`.

        `paths`: one or more dataset folders. `holdout`: the last share of the *first* dataset's episodes go to
        `held` (at least one when > 0); every other episode trains. `keys(dataset)`: the features to keep (default:
        all but `drop`, the bookkeeping columns). `require`: features every dataset must have (one error naming the
        missing ones). `where(episode)`: keep only the episodes it accepts. `transform(episode)`: applied to each kept
        episode before it is stored (e.g. relabelling its actions with an expert's). `augment(episode)`: every
        training episode is also stored as this new one (e.g. its reflection), after it; held-out ones never are."""
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        if not (isinstance(holdout, (int, float)) and 0 <= holdout < 1):
            raise ValueError(f"--holdout must be in [0, 1), got {holdout}")
        dss = [LeRobotV3Dataset(p) for p in paths]
        for d in dss:
            if missing := [k for k in require if k not in d.features]:
                raise ValueError(f"{d.root}: dataset lacks {missing}; it has {sorted(d.features)}")
        first = dss[0]
        n_hold = max(1, int(round(first.num_episodes * holdout))) if holdout > 0 else 0
        train = cls(sum(d.num_frames for d in dss) * (2 if augment is not None else 1), seed=seed)
        held = cls(first.num_frames, seed=seed + 1)
        for j, d in enumerate(dss):
            keep = keys(d) if keys is not None else None
            for i, ep in enumerate(d.iter_episodes()):
                if where is not None and not where(ep):
                    continue
                dest = held if j == 0 and i >= first.num_episodes - n_hold else train
                if transform is not None:
                    ep = transform(ep)
                ep = {k: v for k, v in ep.items() if (k in keep if keep is not None else k not in drop)}
                dest.add_episode(ep)
                if augment is not None and dest is train:
                    train.add_episode(augment(ep))
        return dss, train, held

    @classmethod
    def from_lerobot(cls, root: str | Path, seed: int = 0) -> "EpisodeReplay":
        """One dataset, every episode, in one replay."""
        return cls.from_datasets([root], seed=seed)[1]

    def to_lerobot(self, root: str | Path, fps: int, mode: str = "create", robot_type: str | None = None) -> int:
        if not self._episodes:
            raise ValueError("the replay buffer is empty; nothing to export")
        eps = [self.get_episode(e) for e in self._episodes]
        writer = LeRobotV3Writer(root, fps=fps, features=features_for(eps[0]), mode=mode, robot_type=robot_type)
        for ep in eps:
            write_episode(writer, ep)
        writer.finalize()
        return len(eps)


class MixedReplay:
    """Samples `online_ratio` of each batch from the online buffer and the rest from the offline one (RLPD, WSRL's
    variants that keep offline data, HIL-SERL). Falls back to offline only until the online buffer has data."""

    def __init__(self, offline: EpisodeReplay, online: EpisodeReplay, online_ratio: float = 0.5):
        if not 0.0 <= online_ratio <= 1.0:
            raise ValueError(f"online_ratio must be in [0, 1], got {online_ratio}")
        self.offline, self.online, self.online_ratio = offline, online, online_ratio

    def _split(self, batch_size: int) -> int:
        return int(round(batch_size * self.online_ratio)) if len(self.online) else 0

    def _mix(self, fn: str, batch_size: int, *args, **kw) -> dict[str, np.ndarray]:
        n_on = self._split(batch_size)
        parts = []
        if n_on:
            parts.append((getattr(self.online, fn)(n_on, *args, **kw), True))
        if batch_size - n_on:
            parts.append((getattr(self.offline, fn)(batch_size - n_on, *args, **kw), False))
        keys = set.intersection(*(set(p) for p, _ in parts))
        out = {k: np.concatenate([p[k] for p, _ in parts]) for k in keys}
        out["is_online"] = np.concatenate([np.full(len(p["index"]), flag) for p, flag in parts])
        return out

    def sample(self, batch_size: int, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        return self._mix("sample", batch_size, keys=keys)

    def sample_windows(self, batch_size: int, length: int, keys: list[str] | None = None) -> dict[str, np.ndarray]:
        return self._mix("sample_windows", batch_size, length, keys=keys)

    def __len__(self) -> int:
        return len(self.offline) + len(self.online)


__all__ = ["EpisodeReplay", "MixedReplay"]
