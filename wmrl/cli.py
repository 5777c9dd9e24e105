"""`wmrl`: one entry point. Each subcommand is a dataclass config parsed by tyro; `--config FILE.yaml` supplies
defaults that flags then override.

    wmrl demo | collect | eval | train-wm | post-train-wm | train-policy | imagine | rank | datasets make | offline | finetune | pgd | deploy |
         serve-robot | robot-keys | sysid | calibrate-twin | tasks | bench NAME [--json]
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

# name -> (module in wmrl/commands, its config class, its function, one line of help). Modules are imported only for
# the command that runs (and for `wmrl --help`), so `wmrl tasks` does not pay for torch.
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "demo": ("demo", "DemoConfig", "run_demo", "collect data, evaluate policies, write a report (the main job)"),
    "collect": ("collect", "CollectConfig", "collect", "record scripted-expert episodes into a LeRobot v3 dataset"),
    "eval": ("evaluate", "EvalConfig", "run_eval", "evaluate a policy on a task; metrics, videos, plots"),
    "train-wm": ("train_wm", "TrainWMConfig", "train_world_model", "train the video world model on a LeRobot v3 dataset"),
    "post-train-wm": ("post_train_wm", "PostTrainWMConfig", "post_train_world_model",
                      "post-train a video world model on its own long rollouts (PersistWorld: DiffusionNFT or self-forcing)"),
    "train-policy": ("train_policy", "TrainPolicyConfig", "train_policy", "behaviour-clone the VLA policy on LeRobot v3 datasets"),
    "imagine": ("imagine", "ImagineConfig", "imagine", "RL (GRPO or PPO) of a VLA policy inside a video world model"),
    "rank": ("rank", "RankConfig", "run_rank", "rank policies in the world model and in the true simulator; agreement"),
    "datasets-make": ("datasets_make", "MakeDatasetConfig", "make_dataset", "make a D4RL-style state dataset (SAC locally, qpos/qvel)"),
    "offline": ("offline", "OfflineConfig", "train_offline", "offline RL: ravl | mopo | mbpo | sac-n | edac | td3bc | iql"),
    "finetune": ("finetune", "FinetuneConfig", "finetune", "offline-to-online fine-tuning: wsrl | naive | naive-retain"),
    "pgd": ("pgd", "PGDConfig", "train_pgd", "policy-guided diffusion: td3bc | iql on synthetic + real data"),
    "deploy": ("deploy", "DeployConfig", "deploy", "run a policy on a robot arm: safety layer, sync | async | aligned chunks"),
    "serve-robot": ("serve_robot", "ServeRobotConfig", "serve_robot_command", "serve a robot arm with server-side safety (loopback, or CURVE keys)"),
    "robot-keys": ("robot_keys", "RobotKeysConfig", "robot_keys", "make CURVE key pairs for an authenticated robot link"),
    "sysid": ("sysid", "SysIdConfig", "record_sysid", "record system-identification episodes on the sim-real arm"),
    "calibrate-twin": ("calibrate_twin", "CalibrateConfig", "calibrate", "fit the digital twin's parameters to logged robot episodes (CMA-ES)"),
    "tasks": ("tasks", "TasksConfig", "tasks", "list the registered tasks"),
    "bench": ("bench", "BenchConfig", "bench", "run a benchmark from benchmarks/ and print its JSON"),
}


def load_command(name: str) -> tuple[type, Callable[[Any], Any], str]:
    """(config class, function, help) of a subcommand, importing its module from `wmrl.commands`."""
    module, config, fn, doc = COMMANDS[name]
    mod = importlib.import_module(f"wmrl.commands.{module}")
    return getattr(mod, config), getattr(mod, fn), doc


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """`value` from YAML as the field type `tp`, or a ValueError naming the key: the same types flags accept."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, a, where)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if errors else f"{where}: null is not allowed")
    if tp is Any:
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise ValueError(f"{where}: expected {len(args)} values, got {len(value)}")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args or [Any] * len(value))))
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        return _from_dict(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where}: expected a path, got {value!r}")
        return Path(value)
    return value


def _from_dict(cls: type, raw: dict, where: str) -> Any:
    """Build a (possibly nested) config dataclass from a YAML mapping; unknown keys and values of the wrong type
    are errors naming the key."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping of settings, got {type(raw).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(map(str, unknown))}; valid: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(v, hints[k], f"{where}: {k}") for k, v in raw.items()})


# Ranges every command shares, checked before any work (a command checks its own fields too).
AT_LEAST_ONE = ("num_envs", "image_size", "episodes", "batch_size", "workers")
UNIT_INTERVAL = ("holdout", "failures", "perturbed")


def check_numbers(cfg: Any, where: str = "") -> None:
    """NaN in any number, and the shared ranges above, are refused with the flag named."""
    from real_robot.safety import SafetyConfig

    if isinstance(cfg, SafetyConfig):
        return  # validated by itself (inf there needs --unsafe)
    for f in fields(cfg):
        v, flag = getattr(cfg, f.name), f"--{where}{f.name.replace('_', '-')}"
        if is_dataclass(v):
            check_numbers(v, f"{where}{f.name}.")
            continue
        vals = v if isinstance(v, tuple) else (v,)
        for x in vals:
            if isinstance(x, float) and math.isnan(x):
                raise ValueError(f"{flag}: NaN is not a setting")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if f.name in AT_LEAST_ONE and v < 1:
            raise ValueError(f"{flag} must be >= 1, got {v}")
        if f.name in UNIT_INTERVAL and not 0 <= v <= 1:
            raise ValueError(f"{flag} must be in [0, 1], got {v}")
        if f.name in ("noise", "seed") and v < 0 or (isinstance(v, float) and math.isinf(v) and f.name == "noise"):
            raise ValueError(f"{flag} must be a finite number >= 0, got {v}")


def _defaults_from_yaml(cls: type, path: str) -> Any:
    return _from_dict(cls, yaml.safe_load(Path(path).read_text()) or {}, path)


def main(argv: list[str] | None = None) -> int:
    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: wmrl COMMAND [--help] [--config FILE.yaml] [flags]\n\ncommands:")
        for name, (_, _, _, doc) in COMMANDS.items():
            print(f"  {name.replace('datasets-make', 'datasets make'):<15} {doc}")
        return 0
    name, rest = argv[0], argv[1:]
    if name == "datasets" and rest[:1] == ["make"]:  # `wmrl datasets make ...`
        name, rest = "datasets-make", rest[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    cls, fn, doc = load_command(name)
    policy_field = next((f for f in fields(cls) if f.name == "policy"), None)
    if "--policy" in rest and policy_field is not None and callable(policy_field.default_factory):
        # `--policy NAME` is short for `--policy.type NAME` where `policy` is a nested PolicyConfig
        rest[rest.index("--policy")] = "--policy.type"
    if name == "bench" and rest and not rest[0].startswith("-"):
        rest = ["--name", rest[0], *rest[1:]]
    default = None
    if "--config" in rest:
        i = rest.index("--config")
        try:
            default = _defaults_from_yaml(cls, rest[i + 1])
        except (IndexError, OSError, ValueError, TypeError, yaml.YAMLError) as e:
            print(f"error: --config: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
        rest = rest[:i] + rest[i + 2 :]
    cfg = tyro.cli(cls, args=rest, default=default, prog=f"wmrl {name}", description=doc)
    out = getattr(cfg, "out", None)
    fresh = isinstance(out, Path) and not out.exists()
    try:
        check_numbers(cfg)
        result = fn(cfg)
    except (ValueError, OSError, KeyError, RuntimeError, FloatingPointError, ConnectionError) as e:
        if fresh:
            from wmrl.core.run import discard_if_unused

            discard_if_unused(out)  # a run that failed during set-up leaves no folder behind
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    if name not in ("tasks", "bench") and isinstance(result, dict):
        # per-epoch curves and video paths are in the run folder; the printed line is the summary
        print(json.dumps({k: v for k, v in result.items() if k not in ("videos", "curve")}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
