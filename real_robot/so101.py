"""LeRobot's SO-101 follower, simulated: `SimSO101Follower` speaks the driver API of LeRobot's `SO101Follower` over
the MuJoCo SO-101 cell (`sim.so101`), so everything above the driver runs as it would on a physical arm:

    arm = LeRobotArm(SimSO101Follower(task="reach-red"))          # or LeRobotArm(SO101Follower(config)) on hardware
    robot = SafeRobot(arm, so101_safety(), fk=wmrl.core.so101.forward_kinematics)

The API as LeRobot defines it (lerobot/robots/so101_follower): `connect()`, `get_observation()` ->
{"shoulder_pan.pos": deg, ..., "wrist_roll.pos": deg, "gripper.pos": 0..100, "<camera>": HxWx3 uint8},
`send_action({"<motor>.pos": ...})` -> the goal actually sent, after clipping each motor to within
`max_relative_target` of its present position when that is set, `disconnect()`. Degrees are LeRobot's
`use_degrees=True` mode: 0 in the middle of each joint's range, which is the MJCF's 0 ("new calibration"). The
gripper reads 0 fully open to 100 closed, `LeRobotArm`'s default range. Beyond the motors the simulated cell reports
what a tracker and an operator would (`observation.environment_state`, `task`, `success`) and can reset itself.

Each `send_action` advances the physics one control period (a 10 Hz loop paced by the caller: `wmrl deploy`'s
executor sends on wall-clock deadlines). Like `tabletop-real`, the cell runs hidden parameters that differ from the
nominal twin (servo gains and damping, actuation latency, camera pose, light): `wmrl sysid --robot sim-so101` and
`wmrl calibrate-twin` recover them. Not modelled: backlash, observation latency, the real servos' gains (the
package's kp 17.8 is not measured on an arm).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from real_robot.safety import SafetyConfig
from sim.so101.env import SO101Env
from wmrl.core import so101 as K
from wmrl.core.features import OBS_ENV_STATE, TASK, image_key

MOTORS = K.JOINTS + (K.GRIPPER,)


def so101_safety(base: SafetyConfig | None = None) -> SafetyConfig:
    """The SO-101's limits: its joint ranges and a tip box around the reachable workspace (5 cm beyond the IK's box
    sideways and up, 5 mm above the table); rates and timeouts from `base`."""
    base = base or SafetyConfig()
    return SafetyConfig(**{**base.__dict__, "joint_low": tuple(float(v) for v in K.JOINT_LOW),
                           "joint_high": tuple(float(v) for v in K.JOINT_HIGH),
                           "workspace_low": (0.1, -0.22, 0.005), "workspace_high": (0.34, 0.22, 0.25)})


class SimSO101Follower:
    name = "so101_follower"

    def __init__(self, task: str = "reach-red", cameras: tuple[str, ...] = ("front", "wrist"), image_size: int = 64,
                 control_hz: float = 10.0, max_relative_target: float | None = None, seed: int = 0, twin="real"):
        """`twin`: "real" (the cell's hidden parameters, `sim.so101.env.REAL_SO101`: what calibration must find), None
        (nominal) or any `TwinParams`."""
        if max_relative_target is not None and not max_relative_target > 0:
            raise ValueError(f"max_relative_target: a positive number of degrees or None, got {max_relative_target}")
        self.config = SimpleNamespace(id="sim", cameras={c: None for c in cameras}, max_relative_target=max_relative_target)
        self.task, self.image_size, self.control_hz, self.seed, self.twin = task, image_size, control_hz, seed, twin
        self.env: SO101Env | None = None
        self._obs: dict | None = None
        self._info: dict = {}

    @property
    def is_connected(self) -> bool:
        return self.env is not None

    def connect(self, calibrate: bool = True) -> None:
        self.env = SO101Env(task=self.task, control="joint", image_size=self.image_size,
                            cameras=tuple(self.config.cameras), control_hz=self.control_hz, max_episode_steps=10**9,
                            twin=self.twin)
        self.reset_episode(self.seed)

    def reset_episode(self, seed: int | None = None) -> None:
        """The operator resets the cell: a new layout, the arm at its home pose."""
        self._check()
        self._obs, self._info = self.env.reset(seed=seed)

    def _check(self) -> None:
        if self.env is None:
            raise ConnectionError("SimSO101Follower is not connected")

    def _present_deg(self) -> dict[str, float]:
        q = self.env.arm_joints()
        out = {f"{j}.pos": math.degrees(q[i]) for i, j in enumerate(K.JOINTS)}
        out[f"{K.GRIPPER}.pos"] = 50.0 * (K.gripper_command(q[5]) + 1.0)  # command -1 (open) .. +1 -> 0 .. 100
        return out

    def get_observation(self) -> dict:
        self._check()
        obs = self._present_deg()
        for cam in self.config.cameras:
            obs[cam] = self._obs[image_key(cam)]
        obs[OBS_ENV_STATE], obs[TASK] = self._obs[OBS_ENV_STATE], self._obs[TASK]
        obs["success"], obs["step"] = bool(self._info.get("success", False)), int(self._info.get("step", 0))
        return obs

    def send_action(self, action: dict) -> dict:
        self._check()
        missing = [f"{m}.pos" for m in MOTORS if f"{m}.pos" not in action]
        if missing:
            raise KeyError(f"send_action: missing {missing}")
        goal = {k: float(action[k]) for k in (f"{m}.pos" for m in MOTORS)}
        if not all(math.isfinite(v) for v in goal.values()):
            raise ValueError(f"send_action: non-finite goal {goal}")
        if self.config.max_relative_target is not None:  # LeRobot's ensure_safe_goal_position
            present, cap = self._present_deg(), self.config.max_relative_target
            goal = {k: float(np.clip(v, present[k] - cap, present[k] + cap)) for k, v in goal.items()}
        q = [math.radians(goal[f"{j}.pos"]) for j in K.JOINTS]
        g = float(np.clip(goal[f"{K.GRIPPER}.pos"] / 50.0 - 1.0, -1.0, 1.0))
        self._obs, _, _, _, self._info = self.env.step(np.append(q, g).astype(np.float32))
        return goal

    def disconnect(self) -> None:
        if self.env is not None:
            self.env.close()
        self.env = None


__all__ = ["SimSO101Follower", "so101_safety", "MOTORS"]
