"""Training of the video world model from a LeRobot v3 dataset, in four phases on one global step counter:

1. autoencoder (frames -> latents), then latent statistics (per-channel mean/std, and the std of one-step changes);
2. state channel (when the data has `observation.environment_state`): multi-step unrolled ensemble training;
3. dynamics + frame heads, teacher-forced: real context (noised at a level the model is told) -> next chunk;
4. unrolled: the model generates one chunk from real context, then learns the next chunk from its own generated
   context (DIAMOND/GameNGen's remedy for autoregressive drift), and the frame heads learn success, reward, done
   and proprioception on generated latents (World-VLA-Loop's reward head sees what it will be applied to).

Windows are gathered on the training device from tensors built once (latents of every frame, per-frame arrays,
episode bounds) with `torch.randint` and indexing; every step draws its randomness from (seed, step), so a resumed
run continues exactly. Checkpoints (safetensors + JSON) every `ckpt_every` steps and at each phase end.
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import yaml
from tqdm.auto import tqdm

from wmrl.core.checkpoint import (commit_checkpoint, load_train_state, resolve_checkpoint, resume_checkpoint,
                                  save_train_state)
from wmrl.core.control import EEDeltaControl
from wmrl.core.report import plot_curves
from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE, REWARD, SUCCESS, TERMINATED
from wmrl.core.run import Tracker, start_run
from wmrl.replay import EpisodeReplay
from wmrl.replay.buffer import BOOKKEEPING
from world_models.video.model import (CHANGE_MASK_FIELDS, STATE_CHANNEL_FIELDS, VideoWorldModel, WorldModelConfig, channel_state, commanded_pose,
                                      scene_points)
from world_models.video.networks import TaskEncoder
import sim
from sim import task_from_instruction
from sim.tabletop.env import mirror_episode
from world_models.video.state_channel import CUBE_HUBER_CM, HEIGHT_LOSSES
from world_models.video.state_dagger import StateDaggerConfig, check_placeable, dagger_round, load_episodes, save_episodes


STATE, ENV_STATE, SUCC, REW, TERM = OBS_STATE, OBS_ENV_STATE, SUCCESS, REWARD, TERMINATED

COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune")


@dataclass
class TrainWMConfig:
    data: Path = Path("data/push-red")
    """LeRobot v3 dataset (e.g. from `wmrl collect ... --failures 0.3 --perturbed 0.2`)."""
    out: Path = Path("runs/wm")
    size: str = "small"
    """U-Net widths: tiny, small, base, large."""
    ae_steps: int = 1200
    state_steps: int = 3000
    """State-channel steps (skipped when the data has no observation.environment_state or with --no-state-channel)."""
    state_unroll: int = 12
    """Control steps each state-channel training sequence is unrolled on the model's own predictions. A trade-off
    (README, state channel): 4 steps lets the scripted expert succeed in imagination as often as in the simulator
    with one ensemble member per episode (92-96% vs 92%; 12 steps: 66-75%), but the benchmark's open-loop replays
    with the ensemble mean get worse (success AUROC 0.96 -> 0.80, cube error at the episode's end 4.0 -> 6.5 cm)."""
    dyn_steps: int = 2000
    unroll_steps: int = 600
    """Final phase: two chunks, the second from the model's own generated context; heads on generated latents."""
    change_mask_steps: int = 800
    """After every phase: steps fitting the per-camera change mask on the model's own rollouts (`change_mask.py`),
    which keeps each decoded frame at the start frame where nothing moved (0: no mask)."""
    change_mask_windows: int = 200
    """Training windows (16 frames each) whose rollouts the change mask is fitted on."""
    head_rollout_steps: int = 1500
    """After the last phase: Adam steps fitting the frame heads on the model's own rollouts of training episodes from
    their first frame (`rollout_heads.py`: success read as far into a rollout as imagination reads it; 0: none).
    Frames-only success AUROC 0.80 -> 0.87 on session 37's best model, for 2.6 minutes on one core (README)."""
    head_rollout_horizon: int = 40
    """Steps of each episode those rollouts run (the task's success episodes end at 13-33 steps)."""
    head_rollout_episodes: int = 300
    """Training episodes rolled out for the heads (a seeded choice when there are more)."""
    change_refine: bool = True
    """The change mask's network also learns a pixel correction of the blend (`networks.ChangeMask(refine=True)`):
    on the seed-3 CPU model +0.2 dB on motion windows, +0.3 masked and +0.4 Delta-t for -0.1 dB on static ones (README)."""
    change_warp: bool = True
    """The change mask first warps the start frame to each frame's commanded pose (`networks.ChangeMask`'s warp): the
    wrist camera's view shifts with every small hand motion. On both CPU models (1 step) static windows +1.2-1.6 dB over
    copy-last (-0.3 and -1.1 without it), above the autoencoder's ceiling; motion +0.04 dB, masked -0.05 (README)."""
    change_unwarped: bool = True
    """With the warp, the blend keeps the unwarped start frame as a third source (`ChangeMask(keep_unwarped=True)`): a
    fixed camera's background and the wrist camera's fingers do not move with the pose. Probed alone on both CPU
    models (1 step): masked +0.2 dB and motion +0.1 over the two-source warp; on the demo's model +0.3 / +0.2 (README)."""
    change_read_pose: bool = True
    """With the warp, the mask's network reads the pose change (`networks.ChangeMask(read_pose=True)`): it can tell a
    decode that moves the view from a hand that moved. With the third source, on both CPU models and the demo's (1 step,
    against the two-source warp): static +0.2 / +0.75 / +2.8 dB, Delta-t +0.1-0.3, masked +0.1-0.4 (README)."""
    change_objects: bool = True
    """With the three sources and the state channel, one more per object: the start frame carried by that object's
    predicted image displacement, only near where it now is (`networks.ChangeMask(n_objects)`; the cameras' geometry
    is read from the dataset's simulator task, `world_models/video/camera.py`). Off where it cannot apply (no state
    channel, no three-source mask, no simulator that gives its cameras' geometry); the model's config says."""
    change_coords: bool = False
    """The change mask's network also reads the pixel's x and y (`networks.ChangeMask(coords=True)`): the wrist
    camera's fingers and a fixed camera's background stay put at fixed places in the image."""
    change_pose_layer: bool = True
    """With object sources, every camera fixed to the world gets one more source in its change mask: the arm rendered
    from the hand's position (`networks.PoseLayer`), trained on real frames and recorded positions before the mask
    is fitted (`change_mask.fit_pose_layers`, `--change-layer-steps`), read in rollouts from the state channel's hand.
    A run initialised from a model of the same kind whose mask is fitted keeps its layer (only the mask is refitted)."""
    change_layer_steps: Optional[int] = None
    """Adam steps (batch 32) of each pose layer's training (`change_mask.fit_pose_layers`); None: twice the change
    mask's (`--change-mask-steps`), 1,600 at its default."""
    change_bf16: Optional[bool] = None
    """bf16 autocast in the forward passes of the pose layer's and the change mask's fits (`change_mask.autocast`;
    weights, Adam and the loss stay float32): on the demo's model the mask's fit took 0.77x and the layer's 0.79x the
    time, masked PSNR gain +0.03 [-0.06, +0.11] dB against float32 (`wmrl bench mask-fit-precision`). None: where
    the hardware computes bf16 natively (`change_mask.native_bf16`: a CPU with AVX-512 BF16 or AMX, a CUDA device),
    else float32."""
    change_mask_focus: float = 0.0
    """Weight of a second term in the change mask's loss: the frames' log MSE inside windows around where the recorded
    objects are and were (`change_mask.focus_maps`; needs the recorded object state and the cameras' geometry). The
    whole frame's log MSE hardly sees a cube's few pixels, which a policy reads; 0: the whole frame only."""
    calibration_data: Optional[Path] = None
    """A dataset of the same task(s) whose episodes the model never trains on (e.g. `wmrl collect` of the same recipe
    with another --seed): the fits after training (the change mask, the heads on rollouts) read their episodes'
    rollouts instead of the training episodes'. On training episodes the decode is better than on new ones (the base
    model's plain error there is half the small one's, on new episodes three quarters), so a fit made there trusts
    the generated frames more than they deserve (README, the fits on unseen episodes)."""
    change_mask_static_weight: float = 1.0
    """How many times as often the change mask's fit draws a frame of a static window (nothing moves over 2 cm) as one
    of a motion window (`change_mask.fit_change_mask`); static windows are ~5% of the demo's training windows."""
    batch_size: int = 32
    lr: float = 3e-4
    context: int = 2
    chunk: int = 4
    latent_channels: int = 8
    """Per camera; with ae_width the autoencoder's reconstruction ceiling."""
    ae_width: int = 16
    sampling_steps: int = 3
    mean_share: float = 0.25
    """Share of samples that train the one-step conditional-mean path imagination samples with (0: pure EDM)."""
    deterministic: bool = False
    """Train the no-diffusion baseline (same backbone, direct regression of the change)."""
    motion_weight: float = 3.0
    """Extra dynamics-loss weight on latent pixels where the target future differs from the last context frame
    (0: plain loss). It depends on the target, which could pull predictions toward change; measured at the small
    size, 0 leaves static windows as they were and loses 0.25 dB on motion ones (README)."""
    state_channel: bool = True
    """Learn object-state dynamics when the dataset has observation.environment_state (success from the task's rules)."""
    state_members: int = 5
    state_rest: bool = True
    """The state channel also predicts the proprioception besides the arm's pose (joint angles), so a policy reading
    all of observation.state sees none read back from generated frames (--no-state-rest: the frame heads')."""
    state_pairs: bool = False
    """The state channel's cube head also reads the offset to the nearest other cube, so a push that chains through
    one cube into another can be predicted (`state_channel.py`)."""
    state_hand_frame: bool = True
    """The state channel's cube head works in the hand->cube frame, equivariant to rotations about the vertical
    (`state_channel.py`; --no-state-hand-frame: the world frame, as before)."""
    state_velocity: bool = False
    """The state channel carries each cube's last displacement and its cube head reads it, so a cube still sliding
    from a push is not credited to the hand (`state_channel.py`)."""
    state_arm_rest: bool = False
    """The state channel's arm head also reads the joint angles (needs --state-rest), which the hand's position alone
    does not determine (`state_channel.py`)."""
    state_detach_hand: bool = False
    """The state channel's cube loss does not train its arm through the hand's position (`state_channel.py`)."""
    state_arm_target: bool = True
    """The state channel's heads read the command as the controller executes it (clipped to the workspace), and its
    arm head predicts the hand's deviation from that target (`state_channel.py`): a hand pinned at the workspace's
    edge by an action that pushes past it stays pinned (--no-state-arm-target: the raw action)."""
    frame_state: bool = False
    """Condition every generated frame on its state [hand, opening, object centres] as well as its commanded pose: the
    recorded state in training, the state channel's prediction in a rollout (needs the state channel), so the frames
    put the arm and the cubes where the channel does (`WorldModelConfig.frame_state`). --frame-blobs implies it where
    it applies; alone (constant planes, where no camera geometry is given) it was read weakly (README, session 36)."""
    frame_state_noise: float = 0.01
    """Std (m) of the noise added in training to the states frames are conditioned on (the channel's rollout error)."""
    frame_blobs: bool = True
    """Condition every generated frame on the state channel's points (hand, object centres) drawn as blobs where each
    camera sees them (`world_models/video/camera.py`; the cameras' geometry is read from the dataset's simulator task),
    with the frame state (--frame-state) they come from. Off where it cannot apply (no state channel, no simulator that
    gives its cameras' geometry); the model's config says."""
    state_gate: str = "sample"
    """How the state channel's rollouts apply its contact gate: sample (a contact drawn with the gate's probability,
    each member alone), shared (drawn once per rollout and step, every member against its own probability), hard (moved whenever the probability exceeds 0.5), soft (moved by the probability times the change). Changes no
    weight; recorded in the model's config (`state_channel.GATES`)."""
    state_settle: Optional[bool] = None
    """Rollouts keep every object the hand does not hold (fingers stopped by it) at the height it started at: a cube on
    a table rests flat unless held (`state_channel.settle`). None: on where every dataset's objects are the tabletop's
    cubes (its meta/wmrl.json), off elsewhere (objects placed into or onto others end at another height). Changes no
    weight; recorded in the model's config."""
    state_height_loss: str = "huber"
    """How the state channel fits the cubes' height: huber (close to the mean change) or l1 (the median change: a push
    mostly slides the cube flat and sometimes tips it; the mean is a floating cube; `state_channel.HEIGHT_LOSSES`).
    Measured with --state-settle on push-red: l1 floats less but pushes worse, no gain (README, session 65)."""
    state_settle_unroll: bool = False
    """The state channel's unrolled loss puts every cube the hand does not hold back at the height it had at the
    window's start, as rollouts with --state-settle do, so its heads are fitted on the flat cubes they read in
    imagination (`StateChannelConfig.settle_unroll`)."""
    state_cube_huber_cm: float = CUBE_HUBER_CM
    """The Huber threshold (cm) of the cubes' horizontal change in the state channel's unrolled loss: 1 fits near the
    median change, well below the mean for the tabletop's heavy-tailed pushes; larger fits more of the mean, which
    lengthens the channel's push steps but did not make imagination agree better (`state_channel.CUBE_HUBER_CM`)."""
    state_dagger_rounds: int = 0
    """After the other phases: rounds of DAgger for the state channel (`state_dagger.py`): the scripted expert in
    imagination, the true simulator put in the states it visits, the channel trained on the union (tabletop only)."""
    state_dagger_steps: int = 1500
    """State-channel training steps per DAgger round."""
    state_dagger_starts: int = 150
    """True layouts the expert is imagined from per DAgger round (up to 10 continuations each)."""
    state_dagger_actors: tuple[str, ...] = ("expert",)
    """Who acts in DAgger round r, in imagination and in the true continuations: actors[r % len(actors)], `expert`
    (the scripted expert) or an estimated-state policy folder without cameras (sampling, as RL does), e.g.
    `--state-dagger-actors expert runs/bc` alternates: the states the policy RL starts from visits, beside the expert's."""
    extra_data: tuple[Path, ...] = ()
    """More datasets to train on (all episodes to training), e.g. true rollouts of an evolved policy (co-evolution)."""
    mirror: Optional[bool] = None
    """Train on every training episode and its reflection through the cell's plane of symmetry y = 0 (images flipped
    left-right, y and the base's yaw negated: `sim.tabletop.env.mirror_episode`), a second layout for each recorded
    one (held-out episodes are never reflected). None: on for data recorded in the tabletop simulator whose columns
    all have a known reflection, else off (`resolve_mirror`); True refuses data that cannot be, naming why. On the
    headline benchmark: frames-only success AUROC 0.873 (0.848 without), end-effector at h16 1.20 cm (1.48), 19.6
    instead of 17.6 training minutes on 2 cores (README "Reflections by default")."""
    init_from: Optional[Path] = None
    """Start from another run's checkpoint: all weights if its config matches (fine-tuning), all but the state channel's
    if only the channel differs (e.g. a new channel on an existing model: --ae-steps 0 --dyn-steps 0 --unroll-steps 0),
    the autoencoder, latent statistics and state channel if only the frames model differs (e.g. --frame-state: use
    with --ae-steps 0 --state-steps 0), else the autoencoder and latent statistics only (e.g. a deterministic baseline on the same latents); use with --ae-steps 0."""
    init_state_channel: bool = True
    """With --init-from: take the source's state channel where its config allows (False: the channel trains anew
    whatever the configs, e.g. channel seeds of the source's own recipe: --no-init-state-channel --seed N)."""
    fg_weight: float = 3.0
    """Extra autoencoder-loss weight on pixels that differ from the batch's mean frame of their camera (arm, cubes):
    plain MSE spends the latent on the static background."""
    holdout: float = 0.1
    """Share of episodes (the last ones) held out for evaluation and videos."""
    ckpt_every: int = 500
    log_every: int = 50
    eval_every: int = 500
    """Every this many steps (and at each phase's end) the current phase's loss on fixed windows, with fixed noise,
    of held-out episodes (`val_*`) and of training episodes (`fit_*`): their gap shows overfitting, which the running
    loss (fresh windows and noise each step) cannot. 0: never."""
    videos: int = 3
    seed: int = 0
    device: str = "cpu"
    amp: Optional[bool] = None
    """bf16 autocast in the training steps of the autoencoder and the denoiser (the autoencoder, dynamics and
    unrolled phases; weights, Adam and the losses stay float32). None: where the hardware computes bf16 natively
    (`change_mask.native_bf16`: a CPU with AVX-512 BF16 or AMX, a CUDA device), else float32. On the demo's 2-core
    CPU the denoiser's phases took 0.76-0.82x the time (README, session 60: demo60 against demo59), the autoencoder's
    steps 0.72-0.74x (session 61)."""
    compile: Optional[str] = None
    """torch.compile the training losses and the autoencoder: default, reduce-overhead (CUDA graphs) or
    max-autotune. Pays on a GPU, where small batches are bound by kernel launches; checkpoints are unchanged."""
    threads: Optional[int] = None
    overwrite: bool = False
    resume: bool = False


# options of one run or machine, not of the model's recipe
RUN_FIELDS = frozenset({"data", "out", "extra_data", "calibration_data", "init_from", "init_state_channel", "resume", "overwrite", "seed", "videos", "device",
                        "amp", "compile", "threads", "state_dagger_rounds"})
# recipe options whose default turned on after runs were recorded without them (those runs trained with them off)
RECIPE_ADDED_OFF = {"frame_blobs": False, "change_objects": False, "head_rollout_steps": 0, "change_pose_layer": False,
                    "change_bf16": False, "mirror": False}


def recorded_recipe(config: dict) -> dict:
    """The TrainWMConfig options of a world-model run's config.yaml that its model was built with (a fine-tune with
    other ones would retrain its frames model, e.g. co-evolution's), without those of one run or machine; options
    the config predates were off then (`RECIPE_ADDED_OFF`: add an option there when its default turns on)."""
    recipe = {k: config.get(k, off) for k, off in RECIPE_ADDED_OFF.items()}
    recipe.update({f.name: config[f.name] for f in fields(TrainWMConfig)
                   if f.name in config and f.name not in RUN_FIELDS})
    return recipe


def resolve_mirror(cfg: TrainWMConfig) -> bool:
    """`cfg.mirror` decided before any run folder. True: every dataset's columns must have a known reflection
    (`sim.tabletop.env.mirror_episode` on a one-frame episode of its features), else refused naming the column or
    widths. None: on where they do and every dataset was recorded in the tabletop simulator (its meta/wmrl.json:
    the tabletop's objects, no `robot`; a real or twin cell's data need not be symmetric), else off. False: off."""
    if cfg.mirror is False:
        return False
    from wmrl.datasets import LeRobotV3Dataset

    for d in (cfg.data, *cfg.extra_data):
        try:
            feats = LeRobotV3Dataset(d).features
            mirror_episode({k: np.zeros((1, *(f.get("shape") or ())), np.float32) for k, f in feats.items()
                            if k not in BOOKKEEPING | {"qpos", "qvel"}}, f"--mirror ({d})")
        except ValueError:
            if cfg.mirror:
                raise
            return False
        meta = Path(d) / "meta" / "wmrl.json"
        meta = json.loads(meta.read_text()) if meta.exists() else {}
        if cfg.mirror is None and ("robot" in meta or (meta.get("control") or {}).get("object_state") != "tabletop"):
            return False
    return True


def resolve_settle(cfg: TrainWMConfig) -> bool:
    """`cfg.state_settle` decided before any run folder: None is on where every dataset's objects are the tabletop's
    cubes (its control's `object_state`), which rest on the table unless the gripper holds them."""
    if cfg.state_settle is not None:
        return bool(cfg.state_settle)
    return all(EEDeltaControl.of_dataset(d).object_state == "tabletop" for d in (cfg.data, *cfg.extra_data))


def load_split(data: Path, holdout: float, seed: int = 0, extra: tuple[Path, ...] = (), keep: tuple[str, ...] = (),
               mirror: bool = False):
    """The dataset as two replays: train episodes and held-out episodes (the last `holdout` share of `data`).
    Episodes of the `extra` datasets (e.g. rollouts of an evolved policy) all go to training. `keep`: bookkeeping
    columns to keep (e.g. `qpos` for re-rendering held-out frames). `mirror`: every training episode followed by
    its reflection (`sim.tabletop.env.mirror_episode`)."""
    needed = (STATE, ACTION, SUCC, REW, TERM, "observation.images.front", "observation.images.wrist")
    drop = (BOOKKEEPING | {"qpos", "qvel"}) - set(keep)
    augment = (lambda ep: mirror_episode(ep, "--mirror")) if mirror else None
    dss, train, held = EpisodeReplay.from_datasets([data, *extra], drop=drop, require=needed, holdout=holdout, seed=seed,
                                                   augment=augment)
    if dss[0].num_episodes - held.num_episodes < 2:
        raise ValueError(f"{data}: {dss[0].num_episodes} episodes are too few to train a world model")
    return dss[0], train, held


def model_config(cfg: TrainWMConfig, ds) -> WorldModelConfig:
    vocab = sorted({w for t in ds.tasks for w in TaskEncoder.words(t)})
    c = EEDeltaControl.of_dataset(ds.root)  # the suite's action geometry, recorded with the data
    has_channel = cfg.state_channel and ENV_STATE in ds.features
    blobs = has_channel and cfg.frame_blobs
    objects = (cfg.change_mask_steps > 0 and cfg.change_warp and cfg.change_unwarped and has_channel and cfg.change_objects)
    geometry = camera_geometry(ds) if blobs or objects else None
    # where they cannot apply (no simulator gives the cameras' geometry), no blobs and no object sources
    blobs, objects = blobs and geometry is not None, objects and geometry is not None
    frame_state = has_channel and (cfg.frame_state or blobs)
    return WorldModelConfig(ee_index=c.ee_index, gripper_index=c.gripper_index, gripper_open=c.gripper_open,
                            ee_step=c.ee_step, gripper_action=c.gripper_action, rot_step=c.rot_step,
                            workspace_low=c.workspace_low, workspace_high=c.workspace_high,
                            n_objects=len(c.object_xyz), object_xyz=c.object_xyz, env_arm=c.env_arm,
                            env_previous=c.env_previous,
                            context=cfg.context, chunk=cfg.chunk, size=cfg.size, sampling_steps=cfg.sampling_steps, mean_share=cfg.mean_share,
                            deterministic=cfg.deterministic, motion_weight=cfg.motion_weight, task_vocab=vocab, latent_channels=cfg.latent_channels,
                            ae_width=cfg.ae_width, state_members=cfg.state_members if cfg.state_channel else 0,
                            state_rest=cfg.state_rest, state_pairs=cfg.state_pairs,
                            state_hand_frame=cfg.state_hand_frame, state_velocity=cfg.state_velocity,
                            state_arm_rest=cfg.state_arm_rest, state_detach_hand=cfg.state_detach_hand,
                            state_arm_target=cfg.state_channel and cfg.state_arm_target, state_gate=cfg.state_gate,
                            state_settle=resolve_settle(cfg), state_height_loss=cfg.state_height_loss,
                            state_settle_unroll=cfg.state_settle_unroll, state_cube_huber_cm=cfg.state_cube_huber_cm,
                            frame_state=frame_state, frame_state_noise=cfg.frame_state_noise,
                            frame_blobs=blobs,
                            camera_geometry=geometry or {},
                            change_mask=cfg.change_mask_steps > 0,
                            change_refine=cfg.change_mask_steps > 0 and cfg.change_refine,
                            change_warp=cfg.change_mask_steps > 0 and cfg.change_warp,
                            change_unwarped=cfg.change_mask_steps > 0 and cfg.change_warp and cfg.change_unwarped,
                            change_read_pose=cfg.change_mask_steps > 0 and cfg.change_warp and cfg.change_read_pose,
                            change_objects=objects,
                            change_coords=cfg.change_mask_steps > 0 and cfg.change_coords,
                            change_pose_layer=objects and cfg.change_pose_layer,
                            action_dim=int(ds.features[ACTION]["shape"][0]), state_dim=int(ds.features[STATE]["shape"][0]),
                            env_state_dim=int(ds.features[ENV_STATE]["shape"][0]) if ENV_STATE in ds.features else 0)


def camera_geometry(ds) -> dict | None:
    """The cameras' pinhole models (`world_models.video.camera`) of the simulator the dataset's task runs in; None
    when no simulator runs it or its env gives none (`TabletopEnv.camera_geometry`). Read from a state-only env:
    training renders nothing, so it runs where no GL context can be made (a headless GPU box)."""
    try:
        env = sim.make_env(task_from_instruction(ds.tasks[0]), cameras=()).unwrapped
    except (ValueError, KeyError, TypeError):  # a task no suite knows (a real cell), no cameras= arg
        return None
    try:
        if not hasattr(env, "camera_geometry"):
            return None
        env.reset(seed=0)
        return env.camera_geometry(WorldModelConfig.cameras)  # the model's cameras, which it checks the geometry for
    finally:
        env.close()


def ae_weights(x: torch.Tensor, n_cameras: int, fg_weight: float) -> torch.Tensor:
    """Per-pixel loss weights (N, 1, H, W), mean 1, for a batch x (N, 3, H, W) made of n_cameras equal blocks:
    1 + fg_weight where a pixel is far (> 0.1) from its camera's batch-mean frame."""
    xc = x.reshape(n_cameras, -1, *x.shape[1:])
    fg = ((xc - xc.mean(dim=1, keepdim=True)).abs().mean(dim=2, keepdim=True) > 0.1).float()
    w = (1 + fg_weight * fg).reshape(-1, 1, *x.shape[2:])
    return w / w.mean()


def ae_loss(model: VideoWorldModel, x: torch.Tensor, fg_weight: float) -> torch.Tensor:
    """The autoencoder's loss on frames x (cameras * B, 3, H, W): foreground-weighted reconstruction error and a
    small latent penalty."""
    z = model.ae.encode(x).float()  # float32 error and penalty under bf16 autocast
    return (ae_weights(x, len(model.cfg.cameras), fg_weight) * (model.ae.decode(z).float() - x) ** 2).mean() + 1e-4 * (z**2).mean()


EVAL_BATCHES = 4  # batches of fixed windows per evaluation (per split)


def compile_losses(model: VideoWorldModel, mode: str) -> None:
    """torch.compile the training losses whole (fewer, fused kernels) and the autoencoder; parameter names and
    checkpoints unchanged."""
    model.ae.compile(mode=mode)
    model.dynamics_loss, model.heads_loss = (torch.compile(f, mode=mode) for f in (model.dynamics_loss, model.heads_loss))
    if model.state_channel is not None:  # L unrolled steps of a small ensemble: hundreds of tiny kernels eager
        model.state_channel.unrolled_loss = torch.compile(model.state_channel.unrolled_loss, mode=mode)


def uncompile_losses(model: VideoWorldModel) -> None:
    """Undo `compile_losses`. The fits after training (heads on rollouts, the change mask, the videos) call these
    with other shapes, each a recompile (and, with CUDA graphs, a re-recording): on a lent H200 with CUDA graphs
    the heads' fit (base size) had not finished after about 200 s, where one CPU thread takes about a minute."""
    model.ae._compiled_call_impl = None  # what nn.Module.compile set
    for name in ("dynamics_loss", "heads_loss"):
        model.__dict__.pop(name, None)  # the class's own methods again
    if model.state_channel is not None:
        model.state_channel.__dict__.pop("unrolled_loss", None)


@torch.no_grad()
def fixed_window_losses(model: VideoWorldModel, samplers: dict, phase: int, cfg: "TrainWMConfig") -> dict:
    """The loss of `phase` (0 autoencoder, 1 and >= 4 state channel, 2 and 3 the teacher-forced dynamics loss) on
    EVAL_BATCHES batches of windows and noise drawn from a fixed seed, the same at every call, for each named
    sampler ({"val": held-out, "fit": training episodes}). Uncompiled methods (their shapes differ from training's).
    Keys: `<name>_ae_loss`, `<name>_state_loss`, `<name>_dyn_loss`."""
    dev = model.device
    out = {}
    for name, smp in samplers.items():
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(cfg.seed + 12_345)
            gen = torch.Generator(device=dev).manual_seed(cfg.seed + 12_345)
            losses = []
            for _ in range(EVAL_BATCHES):
                if phase == 0:
                    key, loss = "ae_loss", ae_loss(model, smp.frames(cfg.batch_size, gen), cfg.fg_weight)
                elif phase == 1 or phase >= 4:
                    xs, acts, mask = smp.state_sequences(model.cfg.state_members, 128, cfg.state_unroll, gen)
                    key, loss = "state_loss", type(model.state_channel).unrolled_loss(model.state_channel, xs, acts, mask)[0]
                else:
                    d = smp.sample(cfg.batch_size, cfg.context, cfg.chunk, gen)
                    key, loss = "dyn_loss", VideoWorldModel.dynamics_loss(model, d["ctx"], d["anchor"], d["future"],
                                                                          _pose0(model, d), d["poses"], d["mask"],
                                                                          d.get("states"))
                losses.append(float(loss))
        out[f"{name}_{key}"] = float(np.mean(losses))
    return out


@torch.no_grad()
def encode_all(model: VideoWorldModel, replay, batch: int = 256, raw: bool = False) -> torch.Tensor:
    """Latents of every stored frame, aligned with the replay's slots (standardised unless `raw`), on the model's
    device."""
    hw = replay.high_water
    out = torch.zeros(hw, model.cfg.frame_channels, model.cfg.latent_size, model.cfg.latent_size, device=model.device)
    for i in range(0, hw, batch):
        j = min(i + batch, hw)
        imgs = {f"observation.images.{c}": replay.data[f"observation.images.{c}"][i:j] for c in model.cfg.cameras}
        z = model.encode_frames(imgs)
        out[i:j] = z * model.lat_std + model.lat_mean if raw else z
    return out


def latent_statistics_set(model: VideoWorldModel) -> bool:
    """Whether the model's latent statistics were fixed (`set_latent_statistics`), not the buffers' defaults."""
    return not all(bool((getattr(model, b) == v).all()) for b, v in (("lat_mean", 0.0), ("lat_std", 1.0), ("res_std", 1.0)))


@torch.no_grad()
def set_latent_statistics(model: VideoWorldModel, replay) -> torch.Tensor:
    """Per-channel mean/std of the latents, then the std of one-step changes within episodes (the residual scale).
    Returns the standardised latents of every slot."""
    model.lat_mean.zero_()
    model.lat_std.fill_(1.0)
    raw = encode_all(model, replay)
    live = torch.as_tensor(replay.frame_episode[: replay.high_water] >= 0, device=model.device)
    model.lat_mean.copy_(raw[live].mean(dim=(0, 2, 3)).reshape(-1, 1, 1))
    model.lat_std.copy_(raw[live].std(dim=(0, 2, 3)).reshape(-1, 1, 1) + 1e-6)
    lat = (raw - model.lat_mean) / model.lat_std
    nxt = torch.as_tensor(np.concatenate([np.arange(lo, lo + T - 1) for lo, T in replay.episodes.values()]), device=model.device)
    diff = lat[nxt + 1] - lat[nxt]
    model.res_std.copy_(diff.std(dim=(0, 2, 3)).reshape(-1, 1, 1).clamp(min=1e-3))
    return lat


class WindowSampler:
    """Windows of consecutive frames gathered on the device: K context frames (before an episode's first frame the
    first frame is repeated, as at a reset) and `n` future frames (past the episode's end: masked)."""

    def __init__(self, replay, device, mcfg: WorldModelConfig, lat: torch.Tensor | None = None):
        d = replay.data
        self.mcfg = mcfg
        t = lambda x, dt=torch.float32: torch.as_tensor(np.asarray(x), dtype=dt, device=device)
        hw = replay.high_water
        self.lat, self.device = lat, device
        self.state, self.action = t(d[STATE][:hw]), t(d[ACTION][:hw])
        self.succ, self.rew, self.term = t(d[SUCC][:hw]), t(d[REW][:hw]), t(d[TERM][:hw])
        self.env = t(d[ENV_STATE][:hw]) if ENV_STATE in d else None
        self.task_ids = t(d["task"][:hw], torch.long)
        self.vocab = list(replay.vocab["task"])
        lo, last = np.zeros(hw, np.int64), np.zeros(hw, np.int64)
        starts = []
        for a, T in replay.episodes.values():
            lo[a : a + T], last[a : a + T] = a, a + T - 1
            starts.append(np.arange(a, a + T - 1))  # frames with at least one next frame
        self.lo, self.last = t(lo, torch.long), t(last, torch.long)
        self.starts = t(np.concatenate(starts), torch.long)
        # what the state channel trains on: the replay's frames, and episodes without frames added later
        self.seq = {"state": self.state, "env": self.env, "action": self.action, "last": self.last, "starts": self.starts,
                    "first": self.lo}
        self._remaining = self.last[self.starts] - self.starts
        # uint8 frames resident on the device for the autoencoder phase (on the CPU: views of the replay's arrays)
        self.images = {c: torch.as_tensor(d[f"observation.images.{c}"][:hw], device=device) for c in mcfg.cameras}

    def frames(self, B: int, gen: torch.Generator) -> torch.Tensor:
        """(cameras * B, 3, H, W) frames in [-1, 1], one block per camera, gathered on the device."""
        i = self.starts[torch.randint(len(self.starts), (B,), generator=gen, device=self.device)]
        x = torch.cat([self.images[c][i] for c in self.mcfg.cameras])
        return x.permute(0, 3, 1, 2).float() / 127.5 - 1.0

    def sample(self, B: int, K: int, n: int, gen: torch.Generator, min_future: int = 1, reset_prob: float = 0.1) -> dict:
        pool = self.starts if min_future <= 1 else self.starts[self._remaining >= min_future]
        if len(pool) == 0:
            raise ValueError(f"no episode has {min_future} frames after a start: episodes are too short")
        i = pool[torch.randint(len(pool), (B,), generator=gen, device=self.device)]
        lo, last = self.lo[i], self.last[i]
        ctx = torch.maximum(i[:, None] + torch.arange(-K + 1, 1, device=self.device), lo[:, None])
        dup = torch.rand(B, generator=gen, device=self.device) < reset_prob  # emulate a reset: one frame repeated
        ctx = torch.where(dup[:, None], i[:, None].expand(-1, K), ctx)
        fut = i[:, None] + torch.arange(1, n + 1, device=self.device)
        mask = (fut <= last[:, None]).float()
        fut = torch.minimum(fut, last[:, None])
        act = fut - 1  # the action of frame t leads to frame t + 1
        ee = self.state[:, list(self.mcfg.ee_index)]
        out = {"i": i, "ctx_idx": ctx, "fut_idx": fut, "mask": mask, "actions": self.action[act],
               "poses": commanded_pose(ee[act], self.action[act], self.mcfg), "proprio": self.state[i],
               "prev_action": torch.where((i > lo)[:, None], self.action[(i - 1).clamp(min=0)], torch.nan),
               "task_idx": self.task_ids[i],
               "labels": {"state": self.state[fut], "success": self.succ[act], "reward": self.rew[act], "done": self.term[act]}}
        if self.mcfg.frame_state:  # the recorded state of the last context frame and of every future frame
            idx = torch.cat([i[:, None], fut], 1)
            out["states"] = channel_state(self.mcfg, self.state[idx], self.env[idx])[..., : self.mcfg.frame_state_dim]
        if self.mcfg.change_objects:  # the recorded [hand, objects] of the start frame and every future frame
            idx = torch.cat([i[:, None], fut], 1)
            out["points"] = scene_points(channel_state(self.mcfg, self.state[idx], self.env[idx]), self.mcfg.n_objects)
        if self.lat is not None:
            out.update(ctx=self.lat[ctx], future=self.lat[fut], anchor=self.lat[lo])
        return out

    def state_sequences(self, M: int, B: int, L: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For the state channel: x (M, B, L+1, D) = [ee, opening, object centres(, rest)], actions (M, B, L, A),
        mask (M, B, L); drawn from the replay's episodes and any added with `add_state_episodes`."""
        q = self.seq
        i = q["starts"][torch.randint(len(q["starts"]), (M * B,), generator=gen, device=self.device)]
        idx = i[:, None] + torch.arange(L + 1, device=self.device)
        mask = (idx[:, 1:] <= q["last"][i][:, None]).float()
        # the frame before each (an episode's first frame, and the repeated frames past its end: at rest)
        prev = torch.minimum(torch.maximum(idx - 1, q["first"][i][:, None]), q["last"][i][:, None])
        idx = torch.minimum(idx, q["last"][i][:, None])
        x = channel_state(self.mcfg, q["state"][idx], q["env"][idx], q["env"][prev])
        return x.reshape(M, B, L + 1, -1), q["action"][idx[:, :-1]].reshape(M, B, L, -1), mask.reshape(M, B, L)

    def add_state_episodes(self, episodes: list[dict]) -> None:
        """More episodes ({observation.state, observation.environment_state, action}) for the state channel only
        (no frames: e.g. true continuations from imagined states, `state_dagger.py`)."""
        if not episodes:
            return
        q, n = self.seq, len(self.seq["state"])
        t = lambda k: torch.as_tensor(np.concatenate([e[k] for e in episodes]), dtype=torch.float32, device=self.device)
        lens = np.array([len(e[ACTION]) for e in episodes])
        lo = n + np.concatenate([[0], np.cumsum(lens)[:-1]])
        last, first = np.repeat(lo + lens - 1, lens), np.repeat(lo, lens)
        starts = np.concatenate([np.arange(a, a + T - 1) for a, T in zip(lo, lens)])
        as_long = lambda x: torch.as_tensor(x, dtype=torch.long, device=self.device)
        self.seq = {"state": torch.cat([q["state"], t(STATE)]), "env": torch.cat([q["env"], t(ENV_STATE)]),
                    "action": torch.cat([q["action"], t(ACTION)]), "last": torch.cat([q["last"], as_long(last)]),
                    "starts": torch.cat([q["starts"], as_long(starts)]), "first": torch.cat([q["first"], as_long(first)])}


def _pose0(model: VideoWorldModel, d: dict) -> torch.Tensor:
    prev = d["prev_action"]
    p = model.observed_pose(d["proprio"])
    has = ~torch.isnan(prev[:, 0])
    return torch.where(has[:, None], model.observed_pose(d["proprio"], torch.nan_to_num(prev)), p)


def _save_checkpoint(run: Path, step: int, model, opts: dict, extra: dict) -> None:
    commit_checkpoint(run / "checkpoints", step, lambda d: (model.save(d), save_train_state(d, step, opts, **extra)))


def unrolled_batch(model: VideoWorldModel, d: dict, H: int, gen: torch.Generator) -> dict:
    """The second chunk of a 2H window with the first generated by the model (1 Euler step, no gradient): the
    context, pose and targets the unrolled loss sees. `generated` is the model's own first chunk."""
    K = model.cfg.context
    pose0 = _pose0(model, d)
    st = d.get("states")  # frame_state: recorded states, the first chunk's and then the second's
    with torch.no_grad():
        gen_lat = model.sample_future(d["ctx"], d["anchor"], pose0, d["poses"][:, :H], steps=1, generator=gen,
                                      states=None if st is None else st[:, : H + 1])
    return {"ctx": torch.cat([d["ctx"], gen_lat], 1)[:, -K:], "anchor": d["anchor"], "future": d["future"][:, H:],
            "pose0": d["poses"][:, H - 1], "poses": d["poses"][:, H:], "mask": d["mask"][:, H:], "generated": gen_lat,
            "states": None if st is None else st[:, H : 2 * H + 1]}


def train_world_model(cfg: TrainWMConfig, progress: bool = True) -> dict:
    for name in ("ae_steps", "state_steps", "dyn_steps", "unroll_steps", "change_mask_steps", "change_mask_windows",
                 "head_rollout_steps", "change_layer_steps"):
        if (getattr(cfg, name) or 0) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}")
    if cfg.head_rollout_horizon < 1 or cfg.head_rollout_episodes < 1:
        raise ValueError(f"--head-rollout-horizon and --head-rollout-episodes must be >= 1, got "
                         f"{cfg.head_rollout_horizon} and {cfg.head_rollout_episodes}")
    if not cfg.change_mask_focus >= 0:  # NaN fails too
        raise ValueError(f"--change-mask-focus must be >= 0, got {cfg.change_mask_focus}")
    if not cfg.change_mask_static_weight > 0:
        raise ValueError(f"--change-mask-static-weight must be > 0, got {cfg.change_mask_static_weight}")
    if not 0 <= cfg.mean_share < 1:
        raise ValueError(f"--mean-share must be in [0, 1) (1 would leave the diffusion path untrained), got {cfg.mean_share}")
    if cfg.compile not in COMPILE_MODES:
        raise ValueError(f"--compile must be one of {', '.join(m for m in COMPILE_MODES if m)}, got {cfg.compile!r}")
    dagger = StateDaggerConfig(rounds=cfg.state_dagger_rounds, starts=cfg.state_dagger_starts, steps=cfg.state_dagger_steps,
                               actors=tuple(str(a) for a in cfg.state_dagger_actors))
    dagger.validate()
    calib = None
    if cfg.calibration_data is not None:  # refused before any run folder
        from wmrl.datasets import LeRobotV3Dataset

        _, calib, _ = load_split(cfg.calibration_data, 0.0, cfg.seed)
        have, got = set(LeRobotV3Dataset(cfg.data).tasks), set(LeRobotV3Dataset(cfg.calibration_data).tasks)
        if not got <= have:
            raise ValueError(f"--calibration-data {cfg.calibration_data}: its tasks {sorted(got - have)} are not the "
                             f"training data's {sorted(have)}")
    # the config.yaml records what was trained on
    cfg = replace(cfg, mirror=resolve_mirror(cfg), state_settle=resolve_settle(cfg))
    run = start_run(cfg)
    torch.manual_seed(cfg.seed)
    ds, train, held = load_split(cfg.data, cfg.holdout, cfg.seed, cfg.extra_data, mirror=cfg.mirror)
    mcfg = model_config(cfg, ds)
    if dagger.rounds and not (cfg.state_channel and mcfg.env_state_dim):
        raise ValueError("--state-dagger-rounds trains the state channel: it needs the dataset's "
                         f"{ENV_STATE!r} and --state-channel")
    if cfg.frame_state and not (cfg.state_channel and mcfg.env_state_dim):
        raise ValueError(f"--frame-state conditions frames on the state channel's predictions: it needs --state-channel "
                         f"and the dataset's {ENV_STATE!r}; pass --no-frame-state")
    if cfg.frame_state_noise < 0:
        raise ValueError(f"--frame-state-noise must be >= 0, got {cfg.frame_state_noise}")
    if cfg.state_height_loss not in HEIGHT_LOSSES:
        raise ValueError(f"--state-height-loss: expected one of {HEIGHT_LOSSES}, got {cfg.state_height_loss!r}")
    if not cfg.state_cube_huber_cm > 0:
        raise ValueError(f"--state-cube-huber-cm must be > 0 (cm), got {cfg.state_cube_huber_cm}")
    if cfg.state_channel and cfg.state_steps and not mcfg.env_state_dim:
        raise ValueError(f"{cfg.data}: the state channel needs {ENV_STATE!r}, which the dataset lacks; pass "
                         "--no-state-channel to read success from generated frames only")
    if cfg.state_channel and cfg.state_steps and EEDeltaControl.of_dataset(ds.root).object_state is None:
        raise ValueError(f"{cfg.data}: its task has no success rule on {ENV_STATE!r} for the state channel (its "
                         "meta/wmrl.json 'control' names no object_state); pass --no-state-channel to read success "
                         "from generated frames only")
    ck, _ = resume_checkpoint(run / "checkpoints") if cfg.resume else (None, 0)
    resuming = ck is not None
    model = VideoWorldModel.load(ck, expect=mcfg, device=cfg.device) if resuming else VideoWorldModel(mcfg).to(cfg.device)
    special = {id(p) for m in (model.ae, model.state_channel) if m is not None for p in m.parameters()}
    opts = {"ae": torch.optim.AdamW(model.ae.parameters(), cfg.lr * 3),
            "dyn": torch.optim.AdamW([p for p in model.parameters() if id(p) not in special], cfg.lr)}
    if model.state_channel is not None:
        opts["state"] = torch.optim.AdamW(model.state_channel.parameters(), 2e-3)
    step, extra = 0, {}
    if resuming:
        state = load_train_state(ck, opts, cfg.device)
        step = state["step"]
        extra = {k: v for k, v in state.items() if k != "step"}
    elif cfg.init_from is not None:
        src = VideoWorldModel.load(resolve_checkpoint(cfg.init_from), device=cfg.device)
        # (the gate is no weight; a change mask is refitted after training, so one the source lacks is no difference)
        mask_kind = {f: getattr(mcfg, f) for f in CHANGE_MASK_FIELDS}
        # nor are the cameras' geometry and an object's size: data the mask and blobs read, no weight
        mask_kind.update(camera_geometry=mcfg.camera_geometry, object_radius=mcfg.object_radius)
        same = replace(src.cfg, state_gate=mcfg.state_gate, state_settle=mcfg.state_settle, **mask_kind) == mcfg
        # a mask of another kind (or none) is left out: it is refitted after training
        mask_same = all(getattr(src.cfg, f) == mask_kind[f] for f in CHANGE_MASK_FIELDS)
        weights = {k: v for k, v in src.state_dict().items() if (mask_same or not k.startswith("change_mask"))
                   and (cfg.init_state_channel or not k.startswith("state_channel."))}
        # the same frames model with another state channel: every weight but the channel's (trained anew)
        channel_only = not same and replace(src.cfg, **{f: getattr(mcfg, f) for f in STATE_CHANNEL_FIELDS},
                                            **mask_kind) == mcfg
        fitted = src.change_mask is not None and bool(src.change_mask_fitted)
        if (same or channel_only) and mask_same and fitted and mcfg.layer_cameras:
            # the pose layer reads real frames and recorded hands only: a fine-tune (e.g. co-evolution's) or a new
            # channel keeps it
            extra["pose_layer_trained"] = True
        if same:  # the same model: fine-tune all (but a channel trained anew)
            model.load_state_dict(weights, strict=mask_same and cfg.init_state_channel)
            # a fit this run asks for (other data, other weights) is made even when nothing else trains
            refit = cfg.calibration_data is not None or cfg.change_mask_static_weight != 1
            if mask_same and fitted and not refit and not (cfg.ae_steps or cfg.state_steps or cfg.dyn_steps
                                                           or cfg.unroll_steps or dagger.rounds):
                # nothing the mask reads changes (the heads are not among it): the source's fitted mask stays
                extra["change_mask_step"] = 0
        elif channel_only:
            model.load_state_dict({k: v for k, v in weights.items() if not k.startswith("state_channel.")}, strict=False)
        elif (cfg.init_state_channel and model.state_channel is not None and src.state_channel is not None
              and src.state_channel.cfg == model.state_channel.cfg):
            # another frames model on the same state channel (e.g. --frame-state): the channel is kept
            model.state_channel.load_state_dict(src.state_channel.state_dict())
        model.ae.load_state_dict(src.ae.state_dict())
        # keep the source's latent statistics, unless it was saved before they were set (a checkpoint of its
        # autoencoder or state-channel phase): those hold the defaults, and are computed here as in any first run
        if latent_statistics_set(src):
            for b in ("lat_mean", "lat_std", "res_std"):
                getattr(model, b).copy_(getattr(src, b))
            extra["lat_stats"] = True
    tracker = Tracker(run)
    K, H, B = cfg.context, cfg.chunk, cfg.batch_size
    n_state = cfg.state_steps if model.state_channel is not None else 0
    # phases: 0 autoencoder, 1 state channel, 2 dynamics, 3 unrolled, 4 + r the state channel's DAgger round r
    bounds = np.cumsum([cfg.ae_steps, n_state, cfg.dyn_steps, cfg.unroll_steps] + [cfg.state_dagger_steps] * dagger.rounds)
    dagger_tasks = sorted({task_from_instruction(t) for t in ds.tasks}) if dagger.rounds else []
    for t in dagger_tasks:
        check_placeable(t)
    dagger_ready = 0  # DAgger rounds whose episodes the sampler holds
    total = int(bounds[-1])
    n_pos = float(train.data[SUCC][: train.high_water][train.frame_episode[: train.high_water] >= 0].sum())
    pos_weight = torch.tensor(min(20.0, max(1.0, (len(train) - n_pos) / max(n_pos, 1))), device=cfg.device)
    sampler = WindowSampler(train, cfg.device, mcfg)
    # fixed-window losses on held-out and training episodes (`eval_every`)
    eval_samplers = {"val": WindowSampler(held, cfg.device, mcfg), "fit": sampler} if cfg.eval_every and held.num_episodes else {}
    task_tokens = model.task.token_ids(sampler.vocab)  # (tasks, n) on the device: no strings in the loop
    if cfg.compile:
        compile_losses(model, cfg.compile)
    # one device-side flag instead of a host sync per step; read at log and checkpoint steps, so a non-finite
    # loss never reaches a checkpoint
    nonfinite, checked = torch.zeros((), dtype=torch.bool, device=cfg.device), step
    from world_models.video.change_mask import native_bf16

    use_amp = native_bf16(cfg.device) if cfg.amp is None else cfg.amp
    amp = torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16) if use_amp else nullcontext()
    tracker.log({"amp_bf16": float(use_amp)}, step=step)
    bar = tqdm(total=total, initial=step, desc="train-wm", disable=not progress)
    t0 = time.time() - extra.get("seconds", 0.0)
    last: dict = {}
    while step < total:
        torch.manual_seed(cfg.seed * 1_000_003 + step)  # per-step randomness: a resumed run continues exactly
        if cfg.compile == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs are no longer read
        gen = torch.Generator(device=cfg.device).manual_seed(cfg.seed * 1_000_003 + step)
        phase = int(np.searchsorted(bounds, step, side="right"))
        if phase >= 2 and sampler.lat is None:
            if "lat_stats" not in extra:  # fixed once, after the autoencoder phase
                sampler.lat = set_latent_statistics(model, train)
                extra["lat_stats"] = True
            else:
                sampler.lat = encode_all(model, train)
            if "val" in eval_samplers:
                eval_samplers["val"].lat = encode_all(model, held)
        if phase == 0:
            with amp:
                loss = ae_loss(model, sampler.frames(B, gen), cfg.fg_weight)
            opt, info = opts["ae"], {"ae_loss": loss}
        elif phase == 1 or phase >= 4:
            while phase >= 4 and dagger_ready <= phase - 4:  # a round's episodes: collected once, kept for resume
                r = dagger_ready
                path = run / "state_dagger" / f"round_{r:02d}.npz"
                if path.exists():
                    eps = load_episodes(path)
                else:
                    eps, dinfo = dagger_round(model, train, dagger_tasks, dagger, r, cfg.seed)
                    save_episodes(path, eps)
                    tracker.log(dinfo, step=step)
                    bar.write(f"state DAgger round {r}: {dinfo['dagger_actor']} imagined success {dinfo['dagger_imagined_success']:.3f}, "
                              f"{dinfo['dagger_episodes']} true continuations ({dinfo['dagger_refused']} refused)")
                sampler.add_state_episodes(eps)
                dagger_ready += 1
            xs, acts, mask = sampler.state_sequences(mcfg.state_members, 128, cfg.state_unroll, gen)
            loss, sinfo = model.state_channel.unrolled_loss(xs, acts, mask)
            opt, info = opts["state"], {"state_loss": loss, **sinfo}
        else:
            unroll = phase == 3
            d = sampler.sample(B, K, 2 * H if unroll else H, gen, min_future=H + 1 if unroll else 1)
            tasks = task_tokens[d["task_idx"]]
            with amp:
                if unroll:
                    u = unrolled_batch(model, d, H, gen)
                    l_dyn = model.dynamics_loss(u["ctx"], u["anchor"], u["future"], u["pose0"], u["poses"], u["mask"],
                                                u["states"])
                    head_z, head_mask = u["generated"], d["mask"][:, :H]
                    labels = {k: v[:, :H] for k, v in d["labels"].items()}
                else:
                    l_dyn = model.dynamics_loss(d["ctx"], d["anchor"], d["future"], _pose0(model, d), d["poses"], d["mask"],
                                                d.get("states"))
                    head_z, head_mask, labels = d["future"], d["mask"], d["labels"]
                l_heads, hinfo = model.heads_loss(head_z.flatten(0, 1).float(), tasks.repeat_interleave(H, 0),
                                                  {k: v.flatten(0, 1) for k, v in labels.items()}, head_mask.flatten(0, 1),
                                                  pos_weight=pos_weight)
            loss = l_dyn + l_heads
            opt, info = opts["dyn"], {"unroll_loss" if unroll else "dyn_loss": l_dyn, **{f"head_{k}": v for k, v in hinfo.items()}}
        nonfinite |= ~torch.isfinite(loss.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if phase == 1 or phase >= 4:  # the rest head apart: the joints' larger loss must not shrink the arm's and the cubes' steps
            sc = model.state_channel
            torch.nn.utils.clip_grad_norm_([*sc.arm.parameters(), *sc.cube.parameters()], 1.0)
            if sc.rest is not None:
                torch.nn.utils.clip_grad_norm_(sc.rest.parameters(), 1.0)
        else:
            torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
        opt.step()
        step += 1
        bar.update(1)
        save = step % cfg.ckpt_every == 0 or step == total or step in bounds
        if save or step % cfg.log_every == 0:
            if nonfinite:
                raise RuntimeError(f"loss became non-finite (nan/inf) between steps {checked + 1} and {step}; the last "
                                   f"good checkpoint is in {run / 'checkpoints' / 'last'}")
            checked = step
        if step % cfg.log_every == 0 or step == total:
            last = {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in info.items()}  # host syncs only here
            tracker.log(last, step=step)
            bar.set_postfix({k: f"{v:.3f}" for k, v in list(last.items())[:2]})
        if eval_samplers and (step % cfg.eval_every == 0 or step in bounds):
            tracker.log(fixed_window_losses(model, eval_samplers, phase, cfg), step=step)
        if save:
            _save_checkpoint(run, step, model, opts, {**extra, "seconds": time.time() - t0})
    bar.close()
    if cfg.compile:
        uncompile_losses(model)
    if cfg.head_rollout_steps and extra.get("head_rollout_step") != step:  # after every phase that moves the latents
        from world_models.video.rollout_heads import fit_heads_on_rollouts

        bar.write(f"fitting the frame heads on rollouts ({cfg.head_rollout_steps} steps, {cfg.head_rollout_episodes} "
                  f"episodes x {cfg.head_rollout_horizon} steps)")
        hinfo = fit_heads_on_rollouts(model, train if calib is None else calib, cfg.head_rollout_horizon, cfg.head_rollout_steps,
                                      cfg.head_rollout_episodes, seed=cfg.seed)
        tracker.log(hinfo, step=step)
        last.update(hinfo)
        extra["head_rollout_step"] = step
        _save_checkpoint(run, step, model, opts, {**extra, "seconds": time.time() - t0})
    if cfg.change_mask_steps and extra.get("change_mask_step") != step:  # refitted whenever the model trained on
        from world_models.video.change_mask import fit_change_mask, fit_pose_layers, native_bf16

        bf16 = native_bf16(cfg.device) if cfg.change_bf16 is None else cfg.change_bf16
        if mcfg.layer_cameras and not extra.get("pose_layer_trained"):
            layer_steps = 2 * cfg.change_mask_steps if cfg.change_layer_steps is None else cfg.change_layer_steps
            bar.write(f"training the pose layer ({layer_steps} steps; cameras {', '.join(mcfg.layer_cameras)})")
            linfo = fit_pose_layers(model, train, layer_steps, seed=cfg.seed, bf16=bf16)
            tracker.log(linfo, step=step)
            last.update(linfo)
            extra["pose_layer_trained"] = True
        bar.write(f"fitting the change mask ({cfg.change_mask_steps} steps on {cfg.change_mask_windows} windows' rollouts)")
        minfo = fit_change_mask(model, train if calib is None else calib, cfg.change_mask_windows, cfg.change_mask_steps, seed=cfg.seed,
                                focus=cfg.change_mask_focus, static_weight=cfg.change_mask_static_weight, bf16=bf16)
        tracker.log(minfo, step=step)
        last.update(minfo)
        extra["change_mask_step"] = step
        _save_checkpoint(run, step, model, opts, {**extra, "seconds": time.time() - t0})
    minutes = (time.time() - t0) / 60
    plot_curves(run / "metrics.jsonl", run / "losses.png", [("ae_loss", "fit_ae_loss", "val_ae_loss"),
                ("state_loss", "fit_state_loss", "val_state_loss"), ("dyn_loss", "fit_dyn_loss", "val_dyn_loss"),
                ("unroll_loss",)], title="world model: running, fixed training windows (fit), held-out (val)")
    result = {"run_dir": str(run), "steps": step, "train_minutes": minutes, "success_source": model.success_source,
              "train_episodes": train.num_episodes, "mirror": cfg.mirror, **last}
    if cfg.videos:
        from world_models.video.evaluate import write_side_by_side

        result["videos"] = write_side_by_side(model, held, run / "videos", n=cfg.videos)
    tracker.log({"stage": "done", **{k: v for k, v in result.items() if k != "videos"}})
    tracker.close()
    return result


def check_world_model_task(wm_path, data, tasks, who: str) -> None:
    """Refuse to imagine a task the world model's data never showed (`tasks`: task names such as push-red; empty:
    unknown, nothing to check). One line with both sets of names."""
    from wmrl.datasets import LeRobotV3Dataset

    want = sorted(set(tasks))
    have = sorted({task_from_instruction(t) for t in LeRobotV3Dataset(data).tasks})
    if want and not set(want) & set(have):
        raise ValueError(f"{who} is for task(s) {want}, but the world model {wm_path} was trained on {have} ({data})")


def world_model_data(wm_path: Path) -> Path:
    """The dataset a `wmrl train-wm` run was trained on (from its config.yaml)."""
    cfg = Path(wm_path) / "config.yaml"
    if not cfg.exists():
        raise ValueError(f"{wm_path}: no config.yaml to find the world model's dataset; pass --data")
    return Path(yaml.safe_load(cfg.read_text())["data"])
