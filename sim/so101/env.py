"""`SO101Env`: the tabletop tasks on LeRobot's SO-101 arm, a gymnasium env over a real MuJoCo simulation.

Same contract as `TabletopEnv`, so the tabletop's task rules, scripted expert, datasets and world models apply:
- `observation.state` = [shoulder_pan, shoulder_lift, elbow_flex, wrist_flex, gripper opening (m), tip xyz,
  wrist_roll]: the first 8 entries mean what the tabletop's 8 mean (4 positioning joints, opening, end effector),
  the wrist roll the tabletop arm lacks comes last;
- `observation.environment_state` = cube centres then zone centres (`ENV_STATE_NAMES`), `task` = the instruction;
- actions: `control="ee_delta"` (default) moves the tip by [-1, 1]^3 x `EE_STEP` (3 cm) per 10 Hz step through
  `wmrl.core.so101`'s IK (jaws down, roll held), gripper in [-1 open, +1 closed]; `control="joint"`: the 5 arm
  joints (rad, LeRobot's order) and the gripper command, what `real_robot.so101.SimSO101Follower` sends.
The arm's servos are the package's STS3215 position actuators (kp 17.8, unmeasured on a real arm). Cubes are the
tabletop's 4 cm ones on a region this arm reaches (`REGION`).
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import mujoco
import numpy as np

from sim.so101.model import MESH_CELL, build_model
from sim.tabletop.env import MujocoCell, cell_spaces, check_cell_args, validate_action
from sim.tabletop.tasks import MAX_STEPS, Region, SceneState, instruction, parse_task, reward, sample_layout, success
from sim.tabletop.twin import CUBE_COLOURS, ZONE_COLOURS, TwinParams, apply_twin_params, read_nominal
from wmrl.core import so101 as K
from wmrl.core.control import EEDeltaControl
from wmrl.core.features import OBS_ENV_STATE, OBS_STATE, TASK

STATE_NAMES = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "gripper_opening", "ee_x", "ee_y", "ee_z",
               "wrist_roll"]
CELL = dataclasses.replace(TwinParams(), cube_x_range=(0.16, 0.27), cube_y_range=(-0.12, 0.12), camera_fovy=45.0)
"""The nominal SO-101 cell (`TwinParams`: the tabletop's fields, this cell's layout ranges and camera)."""
REAL_SO101 = CELL.replace(arm_kp=0.7, arm_damping=1.6, latency_s=0.03, light_intensity=0.55,
                          camera_offset=(0.012, -0.01, 0.008), camera_fovy=47.0)
"""The hidden parameters of the simulated "real" SO-101 (`twin="real"`), which calibration must find from logs."""
REGION = Region(zone_x=(0.14, 0.3), zone_y=(-0.18, 0.18), behind_x=(0.14, 0.28), behind_y=0.15)
CONTROL = EEDeltaControl(ee_step=K.EE_STEP, gripper_open=round(K.jaw_opening(K.GRIPPER_OPEN), 4),
                         workspace_low=tuple(float(v) for v in K.WORKSPACE_LOW),
                         workspace_high=tuple(float(v) for v in K.WORKSPACE_HIGH))


class SO101Env(MujocoCell, gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10, "robot_type": "so101_follower", "control": CONTROL.to_meta()}

    def __init__(self, task: str = "reach-red", control: str = "ee_delta", image_size: int | tuple[int, int] = 64,
                 cameras: tuple[str, ...] = ("front", "wrist"), control_hz: float = 10.0,
                 max_episode_steps: int | None = None, render_mode: str | None = None,
                 render_size: tuple[int, int] = (240, 320), full_meshes: bool = False,
                 twin: TwinParams | str | None = None, post_success_steps: int = 0):
        """`full_meshes`: render the package's 322k-face CAD meshes instead of the simplified ones (~25x slower).
        `twin`: None (nominal, `CELL`), "real" (`REAL_SO101`) or any `TwinParams` (its arm gains, damping, latency,
        cube and camera fields apply; reset(options={"twin": ...}) switches per episode, as calibration does).
        `post_success_steps`: keep the episode running this many steps after the first success (`TabletopEnv`'s)."""
        self.spec_ = parse_task(task)
        from sim.so101 import FAMILIES

        if self.spec_.family not in FAMILIES:
            raise ValueError(f"task {task!r}: the SO-101 cell has {', '.join(FAMILIES)} tasks")
        check_cell_args(control, cameras, render_mode, post_success_steps)
        if control_hz <= 0:
            raise ValueError(f"control_hz must be > 0, got {control_hz}")
        self.post_success_steps, self._since_success = post_success_steps, -1
        self.control, self.cameras = control, tuple(cameras)
        self.height, self.width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.render_mode, self.render_size = render_mode, render_size
        self.max_episode_steps = max_episode_steps or MAX_STEPS[self.spec_.family]
        self.model = build_model(None if full_meshes else MESH_CELL)
        self.data = mujoco.MjData(self.model)
        self.nominal = read_nominal(self.model)
        self.base_twin = REAL_SO101 if twin == "real" else (twin or CELL)
        self.twin = self.base_twin
        self._apply_twin(self.twin)
        self.n_substeps = max(1, int(round(1.0 / (control_hz * self.model.opt.timestep))))
        m = self.model
        self._arm_qpos = np.array([m.joint(j).qposadr[0] for j in K.JOINTS])
        self._gripper_qpos = m.joint(K.GRIPPER).qposadr[0]
        self._cube_qpos = {c: m.joint(f"cube_{c}").qposadr[0] for c in CUBE_COLOURS}
        self._zone_geom = {z: m.geom(f"zone_{z}").id for z in ZONE_COLOURS}
        self._pads = (m.geom("fixed_jaw_pad").id, m.geom("moving_jaw_pad").id)
        self._tip = m.site("gripperframe").id
        self._renderer = self._big_renderer = self._seg_renderer = None
        self.kinematics = K.SO101Kinematics()

        self.observation_space, self.action_space = cell_spaces(self.cameras, (self.height, self.width), len(STATE_NAMES),
                                                                control, K.JOINT_LOW, K.JOINT_HIGH)
        self.layout = None
        self.task_text = ""
        self._t = 0

    def _apply_twin(self, twin: TwinParams) -> None:
        apply_twin_params(self.model, self.data, self.nominal, twin, arm_joints=K.JOINTS, gripper_actuators=(K.GRIPPER,))

    def ee_pos(self) -> np.ndarray:
        return self.data.site_xpos[self._tip].copy()

    def gripper_opening(self) -> float:
        """Distance between the two fingertip pads' centres (m); `wmrl.core.so101.jaw_opening` computes the same from
        the joint alone (tested)."""
        return float(np.linalg.norm(self.data.geom_xpos[self._pads[0]] - self.data.geom_xpos[self._pads[1]]))

    def arm_joints(self) -> np.ndarray:
        """The 5 arm joints and the gripper joint (rad), LeRobot's motor order."""
        return np.append(self.data.qpos[self._arm_qpos], self.data.qpos[self._gripper_qpos])

    def scene_state(self) -> SceneState:
        return SceneState(ee=self.ee_pos(), gripper_opening=self.gripper_opening(), cube=self.cube_pos(self.spec_.colour),
                          zone_xy=self.layout.zone_xy[self.layout.zone].copy(), grasped=False,
                          half_size=self.twin.cube_half_size)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        self.twin = options.get("twin", self.base_twin)
        self._apply_twin(self.twin)
        self.layout = options.get("layout") or sample_layout(self.spec_, self.np_random, self.twin, max_tries=20000, region=REGION)
        self.task_text = instruction(self.spec_, self.layout.zone)
        mujoco.mj_resetData(self.model, self.data)
        self.kinematics.last = self.kinematics.initial_guess()
        q = self.kinematics.ik(K.HOME_EE)
        g = K.gripper_joint(-1.0)
        self.data.qpos[self._arm_qpos], self.data.qpos[self._gripper_qpos] = q, g
        self.data.ctrl[:] = np.append(q, g)
        self._place_objects()
        mujoco.mj_forward(self.model, self.data)
        self._t, self._since_success = 0, -1
        return self._obs(), self._info()

    def _ctrl_from_action(self, a: np.ndarray) -> np.ndarray:
        if self.control == "ee_delta":
            target = np.clip(self.ee_pos() + a[:3] * K.EE_STEP, K.WORKSPACE_LOW, K.WORKSPACE_HIGH)
            q = self.kinematics.ik(target, q0=self.data.qpos[self._arm_qpos])
        else:
            q = a[:5]
        return np.append(q, K.gripper_joint(a[-1]))

    def step(self, action):
        if self.layout is None:
            raise RuntimeError("call reset() before step()")
        a = validate_action(action, self.action_space.shape)
        a = np.clip(a, self.action_space.low, self.action_space.high)
        self._actuate(self._ctrl_from_action(a))
        mujoco.mj_kinematics(self.model, self.data)  # positions of the final qpos (mj_step leaves them one step old)
        self._t += 1
        s = self.scene_state()
        ok = success(self.spec_.family, s)
        return self._obs(), reward(self.spec_.family, s), *self._episode_end(ok), self._info(ok)

    def robot_state(self) -> np.ndarray:
        """What LeRobot's SO-101 driver reports, as `LeRobotArm` turns it into `observation.state`: the 5 arm joints
        (rad) and the gripper in [-1 open, +1 closed] (twin calibration compares replays with logs in this layout)."""
        q = self.arm_joints()
        return np.append(q[:5], K.gripper_command(q[5]))

    def _obs(self) -> dict:
        obs = self._render_cameras()
        q = self.data.qpos[self._arm_qpos]
        obs[OBS_STATE] = np.concatenate([q[:4], [self.gripper_opening()], self.ee_pos(), q[4:]]).astype(np.float32)
        env_state = [self.cube_pos(c) for c in CUBE_COLOURS] + [self.layout.zone_xy[z] for z in ZONE_COLOURS]
        obs[OBS_ENV_STATE] = np.concatenate(env_state).astype(np.float32)
        obs[TASK] = self.task_text
        return obs


__all__ = ["SO101Env", "STATE_NAMES", "CONTROL", "REGION", "CELL", "REAL_SO101"]
