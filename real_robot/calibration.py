"""Digital-twin calibration: fit `TwinParams` to logged episodes of the real cell (system identification by replay).

`wmrl calibrate-twin --logs DIR --out twin.yaml`. Each logged episode (LeRobot v3: `observation.state`, the joint
commands actually sent as `action`, the cell's `layout_seed`, and `observation.environment_state` when the cubes are
tracked) is replayed open-loop in the twin under candidate parameters. Two stages, each CMA-ES (Hansen 2016; the
`cma` package) in a normalised parameter box inside physical bounds (`TwinParams.IDENTIFIABLE`), from nominal:
1. dynamics (arm gains, damping, latency; cube mass/friction when asked): the mean squared error between replayed
   and logged trajectories (arm state standardised per dimension, cube positions in centimetres);
2. camera (front camera position offset, field of view, key-light intensity), when the logs hold front-camera
   images: the replay under the stage-1 twin is re-rendered at keyframes under candidate camera parameters, and the
   objective is the mean squared pixel error against the logged frames. Camera parameters do not change the
   dynamics, so the stages separate.
`wmrl deploy` datasets carry the same fields, but a real-time robot steps on its own clock, so replaying them per
control step is only approximate; dedicated system-identification logs (`wmrl sysid`, `collect_logs`) replay exactly.

Two arms: the tabletop cell's (`robot_type` wmrl_tabletop_real; replayed in `TabletopEnv`) and LeRobot's SO-101
(`robot_type` so101_follower: `observation.state` = 5 joints in rad and the gripper in [-1, 1], as `LeRobotArm`
records a physical SO-101 or the simulated one; replayed in `sim.so101.SO101Env`, nominal `CELL`).
`wmrl sysid --robot sim-so101` records SO-101 logs through LeRobot's driver API.

Writes twin.yaml (a full `TwinParams`: `TabletopEnv(twin=TwinParams.from_dict(...))` uses it) and, beside it,
calibration.json: the fitted values, trajectory and image error before (nominal twin) and after, the search curves.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from real_robot.adapters import joint_command
from sim.tabletop.env import TabletopEnv
from sim.experts import ScriptedExpert
from sim.tabletop.tasks import parse_task
from sim.tabletop.twin import TwinParams
from wmrl.core.arm import EE_STEP, HOME_EE, forward_kinematics, inverse_kinematics, step_hand
from wmrl.core.episode import build_episode, features_for
from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE
from wmrl.core.io import atomic_path, write_json
from wmrl.datasets import LeRobotV3Dataset
from wmrl.datasets.lerobot_v3 import LeRobotV3Writer, write_episode


REQUIRED = (OBS_STATE, ACTION, "layout_seed")
CUBE_SCALE = 0.01  # m: cube positions count in centimetres
CUBE_CAP = 25.0  # cm^2: a cube that went elsewhere counts 5 cm off at most (contact replay is chaotic; keep it robust)
DEFAULT_PARAMS = ("arm_damping", "arm_kp", "latency_s")
CUBE_PARAMS = ("cube_mass", "cube_friction")  # from contact-rich (push) logs
CAMERA_PARAMS = ("camera_x", "camera_y", "camera_z", "camera_fovy", "light_intensity")
CAMERA = "observation.images.front"


@dataclass
class CalibrateConfig:
    logs: Path = Path("runs/deploy/dataset")
    out: Path = Path("twin.yaml")
    params: tuple[str, ...] = ()
    """Parameters to fit; empty: chosen from the logs: push logs fit the cube's (CUBE_PARAMS); others the arm's
    (DEFAULT_PARAMS), plus the camera's when they hold front images."""
    init: Path | None = None
    """Start from this twin (a calibrate-twin output) instead of nominal; parameters not fitted keep its values, so
    a push calibration builds on an arm/camera calibration."""
    generations: int = 30
    camera_generations: int = 60  # the camera stage's objective is rougher (pixels) but far cheaper per evaluation
    popsize: int = 10
    sigma0: float = 0.3  # CMA-ES step size in the normalised [0, 1] parameter box
    max_episodes: int = 8
    image_stride: int = 5  # camera stage: compare every image_stride-th logged frame
    seed: int = 0
    progress: bool = True


SO101_ROBOT_TYPE = "so101_follower"


def robot_of(path: Path) -> str:
    """"so101" for logs of LeRobot's SO-101 (their `robot_type`), else "tabletop"."""
    info = Path(path) / "meta" / "info.json"
    robot_type = json.loads(info.read_text()).get("robot_type") if info.exists() else None
    return "so101" if robot_type == SO101_ROBOT_TYPE else "tabletop"


def _hand(robot: str, states: np.ndarray) -> np.ndarray:
    """The end effector per logged state: the tabletop records it (state[5:8]); the SO-101's driver reports joints."""
    if robot == "so101":
        from wmrl.core.so101 import forward_kinematics as so101_fk

        return np.stack([so101_fk(q) for q in states[:, :5]])
    return states[:, 5:8]


def replay_env(robot: str, task: str, cameras: tuple[str, ...] = (), image_size: tuple[int, int] = (64, 64)):
    """The twin a log replays in, under joint control."""
    if robot == "so101":
        from sim.so101.env import SO101Env

        return SO101Env(task=task, control="joint", cameras=cameras, image_size=image_size, max_episode_steps=10**9)
    return TabletopEnv(task=task, control="joint", cameras=cameras, image_size=image_size, max_episode_steps=10**9)


def nominal_twin(robot: str) -> TwinParams:
    if robot == "so101":
        from sim.so101.env import CELL

        return CELL
    return TwinParams()


def load_logs(path: Path, max_episodes: int = 0, images: bool = False) -> tuple[str, list[dict]]:
    """The task name and episodes of a calibration log (with decoded front-camera frames when `images`); a clear
    error lists any missing field."""
    path = Path(path)
    meta_file = path / "meta" / "wmrl.json"
    if not meta_file.exists():
        raise FileNotFoundError(f"{path}: not a wmrl LeRobot v3 dataset (no meta/wmrl.json)")
    task = json.loads(meta_file.read_text()).get("task")
    ds = LeRobotV3Dataset(path)
    first = ds.episode(0, decode=False)
    needed = REQUIRED + ((CAMERA,) if images else ())
    missing = [k for k in needed if k not in first and k not in ds.camera_keys] + ([] if task else ["task (meta/wmrl.json)"])
    if missing:
        raise ValueError(f"{path}: calibration logs need {', '.join(needed)} and the task name; missing: "
                         f"{', '.join(missing)}")
    n = ds.num_episodes if not max_episodes else min(max_episodes, ds.num_episodes)
    robot = robot_of(path)
    eps = []
    for i in range(n):
        e = ds.episode(i, decode=images)
        eps.append({OBS_STATE: np.asarray(e[OBS_STATE], np.float64), ACTION: np.asarray(e[ACTION], np.float64),
                    "hand": _hand(robot, np.asarray(e[OBS_STATE], np.float64)),
                    "layout_seed": int(np.asarray(e["layout_seed"]).reshape(-1)[0]),
                    OBS_ENV_STATE: np.asarray(e[OBS_ENV_STATE], np.float64) if OBS_ENV_STATE in e else None,
                    CAMERA: e[CAMERA] if images else None})
    return task, eps


def has_images(path: Path) -> bool:
    info = Path(path) / "meta" / "info.json"
    return info.exists() and CAMERA in json.loads(info.read_text()).get("features", {})


def default_params(path: Path) -> tuple[str, ...]:
    meta = Path(path) / "meta" / "wmrl.json"
    if meta.exists() and json.loads(meta.read_text()).get("motion") == "push":
        return CUBE_PARAMS
    return DEFAULT_PARAMS + (CAMERA_PARAMS if has_images(path) else ())


def replay(env, twin, ep: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Replay the logged commands in `env` (control="joint") from the logged layout under `twin`: arm states (in the
    log's layout: an SO-101's as its driver reports them), cube states, the simulator's qpos and the hand per frame."""
    state = env.robot_state if hasattr(env, "robot_state") else None
    obs, info = env.reset(seed=ep["layout_seed"], options={"twin": twin})
    states, env_states, qpos, hand = [], [], [], []
    for a in [None, *ep[ACTION][:-1]]:  # the final frame's action is padding
        if a is not None:
            obs, _, _, _, info = env.step(a)
        states.append(state() if state else obs[OBS_STATE])
        env_states.append(obs[OBS_ENV_STATE])
        qpos.append(info["qpos"])
        hand.append(env.ee_pos())
    return (np.asarray(states, np.float64), np.asarray(env_states, np.float64), np.asarray(qpos, np.float64),
            np.asarray(hand, np.float64))


def trajectory_error(env, twin, episodes: list[dict], scale: np.ndarray, cubes: bool = True) -> dict:
    """Mean squared replay error (arm state in units of its logged std; cubes in cm, each coordinate capped at
    CUBE_CAP, when `cubes` and tracked) and the hand's RMSE in mm."""
    arm, cube, ee = [], [], []
    for ep in episodes:
        s, e, _, hand = replay(env, twin, ep)
        arm.append(np.mean(((s - ep[OBS_STATE]) / scale) ** 2))
        ee.append(np.mean(np.sum((hand - ep["hand"]) ** 2, axis=1)))
        if cubes and ep[OBS_ENV_STATE] is not None:
            cube.append(np.mean(np.minimum(((e[:, :9] - ep[OBS_ENV_STATE][:, :9]) / CUBE_SCALE) ** 2, CUBE_CAP)))
    total = float(np.mean(arm) + (np.mean(cube) if cube else 0.0))
    return {"objective": total, "arm": float(np.mean(arm)), "cubes": float(np.mean(cube)) if cube else None,
            "ee_rmse_mm": float(1000 * math.sqrt(np.mean(ee)))}


def keyframes(env, twin, episodes: list[dict], stride: int) -> list[tuple[int, list[tuple[np.ndarray, np.ndarray]]]]:
    """Per episode: its layout seed and (replayed qpos, logged front image) every `stride`-th frame."""
    out = []
    for ep in episodes:
        _, _, qpos, _ = replay(env, twin, ep)
        out.append((ep["layout_seed"], [(qpos[t], ep[CAMERA][t]) for t in range(0, len(qpos), stride)]))
    return out


def image_error(env, twin, frames) -> float:
    """Mean squared pixel error (intensities in [0, 1]) of the front camera re-rendered under `twin` at the
    keyframes against the logged images."""
    errs = []
    for layout_seed, kf in frames:
        env.reset(seed=layout_seed, options={"twin": twin})  # the layout (zones) and the camera/light of `twin`
        for q, logged in kf:
            img = env.render_at(q)[CAMERA]
            errs.append(np.mean(((img.astype(np.float32) - logged.astype(np.float32)) / 255.0) ** 2))
    return float(np.mean(errs))


def project(env, twin, points: np.ndarray) -> np.ndarray:
    """Pixel coordinates (u right, v down) of world `points` (N, 3) in the front camera of `env` under `twin`'s
    camera parameters (pinhole; MuJoCo cameras look along their -z axis, y up). Compares camera fits by where they
    put the workspace in the image, which is what matters when several poses explain the images equally well."""
    import mujoco

    env.reset(seed=0, options={"twin": twin})
    cam = mujoco.mj_name2id(env.model, mujoco.mjtObj.mjOBJ_CAMERA, "front")
    pos, rot = env.data.cam_xpos[cam], env.data.cam_xmat[cam].reshape(3, 3)
    c = (np.asarray(points, np.float64) - pos) @ rot  # camera-frame coordinates
    f = 0.5 * env.height / math.tan(math.radians(env.model.cam_fovy[cam]) / 2)
    return np.stack([env.width / 2 + f * c[:, 0] / -c[:, 2], env.height / 2 - f * c[:, 1] / -c[:, 2]], axis=1)


class ParamBox:
    """x in [0, 1]^d <-> parameter values: log-uniform within positive bounds, linear where the lower bound is 0."""

    def __init__(self, names: tuple[str, ...]):
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

    def encode(self, twin) -> np.ndarray:
        """The box coordinates of `twin`'s values (a `TwinParams`)."""
        x = []
        for n, (lo, hi) in zip(self.names, self.bounds):
            v = float(np.clip(twin.get(n), lo, hi))
            x.append((v - lo) / (hi - lo) if lo <= 0 else math.log(v / lo) / math.log(hi / lo))
        return np.asarray(x)


def _cmaes(box: ParamBox, start, objective, cfg: CalibrateConfig, generations: int, desc: str) -> tuple[dict, list[float], int]:
    """Minimise objective(twin) over `box` from the twin `start`: (best values, best-so-far curve, evaluations)."""
    import cma
    from tqdm.auto import tqdm

    d = len(box.names)
    # the cma package does not support one dimension (it fails inside its scaling on some runs): search a single
    # parameter with one ignored extra coordinate
    x0 = np.append(box.encode(start), [0.5] * (d == 1))
    es = cma.CMAEvolutionStrategy(x0, cfg.sigma0,
                                  {"bounds": [0, 1], "popsize": cfg.popsize, "seed": cfg.seed + 1, "verbose": -9})
    curve = []
    for _ in tqdm(range(generations), desc=desc, disable=not cfg.progress):
        xs = es.ask()
        es.tell(xs, [objective(start.with_values(box.decode(np.asarray(x)[:d]))) for x in xs])
        curve.append(float(es.result.fbest))
    return box.decode(np.asarray(es.result.xbest)[:d]), curve, int(es.result.evaluations)


def _fit(box: ParamBox, start, objective, cfg: CalibrateConfig, generations: int, desc: str):
    """One calibration stage: CMA-ES from `start`, never handing back values that score worse than `start`'s.
    Returns (values, objective before, objective after, curve, evaluations)."""
    before = objective(start)
    fitted, curve, evals = _cmaes(box, start, objective, cfg, generations, desc)
    after = objective(start.with_values(fitted))
    if after > before:
        fitted, after = {n: start.get(n) for n in box.names}, before
    return fitted, before, after, curve, evals


def calibrate(cfg: CalibrateConfig) -> dict:
    import yaml


    if min(cfg.generations, cfg.camera_generations, cfg.image_stride) < 1 or cfg.popsize < 2 or not 0 < cfg.sigma0 < 1:
        raise ValueError(f"generations, camera_generations, image_stride >= 1, popsize >= 2 and 0 < sigma0 < 1 "
                         f"needed; got {cfg.generations}, {cfg.camera_generations}, {cfg.image_stride}, "
                         f"{cfg.popsize}, {cfg.sigma0}")
    params = tuple(cfg.params) or default_params(cfg.logs)
    ParamBox(params)  # validates the names
    dynamics, camera = [n for n in params if n not in CAMERA_PARAMS], [n for n in params if n in CAMERA_PARAMS]
    task, episodes = load_logs(cfg.logs, cfg.max_episodes, images=bool(camera))
    scale = np.concatenate([ep[OBS_STATE] for ep in episodes]).std(0) + 1e-3
    if cfg.init is not None and not Path(cfg.init).is_file():
        raise FileNotFoundError(f"init: no twin file {cfg.init}")
    robot = robot_of(cfg.logs)
    nominal = TwinParams.from_dict(yaml.safe_load(Path(cfg.init).read_text())) if cfg.init else nominal_twin(robot)
    t0 = time.time()
    report: dict = {"task": task, "robot": robot, "episodes": len(episodes), "fitted": {}, "evaluations": 0}
    twin = nominal
    if dynamics:
        env = replay_env(robot, task)
        box = ParamBox(tuple(dynamics))
        cubes = any(n.startswith("cube_") for n in box.names)  # arm-only fits ignore what the cubes did
        err = lambda tw: trajectory_error(env, tw, episodes, scale, cubes)
        fitted, _, _, curve, evals = _fit(box, nominal, lambda tw: err(tw)["objective"], cfg, cfg.generations,
                                          "calibrating dynamics (CMA-ES)")
        twin = nominal.with_values(fitted)
        before, after = err(nominal), err(twin)  # the error's parts (arm, cubes, hand RMSE) for the report
        env.close()
        report.update(error_before=before, error_after=after, traj_error_before=before["objective"],
                      traj_error_after=after["objective"], curve=curve)
        report["fitted"].update(fitted)
        report["evaluations"] += evals
    if camera:
        h, w = episodes[0][CAMERA].shape[1:3]
        env = replay_env(robot, task, cameras=("front",), image_size=(h, w))
        frames = keyframes(env, twin, episodes, cfg.image_stride)  # replayed under the stage-1 dynamics
        box = ParamBox(tuple(camera))
        fitted, before, after, curve, evals = _fit(box, twin, lambda tw: image_error(env, tw, frames), cfg,
                                                   cfg.camera_generations, "calibrating camera (CMA-ES)")
        twin = twin.with_values(fitted)
        env.close()
        report.update(image_error_before=before, image_error_after=after, image_curve=curve,
                      keyframes=sum(len(kf) for _, kf in frames))
        report["fitted"].update(fitted)
        report["evaluations"] += evals
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        tmp.write_text(yaml.safe_dump(json.loads(json.dumps(twin.to_dict())), sort_keys=False))
    report.update(twin=str(out), params=list(params), seconds=time.time() - t0)
    write_json(out.with_name(out.stem + ".calibration.json"), report)
    return report


@dataclass
class SysIdConfig:
    out: Path = Path("runs/sysid")
    robot: str = "sim-real"
    """sim-real (the tabletop cell's arm) | sim-so101 (LeRobot's SO-101 through its driver API; sweeps only)"""
    task: str = "reach-red"
    episodes: int = 8
    steps: int = 50
    amplitude: float = 0.3  # rad of yaw sweep (pitch joints 0.4x)
    noise_std: float = 0.001
    cameras: tuple[str, ...] = ("front",)  # front images let calibrate-twin fit the camera pose too
    motion: str = "sweep"  # sweep (free space: arm, camera) | push (with --task push-*: cube friction and mass)
    seed: int = 0


def record_sysid(cfg: SysIdConfig) -> dict:
    """`wmrl sysid`: record system-identification episodes on the sim-real cell (the input of calibrate-twin)."""
    if Path(cfg.out).exists() and any(Path(cfg.out).iterdir()):
        raise FileExistsError(f"{cfg.out} already exists; choose another --out")
    if cfg.episodes < 1 or cfg.steps < 2:
        raise ValueError(f"episodes >= 1 and steps >= 2 needed, got {cfg.episodes}, {cfg.steps}")
    collect_logs(cfg.out, cfg.task, cfg.episodes, cfg.steps, cfg.seed, cfg.noise_std, cfg.amplitude,
                 cameras=tuple(cfg.cameras), motion=cfg.motion, robot=cfg.robot)
    return {"logs": str(cfg.out), "robot": cfg.robot, "episodes": cfg.episodes, "steps": cfg.steps, "motion": cfg.motion}


MOTIONS = ("sweep", "push")


def _sweep(rng: np.random.Generator, steps: int, amplitude: float, robot: str = "sim-real"):
    """Multi-sine joint sweeps around the home pose, the hand kept clear of the cubes (12 cm above the table; 8 cm
    for the smaller SO-101): free-space motion that identifies the arm's gains, damping and latency. Yields joint
    commands; ignores observations."""
    if robot == "sim-so101":
        from wmrl.core import so101

        home, fk, clear = so101.SO101Kinematics().ik(so101.HOME_EE + np.array([0.03, 0.0, -0.03])), so101.forward_kinematics, 0.08
        weights = np.array([1.0, 0.4, 0.4, 0.4, 0.6])
    else:
        home, fk, clear = inverse_kinematics(np.asarray(HOME_EE) + np.array([0.05, 0.0, 0.0])), forward_kinematics, 0.12
        weights = np.array([1.0, 0.4, 0.4, 0.4])
    n = len(weights)
    freq = rng.uniform(0.3, 1.2, n)  # rad per control step: different per joint, so their effects separate
    phase = rng.uniform(0, 2 * np.pi, n)
    for t in range(steps):
        q = home + amplitude * weights * np.sin(freq * t + phase)
        for _ in range(10):  # shrink the excursion until the hand clears the cubes
            if fk(q)[2] > clear:
                break
            q = home + 0.7 * (q - home)
        yield np.concatenate([q, [1.0 if (t // 10) % 2 else -1.0]])


def _push(robot, steps: int):
    """The scripted push expert, closed loop on the robot's observations, as joint commands: contact-rich motion
    (the cube slides under the finger) that identifies the cube's friction and mass."""
    expert = ScriptedExpert()
    for _ in range(steps):
        obs = robot.get_observation()
        a = expert.select_action({OBS_STATE: obs[OBS_STATE][None], OBS_ENV_STATE: obs[OBS_ENV_STATE][None], "task": [obs["task"]]})[0]
        yield joint_command(step_hand(np.asarray(obs[OBS_STATE], np.float64)[5:8], a, EE_STEP), a[3])


def collect_logs(out: Path, task: str = "reach-red", episodes: int = 6, steps: int = 50, seed: int = 0,
                 noise_std: float = 0.001, amplitude: float = 0.3, twin="real", cameras: tuple[str, ...] = (),
                 motion: str = "sweep", robot: str = "sim-real") -> Path:
    """System-identification logs from the real cell, recorded as a calibration dataset with the `cameras`' images
    (the camera stage needs the front camera). `motion`: `sweep` (free space: arm parameters, camera) or `push`
    (a push task's expert: cube friction and mass). `robot`: sim-real (the tabletop cell) or sim-so101 (LeRobot's
    SO-101 through `LeRobotArm`, as a physical one would be logged; state noise `noise_std` added here)."""
    if motion not in MOTIONS:
        raise ValueError(f"motion: expected one of {', '.join(MOTIONS)}, got {motion!r}")
    if robot not in ("sim-real", "sim-so101"):
        raise ValueError(f"robot: expected sim-real or sim-so101, got {robot!r}")
    if motion == "push" and parse_task(task).family != "push":
        raise ValueError(f"motion=push needs a push task (e.g. push-red), got {task!r}")
    if motion == "push" and robot != "sim-real":
        raise ValueError(f"motion=push runs on the tabletop cell (sim-real) only, got {robot}")
    so101 = robot == "sim-so101"
    if so101:
        from real_robot.lerobot_adapter import LeRobotArm
        from real_robot.so101 import SimSO101Follower

        robot = LeRobotArm(SimSO101Follower(task, cameras=tuple(cameras), seed=seed, twin=twin))
    else:
        from real_robot.sim_robot import SimRealRobot

        robot = SimRealRobot(task, cameras=tuple(cameras), noise_std=noise_std, seed=seed, twin=twin)
    robot.connect()
    state_noise = np.random.default_rng(seed + 2)
    rng, tracker = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    writer = None
    for e in range(episodes):
        robot.reset_episode(seed + e)
        obs = robot.get_observation()
        observations, actions = [obs], []
        for a in (_sweep(rng, steps, amplitude, "sim-so101" if so101 else "sim-real") if motion == "sweep" else _push(robot, steps)):
            robot.send_action(a)
            observations.append(robot.get_observation())
            actions.append(np.asarray(a, np.float32))
        if so101:  # the driver's encoders are noisy too (SimRealRobot adds its own)
            for o in observations:
                o[OBS_STATE] = o[OBS_STATE] + state_noise.normal(0, noise_std, o[OBS_STATE].shape).astype(np.float32)
        keep = [{k: o[k] for k in (OBS_STATE, OBS_ENV_STATE, "task", *(f"observation.images.{c}" for c in cameras))}
                for o in observations]
        for o in keep:  # a cube tracker is noisy too (the robot adds noise to the arm's own state only)
            o[OBS_ENV_STATE] = o[OBS_ENV_STATE].copy()
            o[OBS_ENV_STATE][:9] += tracker.normal(0, noise_std, 9).astype(np.float32)
        ep = build_episode(keep, actions, [0.0] * steps, [False] * steps, [False] * (steps - 1) + [True],
                           [False] * steps, source="policy", policy_id=f"sysid-{motion}",
                           extras={"layout_seed": [np.int64(seed + e)] * (steps + 1)})
        if writer is None:
            writer = LeRobotV3Writer(out, fps=10, features=features_for(ep),
                                     robot_type=SO101_ROBOT_TYPE if so101 else "wmrl_tabletop_real",
                                     extra_meta={"task": task, "purpose": "twin calibration logs", "motion": motion})
        write_episode(writer, ep)
    writer.finalize()
    robot.disconnect()
    return Path(out)


__all__ = ["CalibrateConfig", "calibrate", "robot_of", "replay_env", "nominal_twin", "SysIdConfig", "record_sysid", "collect_logs", "load_logs", "replay", "trajectory_error",
           "keyframes", "image_error", "has_images", "ParamBox", "REQUIRED", "DEFAULT_PARAMS", "CAMERA_PARAMS",
           "CUBE_PARAMS", "MOTIONS", "project"]
