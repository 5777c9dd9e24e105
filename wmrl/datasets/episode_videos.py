"""Videos people look at: one mp4 per episode (cameras side by side) and a grid GIF of several episodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import imageio.v3 as iio
import numpy as np

from wmrl.core.features import is_image_key
from wmrl.core.io import atomic_path
from wmrl.datasets.video import encode_video


def side_by_side(ep: dict[str, Any], scale: int = 3) -> np.ndarray:
    """(T, H*scale, W*n_cams*scale, 3): every camera of the episode, upscaled with nearest neighbours."""
    cams = [ep[k] for k in sorted(k for k in ep if is_image_key(k))]
    if not cams:
        raise ValueError("episode has no observation.images.* frames to show")
    frames = np.concatenate(cams, axis=2)
    return frames.repeat(scale, axis=1).repeat(scale, axis=2)


def _border(frames: np.ndarray, ok: bool, width: int = 3) -> np.ndarray:
    out = frames.copy()
    colour = np.array([40, 200, 60] if ok else [220, 50, 40], np.uint8)
    out[:, :width], out[:, -width:], out[:, :, :width], out[:, :, -width:] = colour, colour, colour, colour
    return out


def grid(episodes: list[np.ndarray], cols: int = 4) -> np.ndarray:
    """Tile episodes' frame stacks into one (T_max, ...) stack; shorter episodes hold their last frame."""
    T = max(len(e) for e in episodes)
    padded = [np.concatenate([e, np.repeat(e[-1:], T - len(e), 0)]) for e in episodes]
    blank = np.zeros_like(padded[0])
    rows = []
    for r in range(0, len(padded), cols):
        row = padded[r : r + cols] + [blank] * (cols - len(padded[r : r + cols]))
        rows.append(np.concatenate(row, axis=2))
    return np.concatenate(rows, axis=1)


def write_clips(clips: list[tuple[str, np.ndarray]], out_dir: str | Path, gif_name: str, fps: int = 10,
                cols: int = 4) -> list[str]:
    """One mp4 per (name, frames) clip and a grid GIF of all of them (at half resolution)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, tiles = [], []
    for name, frames in clips:
        path = out_dir / f"{name}.mp4"
        with atomic_path(path) as tmp:
            encode_video(frames, tmp, fps=fps, crf=18, pix_fmt="yuv420p")
        paths.append(str(path))
        tiles.append(frames[:, ::2, ::2])
    gif = out_dir / gif_name
    with atomic_path(gif) as tmp:
        iio.imwrite(tmp, grid(tiles, cols=cols), extension=".gif", duration=1000 // fps, loop=0)
    return paths + [str(gif)]


def write_episode_videos(episodes: list[dict], out_dir: str | Path, records: list[dict], fps: int = 10) -> list[str]:
    clips = [(f"episode_{rec['episode']:03d}", _border(side_by_side(ep), rec.get("success", False)))
             for ep, rec in zip(episodes, records)]
    return write_clips(clips, out_dir, "grid.gif", fps=fps)
