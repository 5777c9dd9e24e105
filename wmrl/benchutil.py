"""Shared by the scripts in benchmarks/: machine description, medians, result files."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform()}


def device_name(device: str) -> str:
    """What `device` is, for a result that was trained on one machine and measured on another: the GPU's name for
    a CUDA device, else the device string."""
    import torch

    return torch.cuda.get_device_name() if "cuda" in device and torch.cuda.is_available() else device


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def env_steps_per_s(env, actions, reset_seed: int = 0) -> float:
    """Control steps per second of one env under `actions`, resetting (seeded by the step index) when an episode
    ends. The first reset makes the renderer's GL context and is not timed."""
    env.reset(seed=reset_seed)
    t = time.perf_counter()
    for i, a in enumerate(actions):
        if any(env.step(a)[2:4]):
            env.reset(seed=i)
    return len(actions) / (time.perf_counter() - t)


def tabletop_steps_per_s(steps: int, seed: int = 0) -> float:
    """Our tabletop (push-red, both 64x64 cameras) under uniform random actions: the reference each suite's
    throughput is compared with in the same run."""
    import numpy as np

    import sim

    env = sim.make_env("push-red", cameras=("front", "wrist")).unwrapped
    try:
        return env_steps_per_s(env, np.random.default_rng(seed).uniform(-1, 1, (steps, 4)).astype(np.float32))
    finally:
        env.close()


def portable(obj, roots: tuple[str, ...] | None = None):
    """A result as it can be published: paths inside the repository or the working directory made relative (a
    result never names the machine it ran on) and non-finite numbers as null (strict JSON)."""
    if roots is None:
        roots = tuple(dict.fromkeys(str(p) + os.sep for p in (RESULTS.parent.parent, Path.cwd().resolve())))
    if isinstance(obj, dict):
        return {k: portable(v, roots) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [portable(v, roots) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, str):
        for r in roots:
            obj = obj.replace(r, "")
    return obj


def timed_stages() -> tuple[dict, Callable]:
    """(minutes, stage): `stage(key, fn)` runs `fn()`, records its wall time in `minutes[key]` and returns its value."""
    minutes: dict = {}

    def stage(key: str, fn):
        t = time.time()
        out = fn()
        minutes[key] = (time.time() - t) / 60
        return out

    return minutes, stage


def on_off(value, name: str) -> bool | None:
    """A benchmark's on | off option (the options parser may have read it as a bool already; empty: None, the
    default of whatever it switches)."""
    if isinstance(value, bool):
        return value
    if value not in ("", "on", "off", None):
        raise ValueError(f"{name}: expected on or off (or nothing: the default), got {value!r}")
    return None if not value else value == "on"


def on_off_word(value: bool | None) -> str:
    """`on_off`'s value as the option's word (empty for None)."""
    return "" if value is None else "on" if value else "off"


def finish(name: str, result: dict, quick: bool, command: str | None = None) -> dict:
    result = portable(result)
    result = {"benchmark": name, **result, "machine": machine(),
              "command": command or f"wmrl bench {name} --json" + (" --quick" if quick else ""),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if not quick:  # quick runs are smoke tests; they never overwrite the committed numbers
        RESULTS.mkdir(exist_ok=True)
        tmp = RESULTS / f".{name}.json.tmp"
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(tmp, RESULTS / f"{name}.json")
    return result



def world_model_run_folders(ref: str | Path, work: Path) -> tuple[Path, Path]:
    """(world model run, dataset) of a world-model benchmark tag (a folder of `work`, with model/ and data/) or of a
    `wmrl demo` run folder (world_model/ and dataset/)."""
    for model, data in ((work / ref / "model", work / ref / "data"), (Path(ref) / "world_model", Path(ref) / "dataset")):
        if (model / "checkpoints").exists() and (data / "meta" / "info.json").exists():
            return model, data
    raise ValueError(f"{str(ref)!r}: neither a folder of {work.parent.name}/{work.name} (model/, data/) nor a demo run folder "
                     "(world_model/, dataset/)")


_TINY_BUILT: dict[bool, Path] = {}  # this process's one build of each tiny recipe (it is the same every time)


def tiny_world_model(work: Path, long: bool = False) -> Path:
    """Quick mode of the world-model benchmarks: a tiny push-red dataset (`work/data`) and world model (`work/model`),
    a smoke test of a pipeline, not a result. Returns `work`. With `long`, the episodes are near-success failures that
    run the whole 80 steps (so the held-out episode holds 16-step windows) and the frame heads are refitted on
    rollouts. Each recipe is built once per process and copied after that (its seeds are fixed: the copy is what a
    second build would give; the model's config still names the first build's data, which stays where it is)."""
    import shutil
    import tempfile

    from wmrl.commands.collect import CollectConfig, collect
    from world_models.video.train import TrainWMConfig, train_world_model

    built = _TINY_BUILT.get(long)
    if built is None or not (built / "model").exists():
        built = Path(tempfile.mkdtemp(prefix="wmrl-tiny-world-model-"))
        collect(CollectConfig(task="push-red", episodes=10 if long else 8, out=built / "data",
                              failures=1.0 if long else 0.5, num_envs=1), progress=False)
        train_world_model(TrainWMConfig(data=built / "data", out=built / "model", size="tiny", ae_steps=20,
                                        state_steps=10 if long else 20, dyn_steps=10 if long else 20, unroll_steps=0,
                                        batch_size=8, videos=0, change_mask_steps=5, change_mask_windows=2,
                                        head_rollout_steps=20 if long else 0), progress=False)
        _TINY_BUILT[long] = built
    for part in ("data", "model"):
        shutil.copytree(built / part, work / part, dirs_exist_ok=True)
    return work


def success_over_seeds(policy, env, episodes: int, seeds: int = 3) -> dict:
    """True success of `policy` in `env` over `seeds` evaluation seeds (10000 + 100000 k; the policy benchmarks'
    shared layouts), pooled with a 95% Wilson interval, per seed, and the share of *stalled* episodes: failed with
    the hand frozen (< 2 mm of end-effector motion, `observation.state[5:8]`, over the last 20 steps). `outcomes`:
    each episode's success in layout order (the same layouts for any policy: paired comparisons)."""
    import numpy as np

    from wmrl.eval import evaluate, wilson_interval

    stalled, per, outcomes = [], [], []

    def stall(ep: dict) -> None:
        ee = np.asarray(ep["observation.state"])[-20:, 5:8]
        outcomes.append(bool(np.asarray(ep["next.success"]).any()))
        stalled.append(not outcomes[-1] and np.linalg.norm(ee[-1] - ee[0]) < 0.002)

    seeds = min(seeds, episodes)  # fewer episodes than evaluation seeds: one episode per seed
    for k in range(seeds):
        n = episodes // seeds + (k < episodes % seeds)
        r = evaluate(policy, env, n, seed=10_000 + 100_000 * k, progress=False, on_episode=stall)
        per.append((round(r.pc_success * n / 100), n))
    s, n = sum(p[0] for p in per), sum(p[1] for p in per)
    return {"success": s / n, "ci": list(wilson_interval(s, n)), "per_seed": [a / b for a, b in per], "episodes": n,
            "stalled": float(np.mean(stalled)), "outcomes": outcomes}


def success_in_task(policy, task: str, episodes: int, cameras: tuple[str, ...] = ()) -> dict:
    """`success_over_seeds` in a fresh single env of `task` rendering `cameras` (none: state only), closed after."""
    import sim

    env = sim.make_env(task, cameras=tuple(cameras))
    try:
        return success_over_seeds(policy, env, episodes)
    finally:
        env.close()
