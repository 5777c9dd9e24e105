"""`wmrl`: one entry point. Each subcommand is a dataclass config parsed by tyro; `--config FILE.yaml` supplies
defaults that flags then override.

    wmrl demo | collect | eval | train-wm | train-policy | imagine | rank | datasets make | offline | finetune | pgd | deploy |
         serve-robot | robot-keys | sysid | calibrate-twin | tasks | bench NAME [--json]
"""

from __future__ import annotations

import json
import runpy
import sys
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"


@dataclass
class TasksConfig:
    json: bool = False
    """Print the task list as JSON."""


@dataclass
class BenchConfig:
    name: str = "replay"
    json: bool = True
    """Print one JSON object (always written to benchmarks/results/NAME.json too)."""
    quick: bool = False
    """Tiny sizes, for smoke tests."""
    options: tuple[str, ...] = ()
    """KEY=VALUE arguments of the benchmark's main(), e.g. `--options size=base device=cuda steps_scale=5`."""


def _tasks(cfg: TasksConfig) -> dict:
    import sim

    ids = sim.env_ids()
    if cfg.json:
        print(json.dumps(ids))
    else:
        for i in ids:
            print(i)
    return {"tasks": ids}


def _bench(cfg: BenchConfig) -> dict:
    available = sorted(p.stem.replace("_", "-") for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))
    if cfg.name not in available:
        raise ValueError(f"unknown benchmark {cfg.name!r}; valid: {', '.join(available)}")
    mod = runpy.run_path(str(BENCHMARKS / f"{cfg.name.replace('-', '_')}.py"), run_name="wmrl_bench")
    import inspect

    import yaml

    kwargs = {}
    for opt in cfg.options:
        key, sep, value = opt.partition("=")
        if not sep:
            raise ValueError(f"--options: expected KEY=VALUE, got {opt!r}")
        kwargs[key] = yaml.safe_load(value)  # numbers become numbers, words stay strings
    params = set(inspect.signature(mod["main"]).parameters) - {"quick"}
    if unknown := set(kwargs) - params:
        raise ValueError(f"--options: {cfg.name} has no option(s) {sorted(unknown)}; valid: {sorted(params) or 'none'}")
    result = mod["main"](quick=cfg.quick, **kwargs)
    print(json.dumps(result, indent=None if cfg.json else 2))
    return result


def _offline(cfg):
    from wmrl.rl.ravl import train_offline

    result = train_offline(cfg)
    return {k: v for k, v in result.items() if k != "curve"}


def _pgd(cfg):
    from wmrl.rl.pgd import train_pgd

    return {k: v for k, v in train_pgd(cfg).items() if k != "curve"}


def _calibrate(cfg):
    from real_robot.calibration import calibrate

    return {k: v for k, v in calibrate(cfg).items() if k != "curve"}


def _finetune(cfg):
    from wmrl.rl.wsrl import finetune

    return {k: v for k, v in finetune(cfg).items() if k != "curve"}


def _commands() -> dict[str, tuple[type, Callable[[Any], Any], str]]:
    from wmrl.commands.collect import CollectConfig, collect
    from wmrl.commands.demo import DemoConfig, run_demo
    from wmrl.commands.evaluate import EvalConfig, run_eval
    from wmrl.commands.train_policy import TrainPolicyConfig, train_policy
    from wmrl.eval.rank import RankConfig, run_rank
    from wmrl.rl.imagine import ImagineConfig, imagine
    from world_models.video.train import TrainWMConfig, train_world_model
    from wmrl.datasets.offline import MakeDatasetConfig, make_dataset
    from wmrl.rl.ravl import OfflineConfig
    from real_robot.calibration import CalibrateConfig, SysIdConfig, record_sysid
    from wmrl.commands.deploy import DeployConfig, deploy
    from wmrl.commands.robot_keys import RobotKeysConfig, robot_keys
    from wmrl.commands.serve_robot import ServeRobotConfig, serve_robot_command
    from wmrl.rl.pgd import PGDConfig
    from wmrl.rl.wsrl import FinetuneConfig

    return {
        "demo": (DemoConfig, run_demo, "collect data, evaluate policies, write a report (the main job)"),
        "collect": (CollectConfig, collect, "record scripted-expert episodes into a LeRobot v3 dataset"),
        "eval": (EvalConfig, run_eval, "evaluate a policy on a task; metrics, videos, plots"),
        "train-wm": (TrainWMConfig, train_world_model, "train the video world model on a LeRobot v3 dataset"),
        "train-policy": (TrainPolicyConfig, train_policy, "behaviour-clone the VLA policy on LeRobot v3 datasets"),
        "imagine": (ImagineConfig, imagine, "RL (GRPO or PPO) of a VLA policy inside a video world model"),
        "rank": (RankConfig, run_rank, "rank policies in the world model and in the true simulator; agreement"),
        "datasets-make": (MakeDatasetConfig, make_dataset, "make a D4RL-style state dataset (SAC locally, qpos/qvel)"),
        "offline": (OfflineConfig, _offline, "offline RL: ravl | mopo | mbpo | sac-n | td3bc | iql"),
        "finetune": (FinetuneConfig, _finetune, "offline-to-online fine-tuning: wsrl | naive | naive-retain"),
        "pgd": (PGDConfig, _pgd, "policy-guided diffusion: td3bc | iql on synthetic + real data"),
        "deploy": (DeployConfig, deploy, "run a policy on a robot arm: safety layer, sync | async | aligned chunks"),
        "serve-robot": (ServeRobotConfig, serve_robot_command, "serve a robot arm with server-side safety (loopback, or CURVE keys)"),
        "robot-keys": (RobotKeysConfig, robot_keys, "make CURVE key pairs for an authenticated robot link"),
        "sysid": (SysIdConfig, record_sysid, "record system-identification episodes on the sim-real arm"),
        "calibrate-twin": (CalibrateConfig, _calibrate, "fit the digital twin's parameters to logged robot episodes (CMA-ES)"),
        "tasks": (TasksConfig, _tasks, "list the registered tasks"),
        "bench": (BenchConfig, _bench, "run a benchmark from benchmarks/ and print its JSON"),
    }


def _from_dict(cls: type, raw: dict, where: str) -> Any:
    """Build a (possibly nested) config dataclass from a YAML mapping; unknown keys are errors."""
    known = {f.name: f for f in fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; valid: {sorted(known)}")
    kw = {}
    for k, v in raw.items():
        f = known[k]
        if isinstance(v, dict) and callable(f.default_factory) and is_dataclass(f.default_factory()):
            kw[k] = _from_dict(type(f.default_factory()), v, f"{where}.{k}")
        else:
            kw[k] = Path(v) if "Path" in str(f.type) and v is not None else v
    return cls(**kw)


def _defaults_from_yaml(cls: type, path: str) -> Any:
    return _from_dict(cls, yaml.safe_load(Path(path).read_text()) or {}, path)


def main(argv: list[str] | None = None) -> int:
    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
    cmds = _commands()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: wmrl COMMAND [--help] [--config FILE.yaml] [flags]\n\ncommands:")
        for name, (_, _, doc) in cmds.items():
            print(f"  {name.replace('datasets-make', 'datasets make'):<14}{doc}")
        return 0
    name, rest = argv[0], argv[1:]
    if name == "datasets" and rest[:1] == ["make"]:  # `wmrl datasets make ...`
        name, rest = "datasets-make", rest[1:]
    if name not in cmds:
        print(f"error: unknown command {name!r}; valid: {', '.join(cmds)}", file=sys.stderr)
        return 2
    cls, fn, doc = cmds[name]
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
        except (IndexError, OSError, ValueError, TypeError) as e:
            print(f"error: --config: {e}", file=sys.stderr)
            return 2
        rest = rest[:i] + rest[i + 2 :]
    cfg = tyro.cli(cls, args=rest, default=default, prog=f"wmrl {name}", description=doc)
    try:
        result = fn(cfg)
    except (ValueError, OSError, KeyError, RuntimeError, FloatingPointError, ConnectionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if name not in ("tasks", "bench") and isinstance(result, dict):
        print(json.dumps({k: v for k, v in result.items() if k != "videos"}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
