"""`TabletopEnv`: the embedded default task suite, a gymnasium env over a real MuJoCo simulation.

Observations use LeRobot's names: `observation.images.front` / `.wrist` (uint8 HxWx3), `observation.state`
(4 arm joints, gripper opening, end-effector xyz), `observation.environment_state` (privileged: cube centres and zone
centres, for scripted experts and critics) and `task` (the language instruction).

Actions (`control="ee_delta"`, default): end-effector delta position in [-1, 1]^3 scaled to 5 cm per control step,
and a gripper command in [-1, 1] (+1 closes). `control="joint"`: absolute arm joint targets (rad) and the gripper.
"""

from __future__ import annotations

import string

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

from sim.tabletop import model as M
from sim.tabletop.tasks import MAX_STEPS, Layout, SceneState, parse_task, reward, sample_layout, success, instruction
from sim.tabletop.twin import CUBE_COLOURS, REAL_WORLD, ZONE_COLOURS, TwinParams, apply_twin_params, read_nominal
from wmrl.core.arm import EE_STEP, HOME_EE  # noqa: F401  (re-exported)
from wmrl.core.control import TABLETOP
from wmrl.core.features import (ACTION, DONE, INDEX_FEATURES, INTERVENTION, IS_LAST, OBS_ENV_STATE, OBS_STATE, POLICY_ID,
                                REWARD, SOURCE, SUCCESS, TASK, TERMINATED, TRUNCATED, camera_of, image_key, is_image_key)

STATE_NAMES = ["yaw", "shoulder", "elbow", "wrist", "gripper_opening", "ee_x", "ee_y", "ee_z"]
ENV_STATE_NAMES = [f"{c}_{a}" for c in CUBE_COLOURS for a in "xyz"] + [f"zone_{z}_{a}" for z in ZONE_COLOURS for a in "xy"]
TEXT_CHARSET = string.ascii_lowercase + string.digits + " "
# The cell is symmetric about the plane y = 0 (arm base, table, zones' range, both cameras' optical axes on it):
# reflecting a scene negates these coordinates of the two channels and flips both cameras' images left-right. Only
# the key light (at y = 0.2) and the table's checker phase break it: a flipped image differs from the reflected
# scene's render by ~7 grey levels per pixel, nearly all the checker's (a mirror augmentation of perception).
MIRROR_STATE_SIGN = np.array([-1.0 if n in ("yaw", "ee_y") else 1.0 for n in STATE_NAMES], np.float32)
MIRROR_ENV_STATE_SIGN = np.array([-1.0 if n.endswith("_y") else 1.0 for n in ENV_STATE_NAMES], np.float32)
MIRROR_ACTION_SIGN = np.array([1.0, -1.0, 1.0, 1.0], np.float32)  # the end-effector delta (dx, dy, dz, gripper)
MIRROR_CAMERAS = ("front", "wrist")
# per-frame columns a reflection keeps as recorded: the step's scalars (the task's reward and success are symmetric)
# and the instruction (zones are named by colour, not side)
MIRROR_KEPT = frozenset({REWARD, DONE, TERMINATED, TRUNCATED, SUCCESS, IS_LAST, SOURCE, INTERVENTION, POLICY_ID, TASK,
                         *INDEX_FEATURES})


def check_mirrorable(what: str, cameras, state_dim: int | None, env_state_dim: int | None,
                     action_dim: int | None = None) -> None:
    """Refuse a reflection of data that is not the tabletop's: its channels' widths, its end-effector actions, and
    cameras on its plane of symmetry (a width given as None: the data has no such column)."""
    dims = [(state_dim, len(MIRROR_STATE_SIGN)), (env_state_dim, len(MIRROR_ENV_STATE_SIGN)),
            (action_dim, len(MIRROR_ACTION_SIGN))]
    if not set(cameras) <= set(MIRROR_CAMERAS) or any(got not in (None, want) for got, want in dims):
        raise ValueError(f"{what}: only for the tabletop's channels (state {len(MIRROR_STATE_SIGN)}, object channel "
                         f"{len(MIRROR_ENV_STATE_SIGN)}, actions {len(MIRROR_ACTION_SIGN)}) and cameras on its plane of "
                         f"symmetry {MIRROR_CAMERAS}; got cameras {tuple(cameras)}, state {state_dim}, object channel "
                         f"{env_state_dim}" + (f", actions {action_dim}" if action_dim is not None else ""))


def mirror_episode(episode: dict, what: str = "mirror") -> dict:
    """A recorded episode's reflection through the cell's plane of symmetry y = 0: an episode of the reflected layout
    (both cameras' images flipped left-right, the y coordinates and the base's yaw negated in the two channels and
    the actions). A column it cannot reflect (e.g. the simulator's `qpos`) is refused by name, never copied as is."""
    width = lambda k: int(np.shape(episode[k])[-1]) if k in episode else None
    check_mirrorable(what, [camera_of(k) for k in episode if is_image_key(k)], width(OBS_STATE), width(OBS_ENV_STATE),
                     width(ACTION))
    if unknown := sorted(k for k in episode if not is_image_key(k) and k not in MIRROR_KEPT | {OBS_STATE, OBS_ENV_STATE, ACTION}):
        raise ValueError(f"{what}: no reflection known for the columns {unknown}; drop them first")
    sign = {OBS_STATE: MIRROR_STATE_SIGN, OBS_ENV_STATE: MIRROR_ENV_STATE_SIGN, ACTION: MIRROR_ACTION_SIGN}
    return {k: (np.ascontiguousarray(v[..., ::-1, :]) if is_image_key(k)  # (T, H, W, 3): W is the second last
                else (np.asarray(v) * sign[k]).astype(np.asarray(v).dtype) if k in sign
                else (list(v) if isinstance(v, list) else np.array(v, copy=True)))
            for k, v in episode.items()}


def validate_action(action, shape: tuple[int, ...], field: str = "action") -> np.ndarray:
    """Shared edge check: the right shape and finite values, else a ValueError that names the field."""
    a = np.asarray(action, dtype=np.float64)
    if a.shape != shape:
        raise ValueError(f"{field}: expected shape {shape}, got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{field}: contains NaN or inf: {a}")
    return a


def geom_masks(renderer: mujoco.Renderer, data, cameras: dict[str, str], geoms: np.ndarray) -> dict[str, np.ndarray]:
    """Per camera (ours -> MuJoCo's name), a bool (H, W) mask of the pixels showing one of `geoms`, from a renderer
    with segmentation rendering enabled."""
    return geom_mask_sets(renderer, data, cameras, {"geoms": geoms})["geoms"]


def geom_mask_sets(renderer: mujoco.Renderer, data, cameras: dict[str, str],
                   sets: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """`geom_masks` for several named sets of geoms from one segmentation render per camera: {set: {camera: mask}}."""
    out: dict[str, dict[str, np.ndarray]] = {name: {} for name in sets}
    for ours, cam in cameras.items():
        renderer.update_scene(data, camera=cam)
        seg = renderer.render()
        is_geom = seg[..., 1] == mujoco.mjtObj.mjOBJ_GEOM
        for name, geoms in sets.items():
            out[name][image_key(ours)] = is_geom & np.isin(seg[..., 0], geoms)
    return out


def check_cell_args(control: str, cameras: tuple[str, ...], render_mode: str | None, post_success_steps: int) -> None:
    """The constructor arguments every MuJoCo tabletop cell takes, refused with the valid values."""
    if control not in ("ee_delta", "joint"):
        raise ValueError(f"control: expected 'ee_delta' or 'joint', got {control!r}")
    check_view_args(cameras, render_mode, post_success_steps)


def check_view_args(cameras: tuple[str, ...], render_mode: str | None, post_success_steps: int) -> None:
    """Cameras, render mode and post-success steps, which every suite's env takes (front and wrist cameras in all)."""
    for cam in cameras:
        if cam not in ("front", "wrist"):
            raise ValueError(f"cameras: unknown camera {cam!r}; valid: front, wrist")
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"render_mode: expected None or 'rgb_array', got {render_mode!r}")
    if post_success_steps < 0:
        raise ValueError(f"post_success_steps must be >= 0, got {post_success_steps}")


def cell_spaces(cameras: tuple[str, ...], size: tuple[int, int], n_state: int, control: str, joint_low, joint_high):
    """(observation space, action space) of a MuJoCo tabletop cell: the cameras, `observation.state` (n_state),
    the cubes-and-zones environment state and the instruction; end-effector deltas + gripper ("ee_delta") or the arm's
    joint targets + gripper ("joint")."""
    obs = {image_key(c): spaces.Box(0, 255, (*size, 3), np.uint8) for c in cameras}
    obs[OBS_STATE] = spaces.Box(-np.inf, np.inf, (n_state,), np.float32)
    obs[OBS_ENV_STATE] = spaces.Box(-np.inf, np.inf, (len(ENV_STATE_NAMES),), np.float32)
    obs[TASK] = spaces.Text(max_length=64, min_length=1, charset=TEXT_CHARSET)
    if control == "ee_delta":
        return spaces.Dict(obs), spaces.Box(-1.0, 1.0, (4,), np.float32)
    low, high = np.append(joint_low, -1.0).astype(np.float32), np.append(joint_high, 1.0).astype(np.float32)
    return spaces.Dict(obs), spaces.Box(low, high, (len(low),), np.float32)


class MujocoCell:
    """What the MuJoCo tabletop cells share (`TabletopEnv`, and `sim.so101.SO101Env` with LeRobot's SO-101 arm): the
    cubes and zones placed from the layout, a control period with actuation latency, the episode's end, the `info`
    dict, and rendering: the cameras at the observation size, re-rendering at a given `qpos` (twin calibration),
    segmentation masks of what moves, the big `render()` view. Needs `model`, `data`, `spec_`, `twin`, `layout`,
    `_cube_qpos`, `_zone_geom`, `n_substeps`, the step counters and the camera and renderer attributes."""

    @property
    def task(self) -> str:
        return self.spec_.name

    def cube_pos(self, colour: str) -> np.ndarray:
        a = self._cube_qpos[colour]
        return self.data.qpos[a : a + 3].copy()

    def _place_objects(self) -> None:
        """The cubes (resting on the table, yawed) and the zones where the episode's layout puts them."""
        h = self.twin.cube_half_size
        for c in CUBE_COLOURS:
            a = self._cube_qpos[c]
            (x, y), yaw = self.layout.cube_xy[c], self.layout.cube_yaw[c]
            self.data.qpos[a : a + 7] = [x, y, h, np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)]
        for z in ZONE_COLOURS:
            self.model.geom_pos[self._zone_geom[z], :2] = self.layout.zone_xy[z]

    def _actuate(self, ctrl: np.ndarray) -> None:
        """One control period; the new command takes effect `twin.latency_s` into it (actuation latency)."""
        delay = min(self.n_substeps, int(round(self.twin.latency_s / self.model.opt.timestep)))
        for i in range(self.n_substeps):
            if i == delay:
                self.data.ctrl[:] = ctrl
            mujoco.mj_step(self.model, self.data)
        if delay >= self.n_substeps:
            self.data.ctrl[:] = ctrl

    def _episode_end(self, ok: bool) -> tuple[bool, bool]:
        """(terminated, truncated): the episode ends `post_success_steps` after the first success, or at the limit."""
        if ok or self._since_success >= 0:
            self._since_success += 1
        terminated = self._since_success >= self.post_success_steps
        return terminated, (not terminated) and self._t >= self.max_episode_steps

    def _info(self, ok: bool = False) -> dict:
        return {"success": ok, "is_success": ok, "task": self.task_text, "step": self._t,
                "qpos": self.data.qpos.astype(np.float32), "qvel": self.data.qvel.astype(np.float32)}

    def _render_cameras(self) -> dict[str, np.ndarray]:
        if not self.cameras:  # state-only envs need no GL context
            return {}
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.model, self.height, self.width)
        out = {}
        for cam in self.cameras:
            self._renderer.update_scene(self.data, camera=cam)
            out[image_key(cam)] = self._renderer.render().copy()
        return out

    def render_at(self, qpos: np.ndarray) -> dict[str, np.ndarray]:
        """The cameras' images with the simulator set to `qpos` (image-based twin calibration re-renders logged
        configurations under candidate camera parameters). Leaves the simulator at `qpos`, velocities unchanged."""
        qpos = np.asarray(qpos, np.float64)
        if qpos.shape != (self.model.nq,) or not np.isfinite(qpos).all():
            raise ValueError(f"qpos: expected {self.model.nq} finite values, got shape {qpos.shape}")
        self.data.qpos[:] = qpos
        mujoco.mj_forward(self.model, self.data)
        return self._render_cameras()

    def moving_mask_at(self, qpos: np.ndarray) -> dict[str, np.ndarray]:
        """Per camera, a bool (H, W) mask of the pixels that show the arm or a cube (every geom not on the world
        body: table, floor and zones are excluded), from a MuJoCo segmentation render at `qpos`. World-model
        evaluation scores fidelity on these pixels, where the task happens."""
        return self._geom_masks_at(qpos, {"moving": np.flatnonzero(self.model.geom_bodyid != 0)})["moving"]

    def _geom_masks_at(self, qpos: np.ndarray, sets: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
        """Per named set of geoms and camera, the pixels showing one of them at `qpos` (one segmentation render per
        camera); leaves the simulator there."""
        self.render_at(qpos)
        if self._seg_renderer is None:
            self._seg_renderer = mujoco.Renderer(self.model, self.height, self.width)
            self._seg_renderer.enable_segmentation_rendering()
        return geom_mask_sets(self._seg_renderer, self.data, {c: c for c in self.cameras}, sets)

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


class TabletopEnv(MujocoCell, gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10, "robot_type": "wmrl_tabletop", "control": TABLETOP.to_meta()}
    steps_taken = 0  # true-simulator steps in this process, all instances (RL in imagination reports it stays 0)

    def __init__(
        self,
        task: str = "push-red",
        control: str = "ee_delta",
        image_size: int | tuple[int, int] = 64,
        cameras: tuple[str, ...] = ("front", "wrist"),
        control_hz: float = 10.0,
        twin: TwinParams | str | None = None,
        domain_randomization: float = 0.0,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        render_size: tuple[int, int] = (240, 320),
        post_success_steps: int = 0,
    ):
        self.spec_ = parse_task(task)
        check_cell_args(control, cameras, render_mode, post_success_steps)
        self.control = control
        self.cameras = tuple(cameras)
        self.height, self.width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.render_mode = render_mode
        self.render_size = render_size
        self.base_twin = REAL_WORLD if twin == "real" else (twin or TwinParams())
        self.domain_randomization = float(domain_randomization)
        self.max_episode_steps = max_episode_steps or MAX_STEPS[self.spec_.family]
        # Keep the episode running this many steps after the first success (more frames that show success, for
        # success classifiers and world-model heads); the episode then terminates.
        self.post_success_steps = post_success_steps
        self._since_success = -1

        self.model = mujoco.MjModel.from_xml_string(M.MJCF)
        self.data = mujoco.MjData(self.model)
        self.nominal = read_nominal(self.model)
        self.twin = self.base_twin
        apply_twin_params(self.model, self.data, self.nominal, self.twin)
        self.n_substeps = max(1, int(round(1.0 / (control_hz * self.model.opt.timestep))))
        self._renderer: mujoco.Renderer | None = None
        self._big_renderer: mujoco.Renderer | None = None
        self._seg_renderer: mujoco.Renderer | None = None
        self._ids()

        self.observation_space, self.action_space = cell_spaces(self.cameras, (self.height, self.width), len(STATE_NAMES),
                                                                control, M.JOINT_LOW[:4], M.JOINT_HIGH[:4])
        self.layout: Layout | None = None
        self.task_text = ""
        self._t = 0

    # ------------------------------------------------------------------ model bookkeeping
    def _ids(self):
        m = self.model
        jid = lambda n: mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, n)
        self._arm_qpos = np.array([m.jnt_qposadr[jid(j)] for j in ("yaw", "shoulder", "elbow", "wrist")])
        self._arm_qvel = np.array([m.jnt_dofadr[jid(j)] for j in ("yaw", "shoulder", "elbow", "wrist")])
        self._finger_qpos = np.array([m.jnt_qposadr[jid(j)] for j in ("finger_left", "finger_right")])
        self._cube_qpos = {c: m.jnt_qposadr[jid(f"cube_{c}")] for c in CUBE_COLOURS}
        self._cube_geom = {c: mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, f"cube_{c}") for c in CUBE_COLOURS}
        self._zone_geom = {z: mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, f"zone_{z}") for z in ZONE_COLOURS}
        self._finger_geoms = {mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, g) for g in ("finger_left", "finger_right")}
        self._ee_site = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, "ee")

    def ee_pos(self) -> np.ndarray:
        return self.data.site_xpos[self._ee_site].copy()

    def part_masks_at(self, qpos: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
        """`moving_mask_at` split in two: {"arm": per camera, the arm's pixels; "objects": the cubes'} (their union is
        `moving_mask_at`). World-model evaluation reports where its masked error sits: on the arm, which the
        commanded pose fixes, or on the cubes, which only a pushed cube's predicted state can."""
        cubes = np.array(list(self._cube_geom.values()))
        arm = np.setdiff1d(np.flatnonzero(self.model.geom_bodyid != 0), cubes)
        return self._geom_masks_at(qpos, {"arm": arm, "objects": cubes})

    def camera_geometry(self, cameras: tuple[str, ...] | None = None) -> dict[str, dict]:
        """Per camera (`cameras`, default the env's own; any of this cell's, so a state-only env, which needs no GL
        context, gives them too), the pinhole model a world model projects points with (`world_models.video.camera`): a camera on
        the world body is fixed ("world": its pose); one on the arm is read in the hand's yaw frame at the current
        configuration ("hand_yaw": its offset from the end-effector and orientation, both turned back by the
        end-effector's yaw atan2(y, x) about the base). This arm's base yaws about the vertical through the origin and
        its controller holds the hand level, which that model assumes (other cells' arms do not: none is given)."""
        mujoco.mj_forward(self.model, self.data)
        ee = self.ee_pos()
        a = np.arctan2(ee[1], ee[0])
        yaw = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
        out = {}
        for cam in self.cameras if cameras is None else cameras:
            i = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, cam)
            if i < 0:
                raise ValueError(f"cameras: no camera {cam!r} in this cell")
            pos, rot = self.data.cam_xpos[i].copy(), self.data.cam_xmat[i].reshape(3, 3).copy()
            f = float(1 / np.tan(np.radians(self.model.cam_fovy[i]) / 2))
            if self.model.cam_bodyid[i] == 0:
                out[cam] = {"mount": "world", "R": rot.tolist(), "t": pos.tolist(), "f": f}
            else:
                out[cam] = {"mount": "hand_yaw", "R": (yaw.T @ rot).tolist(), "t": (yaw.T @ (pos - ee)).tolist(), "f": f}
        return out

    def gripper_opening(self) -> float:
        return float(self.data.qpos[self._finger_qpos].sum())

    def grasped(self, colour: str) -> bool:
        cube = self._cube_geom[colour]
        touching = set()
        for i in range(self.data.ncon):
            c = self.data.contact[i]
            pair = {c.geom1, c.geom2}
            if cube in pair:
                touching |= pair & self._finger_geoms
        return len(touching) == 2

    def scene_state(self) -> SceneState:
        return SceneState(
            ee=self.ee_pos(),
            gripper_opening=self.gripper_opening(),
            cube=self.cube_pos(self.spec_.colour),
            zone_xy=self.layout.zone_xy[self.layout.zone].copy(),
            grasped=self.grasped(self.spec_.colour),
            half_size=self.twin.cube_half_size,
        )

    def sim_state(self) -> dict[str, np.ndarray]:
        """Exact simulator state (qpos, qvel, ctrl) so an oracle can restore it."""
        return {"qpos": self.data.qpos.copy(), "qvel": self.data.qvel.copy(), "ctrl": self.data.ctrl.copy()}

    def snapshot(self) -> dict:
        """Everything a continuation depends on: MuJoCo's integration state (qpos, qvel, controls, warm start; so a
        restored episode steps bit for bit as the original would), the layout, the physics parameters and the
        episode's counters. For rollout-based policy improvement with the simulator as a perfect model."""
        if self.layout is None:
            raise RuntimeError("call reset() before snapshot()")
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        state = np.empty(mujoco.mj_stateSize(self.model, spec))
        mujoco.mj_getState(self.model, self.data, state, spec)
        return {"physics": state, "layout": self.layout, "twin": self.twin, "task_text": self.task_text, "t": self._t,
                "since_success": self._since_success}

    def restore(self, snap: dict) -> dict:
        """Return to a `snapshot` (of this env or another of the same task); returns the observation there."""
        if snap["twin"] is not self.twin:
            apply_twin_params(self.model, self.data, self.nominal, snap["twin"])
        self.twin, self.layout, self.task_text = snap["twin"], snap["layout"], snap["task_text"]
        mujoco.mj_setState(self.model, self.data, snap["physics"], mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(self.model, self.data)
        self._t, self._since_success = snap["t"], snap["since_success"]
        return self._obs()

    def place(self, state: np.ndarray, env_state: np.ndarray) -> dict:
        """Put the simulator, mid-episode, in the scene an observation describes and return the observation there:
        the hand at `state`'s end-effector (joints by inverse kinematics, clipped to the workspace) and gripper
        opening, the cubes at `env_state`'s centres (orientations kept), everything at rest; zones stay the layout's.
        For DAgger on a world model: the true continuation from a state the model's own rollouts visit
        (`world_models/video/state_dagger.py`)."""
        if self.layout is None:
            raise RuntimeError("call reset() before place()")
        state, env_state = np.asarray(state, np.float64), np.asarray(env_state, np.float64)
        if state.shape != (len(STATE_NAMES),) or env_state.shape != (len(ENV_STATE_NAMES),):
            raise ValueError(f"place: expected state ({len(STATE_NAMES)},) and env_state ({len(ENV_STATE_NAMES)},), "
                             f"got {state.shape} and {env_state.shape}")
        if not (np.all(np.isfinite(state)) and np.all(np.isfinite(env_state))):
            raise ValueError("place: state or env_state contains NaN or inf")
        q = M.inverse_kinematics(np.clip(state[5:8], M.WORKSPACE_LOW, M.WORKSPACE_HIGH))
        finger = float(np.clip(state[4], 0.0, 2 * M.FINGER_MAX)) / 2
        self.data.qpos[self._arm_qpos], self.data.ctrl[:4] = q, q
        self.data.qpos[self._finger_qpos], self.data.ctrl[4:6] = finger, finger
        for k, c in enumerate(CUBE_COLOURS):
            a = self._cube_qpos[c]
            self.data.qpos[a : a + 3] = env_state[3 * k : 3 * k + 3]
        self.data.qvel[:] = 0.0
        mujoco.mj_forward(self.model, self.data)
        return self._obs()

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        twin = options.get("twin", self.base_twin)
        if self.domain_randomization > 0:
            twin = twin.randomize(self.np_random, self.domain_randomization)
        self.twin = twin
        apply_twin_params(self.model, self.data, self.nominal, twin)
        self.layout = options.get("layout") or sample_layout(self.spec_, self.np_random, twin)
        self.task_text = instruction(self.spec_, self.layout.zone)

        mujoco.mj_resetData(self.model, self.data)
        q = M.inverse_kinematics(HOME_EE)
        self.data.qpos[self._arm_qpos] = q
        self.data.qpos[self._finger_qpos] = M.FINGER_MAX
        self.data.ctrl[:4] = q
        self.data.ctrl[4:6] = M.FINGER_MAX
        self._place_objects()
        mujoco.mj_forward(self.model, self.data)
        self._t = 0
        self._since_success = -1
        return self._obs(), self._info()

    def _ctrl_from_action(self, a: np.ndarray) -> np.ndarray:
        ctrl = np.empty(6)
        if self.control == "ee_delta":
            target = np.clip(self.ee_pos() + a[:3] * EE_STEP, M.WORKSPACE_LOW, M.WORKSPACE_HIGH)
            ctrl[:4] = M.inverse_kinematics(target)
        else:
            ctrl[:4] = a[:4]
        finger = M.FINGER_MAX * (1.0 - a[-1]) / 2.0  # +1 closes (0 travel), -1 opens fully
        ctrl[4:6] = finger
        return ctrl

    def step(self, action):
        if self.layout is None:
            raise RuntimeError("call reset() before step()")
        TabletopEnv.steps_taken += 1
        a = validate_action(action, self.action_space.shape)
        a = np.clip(a, self.action_space.low, self.action_space.high)
        self._actuate(self._ctrl_from_action(a))
        self._t += 1
        s = self.scene_state()
        ok = success(self.spec_.family, s)
        return self._obs(), reward(self.spec_.family, s), *self._episode_end(ok), self._info(ok)

    def _obs(self) -> dict:
        obs = self._render_cameras()
        q = self.data.qpos[self._arm_qpos]
        obs[OBS_STATE] = np.concatenate([q, [self.gripper_opening()], self.ee_pos()]).astype(np.float32)
        env_state = [self.cube_pos(c) for c in CUBE_COLOURS] + [self.layout.zone_xy[z] for z in ZONE_COLOURS]
        obs[OBS_ENV_STATE] = np.concatenate(env_state).astype(np.float32)
        obs[TASK] = self.task_text
        return obs
