"""Digital-twin calibration: fit `TwinParams` to logged episodes of the real cell (system identification by replay).

`wmrl calibrate-twin --logs DIR --out twin.yaml`. Each logged episode (LeRobot v3: `observation.state`, the joint
commands actually sent as `action`, the cell's `layout_seed`, and `observation.environment_state` when the cubes are
tracked) is replayed open-loop in the twin under candidate parameters; the objective is the mean squared error
between replayed and logged trajectories (arm state standardised per dimension, cube positions in centimetres).
CMA-ES (Hansen 2016; the `cma` package) searches the identifiable parameters in a normalised log space inside their
physical bounds (`TwinParams.IDENTIFIABLE`), starting from nominal. `wmrl deploy` datasets carry the same fields,
but a real-time robot steps on its own clock, so replaying them per control step is only approximate; dedicated
system-identification logs (`collect_logs`) replay exactly.

Writes twin.yaml (a full `TwinParams`: `TabletopEnv(twin=TwinParams.from_dict(...))` uses it) and, beside it,
calibration.json: the fitted values, trajectory error before (nominal twin) and after, the search curve.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE

REQUIRED = (OBS_STATE, ACTION, "layout_seed")
CUBE_SCALE = 0.01  # m: cube positions count in centimetres
DEFAULT_PARAMS = ("arm_damping", "arm_kp", "latency_s")  # cube_mass, cube_friction need contact-rich logs


@dataclass
class CalibrateConfig:
    logs: Path = Path("runs/deploy/dataset")
    out: Path = Path("twin.yaml")
    params: tuple[str, ...] = DEFAULT_PARAMS
    generations: int = 30
    popsize: int = 10
    sigma0: float = 0.3  # CMA-ES step size in the normalised [0, 1] parameter box
    max_episodes: int = 8
    seed: int = 0
    progress: bool = True


def load_logs(path: Path, max_episodes: int = 0) -> tuple[str, list[dict]]:
    """The task name and episodes of a calibration log; a clear error lists any missing field."""
    from wmrl.datasets import LeRobotV3Dataset

    path = Path(path)
    meta_file = path / "meta" / "wmrl.json"
    if not meta_file.exists():
        raise FileNotFoundError(f"{path}: not a wmrl LeRobot v3 dataset (no meta/wmrl.json)")
    task = json.loads(meta_file.read_text()).get("task")
    ds = LeRobotV3Dataset(path)
    first = ds.episode(0, decode=False)
    missing = [k for k in REQUIRED if k not in first] + ([] if task else ["task (meta/wmrl.json)"])
    if missing:
        raise ValueError(f"{path}: calibration logs need {', '.join(REQUIRED)} and the task name; missing: "
                         f"{', '.join(missing)}")
    n = ds.num_episodes if not max_episodes else min(max_episodes, ds.num_episodes)
    eps = []
    for i in range(n):
        e = ds.episode(i, decode=False)
        eps.append({OBS_STATE: np.asarray(e[OBS_STATE], np.float64), ACTION: np.asarray(e[ACTION], np.float64),
                    "layout_seed": int(np.asarray(e["layout_seed"]).reshape(-1)[0]),
                    OBS_ENV_STATE: np.asarray(e[OBS_ENV_STATE], np.float64) if OBS_ENV_STATE in e else None})
    return task, eps


def replay(env, twin, ep: dict) -> tuple[np.ndarray, np.ndarray]:
    """Replay the logged commands in `env` (control="joint") from the logged layout under `twin`."""
    obs, _ = env.reset(seed=ep["layout_seed"], options={"twin": twin})
    states, env_states = [obs[OBS_STATE]], [obs[OBS_ENV_STATE]]
    for a in ep[ACTION][:-1]:  # the final frame's action is padding
        obs, *_ = env.step(a)
        states.append(obs[OBS_STATE])
        env_states.append(obs[OBS_ENV_STATE])
    return np.asarray(states, np.float64), np.asarray(env_states, np.float64)


def trajectory_error(env, twin, episodes: list[dict], scale: np.ndarray, cubes: bool = True) -> dict:
    """Mean squared replay error (arm state in units of its logged std; cubes in cm, when `cubes` and tracked) and
    the hand's RMSE in mm."""
    arm, cube, ee = [], [], []
    for ep in episodes:
        s, e = replay(env, twin, ep)
        arm.append(np.mean(((s - ep[OBS_STATE]) / scale) ** 2))
        ee.append(np.mean(np.sum((s[:, 5:8] - ep[OBS_STATE][:, 5:8]) ** 2, axis=1)))
        if cubes and ep[OBS_ENV_STATE] is not None:
            cube.append(np.mean(((e[:, :9] - ep[OBS_ENV_STATE][:, :9]) / CUBE_SCALE) ** 2))
    total = float(np.mean(arm) + (np.mean(cube) if cube else 0.0))
    return {"objective": total, "arm": float(np.mean(arm)), "cubes": float(np.mean(cube)) if cube else None,
            "ee_rmse_mm": float(1000 * math.sqrt(np.mean(ee)))}


class ParamBox:
    """x in [0, 1]^d <-> parameter values: log-uniform within positive bounds, linear where the lower bound is 0."""

    def __init__(self, names: tuple[str, ...]):
        from sim.tabletop.twin import TwinParams

        unknown = [n for n in names if n not in TwinParams.IDENTIFIABLE]
        if unknown:
            raise ValueError(f"params: {unknown} are not identifiable; choose from {', '.join(TwinParams.IDENTIFIABLE)}")
        self.names = tuple(names)
        self.bounds = [TwinParams.IDENTIFIABLE[n] for n in names]

    def decode(self, x: np.ndarray) -> dict[str, float]:
        out = {}
        for n, (lo, hi), xi in zip(self.names, self.bounds, np.clip(x, 0, 1)):
            out[n] = float(lo + xi * (hi - lo)) if lo <= 0 else float(math.exp(math.log(lo) + xi * math.log(hi / lo)))
        return out

    def encode(self, values: dict[str, float]) -> np.ndarray:
        x = []
        for n, (lo, hi) in zip(self.names, self.bounds):
            v = float(np.clip(values[n], lo, hi))
            x.append((v - lo) / (hi - lo) if lo <= 0 else math.log(v / lo) / math.log(hi / lo))
        return np.asarray(x)


def calibrate(cfg: CalibrateConfig) -> dict:
    import cma
    import yaml
    from tqdm.auto import tqdm

    from sim.tabletop.env import TabletopEnv
    from sim.tabletop.twin import TwinParams
    from wmrl.core.io import atomic_path, write_json

    if cfg.generations < 1 or cfg.popsize < 2 or not 0 < cfg.sigma0 < 1:
        raise ValueError(f"generations >= 1, popsize >= 2 and 0 < sigma0 < 1 needed; got {cfg.generations}, "
                         f"{cfg.popsize}, {cfg.sigma0}")
    box = ParamBox(tuple(cfg.params))
    task, episodes = load_logs(cfg.logs, cfg.max_episodes)
    scale = np.concatenate([ep[OBS_STATE] for ep in episodes]).std(0) + 1e-3
    env = TabletopEnv(task=task, control="joint", cameras=(), max_episode_steps=10**9)
    nominal = TwinParams()
    t0 = time.time()
    cubes = any(n.startswith("cube_") for n in box.names)  # arm-only fits ignore what the cubes did
    before = trajectory_error(env, nominal, episodes, scale, cubes)
    objective = lambda x: trajectory_error(env, nominal.replace(**box.decode(x)), episodes, scale, cubes)["objective"]
    es = cma.CMAEvolutionStrategy(box.encode(nominal.to_dict()), cfg.sigma0,
                                  {"bounds": [0, 1], "popsize": cfg.popsize, "seed": cfg.seed + 1, "verbose": -9})
    curve = []
    for _ in tqdm(range(cfg.generations), desc="calibrating twin (CMA-ES)", disable=not cfg.progress):
        xs = es.ask()
        es.tell(xs, [objective(np.asarray(x)) for x in xs])
        curve.append(float(es.result.fbest))
    fitted = box.decode(np.asarray(es.result.xbest))
    twin = nominal.replace(**fitted)
    after = trajectory_error(env, twin, episodes, scale, cubes)
    if after["objective"] > before["objective"]:  # never hand back a twin that replays the logs worse than nominal
        fitted, twin, after = {n: float(getattr(nominal, n)) for n in box.names}, nominal, before
    env.close()
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        tmp.write_text(yaml.safe_dump(json.loads(json.dumps(twin.to_dict())), sort_keys=False))
    report = {"twin": str(out), "task": task, "episodes": len(episodes), "fitted": fitted, "error_before": before,
              "error_after": after, "traj_error_before": before["objective"], "traj_error_after": after["objective"],
              "evaluations": int(es.result.evaluations), "curve": curve, "seconds": time.time() - t0}
    write_json(out.with_name(out.stem + ".calibration.json"), report)
    return report


@dataclass
class SysIdConfig:
    out: Path = Path("runs/sysid")
    task: str = "reach-red"
    episodes: int = 8
    steps: int = 50
    amplitude: float = 0.3  # rad of yaw sweep (pitch joints 0.4x)
    noise_std: float = 0.001
    seed: int = 0


def record_sysid(cfg: SysIdConfig) -> dict:
    """`wmrl sysid`: record system-identification episodes on the sim-real cell (the input of calibrate-twin)."""
    if Path(cfg.out).exists() and any(Path(cfg.out).iterdir()):
        raise FileExistsError(f"{cfg.out} already exists; choose another --out")
    if cfg.episodes < 1 or cfg.steps < 2:
        raise ValueError(f"episodes >= 1 and steps >= 2 needed, got {cfg.episodes}, {cfg.steps}")
    collect_logs(cfg.out, cfg.task, cfg.episodes, cfg.steps, cfg.seed, cfg.noise_std, cfg.amplitude)
    return {"logs": str(cfg.out), "episodes": cfg.episodes, "steps": cfg.steps}


def collect_logs(out: Path, task: str = "reach-red", episodes: int = 6, steps: int = 50, seed: int = 0,
                 noise_std: float = 0.001, amplitude: float = 0.3, twin="real") -> Path:
    """System-identification logs from the real cell: multi-sine joint sweeps around the home pose, hand kept high
    above the cubes (free-space motion identifies the arm's gains, damping and latency), recorded as a calibration
    dataset. Contact-rich logs (pushing) are what cube mass and friction would need."""
    from real_robot.sim_robot import SimRealRobot
    from sim.tabletop.env import HOME_EE
    from sim.tabletop.model import forward_kinematics, inverse_kinematics
    from wmrl.core.episode import build_episode, features_for
    from wmrl.datasets.lerobot_v3 import LeRobotV3Writer, write_episode

    robot = SimRealRobot(task, cameras=(), noise_std=noise_std, seed=seed, twin=twin)
    robot.connect()
    rng = np.random.default_rng(seed)
    home = inverse_kinematics(np.asarray(HOME_EE) + np.array([0.05, 0.0, 0.0]))
    writer = None
    for e in range(episodes):
        obs = robot.reset_episode(seed + e)
        freq = rng.uniform(0.3, 1.2, 4)  # rad per control step: different per joint, so their effects separate
        phase = rng.uniform(0, 2 * np.pi, 4)
        observations, actions = [obs], []
        for t in range(steps):
            q = home + amplitude * np.array([1.0, 0.4, 0.4, 0.4]) * np.sin(freq * t + phase)
            for _ in range(10):  # keep the hand at least 12 cm above the table: shrink the excursion
                if forward_kinematics(q)[2] > 0.12:
                    break
                q = home + 0.7 * (q - home)
            a = np.concatenate([q, [1.0 if (t // 10) % 2 else -1.0]])
            robot.send_action(a)
            obs = robot.get_observation()
            observations.append(obs)
            actions.append(a.astype(np.float32))
        keep = [{k: o[k] for k in (OBS_STATE, OBS_ENV_STATE, "task")} for o in observations]
        ep = build_episode(keep, actions, [0.0] * steps, [False] * steps, [False] * (steps - 1) + [True],
                           [False] * steps, source="policy", policy_id="sysid",
                           extras={"layout_seed": [np.int64(seed + e)] * (steps + 1)})
        if writer is None:
            writer = LeRobotV3Writer(out, fps=10, features=features_for(ep), robot_type="wmrl_tabletop_real",
                                     extra_meta={"task": task, "purpose": "twin calibration logs"})
        write_episode(writer, ep)
    writer.finalize()
    robot.disconnect()
    return Path(out)


__all__ = ["CalibrateConfig", "calibrate", "SysIdConfig", "record_sysid", "collect_logs", "load_logs", "replay", "trajectory_error", "ParamBox", "REQUIRED"]
