"""Model checkpoints: `model.safetensors` + `config.json` in a folder, written atomically. Never pickle: configs are
JSON, tensors are safetensors, so loading an untrusted checkpoint runs no code."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TypeVar

import torch

from wmrl.core.io import atomic_path

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


def read_config(path: str | Path, cls: type[C], expect: C | None = None, what: str = "checkpoint") -> C:
    """The dataclass config of the checkpoint folder `path`; if `expect` is given, a different config is refused
    with the differing fields listed."""
    path = Path(path)
    if not (path / "config.json").exists() or not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"{path}: not a {what} (config.json and model.safetensors needed)")
    raw = json.loads((path / "config.json").read_text())
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ValueError(f"{path}: config.json has fields {unknown} that {cls.__name__} does not know: another kind of checkpoint?")
    for f in dataclasses.fields(cls):  # JSON has lists where the dataclass has tuples
        if f.name in raw and isinstance(f.default, tuple):
            raw[f.name] = tuple(raw[f.name])
    cfg = cls(**raw)
    if expect is not None and dataclasses.asdict(expect) != dataclasses.asdict(cfg):
        diff = {k: (v, getattr(expect, k)) for k, v in dataclasses.asdict(cfg).items() if getattr(expect, k) != v}
        raise ValueError(f"{path}: checkpoint config differs from the requested one (checkpoint, requested): {diff}")
    return cfg


def load_state(module: torch.nn.Module, path: str | Path, device: str = "cpu") -> torch.nn.Module:
    from safetensors.torch import load_file

    module.load_state_dict(load_file(str(Path(path) / "model.safetensors"), device=device))
    return module.to(device)


def resolve_checkpoint(path: str | Path) -> Path:
    """A run folder (its `checkpoints/last`) or a checkpoint folder itself."""
    p = Path(path)
    return p / "checkpoints" / "last" if (p / "checkpoints" / "last").exists() else p


def save_train_state(ck: str | Path, step: int, optimizers: dict[str, torch.optim.Optimizer], **state) -> None:
    """What a training run needs to resume, next to its model checkpoint in `ck`: optimiser states, torch's RNG,
    the step and any JSON-able `state` (e.g. a replay's RNG state, elapsed seconds)."""
    from wmrl.core.io import write_json

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
