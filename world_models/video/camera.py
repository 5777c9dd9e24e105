"""Where a camera sees a point: pinhole projections of the frame state's points (hand, object centres) onto the
latent grid, drawn as Gaussian blobs (`WorldModelConfig.frame_blobs`), and each object's image displacement, which
the change mask's object sources carry the start frame by (`object_moves`, `WorldModelConfig.change_objects`).

Session 36's probe found that a frames model given each frame's state as constant planes barely reads it (moving
every cube 5 cm changed its predicted change by 10%): a convolution has no spatial handle on a number broadcast over
the grid. A blob where the camera sees the object is that handle: the position is where the activation is.

A camera's geometry (`camera_geometry`, from the simulator's model, `sim.tabletop.env.MujocoCell.camera_geometry`):
    {"mount": "world" | "hand_yaw", "R": 3x3 (its columns: the camera's axes), "t": 3, "f": 1 / tan(fovy / 2)}
- "world": a fixed camera; R, t are its orientation and position in the world.
- "hand_yaw": a camera on the hand of an arm that yaws about the vertical axis through the origin and holds the hand
  level (the tabletop arm): R, t are its orientation and its offset from the end-effector in the hand's yaw frame,
  which turns by atan2(ee_y, ee_x). (On the tabletop: 1.5 mm and 0.015 median error against MuJoCo's own camera
  pose over random motion; larger while the hand swings.)
MuJoCo's camera looks along -z with x right and y up; the latent grid's x runs left to right and its y top to
bottom (the CoordConv planes, `VideoWorldModel.coords`), so a point at camera coordinates (x, y, z) lands at grid
(f x / -z, -f y / -z). Points behind the camera draw nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MOUNTS = ("world", "hand_yaw")


def check_geometry(geometry: dict, cameras) -> None:
    """Every camera has a valid entry: a clear error at construction rather than a wrong blob later."""
    for cam in cameras:
        g = geometry.get(cam)
        if g is None:
            raise ValueError(f"frame_blobs needs every camera's geometry: {cam!r} is missing (have {sorted(geometry)})")
        if g.get("mount") not in MOUNTS:
            raise ValueError(f"camera {cam!r}: mount must be one of {MOUNTS}, got {g.get('mount')!r}")
        R, t, f = g.get("R"), g.get("t"), g.get("f")
        if R is None or t is None or f is None or torch.as_tensor(R).shape != (3, 3) or len(t) != 3 or not f > 0:
            raise ValueError(f"camera {cam!r}: expected R (3x3), t (3) and f > 0, got {g}")


def yaw_rotation(p: torch.Tensor) -> torch.Tensor:
    """(..., 3) -> (..., 3, 3): the rotation about z by atan2(p_y, p_x)."""
    a = torch.atan2(p[..., 1], p[..., 0])
    c, s, z, o = torch.cos(a), torch.sin(a), torch.zeros_like(a), torch.ones_like(a)
    return torch.stack([c, -s, z, s, c, z, z, z, o], -1).reshape(*a.shape, 3, 3)


def camera_pose(hand: torch.Tensor, g: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The camera `g`'s position (3,) and orientation (3, 3) in the world (its columns: the camera's axes), or for a
    camera on the hand (..., 3) and (..., 3, 3), with the hand (end-effector) at `hand` (..., 3)."""
    R = torch.as_tensor(g["R"], dtype=hand.dtype, device=hand.device)
    t = torch.as_tensor(g["t"], dtype=hand.dtype, device=hand.device)
    if g["mount"] == "world":
        return t, R
    Y = yaw_rotation(hand)  # the camera turns with the hand's yaw about the base
    return hand + (Y @ t[:, None])[..., 0], Y @ R


def camera_coords(points: torch.Tensor, hand: torch.Tensor, g: dict) -> torch.Tensor:
    """World points (..., N, 3) in the frame of the camera `g` (x right, y up, looking along -z), with the hand
    (end-effector) at `hand` (..., 3)."""
    pos, rot = camera_pose(hand.to(points.dtype), g)
    rel = points - pos[..., None, :] if pos.dim() > 1 else points - pos
    return rel @ rot if rot.dim() == 2 else torch.einsum("...nj,...jk->...nk", rel, rot)  # R^T (p - pos), row vectors


def project(points: torch.Tensor, hand: torch.Tensor, g: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """World points (..., N, 3) seen from the camera `g`, with the hand (end-effector) at `hand` (..., 3):
    grid coordinates (..., N, 2) (x, y in [-1, 1] inside the image) and whether each is in front of the camera."""
    cam = camera_coords(points, hand, g)
    depth = -cam[..., 2]
    front = depth > 1e-3
    d = depth.clamp(min=1e-3)
    return torch.stack([g["f"] * cam[..., 0] / d, -g["f"] * cam[..., 1] / d], -1), front


def blob_maps(points: torch.Tensor, hand: torch.Tensor, geometry: dict, cameras, coords: torch.Tensor,
              width: float) -> torch.Tensor:
    """Gaussian blobs of std `width` (grid units) at every point's projection in every camera: points (B, F, N, 3),
    hand (B, F, 3), coords (1, 2, S, S) the grid's x/y -> (B, len(cameras) * F * N, S, S), camera-major."""
    B, Fr, N = points.shape[:3]
    xs, ys = coords[0, 0], coords[0, 1]  # (S, S)
    maps = []
    for cam in cameras:
        uv, front = project(points, hand, geometry[cam])  # (B, F, N, 2), (B, F, N)
        d2 = (xs - uv[..., 0, None, None]) ** 2 + (ys - uv[..., 1, None, None]) ** 2
        maps.append(torch.exp(-d2 / (2 * width**2)) * front[..., None, None])
    return torch.stack(maps, 1).reshape(B, len(cameras) * Fr * N, *xs.shape)


def object_moves(points0: torch.Tensor, points: torch.Tensor, g: dict, radius: float) -> torch.Tensor:
    """How each object moved in one camera's image between a start frame and a later one, for the change mask's
    object sources (`networks.ChangeMask(n_objects)`): points0, points (N, 1 + k, 3) = [hand, k object centres] at the
    start and at the frame -> (N, k, 5) = [shift x, y (the image displacement), centre x, y (where it is now), window
    (its image radius, radius m at its depth, times 1.5)] in the image's [-1, 1] coordinates. An object behind the
    camera at either time gets no window (centre far outside, window ~0)."""
    uv0, front0 = project(points0[:, 1:], points0[:, 0], g)
    uv, front = project(points[:, 1:], points[:, 0], g)
    depth = -camera_coords(points[:, 1:], points[:, 0], g)[..., 2]
    seen = front0 & front
    window = torch.where(seen, (1.5 * g["f"] * radius / depth.clamp(min=1e-3)).clamp(0.05, 0.6), torch.full_like(depth, 1e-3))
    centre = torch.where(seen[..., None], uv, torch.full_like(uv, 10.0))
    shift = torch.where(seen[..., None], uv - uv0, torch.zeros_like(uv))
    return torch.cat([shift, centre, window[..., None]], -1)


def pixel_rays(hand: torch.Tensor, g: dict, H: int, W: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The camera `g`'s rays through each pixel's centre, with the hand at `hand` (N, 3): origins (N, 3) and unit
    directions (N, H * W, 3) in the world, row-major (`project`'s inverse: grid x = (j + 0.5) / W * 2 - 1)."""
    pos, rot = camera_pose(hand, g)
    pos, rot = pos.expand(len(hand), 3), rot.expand(len(hand), 3, 3)
    ys = (torch.arange(H, dtype=hand.dtype, device=hand.device) + 0.5) / H * 2 - 1
    xs = (torch.arange(W, dtype=hand.dtype, device=hand.device) + 0.5) / W * 2 - 1
    y, x = torch.meshgrid(ys, xs, indexing="ij")
    cam = torch.stack([x / g["f"], -y / g["f"], -torch.ones_like(x)], -1).reshape(-1, 3)  # depth 1 along -z
    d = torch.einsum("nij,pj->npi", rot, cam)
    return pos, d / d.norm(dim=-1, keepdim=True)


def box_hits(origin: torch.Tensor, dirs: torch.Tensor, centres: torch.Tensor, half: float) -> torch.Tensor:
    """Distance along each ray (N, P, 3 from origins (N, 3)) to where it enters each axis-aligned cube of half extent
    `half` centred at `centres` (N, k, 3) -> (N, k, P), inf where it misses (the slab method)."""
    o = origin[:, None, None]  # (N, 1, 1, 3)
    d = dirs[:, None]  # (N, 1, P, 3)
    inv = 1.0 / torch.where(d.abs() < 1e-9, torch.full_like(d, 1e-9), d)
    lo = (centres[:, :, None] - half - o) * inv
    hi = (centres[:, :, None] + half - o) * inv
    t_in = torch.minimum(lo, hi).amax(-1)
    t_out = torch.maximum(lo, hi).amin(-1)
    hit = (t_out >= t_in) & (t_out > 0)
    return torch.where(hit, t_in.clamp(min=0), torch.full_like(t_in, float("inf")))


def cube_pixels(points: torch.Tensor, g: dict, radius: float, H: int, W: int) -> torch.Tensor:
    """Where the camera `g` sees a cube (N, 1, H, W) bool: points (N, 1 + k, 3) = [hand, cube centres], each cube
    axis-aligned with half extent `radius`, every pixel whose ray meets one."""
    origin, dirs = pixel_rays(points[:, 0], g, H, W)
    return torch.isfinite(box_hits(origin, dirs, points[:, 1:], radius).amin(1)).reshape(len(points), 1, H, W)


def reproject_objects(frame0: torch.Tensor, points0: torch.Tensor, points: torch.Tensor, g: dict, radius: float,
                      cover: torch.Tensor | None = None, cover0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each object drawn where it now is in one camera, from its pixels in the start frame: for every pixel whose ray
    meets an object's cube (half extent `radius`, axis-aligned, the nearest cube where several), the point hit is
    carried back by that object's displacement and looked up in the start frame (N, 3, H, W) as the camera saw it
    then. points0, points (N, 1 + k, 3) = [hand, object centres] at the start frame and now -> the frame of the
    objects' pixels (N, 3, H, W) and where it holds one (N, 1, H, W) in [0, 1] (a hit the start frame saw).
    `cover`, `cover0` (N, 1, H, W) in [0, 1]: what stands in front of the objects (the arm, the gripper's fingers) in
    the frame now and in the start frame (default: `cover`, for a camera the occluder is fixed to): an object is
    drawn only where it is not covered now, and looked up only where it was not covered then.

    Unlike `ChangeMask.object_sources`' translated patch, the view's own motion is in it: a camera on the hand that
    comes down over a cube sees the cube grow and turn with the arm's yaw, which a shifted patch of the start frame
    does not show. It assumes the objects slide without turning, and it looks up a face the start frame may not have
    seen (a side that faced away) at whatever the start frame shows there. Drawing the table too (a plane that slides
    under a camera on the hand) was tried: where the gripper's fingers moved since the start frame, their old pixels
    are carried onto the table (session 69)."""
    N, _, H, W = frame0.shape
    origin, dirs = pixel_rays(points[:, 0], g, H, W)
    near, which = box_hits(origin, dirs, points[:, 1:], radius).min(1)  # (N, P)
    hit = torch.isfinite(near)
    p = origin[:, None] + dirs * near.clamp(max=1e3)[..., None]  # (N, P, 3)
    p0 = p - torch.gather(points[:, 1:] - points0[:, 1:], 1, which[..., None].expand(-1, -1, 3))
    uv0, front = project(p0, points0[:, 0], g)
    seen = hit & front & (uv0.abs() <= 1).all(-1)
    grid = uv0.reshape(N, H, W, 2)
    img = F.grid_sample(frame0, grid, mode="bilinear", padding_mode="border", align_corners=False)
    cover0 = cover if cover0 is None else cover0
    if cover0 is not None:
        seen &= F.grid_sample(cover0, grid, mode="bilinear", padding_mode="border", align_corners=False)[:, 0].flatten(1) < 0.5
    a = seen.reshape(N, 1, H, W).to(frame0.dtype)
    return img, a * (1 - cover) if cover is not None else a
