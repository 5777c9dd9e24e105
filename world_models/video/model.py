"""Action-conditioned latent video world model, v2: DIAMOND's EDM recipe in a learned latent space, WoVR's chunked
steps, Ctrl-World's shared multi-camera latent layout and per-frame pose conditioning, World-VLA-Loop's success
head trained on generated latents, and a structured state channel (`state_channel.py`) for object state.

    encode(obs)                 -> state   K context latents (all cameras stacked), the scene anchor, the pose
    step(state, action_chunk)   -> state, preds   one denoising pass predicts the next H frames at once
    decode(latents)             -> {camera: uint8 frames}   only when asked: the costly part

What each generated frame is conditioned on (information a real robot has too):
- its own commanded pose p_j = [clip(ee_{j-1} + ee_step * a_j[:3]), a_j[3]] (end-effector target and gripper
  command), with ee_{j-1} the last observed end-effector for the first frame and afterwards the state channel's
  prediction (or the integrated command chain when there is no state channel); with a pose layout (LIBERO's
  OSC_POSE, `gripper_action` 6) also the frame's commanded rotation step rot_step * a_j[3:6]. Proprioception is
  never re-read from generated latents inside a rollout;
- the K context latents (noised at a level it is told, DIAMOND/GameNGen context augmentation) and the episode's
  first frame (the scene anchor, Ctrl-World's memory in its simplest form);
- optionally (`frame_state`) its own state [hand, opening, object centres]: recorded in training, the state channel's
  readout in a rollout (measured: read weakly as constant planes, no gain at the CPU budget; README), and
  (`frame_blobs`) its points drawn as blobs where each camera sees them (`camera.py`; measured: masked +0.56 and
  +0.62 dB over the constant planes' model, two seeds; README).

The denoiser predicts the *change* r = (z_future - z_last) / res_std: at zero update the last frame is kept, so
the network spends its capacity on what moves. D(r; sigma) = c_skip r + c_out F(c_in r, c_noise, cond) follows
Karras et al. (2022), Table 1, with the coefficients of diffusers' EDMEulerScheduler (`edm_coefficients`), which
also samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import EDMEulerScheduler
from torch import nn

from wmrl.core.features import OBS_ENV_STATE, OBS_STATE
from wmrl.core.checkpoint import load_state, read_config, save_pretrained
from world_models.edm import edm_coefficients
from world_models.video.camera import blob_maps, check_geometry, object_moves, reproject_objects
from world_models.video.networks import ChangeMask, FourierEmbedding, FrameAutoencoder, FrameHeads, TaskEncoder, UNet
from world_models.video.state_channel import CUBE_HUBER_CM, GATES, StateChannel, StateChannelConfig, clipped_target

SIZES = {"tiny": (16, 32), "small": (48, 96), "base": (128, 256), "large": (192, 384)}


# the change mask's kind: a mask is fitted after the other phases, so models that differ only in these share weights
CHANGE_MASK_FIELDS = ("change_mask", "change_refine", "change_warp", "change_unwarped", "change_read_pose", "change_objects",
                      "change_coords", "change_pose_layer")
# How decoded frames show the objects (`WorldModelConfig.object_layer`). "blend": the change mask's softmax over its
# sources, the objects' translated patches among them. "reproject": then each object drawn where the state channel
# puts it from its pixels in the start frame, through each camera's geometry (`camera.reproject_objects`: a camera on
# the hand that comes down over a cube sees it grow), except where the arm (the pose layer's coverage) or the
# gripper's fingers (the mask's weight on the unwarped start frame) stand in front. On generated frames a pixel
# policy's estimator misreads the cubes, and what misleads it is the wrist camera's cube pixels (README, ranking).
OBJECT_LAYERS = ("blend", "reproject")


def pixels(x, device=None) -> torch.Tensor:
    """uint8 (..., H, W, 3) -> float (N, 3, H, W) in [-1, 1]."""
    x = torch.as_tensor(np.asarray(x), device=device).float() / 127.5 - 1.0
    return x.reshape(-1, *x.shape[-3:]).permute(0, 3, 1, 2)


@dataclass
class WorldModelConfig:
    cameras: tuple[str, ...] = ("front", "wrist")
    image_size: int = 64
    latent_channels: int = 8  # per camera; a frame latent is (cameras * latent_channels, image_size / 4, ...)
    context: int = 2  # K context frames
    chunk: int = 4  # H frames predicted per step (one action per frame)
    action_dim: int = 4
    state_dim: int = 8
    env_state_dim: int = 0  # > 0: the data has object state; a state channel learns its dynamics
    size: str = "small"  # U-Net widths, see SIZES; scales up on a GPU without code changes
    ae_width: int = 16
    cond_dim: int = 128
    task_dim: int = 32
    sigma_data: float = 1.0  # residual latents are standardised per channel
    sigma_min: float = 0.002
    sigma_max: float = 5.0
    p_mean: float = -0.4  # training ln(sigma) ~ N(p_mean, p_std), DIAMOND
    p_std: float = 1.2
    context_noise_max: float = 0.7  # training context noise level ~ U(0, max) (GameNGen uses up to 0.7)
    context_noise_sample: float = 0.1  # the small level generated context is noised to, and told, at sampling
    motion_weight: float = 3.0  # extra dynamics-loss weight where the future differs from the last context frame
    sampling_steps: int = 3
    # share of training samples that regress the conditional mean: sigma_max with a zero input, the point one-step
    # sampling starts from (imagination samples with 1 step); the other samples train the diffusion path
    mean_share: float = 0.25
    deterministic: bool = False  # baseline: same backbone regressing the change directly, no diffusion
    # a per-camera pixel mask blends each decoded frame with the rollout's start frame (`networks.ChangeMask`),
    # fitted after the other phases on the model's own rollouts (`change_mask.py`); used once fitted
    change_mask: bool = True
    change_refine: bool = False  # the mask's network also corrects pixels (`networks.ChangeMask(refine=True)`)
    change_warp: bool = False  # the start frame is warped to each frame's commanded pose first (`ChangeMask(warp_pose_dim)`)
    change_unwarped: bool = False  # with the warp, the unwarped start frame is a third source (`ChangeMask(keep_unwarped)`)
    change_read_pose: bool = False  # with the warp, the mask's network reads the pose change (`ChangeMask(read_pose)`)
    # with the three sources and a state channel, one more per object: the start frame carried by the object's
    # predicted image displacement, near where it now is (`ChangeMask(n_objects)`; needs camera_geometry)
    change_objects: bool = False
    change_coords: bool = False  # the mask's network reads the pixel's x and y (`ChangeMask(coords)`)
    # with object sources, each camera fixed to the world gets one more: the arm rendered from the state channel's
    # hand (`networks.PoseLayer`, `ChangeMask(pose_layer)`)
    change_pose_layer: bool = False
    # how decoded frames show the objects (OBJECT_LAYERS; changes no weight): "blend", the change mask's learned
    # blend; "reproject", each object drawn from the start frame where the state channel puts it (needs object sources)
    object_layer: str = "blend"
    object_radius: float = 0.02  # m: an object's half extent, which sets its window in the image
    task_vocab: list[str] = field(default_factory=list)
    # the action space: end-effector delta (scaled by ee_step, clipped to the workspace) and a gripper command
    ee_index: tuple[int, int, int] = (5, 6, 7)  # end-effector xyz inside observation.state
    gripper_index: int = 4  # gripper opening (m) inside observation.state
    gripper_open: float = 0.09  # opening at command -1 (fully open); command +1 closes
    ee_step: float = 0.05
    # where the gripper command sits in the action: 3 for [dx, dy, dz, gripper]; 6 for a pose layout
    # [dx, dy, dz, drx, dry, drz, gripper] (LIBERO's OSC_POSE), whose rotation step (rot_step rad per unit) each
    # frame's commanded pose then carries
    gripper_action: int = 3
    rot_step: float = 0.5
    workspace_low: tuple[float, float, float] = (0.2, -0.28, 0.015)
    workspace_high: tuple[float, float, float] = (0.62, 0.28, 0.3)
    state_members: int = 5  # ensemble members of the state channel (used when env_state_dim > 0)
    # the state channel also predicts the rest of observation.state (joint angles): inside a rollout no
    # proprioception is read back from generated frames (False: checkpoints from before it existed)
    state_rest: bool = True
    state_pairs: bool = False  # the channel's cube head reads the nearest other cube (False: checkpoints from before)
    state_hand_frame: bool = True  # the channel's cube head works in the hand->cube frame (False: checkpoints from before)
    state_velocity: bool = False  # the channel carries the objects' last displacement and its cube head reads it
    state_arm_rest: bool = False  # the channel's arm head also reads the joint angles (needs state_rest)
    state_detach_hand: bool = False  # the channel's cube loss does not train its arm through the hand's position
    state_arm_target: bool = False  # the channel reads the workspace-clipped command; its arm predicts the deviation from it
    state_gate: str = "sample"  # how rollouts apply the channel's contact gate: sample | shared | hard | soft (GATES)
    # rollouts keep every object the hand does not hold at the height it started at (`state_channel.settle`; False:
    # checkpoints from before it existed)
    state_settle: bool = True
    state_height_loss: str = "huber"  # how the channel fits the cubes' height: huber | l1 (`state_channel.HEIGHT_LOSSES`)
    state_settle_unroll: bool = False  # the channel's unrolled loss settles the cubes as rollouts do (`settle_unroll`)
    state_cube_huber_cm: float = CUBE_HUBER_CM  # the Huber threshold of the channel's cube change (`CUBE_HUBER_CM`)
    # every generated frame is also conditioned on its state [hand, opening, object centres] (`frame_state_dim`): the
    # recorded one in training (noised by frame_state_noise m), the state channel's prediction in a rollout
    frame_state: bool = False
    frame_state_noise: float = 0.01
    # with frame_state, the state's points (hand, object centres) are also drawn as Gaussian blobs (std blob_width
    # grid units) where each camera sees them, per frame (`camera.py`; `camera_geometry` from the simulator)
    frame_blobs: bool = False
    blob_width: float = 0.15
    camera_geometry: dict = field(default_factory=dict)
    n_objects: int = 3  # objects the state channel predicts (len(object_xyz))
    # the layout of observation.environment_state (the dataset's `EEDeltaControl`): where each object's centre starts,
    # where [ee, opening] repeat (-1: nowhere), (start, n) of the previous frame's first n entries; the rest is static
    object_xyz: tuple[int, ...] = (0, 3, 6)
    env_arm: int = -1
    env_previous: tuple[int, int] = (0, 0)

    @property
    def latent_size(self) -> int:
        return self.image_size // 4

    @property
    def layer_cameras(self) -> list[str]:
        """The cameras whose change mask has a pose layer (`change_pose_layer`, with object sources): those fixed to
        the world. A camera on the hand sees the arm's fingers where they always are (the unwarped start frame)."""
        if not (self.change_pose_layer and self.change_objects):
            return []
        return [c for c in self.cameras if (self.camera_geometry or {}).get(c, {}).get("mount") == "world"]

    @property
    def rest_index(self) -> list[int]:
        """observation.state entries besides the end-effector and the gripper (joint angles), in order."""
        return [i for i in range(self.state_dim) if i not in self.ee_index and i != self.gripper_index]

    @property
    def frame_channels(self) -> int:
        return len(self.cameras) * self.latent_channels

    @property
    def rotation(self) -> bool:
        """Whether actions command a rotation (a pose layout: rotation at 3:6, the gripper at 6)."""
        return self.gripper_action == 6

    @property
    def frame_state_dim(self) -> int:
        """Entries of a frame's state that frames are conditioned on (`frame_state`): hand xyz, opening, object centres."""
        return 4 + 3 * self.n_objects if self.frame_state else 0

    @property
    def blob_channels(self) -> int:
        """Input maps of `frame_blobs`: one per camera, frame (the last context frame and each future one) and point."""
        return len(self.cameras) * (self.chunk + 1) * (1 + self.n_objects) if self.frame_blobs else 0

    @property
    def pose_dim(self) -> int:
        """Entries of a commanded pose: end-effector xyz target, [the rotation step,] gripper command."""
        return 7 if self.rotation else 4


# the state channel's recipe and rollout options (every `state_*` field but observation.state's size): models that
# differ only in these share every weight but the channel's
STATE_CHANNEL_FIELDS = tuple(f.name for f in fields(WorldModelConfig)
                             if f.name.startswith("state_") and f.name != "state_dim")


def commanded_pose(ee: torch.Tensor, action: torch.Tensor, cfg: WorldModelConfig) -> torch.Tensor:
    """The pose one action commands: [clip(ee + ee_step * a[:3], workspace), a[3]] (..., 4). This is the
    controller's target, as the simulator computes it (`TabletopEnv._ctrl_from_action`) and as a robot logs it.
    With a pose layout (`cfg.rotation`), [target, rot_step * a[3:6], a[6]] (..., 7): the commanded rotation step
    (axis-angle, rad) rides with the frame it moves. The absolute orientation is not integrated: it is what the
    context frames show, and an operational-space controller such as robosuite's turns the hand by this step
    from wherever it is (its goal is the current orientation rotated by the step)."""
    target = clipped_target(ee, action, cfg.ee_step, cfg.workspace_low, cfg.workspace_high)
    g = cfg.gripper_action
    parts = [target, cfg.rot_step * action[..., 3:6]] if cfg.rotation else [target]
    return torch.cat([*parts, action[..., g : g + 1]], -1)


# frames per pass of the autoencoder and the change mask over 64x64 frames: on a 2-core CPU a rollout of 100 windows
# x 16 frames decodes ~3x faster in passes of 32 frames than in one pass, and encodes ~3x faster too (a pass's
# activations then stay in cache; `wmrl bench conv-layout`); imagination's batches (10 envs x a chunk of 4) are about
# one pass anyway
FRAMES_PER_PASS = 32


def in_passes(f, x: torch.Tensor) -> torch.Tensor:
    """f(x) for a frame-wise f, computed over `FRAMES_PER_PASS` frames at a time."""
    return f(x) if len(x) <= FRAMES_PER_PASS else torch.cat([f(c) for c in x.split(FRAMES_PER_PASS)])


ARM_MARGIN = 0.03  # m: how far past the commanded workspace (and the gripper's range) the recorded hand ever is


def bound_arm(x: torch.Tensor, cfg: WorldModelConfig) -> torch.Tensor:
    """The state channel's x (..., D) with the hand kept inside the workspace and the opening inside the gripper's
    range, each widened by ARM_MARGIN. The controller clips every target to the workspace, so the true hand never
    leaves it by more than tracking error; an unbounded channel can extrapolate there, and beyond its data the
    arm's MLP is close to linear in its input, so an imagined hand 10 cm outside grows by orders of magnitude per
    step (seen: an RL rollout reaching inf, which made PPO's value targets NaN)."""
    lo = torch.tensor([*cfg.workspace_low, 0.0], dtype=x.dtype, device=x.device) - ARM_MARGIN
    hi = torch.tensor([*cfg.workspace_high, cfg.gripper_open], dtype=x.dtype, device=x.device) + ARM_MARGIN
    return torch.cat([torch.minimum(torch.maximum(x[..., :4], lo), hi), x[..., 4:]], -1)


def integrate_poses(ee0: torch.Tensor, actions: torch.Tensor, cfg: WorldModelConfig) -> torch.Tensor:
    """Commanded poses (B, h, pose_dim) of an action chunk (B, h, A) from the last known end-effector ee0 (B, 3), when no
    better estimate of the arm exists: each target becomes the next step's start (perfect tracking assumed)."""
    out, ee = [], ee0
    for j in range(actions.shape[1]):
        p = commanded_pose(ee, actions[:, j], cfg)
        out.append(p)
        ee = p[:, :3]
    return torch.stack(out, 1)


def channel_state(cfg: WorldModelConfig, proprio: torch.Tensor, env: torch.Tensor,
                  prev_env: torch.Tensor | None = None) -> torch.Tensor:
    """The state channel's x (..., D) = [ee, opening, object centres(, rest)(, object displacements)] of
    observation.state (..., S) and observation.environment_state (..., E); with `state_velocity` the objects' last
    displacement is env minus `prev_env` (the step before; None: at rest, as at an episode's start)."""
    objects = [o + k for o in cfg.object_xyz for k in range(3)]
    parts = [proprio[..., list(cfg.ee_index)], proprio[..., cfg.gripper_index : cfg.gripper_index + 1], env[..., objects]]
    if cfg.state_rest:
        parts.append(proprio[..., cfg.rest_index])
    if cfg.state_velocity:
        parts.append(env[..., objects] - prev_env[..., objects] if prev_env is not None else torch.zeros_like(env[..., objects]))
    return torch.cat(parts, -1)


def channel_states(cfg: WorldModelConfig, proprio: torch.Tensor, env: torch.Tensor) -> torch.Tensor:
    """`channel_state` of every frame of one sequence (T, S) and (T, E) -> (T, D); the first frame's objects at rest."""
    return channel_state(cfg, proprio, env, torch.cat([env[:1], env[:-1]]))


def scene_points(x: torch.Tensor, n_objects: int) -> torch.Tensor:
    """Channel states (..., D) -> the points a camera projects (..., 1 + n_objects, 3): the hand, the object centres."""
    return torch.cat([x[..., None, :3], x[..., 4 : 4 + 3 * n_objects].reshape(*x.shape[:-1], n_objects, 3)], -2)


class VideoWorldModel(nn.Module):
    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        if cfg.size not in SIZES:
            raise ValueError(f"size: expected one of {sorted(SIZES)}, got {cfg.size!r}")
        if not cfg.task_vocab:
            raise ValueError("task_vocab is empty: build the config from a dataset (its task strings)")
        if cfg.env_state_dim and len(cfg.object_xyz) != cfg.n_objects:
            raise ValueError(f"n_objects ({cfg.n_objects}) must equal len(object_xyz) ({len(cfg.object_xyz)})")
        if cfg.state_gate not in GATES:
            raise ValueError(f"state_gate: expected one of {GATES}, got {cfg.state_gate!r}")
        if cfg.object_layer not in OBJECT_LAYERS:
            raise ValueError(f"object_layer: expected one of {OBJECT_LAYERS}, got {cfg.object_layer!r}")
        if cfg.object_layer == "reproject" and not (cfg.change_mask and cfg.change_objects and cfg.camera_geometry):
            raise ValueError("object_layer reproject draws the objects where the state channel puts them: it needs a "
                             "change mask with object sources (change_objects) and the cameras' geometry")
        self.cfg = cfg
        if cfg.gripper_action not in (3, 6) or cfg.action_dim <= cfg.gripper_action:
            raise ValueError(f"gripper_action: expected 3 ([dx, dy, dz, g]) or 6 ([dx, dy, dz, drx, dry, drz, g]) inside "
                             f"an action of {cfg.action_dim}, got {cfg.gripper_action}")
        if cfg.frame_state and not (cfg.env_state_dim and cfg.state_members):
            raise ValueError("frame_state conditions frames on the state channel's predictions: it needs a state channel "
                             "(env_state_dim > 0 and state_members > 0)")
        if cfg.change_objects:
            if not (cfg.change_mask and cfg.change_unwarped and cfg.env_state_dim and cfg.state_members):
                raise ValueError("change_objects moves each object's patch where the state channel puts it: it needs a "
                                 "state channel and the change mask's three sources (change_warp, change_unwarped)")
            check_geometry(cfg.camera_geometry, cfg.cameras)
        if cfg.frame_blobs:
            if not cfg.frame_state:
                raise ValueError("frame_blobs draws the frame state's points: it needs frame_state")
            check_geometry(cfg.camera_geometry, cfg.cameras)
        C, K, H, P, Fs = cfg.frame_channels, cfg.context, cfg.chunk, cfg.pose_dim, cfg.frame_state_dim
        self.ae = FrameAutoencoder(cfg.latent_channels, cfg.ae_width)
        self.register_buffer("lat_mean", torch.zeros(C, 1, 1))
        self.register_buffer("lat_std", torch.ones(C, 1, 1))
        self.register_buffer("res_std", torch.ones(C, 1, 1))  # std of one-step latent changes, per channel
        self.noise_emb = FourierEmbedding(cfg.cond_dim)
        self.ctx_noise_emb = FourierEmbedding(cfg.cond_dim)
        self.pose_emb = nn.Linear(P, cfg.cond_dim // 4)  # per frame: frame-level conditioning
        self.frame_state_emb = nn.Linear(Fs, cfg.cond_dim // 4) if Fs else None  # added to the pose's embedding
        self.cond = nn.Sequential(nn.Linear(2 * cfg.cond_dim + (H + 1) * (cfg.cond_dim // 4), cfg.cond_dim), nn.SiLU(),
                                  nn.Linear(cfg.cond_dim, cfg.cond_dim))
        # Input: the noisy change, the context, the scene anchor, and maps that give convolutions spatial access to
        # the conditioning: x/y coordinates (CoordConv) and every frame's pose broadcast over the latent grid.
        self.unet = UNet(H * C + K * C + C + 2 + (H + 1) * (P + Fs) + cfg.blob_channels, H * C, cfg.cond_dim, SIZES[cfg.size])
        S = cfg.latent_size
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, S), torch.linspace(-1, 1, S), indexing="ij")
        self.register_buffer("coords", torch.stack([xs, ys])[None], persistent=False)
        lo, hi = np.array(cfg.workspace_low), np.array(cfg.workspace_high)
        rot_mid, rot_half = ([0.0] * 3, [cfg.rot_step] * 3) if cfg.rotation else ([], [])
        self.register_buffer("pose_mid", torch.tensor([*(lo + hi) / 2, *rot_mid, 0.0], dtype=torch.float32), persistent=False)
        self.register_buffer("pose_half", torch.tensor([*(hi - lo) / 2, *rot_half, 1.0], dtype=torch.float32), persistent=False)
        # a frame state [hand, opening, object centres] in the same units: the workspace box, the gripper's range
        mid = [*(lo + hi) / 2, cfg.gripper_open / 2, *np.tile((lo + hi) / 2, cfg.n_objects)]
        half = [*(hi - lo) / 2, cfg.gripper_open / 2, *np.tile((hi - lo) / 2, cfg.n_objects)]
        self.register_buffer("state_mid", torch.tensor(mid, dtype=torch.float32), persistent=False)
        self.register_buffer("state_half", torch.tensor(half, dtype=torch.float32), persistent=False)
        self.task = TaskEncoder(cfg.task_vocab, cfg.task_dim)
        self.heads = FrameHeads(C, cfg.state_dim, cfg.task_dim, cfg.latent_size)
        self.change_mask = (nn.ModuleDict({c: ChangeMask(refine=cfg.change_refine,
                                                          warp_pose_dim=cfg.pose_dim if cfg.change_warp else 0,
                                                          keep_unwarped=cfg.change_unwarped,
                                                          read_pose=cfg.change_read_pose,
                                                          n_objects=cfg.n_objects if cfg.change_objects else 0,
                                                          coords=cfg.change_coords,
                                                          pose_layer=c in cfg.layer_cameras)
                                          for c in cfg.cameras})
                            if cfg.change_mask else None)
        if cfg.change_mask:  # saved with the weights: an unfitted mask is never applied
            self.register_buffer("change_mask_fitted", torch.zeros((), dtype=torch.bool))
        self.state_channel = (StateChannel(StateChannelConfig(cfg.n_objects, cfg.action_dim, cfg.state_members,
                                                              ee_step=cfg.ee_step,
                                                              n_rest=len(cfg.rest_index) if cfg.state_rest else 0,
                                                              pairs=cfg.state_pairs, hand_frame=cfg.state_hand_frame,
                                                              velocity=cfg.state_velocity,
                                                              arm_rest=cfg.state_arm_rest,
                                                              detach_hand=cfg.state_detach_hand,
                                                              arm_target=cfg.state_arm_target,
                                                              workspace_low=cfg.workspace_low,
                                                              workspace_high=cfg.workspace_high,
                                                              height_loss=cfg.state_height_loss,
                                                              settle_unroll=cfg.state_settle_unroll,
                                                              cube_huber_cm=cfg.state_cube_huber_cm))
                              if cfg.env_state_dim and cfg.state_members else None)
        self.scheduler = EDMEulerScheduler(sigma_min=cfg.sigma_min, sigma_max=cfg.sigma_max,
                                           sigma_data=cfg.sigma_data, prediction_type="epsilon")

    @property
    def device(self) -> torch.device:
        return self.lat_mean.device

    has_success_head = True  # imagined episodes can be scored (imagine, rank)

    @property
    def frames_optional(self) -> bool:
        """Whether `step(..., frames=False)` can give all of observation.state (and so success by the task's rules)
        without generating frames: a state channel that also predicts the proprioception besides the arm."""
        return self.state_channel is not None and self.cfg.state_rest

    @property
    def success_source(self) -> str:
        """'state' when a state channel predicts object state (success from the task's definition), else 'frames'."""
        return "state" if self.state_channel is not None else "frames"

    # ------------------------------------------------------------------ frames <-> latents
    def encode_frames(self, images: dict[str, torch.Tensor | np.ndarray]) -> torch.Tensor:
        """{camera key: uint8 (N, H, W, 3)} -> standardised latents (N, C, S, S), cameras stacked on channels."""
        zs = []
        for cam in self.cfg.cameras:
            key = f"observation.images.{cam}"
            if key not in images:
                raise ValueError(f"missing camera {key!r}; got {sorted(images)}")
            x = torch.as_tensor(np.asarray(images[key]), device=self.device)
            if x.ndim != 4 or x.shape[1:] != (self.cfg.image_size, self.cfg.image_size, 3):
                raise ValueError(f"{key}: expected (N, {self.cfg.image_size}, {self.cfg.image_size}, 3), got {tuple(x.shape)}")
            zs.append(in_passes(lambda c: self.ae.encode(c.permute(0, 3, 1, 2).float() / 127.5 - 1.0), x))
        z = torch.cat(zs, dim=1)
        return (z - self.lat_mean) / self.lat_std

    def decode_frames(self, z: torch.Tensor, base: tuple | None = None,
                      mask: bool = True, poses: tuple[torch.Tensor, torch.Tensor] | None = None,
                      points: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Standardised latents (N, C, S, S) -> {camera key: uint8 (N, H, W, 3)}. With `base` = (z0 (B, C, S, S),
        {camera key: uint8 frames (B, H, W, 3)}), N = B * n with each base's n frames consecutive: the pixel-space
        identity path, frame0 + dec(z) - dec(z0) (a third entry, `base_correction`'s output, spares decoding z0 again
        at every step of a rollout), so that
        what the latents leave unchanged is the real start frame itself, not its reconstruction (the autoencoder's
        ceiling then bounds only what changes). Once the change mask is fitted (`change_mask.py`), each frame is then
        blended with the start frame where the mask says nothing moved (`mask=False`: the plain decode). A mask that
        warps the start frame (`change_warp`) needs `poses` = (pose0 (B, pose_dim) of the start frames, the
        commanded pose (N, pose_dim) of every frame). A mask with object sources (`change_objects`) needs `points` =
        (the start frames' (B, 1 + n_objects, 3), every frame's (N, 1 + n_objects, 3)) [hand, object centres]: `encode`'s
        `points0` and `step`'s `points`."""
        z = z * self.lat_std + self.lat_mean
        z0 = base[0] * self.lat_std + self.lat_mean if base is not None else None
        n = len(z) // len(z0) if base is not None else 1  # frames per base (consecutive)
        corr = (base[2] if len(base) > 2 else self.base_correction(base[0], base[1])) if base is not None else None
        masked = mask and base is not None and self.change_mask is not None and bool(self.change_mask_fitted)
        if masked and self.cfg.change_warp:
            if poses is None:
                raise ValueError("this world model's change mask warps the start frame to each frame's pose: "
                                 "decode with the frames' commanded poses (`poses`)")
            p0, p = (self._norm_pose(torch.as_tensor(v, dtype=torch.float32, device=z.device)) for v in poses)
            if p0.shape != (len(z0), self.cfg.pose_dim) or p.shape != (len(z), self.cfg.pose_dim):
                raise ValueError(f"poses: expected ({len(z0)}, {self.cfg.pose_dim}) and ({len(z)}, {self.cfg.pose_dim}), "
                                 f"got {tuple(p0.shape)} and {tuple(p.shape)}")
            p0 = p0.repeat_interleave(n, 0)
        else:
            p0 = p = None
        moves, hands = {}, None
        if masked and self.cfg.change_objects:
            K1 = 1 + self.cfg.n_objects
            if points is None:
                raise ValueError("this world model's change mask moves each object's patch: decode with the start's and "
                                 "every frame's [hand, object] points (`points`: encode's points0, step's points)")
            q0, q = (torch.as_tensor(v, dtype=torch.float32, device=z.device) for v in points)
            if q0.shape != (len(z0), K1, 3) or q.shape != (len(z), K1, 3):
                raise ValueError(f"points: expected ({len(z0)}, {K1}, 3) and ({len(z)}, {K1}, 3), got {tuple(q0.shape)} "
                                 f"and {tuple(q.shape)}")
            q0 = q0.repeat_interleave(n, 0)
            moves = {cam: object_moves(q0, q, self.cfg.camera_geometry[cam], self.cfg.object_radius) for cam in self.cfg.cameras}
            hands = self.norm_hands(q[:, 0], q0[:, 0])

        def part(v: torch.Tensor | None, s: int, e: int) -> torch.Tensor | None:
            return None if v is None else v[s:e]

        out = {}
        for i, cam in enumerate(self.cfg.cameras):
            sl = slice(i * self.cfg.latent_channels, (i + 1) * self.cfg.latent_channels)
            f0 = pixels(base[1][f"observation.images.{cam}"], z.device) if base is not None else None
            frames = []
            for s in range(0, max(len(z), 1), FRAMES_PER_PASS):  # an empty batch gives empty frames
                e = min(s + FRAMES_PER_PASS, len(z))
                x = self.ae.decode(z[s:e, sl])
                if base is not None:  # each base decoded once (`corr`), then shared by its n frames
                    b = torch.arange(s, e, device=z.device) // n
                    x = x + corr[b, 3 * i : 3 * i + 3]
                    if masked and self.cfg.object_layer == "reproject":
                        x = self._reproject(cam, x.clamp(-1, 1), f0[b], part(p, s, e), part(p0, s, e),
                                            part(moves[cam], s, e), q0[s:e], q[s:e], part(hands, s, e))
                    elif masked:
                        x = self.change_mask[cam](x.clamp(-1, 1), f0[b], part(p, s, e), part(p0, s, e),
                                                  part(moves.get(cam), s, e),
                                                  part(hands, s, e) if cam in self.cfg.layer_cameras else None)
                frames.append(((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1))
            out[f"observation.images.{cam}"] = frames[0] if len(frames) == 1 else torch.cat(frames)
        return out

    def base_correction(self, z0: torch.Tensor, frames0: dict) -> torch.Tensor:
        """frame0 - dec(z0) per camera, stacked on channels (B, 3 * cameras, H, W), from standardised latents z0 (B, C,
        S, S) and {camera key: uint8 (B, H, W, 3)}: what `decode_frames` adds to every decode of a start frame's rollout
        (the pixel-space identity path)."""
        z0 = z0 * self.lat_std + self.lat_mean
        L = self.cfg.latent_channels
        return torch.cat([pixels(frames0[f"observation.images.{cam}"], z0.device) - in_passes(self.ae.decode, z0[:, i * L : (i + 1) * L])
                          for i, cam in enumerate(self.cfg.cameras)], 1)

    def norm_hands(self, hand: torch.Tensor, hand0: torch.Tensor) -> torch.Tensor:
        """The pose layer's input (N, 6): the hand's position (N, 3) at a frame and (N, 3) at its start frame, each
        scaled to [-1, 1] over the workspace."""
        mid, half = self.state_mid[:3], self.state_half[:3]
        return torch.cat([(hand - mid) / half, (hand0 - mid) / half], -1)

    # ------------------------------------------------------------------ poses
    def observed_pose(self, proprio: torch.Tensor, last_action: torch.Tensor | None = None) -> torch.Tensor:
        """Pose (B, pose_dim) of an observed frame: its end-effector, [the previous action's rotation step, else
        none,] and its gripper command (the previous action's, else the command that would give the observed
        opening)."""
        c = self.cfg
        ee = proprio[:, list(c.ee_index)]
        g = 1 - 2 * proprio[:, c.gripper_index : c.gripper_index + 1] / c.gripper_open
        rot = []
        if c.rotation:
            rot = [c.rot_step * last_action[:, 3:6] if last_action is not None else ee.new_zeros(len(ee), 3)]
        if last_action is not None:
            g = last_action[:, c.gripper_action : c.gripper_action + 1]
        return torch.cat([ee, *rot, g.clamp(-1, 1)], -1)

    # ------------------------------------------------------------------ environment state <-> state channel
    def env_frame(self, prev: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The environment state (B, E) of a predicted frame from the previous frame's (B, E) and the state channel's
        x (B, 4 + 3 n [+ rest]) = [ee, opening, object centres, rest]: objects (and the arm, where the layout repeats it) written
        in, the previous-frame entries taken from `prev`, everything else (zones, goals, orientations) carried."""
        c = self.cfg
        e = prev.clone()
        start, n = c.env_previous
        if n:
            e[:, start : start + n] = prev[:, :n]
        e[:, [o + k for o in c.object_xyz for k in range(3)]] = x[:, 4 : 4 + 3 * c.n_objects]
        if c.env_arm >= 0:
            e[:, c.env_arm : c.env_arm + 4] = x[:, :4]
        return e

    def scene_points(self, x: torch.Tensor) -> torch.Tensor:
        return scene_points(x, self.cfg.n_objects)

    def _norm_pose(self, p: torch.Tensor) -> torch.Tensor:
        return (p - self.pose_mid) / self.pose_half

    # ------------------------------------------------------------------ the denoiser
    def norm_frame_state(self, s: torch.Tensor) -> torch.Tensor:
        """Frame states (..., frame_state_dim) in the workspace's units, clamped (a cube fallen off the table stays finite)."""
        return ((s - self.state_mid) / self.state_half).clamp(-3, 3)

    def _frame_states(self, states: torch.Tensor | None, poses: torch.Tensor) -> torch.Tensor | None:
        """The normalised frame states (B, H+1, frame_state_dim) that `frame_state` conditions on, checked."""
        if not self.cfg.frame_state:
            return None
        B, H = poses.shape[:2]
        if states is None or tuple(states.shape) != (B, H + 1, self.cfg.frame_state_dim):
            raise ValueError(f"this world model conditions frames on their state (frame_state): pass `states` "
                             f"({B}, {H + 1}, {self.cfg.frame_state_dim}) = [hand, opening, object centres] of the last "
                             f"context frame and of every future frame, got {None if states is None else tuple(states.shape)}")
        return self.norm_frame_state(states)

    def blobs(self, states: torch.Tensor) -> torch.Tensor:
        """`frame_blobs`' input maps (B, blob_channels, S, S) from raw frame states (B, H+1, frame_state_dim): the hand
        and every object centre, a blob where each camera sees it (the wrist camera placed by that frame's hand)."""
        points = self.scene_points(states)  # a frame state opens like a channel state: [hand, opening, objects]
        return blob_maps(points, states[..., :3], self.cfg.camera_geometry, self.cfg.cameras, self.coords, self.cfg.blob_width)

    def _inputs(self, x_in, ctx, anchor, pose0, poses, states=None, blobs=None) -> torch.Tensor:
        B, S = x_in.shape[0], x_in.shape[-1]
        parts = [self._norm_pose(pose0), self._norm_pose(poses).flatten(1)]
        if states is not None:
            parts.append(states.flatten(1))
        maps = torch.cat(parts, 1)[:, :, None, None].expand(-1, -1, S, S)
        extra = [] if blobs is None else [blobs]
        return torch.cat([x_in, ctx.flatten(1, 2), anchor, self.coords.expand(B, -1, -1, -1), maps, *extra], dim=1)

    def _condition(self, c_noise, ctx_sigma, pose0, poses, states=None):
        B = poses.shape[0]
        p = self.pose_emb(self._norm_pose(torch.cat([pose0[:, None], poses], 1)))
        if states is not None:
            p = p + self.frame_state_emb(states)
        return self.cond(torch.cat([self.noise_emb(c_noise), self.ctx_noise_emb(ctx_sigma), p.reshape(B, -1)], dim=-1))

    def _F(self, x_in, c_noise, ctx, ctx_sigma, anchor, pose0, poses, states=None):
        """The network F; `states`: raw frame states (B, H+1, frame_state_dim) where `frame_state` (else ignored)."""
        s = self._frame_states(states, poses)
        blobs = self.blobs(states) if self.cfg.frame_blobs else None
        return self.unet(self._inputs(x_in, ctx, anchor, pose0, poses, s, blobs), self._condition(c_noise, ctx_sigma, pose0, poses, s))

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor, ctx: torch.Tensor, ctx_sigma: torch.Tensor, anchor: torch.Tensor,
                pose0: torch.Tensor, poses: torch.Tensor, states: torch.Tensor | None = None) -> torch.Tensor:
        """EDM's denoiser D(x; sigma) = c_skip x + c_out F(c_in x, c_noise) on the noisy change x (B, H*C, S, S) at
        noise levels sigma (B,), given the (noised, at ctx_sigma) context: the model's estimate of the clean change.
        `states` (B, H+1, frame_state_dim): the frames' states, for a model with `frame_state`."""
        B = x.shape[0]
        c_skip, c_out, c_in, c_noise = (c.reshape(B, 1, 1, 1) for c in edm_coefficients(sigma, self.cfg.sigma_data))
        return c_skip * x + c_out * self._F(c_in * x, c_noise.reshape(B), ctx, ctx_sigma, anchor, pose0, poses, states)

    def to_residual(self, future: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """(B, H, C, S, S) future latents -> standardised changes over the last context latent, (B, H*C, S, S)."""
        return ((future - last[:, None]) / self.res_std).flatten(1, 2)

    def from_residual(self, r: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The identity path: r = 0 gives back the last context latent for every future frame exactly."""
        B, C = last.shape[:2]
        return last[:, None] + r.reshape(B, -1, C, *r.shape[-2:]) * self.res_std

    # ------------------------------------------------------------------ losses
    def dynamics_loss(self, ctx: torch.Tensor, anchor: torch.Tensor, future: torch.Tensor, pose0: torch.Tensor,
                      poses: torch.Tensor, mask: torch.Tensor, states: torch.Tensor | None = None) -> torch.Tensor:
        """ctx (B,K,C,S,S) clean context, anchor (B,C,S,S), future (B,H,C,S,S), pose0 (B,pose_dim) of the last context frame,
        poses (B,H,pose_dim) commanded per future frame, mask (B,H) of real frames; with `frame_state`, states
        (B,H+1,frame_state_dim) recorded for the last context frame and each future frame, noised here by
        `frame_state_noise` (m, every entry is one): a rollout conditions on the state channel's predictions, which
        are off by about that much."""
        B, H, C = future.shape[:3]
        last = ctx[:, -1]
        if self.cfg.frame_state and states is not None and self.cfg.frame_state_noise > 0:
            states = states + self.cfg.frame_state_noise * torch.randn_like(states)
        # where the future differs from the clean last context frame (computed before the context is noised)
        moved = (future - last[:, None]).abs().mean(dim=2, keepdim=True)
        ctx_sigma = torch.rand(B, device=ctx.device) * self.cfg.context_noise_max
        ctx_n = ctx + ctx_sigma.reshape(B, 1, 1, 1, 1) * torch.randn_like(ctx)
        r0 = self.to_residual(future, last)
        if self.cfg.deterministic:
            sigma = torch.full((B,), self.cfg.sigma_max, device=r0.device)
            c_skip, c_out, c_in, c_noise = (c.reshape(B, 1, 1, 1) for c in edm_coefficients(sigma, self.cfg.sigma_data))
            err = (self._F(torch.zeros_like(r0), c_noise.reshape(B), ctx_n, ctx_sigma, anchor, pose0, poses, states) - r0) ** 2
        else:
            sigma = torch.exp(self.cfg.p_mean + self.cfg.p_std * torch.randn(B, device=r0.device))
            x = r0 + sigma.reshape(B, 1, 1, 1) * torch.randn_like(r0)
            if self.cfg.mean_share > 0:  # the one-step path: D(0; sigma_max) learns E[r | conditioning]
                mean = torch.rand(B, device=r0.device) < self.cfg.mean_share
                sigma = torch.where(mean, torch.full_like(sigma, self.cfg.sigma_max), sigma)
                x = torch.where(mean.reshape(B, 1, 1, 1), torch.zeros_like(x), x)
            c_skip, c_out, c_in, c_noise = (c.reshape(B, 1, 1, 1) for c in edm_coefficients(sigma, self.cfg.sigma_data))
            F_ = self._F(c_in * x, c_noise.reshape(B), ctx_n, ctx_sigma, anchor, pose0, poses, states)
            err = (F_ - (r0 - c_skip * x) / c_out) ** 2  # EDM loss: lambda(sigma) ||D(x) - r0||^2
        err = err.reshape(B, H, C, *err.shape[-2:])
        if self.cfg.motion_weight:  # most of a frame is static background; the arm and cubes are what matter
            err = err * (1 + self.cfg.motion_weight * (moved / 0.5).clamp(max=1))
        err = err.mean(dim=(2, 3, 4))
        return (err * mask).sum() / mask.sum().clamp(min=1)

    def heads_loss(self, z: torch.Tensor, tasks: list[str] | torch.Tensor, labels: dict[str, torch.Tensor], mask: torch.Tensor,
                   noise: float = 0.2, pos_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """Per-frame heads on latents z (N,C,S,S): proprioception (for the policy's observation), success, reward,
        done. Trained on real latents first, then on generated ones (`train.py`'s unrolled phase). `tasks`: N
        instructions or their token ids (`self.task.token_ids`)."""
        z = z + noise * torch.rand(len(z), 1, 1, 1, device=z.device) * torch.randn_like(z)
        out = self.heads(z, self.task(tasks))
        m = mask.float()
        n = m.sum().clamp(min=1)
        l_state = (((out["state"] - labels["state"]) ** 2).mean(-1) * m).sum() / n
        l_succ = (F.binary_cross_entropy_with_logits(out["success_logit"], labels["success"], pos_weight=pos_weight,
                                                     reduction="none") * m).sum() / n
        l_rew = (((out["reward"] - labels["reward"]) ** 2) * m).sum() / n
        l_done = (F.binary_cross_entropy_with_logits(out["done_logit"], labels["done"], reduction="none") * m).sum() / n
        loss = l_state + l_succ + l_rew + 0.5 * l_done
        return loss, {"state": l_state.detach(), "success": l_succ.detach(), "reward": l_rew.detach(), "done": l_done.detach()}

    # ------------------------------------------------------------------ imagination
    @torch.no_grad()
    def sample_future(self, ctx: torch.Tensor, anchor: torch.Tensor, pose0: torch.Tensor, poses: torch.Tensor,
                      steps: int | None = None, generator: torch.Generator | None = None,
                      mean: bool | None = None, states: torch.Tensor | None = None) -> torch.Tensor:
        """Latents of the next H frames (B, H, C, S, S) by Euler sampling of the change through diffusers' EDM
        scheduler. The context is noised to `context_noise_sample`, the level the model is told. `mean`: one step
        from a zero input, the conditional mean the model learns on `mean_share` of its samples (default: when
        sampling with 1 step and the model learned it); False draws a sample. `states`: the frames' states
        (B, H+1, frame_state_dim), which a model with `frame_state` needs."""
        B = ctx.shape[0]
        H, C, S = self.cfg.chunk, self.cfg.frame_channels, self.cfg.latent_size
        dev = ctx.device
        s = self.cfg.context_noise_sample
        ctx_sigma = torch.full((B,), s, device=dev)
        ctx_n = ctx + s * torch.randn(ctx.shape, device=dev, generator=generator) if s > 0 else ctx
        last = ctx[:, -1]
        if self.cfg.deterministic:
            c_noise = edm_coefficients(torch.full((B,), self.cfg.sigma_max, device=dev), self.cfg.sigma_data)[3]
            r = self._F(torch.zeros(B, H * C, S, S, device=dev), c_noise, ctx_n, ctx_sigma, anchor, pose0, poses, states)
            return self.from_residual(r, last)
        sched = EDMEulerScheduler.from_config(self.scheduler.config)
        n = steps or self.cfg.sampling_steps
        sched.set_timesteps(n, device=dev)
        x = torch.randn(B, H * C, S, S, device=dev, generator=generator) * sched.init_noise_sigma
        if n == 1 and (self.cfg.mean_share > 0 if mean is None else mean):
            x = torch.zeros_like(x)
        for t in sched.timesteps:  # EDM's timesteps are c_noise = ln(sigma) / 4
            F_ = self._F(sched.scale_model_input(x, t), t.reshape(1).expand(B).to(dev), ctx_n, ctx_sigma, anchor, pose0, poses,
                         states)
            x = sched.step(F_, t, x).prev_sample  # c_skip x + c_out F, then the Euler step
        return self.from_residual(x, last)

    @torch.no_grad()
    def encode(self, obs: dict, anchor: dict | None = None) -> dict:
        """Observation dict with K context frames per camera (B, K, H, W, 3) (or one frame (B, H, W, 3), repeated),
        `observation.state` (B, state_dim), `task` (B strings) and, for the state channel,
        `observation.environment_state` (B, env_state_dim) -> imagination state. `anchor`: the episode's first frame
        per camera (B, H, W, 3); by default the first context frame (right for a reset)."""
        imgs = {k: torch.as_tensor(np.asarray(v)) for k, v in obs.items() if k.startswith("observation.images.")}
        first = next(iter(imgs.values()))
        if first.ndim == 4:
            imgs = {k: v[:, None].expand(-1, self.cfg.context, *v.shape[1:]) for k, v in imgs.items()}
        B, K = next(iter(imgs.values())).shape[:2]
        if K != self.cfg.context:
            raise ValueError(f"expected {self.cfg.context} context frames, got {K}")
        z = self.encode_frames({k: v.reshape(B * K, *v.shape[2:]) for k, v in imgs.items()})
        ctx = z.reshape(B, K, *z.shape[1:])
        anc = self.encode_frames({k: np.asarray(v) for k, v in anchor.items()}) if anchor is not None else ctx[:, 0].clone()
        proprio = torch.as_tensor(np.asarray(obs[OBS_STATE]), dtype=torch.float32, device=self.device)
        tasks = list(obs["task"]) if not isinstance(obs["task"], str) else [obs["task"]] * B
        pose = self.observed_pose(proprio)  # "pose" moves with the rollout; "pose0" stays the start frame's
        state = {"ctx": ctx, "anchor": anc, "pose": pose, "proprio": proprio, "task": tasks,
                 "z0": ctx[:, -1].clone(), "frames0": {k: v[:, -1].numpy() for k, v in imgs.items()}, "pose0": pose.clone()}
        if self.state_channel is not None:
            key = OBS_ENV_STATE
            if key not in obs:
                raise ValueError(f"this world model has a state channel and needs {key!r} in the start observation")
            env = torch.as_tensor(np.asarray(obs[key]), dtype=torch.float32, device=self.device)
            x = channel_state(self.cfg, proprio, env)
            state["x"] = x[None].repeat(self.cfg.state_members, 1, 1)
            state["points0"] = self.scene_points(x)  # the start frame's hand and objects, for the change mask
            state["rest_z"] = x[:, 6 : 4 + 3 * self.cfg.n_objects : 3].clone()  # where each object rests (`state_settle`)
            state["env"] = env  # the last frame's whole environment state (what the channel does not predict is kept)
        return state

    def reanchor_state(self, state: dict, proprio, env, prev_env=None) -> dict:
        """`state` with its state channel set to an observed frame (observation.state (B, S), environment_state
        (B, E), and the frame before's environment state for the objects' velocity), the generated frame context
        kept. A diagnostic, not imagination: rolled out with the recorded states put back at every chunk, the frames'
        error is what the frames model makes without the state channel's drift (`evaluate.rollout(state_oracle=)`)."""
        if self.state_channel is None:
            raise ValueError("reanchor_state: this world model has no state channel")
        t = lambda v: torch.as_tensor(np.asarray(v), dtype=torch.float32, device=self.device)  # noqa: E731
        proprio, env = t(proprio), t(env)
        x = channel_state(self.cfg, proprio, env, None if prev_env is None else t(prev_env))
        return {**state, "x": x[None].repeat(self.cfg.state_members, 1, 1), "env": env, "proprio": proprio,
                "pose": self.observed_pose(proprio)}

    @torch.no_grad()
    def step(self, state: dict, action_chunk: torch.Tensor, steps: int | None = None,
             generator: torch.Generator | None = None, frames: bool = True,
             state_generator: torch.Generator | None = None) -> tuple[dict, dict]:
        """Advance by h <= H actions (B, h, A). Returns the new state and per-frame predictions (B, h, ...):
        `latents`, `pose` (commanded), `observation.state`, `success`, `reward`, `done` (frame heads; probabilities)
        and, with a state channel, `observation.environment_state`, `ee`, `gripper_opening` and `disagreement`
        (ensemble spread of object positions, cm).

        `frames=False` advances the state channel only (`frames_optional`): no latents are generated, so there are
        no `latents` or frame-head predictions, and the rollout cannot ask for frames later (its context would be
        stale). Generating the chunk's latents is ~90% of a step's time on a CPU; a consumer that reads only state
        (scripted or object-reading policies, success from the task's rules) need not pay for it.
        `generator` draws the frames' noise and, unless `state_generator` is given, the state channel's sampled
        contacts (`state_gate` sample)."""
        a = torch.as_tensor(action_chunk, dtype=torch.float32, device=self.device)
        if a.ndim != 3 or a.shape[-1] != self.cfg.action_dim or not 1 <= a.shape[1] <= self.cfg.chunk:
            raise ValueError(f"action_chunk: expected (B, 1..{self.cfg.chunk}, {self.cfg.action_dim}), got {tuple(a.shape)}")
        if not torch.isfinite(a).all():
            raise ValueError("action_chunk: contains NaN or inf")
        if not frames and not self.frames_optional:
            raise ValueError("frames=False needs a state channel that predicts all of observation.state (state_rest)")
        if frames and state.get("frames_stale"):
            raise ValueError("this rollout was advanced with frames=False: its frame context is stale; keep frames=True "
                             "from the start (reset) when frames are needed")
        h = a.shape[1]
        if h < self.cfg.chunk:  # pad with the last real action; only the first h frames are kept
            a = torch.cat([a, a[:, -1:].expand(-1, self.cfg.chunk - h, -1)], dim=1)
        B = a.shape[0]
        preds: dict = {}
        new = dict(state)
        if self.state_channel is not None:  # arm and objects first: the arm's prediction sets each frame's pose
            xs, poses, x, member, consensus = [], [], state["x"], state.get("member"), state.get("consensus")
            rest_z = state.get("rest_z") if self.cfg.state_settle else None
            Fs = self.cfg.frame_state_dim
            fstates = [self.state_channel.readout(x, member)[:, :Fs]]  # the last frame's, then each future frame's
            for j in range(self.cfg.chunk):
                mean = self.state_channel.readout(x, member)
                poses.append(commanded_pose(mean[:, :3], a[:, j], self.cfg))
                if consensus is not None:  # every member steps from the members' mean; their spread after it remains
                    x = self.state_channel.consensus(x, consensus)
                x = bound_arm(self.state_channel.rollout_step(x, a[:, j], self.cfg.state_gate,
                                                                   state_generator or generator, rest_z,
                                                                   self.cfg.object_radius), self.cfg)
                xs.append(x)
                fstates.append(self.state_channel.readout(x, member)[:, :Fs])
                if j == h - 1:
                    new["x"] = x
            poses, fstates = torch.stack(poses, 1), torch.stack(fstates, 1)
            summ = [self.state_channel.summary(x_, member) for x_ in xs[:h]]
            mean = torch.stack([m for m, _ in summ], 1)  # (B, h, D)
            preds["ee"], preds["gripper_opening"] = mean[..., :3], mean[..., 3]
            preds["points"] = self.scene_points(mean)
            if self.cfg.state_rest:
                preds["rest"] = mean[..., 4 + 3 * self.cfg.n_objects : 4 + 3 * self.cfg.n_objects + len(self.cfg.rest_index)]
            envs, e = [], state["env"]
            for j in range(h):
                e = self.env_frame(e, mean[:, j])
                envs.append(e)
            preds[OBS_ENV_STATE], new["env"] = torch.stack(envs, 1), e
            preds["disagreement"] = torch.stack([d for _, d in summ], 1)
        else:
            poses, fstates = integrate_poses(state["pose"][:, :3], a, self.cfg), None
        if not frames:  # every entry of observation.state comes from the channel
            proprio = torch.empty(B, h, self.cfg.state_dim, device=self.device)
            proprio[..., list(self.cfg.ee_index)] = preds["ee"]
            proprio[..., self.cfg.gripper_index] = preds["gripper_opening"]
            proprio[..., self.cfg.rest_index] = preds["rest"]
            preds.update({"pose": poses[:, :h], OBS_STATE: proprio})
            new.update({"pose": poses[:, h - 1], "proprio": proprio[:, -1], "frames_stale": True})
            return new, preds
        fut = self.sample_future(state["ctx"], state["anchor"], state["pose"], poses, steps, generator,
                                 states=fstates if self.cfg.frame_state else None)[:, :h]
        out = self.heads(fut.flatten(0, 1), self.task(state["task"]).repeat_interleave(h, dim=0))
        proprio = out["state"].reshape(B, h, -1)
        if self.state_channel is not None:  # the policy sees the state channel's proprioception where it has one
            proprio = proprio.clone()
            proprio[..., list(self.cfg.ee_index)] = preds["ee"]
            proprio[..., self.cfg.gripper_index] = preds["gripper_opening"]
            if "rest" in preds:
                proprio[..., self.cfg.rest_index] = preds["rest"]
        preds.update({"latents": fut, "pose": poses[:, :h], OBS_STATE: proprio,
                      "success": torch.sigmoid(out["success_logit"]).reshape(B, h),
                      "reward": out["reward"].reshape(B, h), "done": torch.sigmoid(out["done_logit"]).reshape(B, h)})
        new["ctx"] = torch.cat([state["ctx"], fut], dim=1)[:, -self.cfg.context :].contiguous()
        new["pose"] = poses[:, h - 1]
        new["proprio"] = proprio[:, -1]
        return new, preds

    def _reproject(self, cam: str, x: torch.Tensor, f0: torch.Tensor, p, p0, moves: torch.Tensor, q0: torch.Tensor,
                   q: torch.Tensor, hands: torch.Tensor) -> torch.Tensor:
        """`decode_frames`' blend of one camera's frames x (N, 3, H, W) with the start frames f0, then the objects drawn
        over it where the state channel's points q (N, 1 + k, 3; q0 at the start; `hands` their hands normalised) put
        them (`OBJECT_LAYERS`)."""
        cm = self.change_mask[cam]
        if cam in self.cfg.layer_cameras:  # the arm in front: the pose layer's coverage now and at the start frame
            drawn, cover = cm.layer.draw(hands, f0)
            cover0 = cm.layer.draw(self.norm_hands(q0[:, 0], q0[:, 0]), f0)[1]
            x = cm(x, f0, p, p0, moves, rendered=drawn)
        elif self.cfg.camera_geometry[cam]["mount"] == "world":  # no pose layer: nothing known in front
            x, cover, cover0 = cm(x, f0, p, p0, moves), None, None
        else:  # a camera on the hand: its fingers stay where they are in the image, the unwarped start frame's source
            x, w = cm(x, f0, p, p0, moves, weights=True)
            cover, cover0 = w[:, 2:3], None
        img, a = reproject_objects(f0, q0, q, self.cfg.camera_geometry[cam], self.cfg.object_radius, cover, cover0)
        return x * (1 - a) + img * a

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, state: dict | None = None, poses: torch.Tensor | None = None,
               points: torch.Tensor | None = None) -> dict[str, np.ndarray]:
        """Latents (B, ..., C, S, S) -> {camera key: uint8 (B, ..., H, W, 3)}. With the imagination `state` of the
        rollout, through the pixel-space identity path anchored on its real start frame (see `decode_frames`).
        `poses` (B, ..., pose_dim): the frames' commanded poses (`step`'s `pose`), which a warping change mask needs;
        `points` (B, ..., 1 + n_objects, 3): the frames' [hand, objects] (`step`'s `points`), which object sources need."""
        lead = latents.shape[:-3]
        base = None
        if state is not None and "frames0" in state:
            # computed at the rollout's first decode and carried by the states `step` returns (a reset that writes
            # new starts into a state drops it: `WorldModelEnv._reset_envs`)
            if "base_correction" not in state:
                state["base_correction"] = self.base_correction(state["z0"], state["frames0"])
            base = (state["z0"], state["frames0"], state["base_correction"])
        pp = None
        if poses is not None and base is not None and "pose0" in state:
            pp = (state["pose0"], torch.as_tensor(poses).reshape(-1, self.cfg.pose_dim))
        qq = None
        if points is not None and base is not None and "points0" in state:
            qq = (state["points0"], torch.as_tensor(points).reshape(-1, 1 + self.cfg.n_objects, 3))
        frames = self.decode_frames(latents.reshape(-1, *latents.shape[-3:]), base, poses=pp, points=qq)
        return {k: v.reshape(*lead, *v.shape[1:]).cpu().numpy() for k, v in frames.items()}

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | Path) -> None:
        save_pretrained(self, self.cfg, path)

    @classmethod
    def load(cls, path: str | Path, expect: WorldModelConfig | None = None, device: str = "cpu",
             state_gate: str | None = None, state_settle: bool | None = None,
             object_layer: str | None = None) -> "VideoWorldModel":
        """`state_gate`, `state_settle`, `object_layer`: the contact gate, settling and object layer rollouts use
        instead of the checkpoint's (they change no weight)."""
        # keys a checkpoint saved before they existed lacks: what it was trained and run with
        cfg = read_config(path, WorldModelConfig, expect, what="world-model checkpoint",
                          absent={"mean_share": 0.0, "change_mask": False, "change_refine": False, "change_warp": False, "change_unwarped": False, "change_read_pose": False, "state_rest": False, "state_pairs": False,
                                  "state_hand_frame": False, "state_velocity": False, "state_gate": "hard", "state_settle": False, "state_height_loss": "huber", "state_cube_huber_cm": CUBE_HUBER_CM,
                                  "state_arm_rest": False, "state_detach_hand": False, "state_arm_target": False,
                                  "frame_state": False, "frame_state_noise": 0.0,
                                  "frame_blobs": False, "blob_width": 0.15, "camera_geometry": {},
                                  "change_objects": False, "object_radius": 0.02, "change_coords": False,
                                  "change_pose_layer": False, "object_layer": "blend"})
        cfg = replace(cfg, state_gate=state_gate or cfg.state_gate, object_layer=object_layer or cfg.object_layer,
                      state_settle=cfg.state_settle if state_settle is None else state_settle)
        return load_state(cls(cfg), path, device)


def imagined_success(model: VideoWorldModel, preds: dict, tasks, rules=None, threshold: float = 0.9) -> np.ndarray:
    """Per-frame success (B, h) bools of one `step`'s predictions. With a state channel and the task's rules
    (`rules(tasks, ee, opening, env_state) -> (success, reward)`, e.g. `sim.tabletop.tasks.success_and_reward`),
    success is the task's own definition on predicted state; otherwise the success head's probability on the
    generated latents, thresholded."""
    if rules is not None and OBS_ENV_STATE in preds:
        ee, op, env = (preds[k].cpu().numpy() for k in ("ee", "gripper_opening", OBS_ENV_STATE))
        B, h = op.shape
        tasks = [tasks] * B if isinstance(tasks, str) else list(tasks)
        ok, _ = rules([t for t in tasks for _ in range(h)], ee.reshape(B * h, 3), op.reshape(-1), env.reshape(B * h, -1))
        return ok.reshape(B, h)
    return preds["success"].cpu().numpy() >= threshold
