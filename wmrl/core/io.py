"""Atomic file writes: write to a temporary file in the same folder, fsync, then rename over the target."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | Path):
    """Yields a temporary path next to `path`; on success it is renamed onto `path` (atomic on POSIX). The file
    gets the permissions a plain `open(path, "w")` would (mkstemp's 0600 is for the temporary name only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str | Path, obj) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, default=_json_default))


def _json_default(o):
    import numpy as np

    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer, np.bool_)):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# ---------------------------------------------------------------------- what --overwrite may delete
RUN_MARKER = "wmrl-run.json"  # written into every run folder by `wmrl.core.run.prepare_run_dir`
LEGACY_RUN_FILES = ("metrics.jsonl", "summary.json", "checkpoints", "report.html")


def recognise(path: str | Path) -> str | None:
    """'run' (a wmrl run folder), 'dataset' (a LeRobot v3 dataset) or None, by their metadata files."""
    path = Path(path)
    if (path / RUN_MARKER).is_file():
        return "run"
    if (path / "config.yaml").is_file() and any((path / f).exists() for f in LEGACY_RUN_FILES):
        return "run"  # made before the marker existed
    try:
        info = json.loads((path / "meta" / "info.json").read_text())
    except (OSError, ValueError):
        return None
    return "dataset" if isinstance(info, dict) and "codebase_version" in info else None


def check_out(out: str | Path) -> None:
    """An output folder that can exist: not a file, and no file where a parent folder should be."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out}: exists and is not a folder")
    if any(p.exists() and not p.is_dir() for p in out.parents):
        raise FileExistsError(f"--out {out}: a parent of it is a file, not a folder")


def remove_for_overwrite(path: str | Path) -> None:
    """Delete `path` for `--overwrite`, only if it is a run or a dataset (and not a link); anything else is refused
    and left untouched."""
    import shutil

    path = Path(path)
    if path.is_symlink():
        raise FileExistsError(f"{path} is a symlink; --overwrite does not delete through links")
    if not path.exists():
        return
    if not path.is_dir():
        raise FileExistsError(f"{path} is a file, not a run or dataset folder; not replaced")
    if recognise(path) is None:
        raise FileExistsError(f"{path} is neither a wmrl run nor a LeRobot dataset; --overwrite refuses to delete it "
                              f"(remove it yourself, or choose another --out)")
    shutil.rmtree(path)
