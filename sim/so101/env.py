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
from gymnasium import spaces

from sim.so101.model import build_model
from sim.tabletop.env import ENV_STATE_NAMES, TEXT_CHARSET, geom_masks, validate_action
from sim.tabletop.tasks import MAX_STEPS, Region, SceneState, instruction, parse_task, reward, sample_layout, success
from sim.tabletop.twin import CUBE_COLOURS, ZONE_COLOURS, TwinParams
from wmrl.core import so101 as K
from wmrl.core.control import EEDeltaControl
from wmrl.core.features import OBS_ENV_STATE, OBS_STATE, TASK, image_key

STATE_NAMES = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "gripper_opening", "ee_x", "ee_y", "ee_z",
               "wrist_roll"]
CELL = dataclasses.replace(TwinParams(), cube_x_range=(0.16, 0.27), cube_y_range=(-0.12, 0.12))
REGION = Region(zone_x=(0.14, 0.3), zone_y=(-0.18, 0.18), behind_x=(0.14, 0.28), behind_y=0.15)
CONTROL = EEDeltaControl(ee_step=K.EE_STEP, gripper_open=round(K.jaw_opening(K.GRIPPER_OPEN), 4),
                         workspace_low=tuple(float(v) for v in K.WORKSPACE_LOW),
                         workspace_high=tuple(float(v) for v in K.WORKSPACE_HIGH))


class SO101Env(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10, "robot_type": "so101_follower", "control": CONTROL.to_meta()}

    def __init__(self, task: str = "reach-red", control: str = "ee_delta", image_size: int | tuple[int, int] = 64,
                 cameras: tuple[str, ...] = ("front", "wrist"), control_hz: float = 10.0,
                 max_episode_steps: int | None = None, render_mode: str | None = None,
                 render_size: tuple[int, int] = (240, 320)):
        self.spec_ = parse_task(task)
        from sim.so101 import FAMILIES

        if self.spec_.family not in FAMILIES:
            raise ValueError(f"task {task!r}: the SO-101 cell has {', '.join(FAMILIES)} tasks")
        if control not in ("ee_delta", "joint"):
            raise ValueError(f"control: expected 'ee_delta' or 'joint', got {control!r}")
        for cam in cameras:
            if cam not in ("front", "wrist"):
                raise ValueError(f"cameras: unknown camera {cam!r}; valid: front, wrist")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode: expected None or 'rgb_array', got {render_mode!r}")
        if control_hz <= 0:
            raise ValueError(f"control_hz must be > 0, got {control_hz}")
        self.control, self.cameras = control, tuple(cameras)
        self.height, self.width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.render_mode, self.render_size = render_mode, render_size
        self.max_episode_steps = max_episode_steps or MAX_STEPS[self.spec_.family]
        self.model = build_model()
        self.data = mujoco.MjData(self.model)
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

        obs = {image_key(c): spaces.Box(0, 255, (self.height, self.width, 3), np.uint8) for c in self.cameras}
        obs[OBS_STATE] = spaces.Box(-np.inf, np.inf, (len(STATE_NAMES),), np.float32)
        obs[OBS_ENV_STATE] = spaces.Box(-np.inf, np.inf, (len(ENV_STATE_NAMES),), np.float32)
        obs[TASK] = spaces.Text(max_length=64, min_length=1, charset=TEXT_CHARSET)
        self.observation_space = spaces.Dict(obs)
        if control == "ee_delta":
            self.action_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        else:
            self.action_space = spaces.Box(np.append(K.JOINT_LOW, -1.0).astype(np.float32),
                                           np.append(K.JOINT_HIGH, 1.0).astype(np.float32), (6,), np.float32)
        self.layout = None
        self.task_text = ""
        self._t = 0

    @property
    def task(self) -> str:
        return self.spec_.name

    def ee_pos(self) -> np.ndarray:
        return self.data.site_xpos[self._tip].copy()

    def gripper_opening(self) -> float:
        """Distance between the two fingertip pads' centres (m); `wmrl.core.so101.jaw_opening` computes the same from
        the joint alone (tested)."""
        return float(np.linalg.norm(self.data.geom_xpos[self._pads[0]] - self.data.geom_xpos[self._pads[1]]))

    def cube_pos(self, colour: str) -> np.ndarray:
        a = self._cube_qpos[colour]
        return self.data.qpos[a : a + 3].copy()

    def arm_joints(self) -> np.ndarray:
        """The 5 arm joints and the gripper joint (rad), LeRobot's motor order."""
        return np.append(self.data.qpos[self._arm_qpos], self.data.qpos[self._gripper_qpos])

    def scene_state(self) -> SceneState:
        return SceneState(ee=self.ee_pos(), gripper_opening=self.gripper_opening(), cube=self.cube_pos(self.spec_.colour),
                          zone_xy=self.layout.zone_xy[self.layout.zone].copy(), grasped=False,
                          half_size=CELL.cube_half_size)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        self.layout = options.get("layout") or sample_layout(self.spec_, self.np_random, CELL, max_tries=20000, region=REGION)
        self.task_text = instruction(self.spec_, self.layout.zone)
        mujoco.mj_resetData(self.model, self.data)
        self.kinematics.last = self.kinematics.initial_guess()
        q = self.kinematics.ik(K.HOME_EE)
        g = K.gripper_joint(-1.0)
        self.data.qpos[self._arm_qpos], self.data.qpos[self._gripper_qpos] = q, g
        self.data.ctrl[:] = np.append(q, g)
        h = CELL.cube_half_size
        for c in CUBE_COLOURS:
            a = self._cube_qpos[c]
            (x, y), yaw = self.layout.cube_xy[c], self.layout.cube_yaw[c]
            self.data.qpos[a : a + 7] = [x, y, h, np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)]
        for z in ZONE_COLOURS:
            self.model.geom_pos[self._zone_geom[z], :2] = self.layout.zone_xy[z]
        mujoco.mj_forward(self.model, self.data)
        self._t = 0
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
        self.data.ctrl[:] = self._ctrl_from_action(a)
        for _ in range(self.n_substeps):
            mujoco.mj_step(self.model, self.data)
        mujoco.mj_kinematics(self.model, self.data)  # positions of the final qpos (mj_step leaves them one step old)
        self._t += 1
        s = self.scene_state()
        ok = success(self.spec_.family, s)
        truncated = (not ok) and self._t >= self.max_episode_steps
        return self._obs(), reward(self.spec_.family, s), ok, truncated, self._info(ok)

    def _info(self, ok: bool = False) -> dict:
        return {"success": ok, "is_success": ok, "task": self.task_text, "step": self._t,
                "qpos": self.data.qpos.astype(np.float32), "qvel": self.data.qvel.astype(np.float32)}

    def _obs(self) -> dict:
        obs = {}
        if self.cameras:
            if self._renderer is None:
                self._renderer = mujoco.Renderer(self.model, self.height, self.width)
            for cam in self.cameras:
                self._renderer.update_scene(self.data, camera=cam)
                obs[image_key(cam)] = self._renderer.render().copy()
        q = self.data.qpos[self._arm_qpos]
        obs[OBS_STATE] = np.concatenate([q[:4], [self.gripper_opening()], self.ee_pos(), q[4:]]).astype(np.float32)
        env_state = [self.cube_pos(c) for c in CUBE_COLOURS] + [self.layout.zone_xy[z] for z in ZONE_COLOURS]
        obs[OBS_ENV_STATE] = np.concatenate(env_state).astype(np.float32)
        obs[TASK] = self.task_text
        return obs

    def moving_mask_at(self, qpos: np.ndarray) -> dict[str, np.ndarray]:
        """Per camera, the pixels showing the arm or a cube (segmentation render at `qpos`), as `TabletopEnv`'s."""
        self.data.qpos[:] = np.asarray(qpos, np.float64)
        mujoco.mj_forward(self.model, self.data)
        if self._seg_renderer is None:
            self._seg_renderer = mujoco.Renderer(self.model, self.height, self.width)
            self._seg_renderer.enable_segmentation_rendering()
        return geom_masks(self._seg_renderer, self.data, {c: c for c in self.cameras},
                          np.flatnonzero(self.model.geom_bodyid != 0))

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        if self._big_renderer is None:
            self._big_renderer = mujoco.Renderer(self.model, *self.render_size)
        self._big_renderer.update_scene(self.data, camera="front")
        return self._big_renderer.render().copy()

    def close(self):
        for r in (self._renderer, self._big_renderer, self._seg_renderer):
            if r is not None:
                r.close()
        self._renderer = self._big_renderer = self._seg_renderer = None


__all__ = ["SO101Env", "STATE_NAMES", "CONTROL", "REGION", "CELL"]
