"""LeRobot v3 writer and reader throughput (frames/s) on tabletop-shaped frames: two 64x64 cameras (h264 mp4)
plus state, action and the step fields; and whether recording slows down as a dataset grows.

The growth check records `growth_episodes` state-only episodes (no video, so the per-episode metadata is what is
timed) twice in the same run: with the writer's episodes table split into files of 100 rows (the default), and as one
file rewritten whole after every episode (`episodes_per_meta_file` unbounded: the writer before 2026-11-28). It
reports each one's time per episode over the last tenth of the episodes divided by that over the first tenth."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish


def main(quick: bool = False) -> dict:
    from wmrl.core.episode import build_episode, features_for
    from wmrl.datasets import LeRobotV3Dataset, LeRobotV3Writer, write_episode

    n_eps, T = (3, 20) if quick else (40, 50)
    rng = np.random.default_rng(0)
    # smooth images (a moving gradient), so the codec sees video-like content rather than noise
    yy, xx = np.mgrid[0:64, 0:64]
    eps = []
    for e in range(n_eps):
        obs = []
        for t in range(T + 1):
            img = ((xx + yy + 3 * t + 10 * e)[..., None] * np.array([1, 2, 3]) % 256).astype(np.uint8)
            obs.append({"observation.images.front": img, "observation.images.wrist": img[::-1].copy(),
                        "observation.state": rng.normal(size=8).astype(np.float32), "task": "push the red cube"})
        eps.append(build_episode(obs, [rng.normal(size=4).astype(np.float32) for _ in range(T)], [0.0] * T,
                                 [False] * T, [False] * (T - 1) + [True], [False] * T, source="expert"))
    frames = n_eps * (T + 1)
    root = Path(tempfile.mkdtemp()) / "ds"
    try:
        t = time.perf_counter()
        w = LeRobotV3Writer(root, fps=10, features=features_for(eps[0]))
        for ep in eps:
            write_episode(w, ep)
        w.finalize()
        write_s = time.perf_counter() - t
        t = time.perf_counter()
        ds = LeRobotV3Dataset(root)
        n = sum(len(ep["action"]) for ep in ds.iter_episodes())
        read_s = time.perf_counter() - t
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
    assert n == frames
    growth_eps = 40 if quick else 2000
    growth = {name: _growth(growth_eps, per_file) for name, per_file in (("split", 100), ("one_file", 10**9))}
    return finish("dataset", {"episodes": n_eps, "frames": frames, "write_frames_per_s": frames / write_s,
                              "read_frames_per_s": frames / read_s, "bytes_per_frame_on_disk": size / frames,
                              "codec": "h264 yuv444p crf 12", "growth_episodes": growth_eps,
                              **{f"record_slowdown_last_vs_first_{k}": v["slowdown"] for k, v in growth.items()},
                              **{f"record_ms_per_episode_last_{k}": v["last_ms"] for k, v in growth.items()}}, quick)


def _growth(n_eps: int, per_file: int) -> dict:
    """Record n_eps state-only 40-step episodes; per-episode time over the last tenth / over the first tenth."""
    from wmrl.core.episode import build_episode, features_for
    from wmrl.datasets import LeRobotV3Writer, write_episode

    T, rng = 40, np.random.default_rng(0)
    obs = [{"observation.state": rng.normal(size=8).astype(np.float32), "observation.environment_state":
            rng.normal(size=13).astype(np.float32), "task": "push the red cube"} for _ in range(T + 1)]
    ep = build_episode(obs, [rng.normal(size=4).astype(np.float32) for _ in range(T)], [0.0] * T, [False] * T,
                       [False] * (T - 1) + [True], [False] * T, source="expert")
    root = Path(tempfile.mkdtemp()) / "ds"
    try:
        w = LeRobotV3Writer(root, fps=10, features=features_for(ep), episodes_per_meta_file=per_file)
        times = []
        for _ in range(n_eps):
            t = time.perf_counter()
            write_episode(w, ep)
            times.append(time.perf_counter() - t)
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
    k = max(1, n_eps // 10)
    first, last = float(np.median(times[:k])), float(np.median(times[-k:]))
    return {"slowdown": last / first, "last_ms": 1000 * last}
