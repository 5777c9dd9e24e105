"""Run folders: refuse to clobber, write config.yaml, log metrics.jsonl (and wandb, offline, when asked)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import yaml


def prepare_run_dir(out: str | Path, overwrite: bool = False, resume: bool = False) -> Path:
    out = Path(out)
    if overwrite and resume:
        raise ValueError("--overwrite and --resume exclude each other")
    if out.exists() and any(out.iterdir()):
        if overwrite:
            shutil.rmtree(out)
        elif not resume:
            raise FileExistsError(f"{out} already exists; pass --overwrite to replace it or --resume to continue it")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def save_config(run_dir: Path, cfg: Any) -> None:
    from wmrl.core.io import atomic_path

    with atomic_path(run_dir / "config.yaml") as tmp:
        tmp.write_text(yaml.safe_dump(_plain(cfg), sort_keys=False))


class Tracker:
    """Appends one JSON line per `log` to metrics.jsonl; mirrors to wandb in offline mode when `wandb=True`
    (no account, no network)."""

    def __init__(self, run_dir: Path, wandb: bool = False, config: Any = None, project: str = "wmrl"):
        self.path = Path(run_dir) / "metrics.jsonl"
        self._wandb = None
        if wandb:
            try:
                import wandb as wb
            except ImportError as e:
                raise ValueError("--wandb needs the tracking extra: pip install 'wmrl[tracking]'") from e
            os.environ.setdefault("WANDB_MODE", "offline")
            self._wandb = wb.init(project=project, dir=str(run_dir), config=_plain(config), mode="offline")

    def log(self, metrics: dict, step: int | None = None) -> None:
        rec = {"time": time.time(), **({"step": step} if step is not None else {}), **metrics}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec, default=float) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
