"""Run folders: refuse to clobber, write config.yaml, log metrics.jsonl (and wandb, offline, when asked)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from wmrl.core.io import RUN_MARKER, check_out, recognise, remove_for_overwrite, write_json


SETUP_FILES = {RUN_MARKER, "config.yaml"}


def prepare_run_dir(out: str | Path, overwrite: bool = False, resume: bool = False) -> Path:
    """The run folder `out`, made (with its marker) or, with `overwrite`, replaced: only a run or a dataset is ever
    deleted. `resume` needs an existing run."""
    out = Path(out)
    if overwrite and resume:
        raise ValueError("--overwrite and --resume exclude each other")
    check_out(out)
    if out.exists() and any(out.iterdir()):
        if overwrite:
            remove_for_overwrite(out)
        elif not resume:
            raise FileExistsError(f"{out} already exists; pass --overwrite to replace it or --resume to continue it")
        elif recognise(out) != "run":
            raise FileExistsError(f"--resume {out}: not a wmrl run folder")
    out.mkdir(parents=True, exist_ok=True)
    if not (out / RUN_MARKER).exists():
        write_json(out / RUN_MARKER, {"kind": "wmrl-run", "created": time.strftime("%Y-%m-%d %H:%M:%S")})
    return out


def discard_if_unused(out: str | Path) -> bool:
    """After a command failed during set-up: remove the run folder it made if it holds nothing but set-up files
    (so the corrected rerun needs no --overwrite). True if removed."""
    out = Path(out)
    if out.is_symlink() or not out.is_dir() or recognise(out) != "run":
        return False
    if not {p.name for p in out.iterdir()} <= SETUP_FILES:
        return False
    shutil.rmtree(out)
    return True


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


# Settings that may differ between a run and its resumption (where and how fast, not what is computed).
RESUME_MAY_CHANGE = {"resume", "overwrite", "device", "threads", "progress", "wandb", "amp", "workers", "ckpt_every",
                     "log_every", "eval_every", "keep_every",
                     "out",  # a run folder copied or moved elsewhere resumes there
                     "dagger"}  # DAgger rounds may follow a finished BC run (rounds already recorded are kept)
BUDGETS = {"steps", "iterations", "epochs"}  # and every `*_steps`: may grow on resume (train longer), never shrink


def resume_differences(run_dir: Path, cfg: Any) -> dict[str, tuple[Any, Any]]:
    """The settings in which `cfg` differs from the run's saved config.yaml, as (saved, now), besides those a
    resumed run may change (`RESUME_MAY_CHANGE`, a budget that grows); empty when the run can be resumed with it."""
    path = Path(run_dir) / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: unreadable ({str(e).splitlines()[0]}); cannot check the resumed config") from None
    now = _plain(cfg)
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: not a mapping of settings; cannot check the resumed config")

    def grows(k):
        return (k in BUDGETS or k.endswith("_steps")) and isinstance(saved.get(k), int) and isinstance(now.get(k), int) and now[k] >= saved[k]

    return {k: (saved.get(k), now.get(k)) for k in sorted(set(saved) | set(now))
            if k not in RESUME_MAY_CHANGE and saved.get(k) != now.get(k) and not grows(k)}


def save_config(run_dir: Path, cfg: Any) -> None:
    """Write `config.yaml`; on `--resume`, refuse a config that differs from the saved one (besides
    `RESUME_MAY_CHANGE`) instead of rewriting it."""
    from wmrl.core.io import atomic_path

    path = run_dir / "config.yaml"
    if getattr(cfg, "resume", False) and path.exists():
        if diff := resume_differences(run_dir, cfg):
            shown = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(diff.items())[:4])
            raise ValueError(f"--resume {run_dir}: the config differs from the run's config.yaml ({shown}"
                             f"{', ...' if len(diff) > 4 else ''}); resume with the same settings or use a new --out")
    with atomic_path(path) as tmp:  # new, or the same settings (a longer budget at most) on resume
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


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records a run's Tracker wrote, in order (none for a run that logged nothing yet)."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def start_run(cfg: Any, out: str | Path | None = None) -> Path:
    """The one run set-up every command shares: `cfg.threads` torch threads (when the config has them and sets
    them), the run folder (`cfg.out`, or `out`; `--overwrite` / `--resume` as the config says) and its config.yaml,
    checked against the saved one on resume. Seeding stays with each algorithm (what it seeds is part of it)."""
    if getattr(cfg, "threads", None):
        torch.set_num_threads(cfg.threads)
    run = prepare_run_dir(cfg.out if out is None else out, getattr(cfg, "overwrite", False), getattr(cfg, "resume", False))
    save_config(run, cfg)
    return run
