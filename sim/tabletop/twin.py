"""Twin parameters: everything a digital twin of the tabletop cell must match.

`TwinParams` is applied in place to a compiled MuJoCo model (no recompilation, so renderers stay valid),
randomised for domain randomisation, and perturbed to make the hidden "real" world of `tabletop-real`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import mujoco
import numpy as np

CUBE_COLOURS = ("red", "green", "blue")
ZONE_COLOURS = ("yellow", "purple")
ARM_JOINTS = ("yaw", "shoulder", "elbow", "wrist")


def _default_cube_rgba() -> dict[str, tuple[float, float, float, float]]:
    return {"red": (0.85, 0.12, 0.1, 1.0), "green": (0.1, 0.7, 0.15, 1.0), "blue": (0.1, 0.25, 0.9, 1.0)}


def _default_zone_rgba() -> dict[str, tuple[float, float, float, float]]:
    return {"yellow": (0.95, 0.85, 0.1, 1.0), "purple": (0.6, 0.2, 0.75, 1.0)}


@dataclass
class TwinParams:
    """Physical, visual and timing parameters of the tabletop cell.

    Scalars marked *scale* multiply the nominal model value, so 1.0 is nominal everywhere.
    """

    cube_half_size: float = 0.02  # m
    cube_mass: float = 0.05  # kg
    cube_friction: float = 1.0  # sliding friction coefficient of the cubes
    table_friction: float = 0.6
    arm_damping: float = 1.0  # scale on joint damping
    arm_kp: float = 1.0  # scale on arm position-actuator gains
    gripper_kp: float = 1.0  # scale on finger position-actuator gains
    latency_s: float = 0.0  # control latency: a new command takes effect this long into the control period
    light_intensity: float = 0.7  # diffuse intensity of the key light
    camera_offset: tuple[float, float, float] = (0.0, 0.0, 0.0)  # front camera position offset (m)
    camera_fovy: float = 40.0  # front camera vertical field of view (deg)
    cube_rgba: dict[str, tuple[float, float, float, float]] = field(default_factory=_default_cube_rgba)
    zone_rgba: dict[str, tuple[float, float, float, float]] = field(default_factory=_default_zone_rgba)
    # Initial object-pose distribution (workspace region the layout sampler draws from).
    cube_x_range: tuple[float, float] = (0.3, 0.5)
    cube_y_range: tuple[float, float] = (-0.16, 0.16)
    cube_yaw_range: float = 0.25  # rad, symmetric
    zone_radius: float = 0.05

    # Parameters a calibration can identify from logs (name -> bounds); used by twin calibration.
    IDENTIFIABLE = {
        "cube_mass": (0.01, 0.3),
        # MuJoCo uses the larger friction of two touching geoms: below the table's (0.6) the cube's friction has no
        # effect on sliding, so a search below it would only wander on a plateau
        "cube_friction": (0.6, 2.0),
        "arm_damping": (0.3, 3.0),
        "arm_kp": (0.3, 3.0),
        "latency_s": (0.0, 0.08),
        # identified from camera images: the front camera's position offset (m), field of view (deg), key light
        "camera_x": (-0.05, 0.05),
        "camera_y": (-0.05, 0.05),
        "camera_z": (-0.05, 0.05),
        "camera_fovy": (30.0, 55.0),
        "light_intensity": (0.2, 1.0),
    }
    OFFSET_AXES = {"camera_x": 0, "camera_y": 1, "camera_z": 2}  # identifiable names that index camera_offset

    def get(self, name: str) -> float:
        """An identifiable parameter's value (camera_x/y/z read `camera_offset`)."""
        return float(self.camera_offset[self.OFFSET_AXES[name]]) if name in self.OFFSET_AXES else float(getattr(self, name))

    def with_values(self, values: dict[str, float]) -> "TwinParams":
        """A copy with identifiable parameters set by name (camera_x/y/z write `camera_offset`)."""
        offset, plain = list(self.camera_offset), {}
        for k, v in values.items():
            if k in self.OFFSET_AXES:
                offset[self.OFFSET_AXES[k]] = float(v)
            else:
                plain[k] = v
        return self.replace(camera_offset=tuple(offset), **plain)

    def replace(self, **changes) -> "TwinParams":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TwinParams":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown TwinParams fields {sorted(unknown)}; valid: {sorted(known)}")
        kw = {}
        for k, v in d.items():
            kw[k] = {c: tuple(x) for c, x in v.items()} if isinstance(v, dict) else (tuple(v) if isinstance(v, list) else v)
        return cls(**kw)

    def randomize(self, rng: np.random.Generator, scale: float = 0.1) -> "TwinParams":
        """Domain randomisation: multiplicative log-uniform noise of relative size `scale` on physics and
        appearance, a small camera shift and colour jitter."""

        def mul(x: float) -> float:
            return float(x * np.exp(rng.uniform(-scale, scale)))

        jitter = lambda rgba: tuple(float(np.clip(c + rng.uniform(-scale, scale) * 0.5, 0, 1)) for c in rgba[:3]) + (1.0,)
        return self.replace(
            cube_mass=mul(self.cube_mass),
            cube_friction=mul(self.cube_friction),
            arm_damping=mul(self.arm_damping),
            arm_kp=mul(self.arm_kp),
            gripper_kp=mul(self.gripper_kp),
            light_intensity=float(np.clip(mul(self.light_intensity), 0.2, 1.0)),
            camera_offset=tuple(float(o + rng.uniform(-scale, scale) * 0.05) for o in self.camera_offset),
            latency_s=float(max(0.0, self.latency_s + rng.uniform(0, scale) * 0.05)),
            cube_rgba={k: jitter(v) for k, v in self.cube_rgba.items()},
        )

    def perturb(self, **relative: float) -> "TwinParams":
        """Multiply named scalar fields by (1 + relative[name])."""
        out = {}
        for k, r in relative.items():
            v = getattr(self, k)
            if not isinstance(v, (int, float)):
                raise ValueError(f"perturb() takes scalar fields only; {k!r} is {type(v).__name__}")
            out[k] = float(v * (1.0 + r))
        return self.replace(**out)


# The hidden parameters of the "real" cell. Later issues calibrate a twin against episodes recorded here without
# reading this object; tests use it as ground truth for parameter recovery.
REAL_WORLD = TwinParams(
    cube_mass=0.08,
    cube_friction=0.75,
    arm_damping=1.4,
    arm_kp=0.8,
    latency_s=0.03,
    light_intensity=0.55,
    camera_offset=(0.015, -0.01, 0.01),
    camera_fovy=42.0,
)


@dataclass
class NominalModelValues:
    """Values of the compiled nominal model that TwinParams scale (read once, after compilation)."""

    dof_damping: np.ndarray
    actuator_gain: np.ndarray
    cam_pos: np.ndarray


def read_nominal(model: mujoco.MjModel) -> NominalModelValues:
    return NominalModelValues(
        dof_damping=model.dof_damping.copy(),
        actuator_gain=model.actuator_gainprm[:, 0].copy(),
        cam_pos=model.cam_pos.copy(),
    )


def apply_twin_params(model: mujoco.MjModel, data: mujoco.MjData, nominal: NominalModelValues, p: TwinParams,
                      arm_joints: tuple[str, ...] = ARM_JOINTS, gripper_actuators: tuple[str, ...] = ("finger_left", "finger_right")) -> None:
    """Write `p` into the compiled model in place, then recompute the model's derived constants (mj_setConst; it
    uses and overwrites `data`, so call it before resetting the state). Without that, the constraint solver keeps
    the compile-time inverse weights of the cubes: a cube heavier than nominal (0.08 kg) then makes contacts
    unstable (MuJoCo's "Nan, Inf or huge value in QVEL" reset) in ~1 of 10 fast sweeps, 0 after. `arm_joints` and
    `gripper_actuators` name the cell's arm (the tabletop's by default; the SO-101 cell passes its own)."""
    for colour in CUBE_COLOURS:
        gid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f"cube_{colour}")
        bid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, f"cube_{colour}")
        h = p.cube_half_size
        model.geom_size[gid] = (h, h, h)
        model.geom_rbound[gid] = np.sqrt(3) * h
        model.geom_aabb[gid, 3:] = h
        model.geom_rgba[gid] = p.cube_rgba[colour]
        model.geom_friction[gid, 0] = p.cube_friction
        model.body_mass[bid] = p.cube_mass
        model.body_inertia[bid] = p.cube_mass * (2 * h) ** 2 / 6.0
    for colour in ZONE_COLOURS:
        gid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f"zone_{colour}")
        model.geom_rgba[gid] = p.zone_rgba[colour]
        model.geom_size[gid, 0] = p.zone_radius
    table = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "table")
    model.geom_friction[table, 0] = p.table_friction
    arm_dofs = [model.jnt_dofadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, j)] for j in arm_joints]
    model.dof_damping[arm_dofs] = nominal.dof_damping[arm_dofs] * p.arm_damping
    for i in range(model.nu):
        scale = p.gripper_kp if model.actuator(i).name in gripper_actuators else p.arm_kp
        kp = nominal.actuator_gain[i] * scale
        model.actuator_gainprm[i, 0] = kp
        model.actuator_biasprm[i, 1] = -kp
    cam = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, "front")
    model.cam_pos[cam] = nominal.cam_pos[cam] + np.asarray(p.camera_offset)
    model.cam_fovy[cam] = p.camera_fovy
    model.light_diffuse[0] = (p.light_intensity,) * 3
    mujoco.mj_setConst(model, data)
