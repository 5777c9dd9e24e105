"""Meta-World as a wmrl suite: `wmrl/metaworld-<task>-v0` for each of its 50 v3 tasks, when the optional
`metaworld` package is installed (`pip install 'wmrl[metaworld]'`; see the README for mujoco versions)."""

from __future__ import annotations

import functools
import importlib.util

ENTRY_POINT = "sim.metaworld.env:MetaWorldEnv"


@functools.cache  # asked on every scripted action
def available() -> bool:
    return importlib.util.find_spec("metaworld") is not None


def env_ids() -> list[str]:
    if not available():
        return []
    from sim.metaworld.env import task_names

    return [f"wmrl/metaworld-{t}-v0" for t in task_names()]
