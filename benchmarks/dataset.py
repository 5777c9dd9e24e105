"""LeRobot v3 writer and reader throughput (frames/s) on tabletop-shaped frames: two 64x64 cameras (h264 mp4)
plus state, action and the step fields."""

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
    return finish("dataset", {"episodes": n_eps, "frames": frames, "write_frames_per_s": frames / write_s,
                              "read_frames_per_s": frames / read_s, "bytes_per_frame_on_disk": size / frames,
                              "codec": "h264 yuv444p crf 12"}, quick)
