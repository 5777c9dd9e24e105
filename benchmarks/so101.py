"""LeRobot's SO-101 as a twin: kinematics, rendering, the scripted expert on the arm, and deployment through the
stack a physical SO-101 uses, with the safety layer fuzzed at the arm.

- Kinematics: the deployment side's numpy forward kinematics against MuJoCo's on random configurations (max error);
  the IK on a 10 x 9 x 10 grid over its workspace box (position error, jaw tilt, time per solve, cold and warm).
- Rendering: control steps/s of `SO101Env` with both 64x64 cameras on the simplified meshes vs the package's full
  CAD meshes in the same run (ratio), the arm's silhouette overlap between the two, and our tabletop (push-red) in the
  same run.
- The task: the tabletop's scripted expert driving the SO-101 cell in end-effector deltas (clean and with action
  noise 0.3) and a uniform random policy (the metric's check: near 0), on the same seeded layouts, Wilson 95% CIs.
- Deployment: `wmrl deploy --robot sim-so101 --policy scripted` (LeRobot's driver API -> `LeRobotArm` ->
  `SafeRobot` with the SO-101's limits -> the executor at 10 Hz wall-clock): success, deadline misses, stalls,
  safety trips per episode.
- Twin calibration: system-identification sweeps logged through the driver API on the cell with hidden parameters,
  then `calibrate-twin` from the nominal twin: each parameter against the truth, hand and image errors before/after.
- Safety at the arm: uniformly random joint commands (each entry up to 1 rad past its limits, NaN 5% of the time)
  sent through `SafeRobot`; the arm's own joints and tip are read back from the simulator: the worst excursion past
  the joint limits and the lowest tip height (the safety layer's claim: inside the limits, above the table).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import env_steps_per_s, finish, tabletop_steps_per_s


def kinematics(n_random: int = 500, grid_shape: tuple[int, int, int] = (10, 9, 10)) -> dict:
    import mujoco

    from sim.so101.model import asset_dir
    from wmrl.core import so101 as K

    m = mujoco.MjModel.from_xml_path(str(asset_dir() / "so101_new_calib.xml"))
    d = mujoco.MjData(m)
    rng = np.random.default_rng(0)
    fk_err = 0.0
    for q in rng.uniform(K.JOINT_LOW, K.JOINT_HIGH, (n_random, 5)):
        d.qpos[:5] = q
        mujoco.mj_kinematics(m, d)
        fk_err = max(fk_err, float(np.abs(K.forward_kinematics(q) - d.site("gripperframe").xpos).max()))
    grid = np.stack(np.meshgrid(*(np.linspace(lo, hi, n) for lo, hi, n in zip(K.WORKSPACE_LOW, K.WORKSPACE_HIGH, grid_shape)),
                                indexing="ij"), -1).reshape(-1, 3)
    cold, warm, errs, tilts = [], [], [], []
    kin = K.SO101Kinematics()
    for target in grid:
        t = time.perf_counter()
        q = kin.ik(target, q0=K.SO101Kinematics.initial_guess())
        cold.append(time.perf_counter() - t)
        errs.append(np.linalg.norm(K.forward_kinematics(q) - target))
        tilts.append(abs(K.jaw_tilt(q)))
        t = time.perf_counter()
        kin.ik(target + np.array([0.01, 0.0, 0.0]))  # a 1 cm step from the last solution: the control loop's case
        warm.append(time.perf_counter() - t)
    errs, tilts = np.array(errs) * 1000, np.degrees(tilts)
    return {"fk_max_error_m": fk_err, "ik_targets": len(grid), "ik_error_mm_median": float(np.median(errs)),
            "ik_error_mm_p99": float(np.percentile(errs, 99)), "ik_error_mm_max": float(errs.max()),
            "ik_jaw_tilt_deg_median": float(np.median(tilts)), "ik_share_jaws_within_5deg_of_vertical": float(np.mean(tilts < 5)),
            "ik_ms_cold_median": 1000 * float(np.median(cold)), "ik_ms_warm_median": 1000 * float(np.median(warm))}


def rendering(steps: int) -> dict:
    from sim.so101.env import SO101Env

    out = {}
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (steps, 4)).astype(np.float32)
    for name, full in (("simplified", False), ("full_cad", True)):
        env = SO101Env(cameras=("front", "wrist"), full_meshes=full)
        n = steps if not full else max(10, steps // 10)
        out[f"steps_per_s_two_cameras_{name}"] = env_steps_per_s(env, actions[:n])
        out[f"mesh_faces_{name}"] = int(env.model.mesh_facenum.sum())
        env.close()
    out["render_speedup_vs_full_cad"] = out["steps_per_s_two_cameras_simplified"] / out["steps_per_s_two_cameras_full_cad"]
    out["steps_per_s_tabletop_two_cameras_64px"] = tabletop_steps_per_s(steps)
    out["tabletop_over_so101"] = out["steps_per_s_tabletop_two_cameras_64px"] / out["steps_per_s_two_cameras_simplified"]
    return out


def task_success(episodes: int) -> dict:
    import gymnasium as gym

    import sim
    from policies.random_policy import RandomPolicy
    from sim.experts import ScriptedExpert
    from wmrl.eval.loop import evaluate, wilson_interval

    env = sim.make_env("so101-reach-red", cameras=()).unwrapped
    out = {}
    for name, policy in (("expert", ScriptedExpert(seed=0)), ("expert_noise_0.3", ScriptedExpert(noise=0.3, seed=0)),
                         ("random", RandomPolicy(gym.spaces.Box(-1, 1, (4,), np.float32), seed=0))):
        r = evaluate(policy, env, episodes, seed=9_000, progress=False)
        ok = [bool(e["success"]) for e in r.per_episode]
        out[name] = {"success": float(np.mean(ok)), "success_ci95": list(wilson_interval(int(sum(ok)), len(ok))),
                     "median_steps": float(np.median([e["length"] for e in r.per_episode]))}
    env.close()
    return out


def deployment(episodes: int) -> dict:
    from wmrl.commands.deploy import DeployConfig, deploy

    with tempfile.TemporaryDirectory() as tmp:
        s = deploy(DeployConfig(robot="sim-so101", task="reach-red", episodes=episodes, out=Path(tmp) / "run"))
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "episodes.jsonl").read_text().splitlines()]
    return {"success": s["success_rate"], "deadline_miss_rate": s["deadline_miss_rate"], "stall_rate": s["stall_rate"],
            "safety_trips_per_episode": s["safety_trips"] / episodes, "estopped": s["estopped"],
            "median_steps": float(np.median([r["steps"] for r in rows]))}


def safety_fuzz(steps: int) -> dict:
    from real_robot.lerobot_adapter import LeRobotArm
    from real_robot.safety import SafeRobot
    from real_robot.so101 import SimSO101Follower, so101_safety
    from wmrl.core import so101 as K

    follower = SimSO101Follower(cameras=(), seed=0)
    cfg = so101_safety()
    robot = SafeRobot(LeRobotArm(follower), cfg, fk=K.forward_kinematics)
    robot.connect()
    rng = np.random.default_rng(0)
    low, high = np.append(K.JOINT_LOW - 1, -2.0), np.append(K.JOINT_HIGH + 1, 2.0)
    past, min_z = 0.0, np.inf
    for _ in range(steps):
        robot.get_observation()  # a fresh observation each period, as a control loop reads one (else: stale holds)
        a = rng.uniform(low, high)
        if rng.random() < 0.05:
            a[rng.integers(6)] = np.nan
        robot.send_action(a)
        q = follower.env.arm_joints()[:5]
        past = max(past, float(np.max(np.maximum(q - K.JOINT_HIGH, K.JOINT_LOW - q))))
        min_z = min(min_z, float(follower.env.ee_pos()[2]))
    follower.disconnect()
    kinds: dict[str, int] = {}
    for t in robot.trips:
        kinds[t.kind] = kinds.get(t.kind, 0) + 1
    return {"commands": steps, "max_joint_excursion_past_limits_rad": past, "min_tip_height_m": min_z,
            "workspace_floor_m": cfg.workspace_low[2], "trips": kinds}


def calibration(episodes: int, steps: int, generations: int, camera_generations: int) -> dict:
    """`wmrl sysid --robot sim-so101` logs (joint sweeps with front-camera video, through LeRobot's driver API, from
    the cell with hidden parameters) and `wmrl calibrate-twin` on them: every identifiable arm and camera parameter
    from the nominal twin, against the hidden truth."""
    from real_robot.calibration import CalibrateConfig, SysIdConfig, calibrate, record_sysid
    from sim.so101.env import CELL, REAL_SO101

    with tempfile.TemporaryDirectory() as tmp:
        record_sysid(SysIdConfig(out=Path(tmp) / "logs", robot="sim-so101", episodes=episodes, steps=steps))
        r = calibrate(CalibrateConfig(logs=Path(tmp) / "logs", out=Path(tmp) / "twin.yaml", generations=generations,
                                      camera_generations=camera_generations, progress=False))
    rows = {n: {"truth": REAL_SO101.get(n), "nominal": CELL.get(n), "fitted": v} for n, v in r["fitted"].items()}
    closer = [abs(x["fitted"] - x["truth"]) < abs(x["nominal"] - x["truth"]) for x in rows.values()]
    return {"params": rows, "share_params_closer_than_nominal": float(np.mean(closer)),
            "hand_rmse_mm_before": r["error_before"]["ee_rmse_mm"], "hand_rmse_mm_after": r["error_after"]["ee_rmse_mm"],
            "image_mse_before": r["image_error_before"], "image_mse_after": r["image_error_after"],
            "episodes": episodes, "steps": steps, "seconds": r["seconds"]}


def main(quick: bool = False, episodes: int = 50, deploy_episodes: int = 10, fuzz_steps: int = 500) -> dict:
    import sim.so101

    if not sim.so101.available():
        raise RuntimeError("the SO-101 model is not installed: pip install 'wmrl[so101]'")
    t0 = time.time()
    episodes, deploy_episodes, fuzz_steps = (3, 1, 40) if quick else (int(episodes), int(deploy_episodes), int(fuzz_steps))
    result = {"kinematics": kinematics(50, (4, 4, 4)) if quick else kinematics(), "rendering": rendering(10 if quick else 300),
              "task": task_success(episodes), "episodes_per_policy": episodes,
              "deployment": deployment(deploy_episodes), "deploy_episodes": deploy_episodes,
              "safety_fuzz": safety_fuzz(fuzz_steps),
              "calibration": calibration(1, 6, 1, 1) if quick else calibration(4, 40, 30, 60),
              "seconds": time.time() - t0}
    return finish("so101", result, quick)


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
