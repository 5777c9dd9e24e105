"""`wmrl bench NAME [--json] [--quick] [--options KEY=VALUE ...]`: run a benchmark script from `benchmarks/` and print
its JSON (also written to `benchmarks/results/NAME.json` by the script)."""

from __future__ import annotations

import contextlib
import inspect
import json
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@dataclass
class BenchConfig:
    name: str = "replay"
    json: bool = True
    """Print one JSON object (always written to benchmarks/results/NAME.json too)."""
    quick: bool = False
    """Tiny sizes, for smoke tests."""
    options: tuple[str, ...] = ()
    """KEY=VALUE arguments of the benchmark's main(), e.g. `--options size=base device=cuda steps_scale=5`."""


def bench(cfg: BenchConfig) -> dict:
    available = sorted(p.stem.replace("_", "-") for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))
    if cfg.name not in available:
        raise ValueError(f"unknown benchmark {cfg.name!r}; valid: {', '.join(available)}")
    with contextlib.redirect_stdout(sys.stderr):  # libraries' log lines must not precede the JSON on stdout
        mod = runpy.run_path(str(BENCHMARKS / f"{cfg.name.replace('-', '_')}.py"), run_name="wmrl_bench")
    kwargs = {}
    for opt in cfg.options:
        key, sep, value = opt.partition("=")
        if not sep:
            raise ValueError(f"--options: expected KEY=VALUE, got {opt!r}")
        kwargs[key] = yaml.safe_load(value)  # numbers become numbers, words stay strings
    params = set(inspect.signature(mod["main"]).parameters) - {"quick"}
    if unknown := set(kwargs) - params:
        raise ValueError(f"--options: {cfg.name} has no option(s) {sorted(unknown)}; valid: {sorted(params) or 'none'}")
    with contextlib.redirect_stdout(sys.stderr):
        result = mod["main"](quick=cfg.quick, **kwargs)
    print(json.dumps(result, indent=None if cfg.json else 2))
    return result
