"""How an end-effector-delta action moves a suite's arm: the contract between a simulator, the datasets it
writes (`meta/wmrl.json`, key `control`) and the world model, which integrates commanded poses from actions
(`world_models.video.model.commanded_pose`) and so must know the step size, the workspace and where the hand and
gripper sit in `observation.state`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from wmrl.core.arm import EE_STEP, WORKSPACE_HIGH, WORKSPACE_LOW


@dataclass(frozen=True)
class EEDeltaControl:
    ee_index: tuple[int, int, int] = (5, 6, 7)
    """End-effector xyz inside observation.state."""
    gripper_index: int = 4
    """Gripper opening inside observation.state."""
    gripper_open: float = 0.09
    """The opening at gripper command -1 (fully open); command +1 closes."""
    ee_step: float = EE_STEP
    """m per control step at |action| = 1."""
    workspace_low: tuple[float, float, float] = tuple(float(v) for v in WORKSPACE_LOW)
    workspace_high: tuple[float, float, float] = tuple(float(v) for v in WORKSPACE_HIGH)
    object_state: str | None = "tabletop"
    """Whose task rules read observation.environment_state ("tabletop": cube xyz then zone xy; "metaworld":
    Meta-World's 39-entry observation; "libero": every body's xyz and wxyz quaternion); None: a task whose state the
    world model's state channel does not model (no rule reads it)."""
    object_xyz: tuple[int, ...] = (0, 3, 6)
    """Where each object's centre (x, y, z) starts inside observation.environment_state: what the state channel
    predicts. Entries it does not predict or derive are carried unchanged from the start (zones, goals)."""
    env_arm: int = -1
    """Where [end-effector xyz, gripper opening] repeat inside observation.environment_state (-1: they do not)."""
    env_previous: tuple[int, int] = (0, 0)
    """(start, n): entries holding the previous frame's first n entries (Meta-World's frame stacking; n = 0: none)."""
    gripper_action: int = 3
    """Where the gripper command sits in the action: 3 for [dx, dy, dz, gripper] (the tabletop, Meta-World, the
    SO-101 cell); 6 for LIBERO's OSC_POSE [dx, dy, dz, drx, dry, drz, gripper], whose rotation step the world
    model's commanded pose then carries (`world_models.video.model.commanded_pose`)."""
    rot_step: float = 0.5
    """rad of axis-angle rotation per control step at |action| = 1 (pose layouts; robosuite's OSC: 0.5)."""

    def to_meta(self) -> dict:
        return asdict(self)

    @classmethod
    def from_meta(cls, meta: dict) -> "EEDeltaControl":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(meta) - known)
        if unknown:
            raise ValueError(f"control: unknown keys {unknown} (known: {sorted(known)})")
        tuples = {k: tuple(v) for k, v in meta.items() if isinstance(v, list)}
        return cls(**{**meta, **tuples})

    @classmethod
    def of_dataset(cls, root: str | Path) -> "EEDeltaControl":
        """The control a dataset was recorded with (`meta/wmrl.json`); the tabletop's when it names none (datasets
        written before the key existed, or by other tools)."""
        path = Path(root) / "meta" / "wmrl.json"
        meta = json.loads(path.read_text()).get("control") if path.exists() else None
        return cls.from_meta(meta) if meta else TABLETOP


TABLETOP = EEDeltaControl()
