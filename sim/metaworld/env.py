"""Meta-World (Yu et al., 2019; the Farama `metaworld` 3.x package, v3 tasks) in wmrl's env contract.

`MetaWorldEnv(task="push")` wraps the goal-observable Sawyer env of that task:

- observations use LeRobot's names, as the tabletop's do: `observation.images.front` (Meta-World's `corner2` camera)
  and `.wrist` (`behindGripper`, on the hand), `observation.state` (hand xyz and gripper opening, Meta-World's first
  four observation entries), `observation.environment_state` (Meta-World's whole 39-entry observation: hand, objects,
  the previous frame's hand and objects, the goal; privileged, for the suite's scripted policies and critics) and
  `task` (an instruction, `INSTRUCTIONS`);
- actions are Meta-World's own: end-effector delta xyz in [-1, 1]^3 (1 cm per unit) and a gripper effort in [-1, 1]
  (+1 closes), the tabletop's layout, so every 4-D policy here acts in both;
- `info["success"]` is Meta-World's own success flag; the episode terminates on it (after `post_success_steps`) and
  truncates at `max_episode_steps` (150 by default: the suite's scripted policies finish in 40-130 steps; the
  benchmark's own horizon is 500);
- `reset(seed=s)` draws the layout (object and goal positions, Meta-World's "rand_vec") from `s`, so a seed is a
  reproducible start and paired evaluations share it; `layout()` reads it and `options={"rand_vec": v}` restores it.

Rendering is ours, not Meta-World's `MujocoRenderer`: a `mujoco.Renderer` at the observation size with shadows,
reflections and multisampling off (about 5x faster at 64 px on the CPU, what a 64-px policy sees anyway).

Two fixes to the package, applied here rather than by patching it: mujoco 4 widened a weld constraint's `eq_data`
row from 11 to 12 entries, so Meta-World's `reset_mocap_welds` fails at construction; `_reset_mocap_welds` writes
the same 11 values into the row's first 11 entries (under mujoco 3.x the row has 11 and it is the original). The
first observation after a reset can hold the previous episode's object positions (tasks that move bodies in the
model); it is recomputed after a forward pass. And the goal-observable flag must be set before the observation bounds are cached, or the goal reads as zeros (which
is what `metaworld`'s own goal-observable constructor does).
"""

from __future__ import annotations

import functools

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

from sim.metaworld import tasks as mw_tasks
from sim.tabletop.env import TEXT_CHARSET, check_view_args, geom_masks, validate_action
from wmrl.core.control import EEDeltaControl
from wmrl.core.features import OBS_ENV_STATE, OBS_STATE, TASK, image_key

CAMERAS = {"front": "corner2", "wrist": "behindGripper"}
STATE_NAMES = ["hand_x", "hand_y", "hand_z", "gripper_opening"]
MAX_STEPS = 150

# Instructions for the MT10 tasks and a few more; every other task reads its name ("basketball", "dial turn").
INSTRUCTIONS = {
    "reach": "reach the goal",
    "push": "push the puck to the goal",
    "pick-place": "pick up the puck and place it at the goal",
    "door-open": "open the door",
    "drawer-open": "open the drawer",
    "drawer-close": "close the drawer",
    "button-press-topdown": "press the button from the top",
    "button-press": "press the button",
    "peg-insert-side": "insert the peg into the hole",
    "window-open": "open the window",
    "window-close": "close the window",
    "reach-wall": "reach the goal over the wall",
    "push-wall": "push the puck around the wall to the goal",
    "pick-place-wall": "pick up the puck and place it over the wall",
}


def task_names() -> list[str]:
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    return sorted(n.removesuffix("-v3") for n in ALL_V3_ENVIRONMENTS)


def instruction(task: str) -> str:
    return INSTRUCTIONS.get(task, task.replace("-", " "))


@functools.cache
def _task_of_instruction() -> dict[str, str]:
    return {instruction(t): t for t in task_names()}


def task_of(text: str) -> str | None:
    """The Meta-World task an instruction names, or None if it is not one of the suite's."""
    return _task_of_instruction().get(text)


def goal_distance(task: str, env_state: np.ndarray) -> float:
    """Distance (m) to the goal of what the task moves there: the hand for reach tasks, else the first object."""
    e = np.asarray(env_state, np.float64)
    return float(np.linalg.norm((e[:3] if task.startswith("reach") else e[4:7]) - e[-3:]))


def _reset_mocap_welds(self) -> None:
    """Meta-World's `reset_mocap_welds`, written so it runs under mujoco 3.x (11-entry rows) and 4.x (12)."""
    if self.model.nmocap > 0 and self.model.eq_data is not None:
        weld = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 5.0])
        for i in range(self.model.eq_data.shape[0]):
            if self.model.eq_type[i] == mujoco.mjtEq.mjEQ_WELD:
                self.model.eq_data[i, : len(weld)] = weld


def _sawyer_class(task: str):
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    key = f"{task}-v3"
    if key not in ALL_V3_ENVIRONMENTS:
        raise ValueError(f"unknown Meta-World task {task!r}; valid: {', '.join(task_names())}")
    base = ALL_V3_ENVIRONMENTS[key]
    return type(f"Wmrl{base.__name__}", (base,), {"reset_mocap_welds": _reset_mocap_welds})


class MetaWorldEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 80, "robot_type": "sawyer"}  # 5 x 2.5 ms per step
    steps_taken = 0  # true-simulator steps in this process (imagination RL reports that it stays 0)

    def __init__(self, task: str = "reach", image_size: int | tuple[int, int] = 64,
                 cameras: tuple[str, ...] = ("front", "wrist"), max_episode_steps: int | None = None,
                 render_mode: str | None = None, render_size: tuple[int, int] = (240, 320), post_success_steps: int = 0):
        check_view_args(cameras, render_mode, post_success_steps)
        self.task = task
        self.sawyer = _sawyer_class(task)()
        self.sawyer._partially_observable = False  # the goal is part of the (privileged) environment state
        self.sawyer._set_task_called = True
        self.sawyer.__dict__.pop("sawyer_observation_space", None)  # re-cache the bounds with the goal visible
        self.model, self.data = self.sawyer.model, self.sawyer.data
        self.model.vis.quality.offsamples = 0  # no multisampling (before any renderer is made)
        self.cameras = tuple(cameras)
        self.height, self.width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.render_mode, self.render_size = render_mode, render_size
        self.max_episode_steps = int(max_episode_steps or MAX_STEPS)
        self.sawyer.max_path_length = max(self.sawyer.max_path_length, self.max_episode_steps + post_success_steps)
        self.post_success_steps = post_success_steps
        self.task_text = instruction(task)
        control = EEDeltaControl(ee_index=(0, 1, 2), gripper_index=3, gripper_open=1.0, ee_step=self.sawyer.action_scale,
                                 workspace_low=tuple(float(v) for v in self.sawyer.mocap_low),
                                 workspace_high=tuple(float(v) for v in self.sawyer.mocap_high),
                                 # a world model's state channel predicts the objects where the task has a state rule
                                 object_state="metaworld" if mw_tasks.has_rule(task) else None,
                                 object_xyz=mw_tasks.OBJECT_XYZ, env_arm=mw_tasks.ENV_ARM, env_previous=mw_tasks.ENV_PREVIOUS)
        self.metadata = {**type(self).metadata, "control": control.to_meta()}  # per task: workspaces differ
        self._renderers: dict[tuple[int, int], mujoco.Renderer] = {}
        self._seg_renderer: mujoco.Renderer | None = None

        obs = {image_key(c): spaces.Box(0, 255, (self.height, self.width, 3), np.uint8) for c in self.cameras}
        obs[OBS_STATE] = spaces.Box(-np.inf, np.inf, (len(STATE_NAMES),), np.float32)
        obs[OBS_ENV_STATE] = spaces.Box(-np.inf, np.inf, (39,), np.float32)
        obs[TASK] = spaces.Text(max_length=64, min_length=1, charset=TEXT_CHARSET)
        self.observation_space = spaces.Dict(obs)
        self.action_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self._raw: np.ndarray | None = None
        self._t = 0
        self._since_success = -1

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        vec = options.get("rand_vec")
        if vec is None:
            # Meta-World draws the layout itself (some tasks redraw until objects are far enough apart), from the
            # generator we seed here from ours: a seed is a reproducible start.
            self.sawyer.np_random = np.random.default_rng(int(self.np_random.integers(2**63)))
            self.sawyer.seeded_rand_vec, self.sawyer._freeze_rand_vec = True, False
            self.sawyer.reset()
            vec = self.sawyer._last_rand_vec
        vec = np.asarray(vec, np.float64)
        low = self.sawyer._random_reset_space.low
        if vec.shape != low.shape or not np.all(np.isfinite(vec)):
            raise ValueError(f"rand_vec: expected {low.shape[0]} finite values, got shape {vec.shape}")
        # Reset (again) with the layout frozen: Meta-World's reset runs its layout code twice, and the simulator
        # steps some tasks take there depend on the first pass, so only a frozen layout makes the start a function
        # of the layout alone (what `options={"rand_vec": ...}` restores).
        self.sawyer._last_rand_vec, self.sawyer._freeze_rand_vec = vec, True
        self.sawyer.reset()
        # Some tasks move bodies through the model (`model.body(...).pos`) and return an observation computed before
        # the next forward pass, i.e. with the previous episode's object positions: recompute it after one.
        mujoco.mj_forward(self.model, self.data)
        current = self.sawyer._get_curr_obs_combined_no_goal()
        self.sawyer._prev_obs = current.copy()
        self._raw = np.hstack([current, current, self.sawyer._get_pos_goal()])
        self._t, self._since_success = 0, -1
        return self._obs(), self._info()

    def step(self, action):
        if self._raw is None:
            raise RuntimeError("call reset() before step()")
        MetaWorldEnv.steps_taken += 1
        a = np.clip(validate_action(action, self.action_space.shape), -1.0, 1.0).astype(np.float32)
        self._raw, reward, _, _, info = self.sawyer.step(a)
        self._t += 1
        ok = bool(info["success"])
        if ok or self._since_success >= 0:
            self._since_success += 1
        terminated = self._since_success >= self.post_success_steps
        truncated = (not terminated) and self._t >= self.max_episode_steps
        return self._obs(), float(reward), terminated, truncated, self._info(ok)

    def layout(self) -> np.ndarray:
        """This episode's object and goal positions (`options={"rand_vec": ...}` restores them)."""
        return np.array(self.sawyer._last_rand_vec)

    def moving_mask_at(self, qpos: np.ndarray) -> dict[str, np.ndarray]:
        """Per camera, a bool (H, W) mask of the pixels showing the arm or an object (geoms on bodies that can move:
        the table, walls and the arm's fixed base are excluded), from a MuJoCo segmentation render at `qpos`;
        world-model evaluation scores fidelity on these pixels. Leaves the simulator at `qpos`."""
        qpos = np.asarray(qpos, np.float64)
        if qpos.shape != (self.model.nq,) or not np.isfinite(qpos).all():
            raise ValueError(f"qpos: expected {self.model.nq} finite values, got shape {qpos.shape}")
        self.data.qpos[:] = qpos
        mujoco.mj_forward(self.model, self.data)
        if self._seg_renderer is None:
            self._seg_renderer = mujoco.Renderer(self.model, self.height, self.width)
            self._seg_renderer.enable_segmentation_rendering()
        moving = np.flatnonzero(self.model.body_weldid[self.model.geom_bodyid] != 0)
        return geom_masks(self._seg_renderer, self.data, {c: CAMERAS[c] for c in self.cameras}, moving)

    def _info(self, ok: bool = False) -> dict:
        return {"success": ok, "is_success": ok, "task": self.task_text, "step": self._t,
                "qpos": self.data.qpos.astype(np.float32), "qvel": self.data.qvel.astype(np.float32)}

    def _render(self, camera: str, size: tuple[int, int]) -> np.ndarray:
        if size not in self._renderers:
            self._renderers[size] = mujoco.Renderer(self.model, *size)
        r = self._renderers[size]
        r.update_scene(self.data, camera=CAMERAS[camera])
        r.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
        r.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
        return r.render().copy()

    def _obs(self) -> dict:
        obs = {image_key(c): self._render(c, (self.height, self.width)) for c in self.cameras}
        obs[OBS_STATE] = self._raw[:4].astype(np.float32)
        obs[OBS_ENV_STATE] = self._raw.astype(np.float32)
        obs[TASK] = self.task_text
        return obs

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        return self._render("front", tuple(self.render_size))

    def close(self):
        for r in [*self._renderers.values(), *([self._seg_renderer] if self._seg_renderer is not None else [])]:
            r.close()
        self._renderers, self._seg_renderer = {}, None
        self.sawyer.close()
