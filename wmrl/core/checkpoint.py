"""Model checkpoints: `model.safetensors` + `config.json` in a folder, written atomically. Never pickle: configs are
JSON, tensors are safetensors, so loading an untrusted checkpoint runs no code.

Training checkpoints are self-consistent: `commit_checkpoint(home, step, write)` fills a new folder
`home/ckpt-<step>`, records every file's SHA-256 and the step in its `manifest.json`, then switches the `home/last`
link to it with one atomic rename. A kill at any point leaves `last` at the previous complete checkpoint;
`resume_checkpoint` verifies the manifest and refuses (one line naming the file) anything missing or changed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Callable, TypeVar

import torch

from wmrl.core.io import atomic_path, write_json

C = TypeVar("C")


def save_pretrained(module: torch.nn.Module, config, path: str | Path) -> Path:
    """Writes `module`'s state dict and its dataclass `config` under the folder `path`."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    with atomic_path(path / "model.safetensors") as tmp:
        save_file(state, str(tmp))
    with atomic_path(path / "config.json") as tmp:
        tmp.write_text(json.dumps(dataclasses.asdict(config), indent=2))
    return path


def read_config(path: str | Path, cls: type[C], expect: C | None = None, what: str = "checkpoint",
                absent: dict | None = None) -> C:
    """The dataclass config of the checkpoint folder `path`; if `expect` is given, a different config is refused
    with the differing fields listed. `absent`: values for fields a checkpoint written before they existed lacks,
    where the dataclass default would describe a different model."""
    path = Path(path)
    if not (path / "config.json").exists() or not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"{path}: not a {what} (config.json and model.safetensors needed)")
    # the files a model is loaded from; a resume checks the whole folder (optimiser states too), so weights copied
    # without the optimiser state (e.g. back from a lent GPU) still load for evaluation
    verify_checkpoint(path, only=("config.json", "model.safetensors"))
    try:
        raw = json.loads((path / "config.json").read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path / 'config.json'}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path / 'config.json'}: expected a JSON object of settings")
    for k, v in (absent or {}).items():
        raw.setdefault(k, v)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ValueError(f"{path}: config.json has fields {unknown} that {cls.__name__} does not know: another kind of checkpoint?")
    for f in dataclasses.fields(cls):  # JSON has lists where the dataclass has tuples
        if f.name in raw and isinstance(f.default, tuple):
            raw[f.name] = tuple(raw[f.name])
    try:
        cfg = cls(**raw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path / 'config.json'}: {e}") from None
    if expect is not None and dataclasses.asdict(expect) != dataclasses.asdict(cfg):
        diff = {k: (v, getattr(expect, k)) for k, v in dataclasses.asdict(cfg).items() if getattr(expect, k) != v}
        raise ValueError(f"{path}: checkpoint config differs from the requested one (checkpoint, requested): {diff}")
    return cfg


def load_state(module: torch.nn.Module, path: str | Path, device: str = "cpu") -> torch.nn.Module:
    from safetensors.torch import load_file

    f = Path(path) / "model.safetensors"
    try:
        state = load_file(str(f), device=device)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for truncated or corrupt files
        raise ValueError(f"{f}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"{f}: weights do not fit the model its config.json describes ({str(e).splitlines()[0]})") from None
    return module.to(device)


def resolve_checkpoint(path: str | Path) -> Path:
    """A run folder (its `checkpoints/last`), a checkpoint home (its `last`) or a checkpoint folder itself."""
    p = Path(path)
    for cand in (p / "checkpoints" / "last", p / "last"):
        if cand.exists() and (cand / "model.safetensors").exists():
            return cand
    return p


def save_train_state(ck: str | Path, step: int, optimizers: dict[str, torch.optim.Optimizer], **state) -> None:
    """What a training run needs to resume, next to its model checkpoint in `ck`: optimiser states, torch's RNG,
    the step and any JSON-able `state` (e.g. a replay's RNG state, elapsed seconds)."""
    ck = Path(ck)
    for name, opt in optimizers.items():
        with atomic_path(ck / f"optim_{name}.pt") as tmp:
            torch.save(opt.state_dict(), tmp)
    with atomic_path(ck / "rng_torch.pt") as tmp:
        torch.save(torch.get_rng_state(), tmp)
    write_json(ck / "train_state.json", {"step": step, **state})  # written last: its presence marks a complete save


def load_train_state(ck: str | Path, optimizers: dict[str, torch.optim.Optimizer], device: str = "cpu") -> dict:
    """Restores optimisers and torch's RNG from `ck` (tensors only: weights_only) and returns the JSON state."""
    ck = Path(ck)
    for name, opt in optimizers.items():
        opt.load_state_dict(torch.load(ck / f"optim_{name}.pt", weights_only=True, map_location=device))
    torch.set_rng_state(torch.load(ck / "rng_torch.pt", weights_only=True))
    return json.loads((ck / "train_state.json").read_text())


# ---------------------------------------------------------------------- self-consistent training checkpoints
log = logging.getLogger("wmrl.checkpoint")
MANIFEST = "manifest.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_checkpoint(ck: str | Path, only: tuple[str, ...] | None = None) -> dict | None:
    """The manifest of checkpoint folder `ck` after checking every file it lists (or the `only` ones among them)
    against its hash; None for a folder without a manifest (a model saved on its own). A missing or changed file:
    ValueError naming it."""
    ck = Path(ck)
    if not (ck / MANIFEST).exists():
        return None
    try:
        man = json.loads((ck / MANIFEST).read_text())
        files, step = man["files"], int(man["step"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{ck / MANIFEST}: unreadable checkpoint manifest ({e})") from None
    for name, digest in files.items():
        if only is not None and name not in only:
            continue
        f = ck / name
        if not f.is_file():
            raise ValueError(f"{f}: missing from the step-{step} checkpoint its manifest describes")
        if _sha256(f) != digest:
            raise ValueError(f"{f}: changed since the step-{step} checkpoint was saved (hash mismatch)")
    return man


def commit_checkpoint(home: str | Path, step: int, write: Callable[[Path], None], keep: int = 2) -> Path:
    """`write(folder)` fills a fresh folder; then the manifest (step + SHA-256 of each file, those in sub-folders
    too, e.g. a saved replay), then `home/last` is switched to it by one atomic rename. The newest `keep` committed
    checkpoints are kept."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    name, n = f"ckpt-{step:09d}", 0
    while (home / name).exists():  # the same step saved again: a new folder too, so `last` is never without one
        n += 1
        name = f"ckpt-{step:09d}.{n}"
    tmp = home / f".{name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)  # every file lands through `atomic_path`, fsynced
    files = {p.relative_to(tmp).as_posix(): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    write_json(tmp / MANIFEST, {"step": step, "files": files})
    final = home / name
    os.rename(tmp, final)
    _switch_last(home, name)
    committed = sorted((p for p in home.glob("ckpt-*") if _CKPT.fullmatch(p.name)),
                       key=lambda p: tuple(int(x) for x in _CKPT.fullmatch(p.name).groups(default="0")))
    for old in committed[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


_CKPT = re.compile(r"ckpt-(\d{9})(?:\.(\d+))?")


def _switch_last(home: Path, name: str) -> None:
    link = home / "last"
    if link.exists() and not link.is_symlink():
        shutil.rmtree(link)  # a `last` folder from before self-consistent checkpoints
    tmp = home / ".last.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(name)
    os.replace(tmp, link)  # atomic: `last` names the old or the new checkpoint, never half of each
    fd = os.open(home, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resume_checkpoint(home: str | Path) -> tuple[Path | None, int]:
    """(the verified `home/last`, its step) to resume from, or (None, 0) when nothing was committed yet.
    Refuses, with one line naming the file, a checkpoint that is incomplete, changed or from an older layout."""
    home = Path(home)
    last = home / "last"
    if not last.exists():
        if last.is_symlink():
            raise ValueError(f"{last}: points to a checkpoint that is gone; cannot resume")
        return None, 0
    man = verify_checkpoint(last)
    if man is None:
        raise ValueError(f"{last}: no {MANIFEST}, so its files cannot be checked against each other (an older wmrl "
                         f"or an interrupted save); resume refused")
    state_step = json.loads((last / "train_state.json").read_text()).get("step") if (last / "train_state.json").exists() else None
    if state_step is not None and state_step != man["step"]:
        raise ValueError(f"{last / 'train_state.json'}: step {state_step} but the manifest says {man['step']}; resume refused")
    log.warning("resuming from step %d (%s)", man["step"], last.resolve())
    return last, int(man["step"])
