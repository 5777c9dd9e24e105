"""Benchmarks are not tests, but their scripts must keep running and keep printing the keys the README and other
tools rely on. Quick mode: tiny sizes, and the committed results are left alone."""

import runpy
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(name):
    return runpy.run_path(str(BENCH / f"{name}.py"), run_name="bench")["main"](quick=True)


def test_replay_benchmark_keys_and_memory():
    r = _run("replay")
    for k in ("sample_ratio_vs_torchrl", "window_sample_ratio_vs_torchrl", "bytes_per_frame_ratio", "machine", "command", "date"):
        assert k in r
    assert r["bytes_per_frame_ratio"] < 1.1  # frames stored once
    assert r["torchrl_bytes_per_frame_ratio"] > 1.9  # torchrl's transitions keep a copy of the next observation


@pytest.mark.parametrize("name,keys", [("sim", ["steps_per_s_physics", "steps_per_s_render_2cam_64"]),
                                       ("dataset", ["write_frames_per_s", "read_frames_per_s"])])
def test_benchmark_keys(name, keys):
    r = _run(name)
    for k in keys:
        assert r[k] > 0
