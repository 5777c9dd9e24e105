"""mp4 encode/decode with PyAV (bundled FFmpeg). Frames are uint8 (T, H, W, 3) RGB."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from av.video.reformatter import VideoReformatter

CODECS = {"h264": "libx264", "av1": "libsvtav1"}


def check_codec(codec: str) -> None:
    """A known codec whose encoder this FFmpeg build has (checked before any work that would end in encoding)."""
    if codec not in CODECS:
        raise ValueError(f"video codec: expected one of {sorted(CODECS)}, got {codec!r}")
    try:
        av.codec.Codec(CODECS[codec], "w")
    except Exception as e:  # noqa: BLE001 - PyAV raises several kinds for a missing encoder
        raise ValueError(f"video codec {codec!r}: this FFmpeg build has no {CODECS[codec]} encoder ({e})") from None


def encode_video(frames: np.ndarray, path: str | Path, fps: int, codec: str = "h264", crf: int = 12,
                 pix_fmt: str = "yuv444p", gop: int = 2) -> None:
    """Encode frames to an mp4. h264 with yuv444p (LeRobot accepts both) keeps colours of 64x64 frames intact;
    a GOP of 2 (LeRobot's default) keeps random access cheap."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"video frames: expected uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
    check_codec(codec)
    if codec == "av1":
        pix_fmt = "yuv420p"  # SVT-AV1 has no 4:4:4
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream(CODECS[codec], rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = pix_fmt
        stream.time_base = Fraction(1, fps)
        stream.options = {"crf": str(crf), "g": str(gop)}
        if codec == "h264":
            # tune psnr (no psychovisual optimisation, no adaptive quantisation): the frames are training data for
            # models scored on pixel error, and x264's default psy path encoded the same frames to different files
            # in some repeats (2 frames up to 69 grey levels apart; 7 extra files over 6 episodes x 60 repeats,
            # none with this tune, whose stored frames sit at 47.6 instead of 43.1 dB PSNR for 27% more bytes)
            stream.options["preset"] = "veryfast"
            stream.options["tune"] = "psnr"
        for i, img in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def decode_video(path: str | Path, from_ts: float = 0.0, to_ts: float | None = None,
                 num_frames: int | None = None) -> np.ndarray:
    """Decode the frames whose timestamps lie in [from_ts, to_ts) (LeRobot v3 stores many episodes per file and
    addresses each by its timestamp range). Returns uint8 (T, H, W, 3)."""
    out = []
    eps = 1e-4
    # one reformatter for the whole clip: `frame.to_ndarray(format=...)` builds a new swscale context per frame,
    # which cost ~4x the decoding itself (a 37k-frame dataset took minutes to load); the output is bit-identical
    rgb = VideoReformatter()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if from_ts > 0:
            container.seek(int(from_ts / stream.time_base), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            t = float(frame.pts * stream.time_base)
            if t < from_ts - eps:
                continue
            if to_ts is not None and t >= to_ts - eps:
                break
            out.append(rgb.reformat(frame, format="rgb24").to_ndarray())
            if num_frames is not None and len(out) == num_frames:
                break
    if not out:
        return np.zeros((0, 0, 0, 3), np.uint8)
    return np.stack(out)


def video_info(codec: str, fps: int, height: int, width: int, pix_fmt: str = "yuv444p") -> dict:
    """The `info` block LeRobot keeps for a video feature in meta/info.json."""
    return {
        "video.height": height,
        "video.width": width,
        "video.codec": "av1" if codec == "av1" else "h264",
        "video.pix_fmt": "yuv420p" if codec == "av1" else pix_fmt,
        "video.is_depth_map": False,
        "video.fps": fps,
        "video.channels": 3,
        "has_audio": False,
    }
