"""The tabletop arm's description, readable by both the simulator and the deployment side: its geometry, joint and
workspace limits, the end-effector delta control step and closed-form kinematics.
The arm: base yaw, shoulder pitch, elbow pitch, wrist pitch (4 hinges) and a parallel gripper (2 slide fingers).
With the three pitch joints summing to zero the hand points straight down, which gives a closed-form inverse
kinematics for end-effector position control (no iterative solver in the control loop).
"""

from __future__ import annotations

import math

import numpy as np

BASE_HEIGHT = 0.1  # yaw joint height
SHOULDER_Z = 0.15  # shoulder joint height above the table
L1 = 0.32  # shoulder -> elbow
L2 = 0.32  # elbow -> wrist
HAND_DROP = 0.11  # wrist joint -> end-effector site (centre of the fingers), straight down
FINGER_MAX = 0.045  # each finger's opening travel (m)
TABLE_Z = 0.0
TABLE_LOW = np.array([-0.1, -0.45])  # the table top's xy extent (the MJCF's table box)
TABLE_HIGH = np.array([0.8, 0.45])
N_CUBES = 3  # the tabletop's object channel (`observation.environment_state`): 3 cubes x xyz, then 2 zones x xy
OFF_TABLE_Z = -0.01  # m: a cube centre below this has left the table (nothing stops its fall: metres within seconds)

WORKSPACE_LOW = np.array([0.2, -0.28, 0.015])
WORKSPACE_HIGH = np.array([0.62, 0.28, 0.3])

JOINT_LOW = np.array([-1.6, -1.2, -0.5, -2.8, 0.0])  # 4 arm joints + gripper command in [0, 1]
JOINT_HIGH = np.array([1.6, 1.6, 2.8, 2.8, 1.0])
EE_STEP = 0.05  # m per control step at |action| = 1
HOME_EE = np.array([0.3, 0.0, 0.2])


def inverse_kinematics(ee: np.ndarray) -> np.ndarray:
    """Closed-form IK for an end-effector position with the hand pointing down.

    Returns the 4 arm joint angles (yaw, shoulder, elbow, wrist), elbow-up branch. Unreachable targets are pulled
    onto the reachable sphere, so the result is always a valid configuration.
    """
    x, y, z = float(ee[0]), float(ee[1]), float(ee[2])
    yaw = math.atan2(y, x)
    r = math.hypot(x, y)
    wz = z + HAND_DROP - SHOULDER_Z  # wrist joint height relative to the shoulder
    d = math.hypot(r, wz)
    d = min(max(d, 0.05), L1 + L2 - 1e-4)
    beta = math.atan2(r, wz)  # angle of the shoulder->wrist line from vertical
    alpha = math.acos(np.clip((L1 * L1 + d * d - L2 * L2) / (2 * L1 * d), -1.0, 1.0))
    a1 = beta - alpha  # upper-arm angle from vertical (elbow up)
    er, ez = L1 * math.sin(a1), L1 * math.cos(a1)
    tr, tz = d * math.sin(beta), d * math.cos(beta)
    a2 = math.atan2(tr - er, tz - ez)  # forearm angle from vertical
    shoulder = a1
    elbow = a2 - a1 - math.pi / 2
    wrist = math.pi / 2 - a2
    return np.array([yaw, shoulder, elbow, wrist])


def forward_kinematics(q: np.ndarray) -> np.ndarray:
    """End-effector position for arm joints q (used by tests to check IK, and by the joint-position mode)."""
    yaw, a1 = q[0], q[1]
    a2 = q[2] + a1 + math.pi / 2
    a3 = q[3] + a2 + math.pi / 2
    r = L1 * math.sin(a1) + L2 * math.sin(a2) + HAND_DROP * math.sin(a3)
    z = SHOULDER_Z + L1 * math.cos(a1) + L2 * math.cos(a2) + HAND_DROP * math.cos(a3)
    return np.array([r * math.cos(yaw), r * math.sin(yaw), z])


def step_hand(ee: np.ndarray, delta: np.ndarray, ee_step: float = EE_STEP, low=WORKSPACE_LOW,
              high=WORKSPACE_HIGH) -> np.ndarray:
    """The hand target one end-effector delta (in [-1, 1] units of `ee_step`) away, kept in the workspace (this
    arm's, or the `low`/`high` box of another)."""
    return np.clip(ee + np.clip(delta[:3], -1, 1) * ee_step, low, high)


def cubes_on_table(env_state, n_cubes: int = N_CUBES):
    """(..., n_cubes) bool: which cubes of the tabletop's object channel (`observation.environment_state`: cubes x xyz
    first, then the zones) are still on the table. A cube pushed off the table falls without end, so its position is
    metres away within seconds and no camera sees it: learners mask it rather than regress it. A numpy array or a
    torch tensor in, the same kind out (a training loss builds its mask on the device, without a host copy)."""
    if not hasattr(env_state, "shape"):
        env_state = np.asarray(env_state)
    return env_state[..., 2 : 3 * n_cubes : 3] > OFF_TABLE_Z


def on_table_mask(env_state, n_cubes: int = N_CUBES):
    """Per-value mask of the object channel, the shape and kind (numpy or torch) of `env_state`: False on the three
    coordinates of each cube that has left the table, True elsewhere (the zones never leave it)."""
    if not hasattr(env_state, "shape"):
        env_state = np.asarray(env_state)
    if isinstance(env_state, np.ndarray):
        mask = np.ones(env_state.shape, bool)
    else:
        mask = env_state.new_ones(env_state.shape, dtype=bool)
    mask[..., : 3 * n_cubes] = cubes_on_table(env_state, n_cubes)[..., [j // 3 for j in range(3 * n_cubes)]]
    return mask


def clip_to_table(env_state: np.ndarray, n_cubes: int = N_CUBES) -> np.ndarray:
    """The object channel with cube positions clipped to the table's box (xy to its extent, z to [OFF_TABLE_Z, 0.3]):
    a fallen cube reads as at the table's edge, just below it, instead of metres away (a learner's input stays in
    range and its standardisation is not ruled by a few falling frames)."""
    out = np.array(env_state, np.float32, copy=True)
    cubes = out[..., : 3 * n_cubes].reshape(*out.shape[:-1], n_cubes, 3)
    cubes[..., :2] = np.clip(cubes[..., :2], TABLE_LOW, TABLE_HIGH)
    cubes[..., 2] = np.clip(cubes[..., 2], OFF_TABLE_Z, WORKSPACE_HIGH[2])
    out[..., : 3 * n_cubes] = cubes.reshape(*out.shape[:-1], 3 * n_cubes)
    return out
