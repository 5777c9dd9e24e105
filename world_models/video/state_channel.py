"""The structured state channel of the video world model: an ensemble that predicts how the end-effector, the
gripper and the objects move under the commanded actions, trained with a multi-step unrolled loss.

When a dataset carries object state (`observation.environment_state`: simulator or twin data, a tracked real cell),
success, reward and done are best read from the task's own definitions on predicted state rather than from a
classifier on generated pixels (issue "World model v2"; the same idea as WoVR's and Ctrl-World's proprioceptive
conditioning, pushed to the objects). Per member:

    arm:   [ee, opening, a(, rest)]                  -> delta [ee, opening]   (rest with `arm_rest`)
    cube:  [cube - ee, cube_z, opening, a, d_ee_cmd(, nearest other cube - cube)]  -> delta cube, contact-gate logit
                                                      (shared by all cubes; the last term with `pairs`)
    rest:  [rest, ee, opening, a]                    -> delta rest     (the other proprioception, e.g. joint angles)

The rest head exists so that a policy reading all of `observation.state` sees, inside a rollout, proprioception
from the channel and none read back from generated frames (issue "World model v2", item 1): joint angles from
frame heads on generated latents erred by ~1 std of a policy's input after 16 one-action steps, and an actor that
succeeds 54-58% in the simulator succeeded 2% closed-loop in imagination.

Without `pairs` each cube sees only the hand, so a cube pushed by another cube cannot be predicted from its input.
With `pairs` the cube head also reads the offset to its nearest other cube (one neighbour, shared head). Measured on
push-red it makes the expert's closed loop in imagination worse (two channel seeds; README, state channel), so it
is off by default.

With `hand_frame` the cube head works in the hand's frame: its horizontal inputs (offset to the hand, action,
commanded displacement, nearest other cube) are rotated so the first axis points from the hand to the cube, and its
predicted horizontal displacement is rotated back. The head is then equivariant to rotations about the vertical (a
push reads the same whichever way it points), so every push direction in the data teaches every other; in the world
frame a sideways sweep of the hand behind a cube, rare in the data, was predicted to drag the cube along with the
hand (twice the true lateral motion on the expert's own re-alignment steps), which sent imagined pushes to the
workspace's edge (README, state channel).

With `arm_rest` the arm head also reads the rest of the proprioception (the joint angles). The hand's position does
not fix the arm's configuration, and the position-controlled joints' response to an inverse-kinematics target depends
on where they are, so a head that sees only the hand cannot tell two arms with the same hand apart (the one-step
tracking error of the commanded pose is 0.26 cm median, 1.6 cm at p90 on push-red; README, state channel).

With `arm_target` every head reads the command as the controller executes it: the hand's displacement to its
target clip(ee + ee_step * a, workspace) - ee, in action units, instead of the raw action; and the arm head predicts
the hand's deviation from that target, scaled by the commanded displacement's norm, so a hand commanded nowhere
stays exactly where it is. A hand pinned at the workspace's edge by a policy that pushes on past it is then a hand
commanded nowhere, as the simulator sees it; on the raw action the arm extrapolated there (the demo's failed episodes:
hand at y = -0.28 with |a_y| ~ 1, rare in the data, and the imagined hand drifted 6-7 cm in x and z over 16 steps
while the real one stayed within 2 cm). What it does not fix: targets the arm cannot reach (joint limits inside the
workspace box, e.g. far out and high), where the real hand falls centimetres short of the target and the head has
to learn it from few examples (README, state channel).

The contact gate p = sigmoid(logit) multiplies the cube's change; it is trained to tell whether the cube moves at
all (BCE on |delta| > 0.5 mm), so the head's change is the change given contact. Inside rollouts (`GATES`) the
contact is drawn with probability p (`sample`, the default for new models; below GATE_FLOOR never), or taken
whenever p > 0.5 (`hard`, the first models'), or the change scaled by p (`soft`); untouched cubes stay exactly still
instead of drifting. Where contact is a toss-up (the finger sweeping past a cube while re-aligning), `hard` moves the
cube on every such step and `sample` on the share of steps the data did: with the hand-frame head the noisy
expert's imagined success rose 15-17 points with one member per episode (three channel seeds, 400 layouts; README,
state channel). Members differ by initialisation and minibatches; their spread (`disagreement`, cm) flags
imagined states the data never covered (MOPO's and RAVL's use of ensemble disagreement).

With `velocity` the state also carries each cube's last displacement (one control step, m), and the cube head reads
it (in the hand's frame with `hand_frame`): a cube the finger kicked slides on while the hand re-aligns, and a
position-only head, which cannot see that, credits the slide to whatever the hand is doing (on the recorded data it
moved a re-aligning cube across with the hand twice as far as the simulator did; README, state channel). The
displacement is not a prediction target: a rollout's next one is the difference of its own predicted positions.
Measured on push-red it makes the expert's closed loop in imagination far worse (25-31 points, three seeds: a cube
that once moves keeps reading its own motion back; README, state channel), so it is off by default.

A cube's height is where the channel went wrong in closed loop (README, ranking, session 65): pushes tip the cube
now and then and mostly slide it flat, the Huber loss fits the average (+0.5 cm per push step at a flat cube), and
the gate then freezes a cube left floating once the hand goes. Two remedies, each an option: `height_loss` "l1" fits
the median change (HEIGHT_LOSSES), and rollouts given each cube's resting height keep every cube the hand does not
hold there (`settle`; `WorldModelConfig.state_settle`).

State vector x (D = 4 + 3 * n_cubes + n_rest [+ 3 * n_cubes]): ee xyz (m), gripper opening (m), cube centres (m),
the rest of the proprioception in its own units (radians for joints), then with `velocity` each cube's last
displacement (m). Zones are static and kept aside by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from wmrl.core.arm import OFF_TABLE_Z
from world_models.dynamics.ensemble import EnsembleLinear

MOVE_EPS = 5e-4  # m: a cube whose centre moved less than this in one step counts as untouched (the gate's label)
SCALE = 10.0  # inputs in decimetres keep MLP inputs near unit scale
OUT_SCALE = 100.0  # outputs in centimetres: one unit of loss is 1 cm
REST_SCALE = 100.0  # rest outputs in hundredths (0.01 rad for joints, about 0.3-0.5 cm at the gripper)

# The Huber loss is quadratic below its threshold and linear above, so it fits something between the mean and the
# median of what it cannot tell apart. A cube's change in a push step is heavy-tailed (the simulator's noisy expert:
# 2.38 cm along the push per moving step, median 1.61, p90 5.98: a kicked cube slides on), and at a threshold of 1 cm
# the channel's step from true states moves it 1.33 cm against the simulator's 2.11 (README, session 70). A larger
# threshold fits more of the mean (1.52 at 3 cm, 1.70 at 10), but drags the cube across with the hand more as well,
# and neither the expert's closed loop nor the ranking of pixel policies gained: 1 stays.
CUBE_HUBER_CM = 1.0


@dataclass
class StateChannelConfig:
    n_cubes: int = 3
    action_dim: int = 4
    members: int = 5
    hidden: int = 128
    ee_step: float = 0.05  # m per control step at |action| = 1 (the commanded displacement, an input feature)
    n_rest: int = 0  # proprioception besides ee and opening the channel also predicts (joint angles); 0: none
    pairs: bool = False  # the cube head also reads the offset to the nearest other cube (cube-cube pushes)
    hand_frame: bool = False  # the cube head's horizontal inputs and outputs in the hand->cube frame (see above)
    velocity: bool = False  # x carries each cube's last displacement, and the cube head reads it (see above)
    arm_rest: bool = False  # the arm head also reads the rest (joint angles; needs n_rest > 0; see above)
    # the cube head reads the predicted hand without the cube's loss training the arm through it: in the unrolled
    # loss the arm could otherwise learn to be wrong where that makes the cube right
    detach_hand: bool = False
    # the heads read the command as the controller executes it (clipped to the workspace) and the arm predicts the
    # hand's deviation from that target (see above); needs the workspace
    arm_target: bool = False
    workspace_low: tuple[float, float, float] | None = None
    workspace_high: tuple[float, float, float] | None = None
    # the cubes' height is fitted to the median change (L1) instead of the Huber loss's near-mean (see HEIGHT_LOSSES)
    height_loss: str = "huber"
    # the unrolled loss applies `settle` as rollouts with the rule do (each window's first state as the resting height),
    # so the heads are fitted on the flat cubes they will read in imagination, not on their own floating ones
    settle_unroll: bool = False
    # the Huber threshold (cm) of the cubes' horizontal change in the unrolled loss (CUBE_HUBER_CM: why it matters)
    cube_huber_cm: float = CUBE_HUBER_CM

    def __post_init__(self):
        if not self.cube_huber_cm > 0:
            raise ValueError(f"cube_huber_cm: expected > 0 (cm), got {self.cube_huber_cm}")
        if self.height_loss not in HEIGHT_LOSSES:
            raise ValueError(f"height_loss: expected one of {HEIGHT_LOSSES}, got {self.height_loss!r}")
        if self.arm_rest and not self.n_rest:
            raise ValueError("arm_rest: the arm head reads the rest of the proprioception, but n_rest is 0")
        if self.arm_target and (self.workspace_low is None or self.workspace_high is None):
            raise ValueError("arm_target: the commanded target is clipped to the workspace, but no workspace is given")

    @property
    def n_arm_objects(self) -> int:
        """Entries of x before the rest: [ee, opening, cube centres]."""
        return 4 + 3 * self.n_cubes

    @property
    def dim(self) -> int:
        return self.n_arm_objects + self.n_rest + 3 * self.n_cubes * self.velocity


# How a rollout applies the contact gate p = sigmoid(logit). Training uses "soft": the head's change times p fits the
# mean change, so the head itself learns the change *given* contact. "hard" moves the cube by that whole change
# whenever p > 0.5; "sample" draws the contact with probability p (PETS-style), so over many steps a cube moves
# p times as often as it is touched, as in the data. "shared" draws it the same way, but with one uniform number per
# rollout, cube and step that every member compares with its own p: the members are hypotheses about one world, and
# whether the finger catches the cube this step is that world's chance, not a member's. Under "sample" each member
# draws alone, so where members agree on p = 0.6 their mean cube (the `readout` policies and rules read by default)
# moves 60% of a push while the hand moves all of it, and the finger ends inside the mean cube.
GATES = ("hard", "soft", "sample", "shared")
GATE_FLOOR = 0.05  # "sample", "shared": contacts less likely than this are not drawn (far cubes stay exactly still)

# What a rollout reads of the ensemble (`WorldModelEnv(state_readout=...)`): "mean", the average of members that each
# follow their own prediction; "member", one member per episode (PETS's TS-infinity); "consensus", every step starts
# all members from their mean, so each step is the ensemble's mean prediction from one shared state (members that
# drift apart, e.g. one pushed a cube and another did not, are not averaged into a state none of them is in: the
# finger inside the mean cube).
READOUTS = ("mean", "member", "consensus")

# How the unrolled loss fits the cubes' height. A push tips the cube now and then (on the demo's data its centre rose
# by more than 1 mm on 24% of the steps it moved, and fell back on others) and mostly slides flat; under "huber" (quadratic
# below 1 cm: close to the mean) the head predicts the average, +0.5 cm per push step at a flat cube, a height between
# a flat and a tipped cube that no real cube has, and in imagination pushed cubes float up a centimetre. "l1" fits the
# median change, a cube that slides flat. Horizontal positions, the hand and the rest keep the Huber loss. Measured
# on push-red (three channel seeds, README session 65): l1 floats less, but with `settle` its channels push worse
# than Huber's, so Huber stays the default and `settle` carries the fix.
HEIGHT_LOSSES = ("huber", "l1")

PAIR_RANGE = 0.3  # m: offsets to another cube are clipped here (a cube that fell off the table is metres away)


def huber(r: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Huber's loss of residuals r with a threshold per entry (`F.huber_loss`'s, which takes one): quadratic below
    delta, linear above, so with delta 1 it equals F.huber_loss(..., delta=1.0)."""
    a = r.abs()
    return torch.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def nearest_other(cubes: torch.Tensor) -> torch.Tensor:
    """(..., n, 3) cube centres -> (..., n, 3): each cube's offset to its nearest other cube (clipped to +-PAIR_RANGE;
    zeros when there is no other cube)."""
    n = cubes.shape[-2]
    if n < 2:
        return torch.zeros_like(cubes)
    off = cubes[..., None, :, :] - cubes[..., :, None, :]  # [..., i, j] = cube_j - cube_i
    dist = off.norm(dim=-1) + torch.eye(n, device=cubes.device) * 1e6  # never oneself
    j = dist.argmin(-1)  # (..., n)
    pick = torch.gather(off, -2, j[..., None, None].expand(*j.shape, 1, 3)).squeeze(-2)
    return pick.clamp(-PAIR_RANGE, PAIR_RANGE)


def hand_frame_axes(rel_xy: torch.Tensor) -> torch.Tensor:
    """(..., 2) horizontal offsets hand -> cube -> (..., 2, 2) rows [n, n_perp]: n the unit offset (x when the hand is
    right above the cube), n_perp it turned 90 degrees anticlockwise. `axes @ v` expresses v in the hand's frame,
    `axes.mT @ v` brings it back."""
    norm = rel_xy.norm(dim=-1, keepdim=True)
    default = torch.zeros_like(rel_xy)
    default[..., 0] = 1.0
    n = torch.where(norm > 1e-6, rel_xy / norm.clamp(min=1e-6), default)
    return torch.stack([n, torch.stack([-n[..., 1], n[..., 0]], -1)], -2)


def _rotate_xy(axes: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """v (..., k) with its first two entries turned by axes (..., 2, 2); the rest unchanged."""
    return torch.cat([(axes @ v[..., :2, None])[..., 0], v[..., 2:]], -1)


def clipped_target(ee: torch.Tensor, a: torch.Tensor, ee_step: float, low, high) -> torch.Tensor:
    """The controller's end-effector target (..., 3): clip(ee + ee_step * a[:3], [low, high]), as the simulator
    computes it (`TabletopEnv._ctrl_from_action`) and a robot logs it."""
    lo, hi = (torch.tensor(v, dtype=ee.dtype, device=ee.device) for v in (low, high))
    return torch.minimum(torch.maximum(ee + ee_step * a[..., :3], lo), hi)


def settle(cubes: torch.Tensor, ee: torch.Tensor, opening: torch.Tensor, d_cube: torch.Tensor, rest_z: torch.Tensor,
           radius: float) -> torch.Tensor:
    """The step's predicted change of the cubes `d_cube` (M, N, cubes, 3) with the height of every cube the hand does
    not hold set back to its resting height: cubes (M, N, cubes, 3), hand ee (M, N, 3), gripper opening (M, N, 1)
    (m), rest_z (N, cubes), `radius` a cube's half extent. Held: the hand within `radius` of the cube's centre horizontally and
    within two radii vertically, the fingers stopped by it (opening within 1 cm of the cube's width). A held cube
    keeps the head's change (lifted, carried); a released one is back on the table the next step.

    Why: a cube on a table rests flat unless it is held. The head's height is an average over pushes that mostly
    slide the cube flat and sometimes tip it, and the contact gate keeps an untouched cube exactly where it is, so in
    closed loop imagined cubes float: on the demo's model the red cube stood 0.3 cm above the table at the median
    after 10 steps of a pixel policy's imagined episodes and 0.9 cm at p90; that policy, which reads the cube's
    height, stopped its descent above the cube, and its success on the channel was 0.18 against 0.56 in the
    simulator, 0.68 with every cube put back at its height each step (README, ranking, session 65). What it does not
    model: a tipped cube, which this puts back flat."""
    z = cubes[..., 2]
    width = 2 * radius
    held = (((cubes[..., :2] - ee[:, :, None, :2]).norm(dim=-1) < radius)
            & ((ee[:, :, None, 2] - z).abs() < 2 * radius) & ((opening - width).abs() < 0.01))
    rest_z = rest_z if rest_z.ndim == z.ndim else rest_z[None]
    return torch.cat([d_cube[..., :2], torch.where(held, d_cube[..., 2], rest_z - z)[..., None]], -1)


class _EnsembleMLP(nn.Module):
    def __init__(self, members: int, d_in: int, d_out: int, hidden: int):
        super().__init__()
        self.l1, self.l2 = EnsembleLinear(members, d_in, hidden), EnsembleLinear(members, hidden, hidden)
        self.out = EnsembleLinear(members, hidden, d_out)
        nn.init.zeros_(self.out.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (M, N, d_in) -> (M, N, d_out)
        return self.out(F.silu(self.l2(F.silu(self.l1(x)))))


class StateChannel(nn.Module):
    def __init__(self, cfg: StateChannelConfig):
        super().__init__()
        self.cfg = cfg
        A, M, h = cfg.action_dim, cfg.members, cfg.hidden
        self.arm = _EnsembleMLP(M, 4 + A + cfg.n_rest * cfg.arm_rest, 4, h)
        self.cube = _EnsembleMLP(M, 3 + 1 + 1 + A + 3 + 3 * cfg.pairs + 3 * cfg.velocity, 4, h)
        self.rest = _EnsembleMLP(M, cfg.n_rest + 4 + A, cfg.n_rest, h) if cfg.n_rest else None

    def next(self, x: torch.Tensor, a: torch.Tensor, gate: str = "hard",
             generator: torch.Generator | None = None, rest_z: torch.Tensor | None = None,
             hold_radius: float = 0.02) -> tuple[torch.Tensor, torch.Tensor]:
        """One control step for every member: x (M, N, D), a (N, A) or (M, N, A) -> (x', gate logits (M, N, cubes)).
        `gate` (see GATES): how the contact probability scales the cube's predicted change; `generator`: the
        sampled gate's draws. `rest_z` (N, cubes): each cube's resting height (m); given, every cube the hand does
        not hold is put there (`settle`; `hold_radius`: a cube's half extent); (M, N, cubes) gives each member its own."""
        if gate not in GATES:
            raise ValueError(f"gate: expected one of {GATES}, got {gate!r}")
        M, N, _ = x.shape
        a = a.expand(M, N, -1) if a.ndim == 2 else a
        ee, opening = x[..., :3], x[..., 3:4]
        if self.cfg.arm_target:  # every head reads the displacement the controller will command, in action units
            # (an input: no head's loss trains the arm through the clip, as the rest head reads the arm detached)
            a = torch.cat([self.commanded_step(ee.detach(), a) / self.cfg.ee_step, a[..., 3:]], -1)
        P, R = self.cfg.n_arm_objects, self.cfg.n_arm_objects + self.cfg.n_rest
        arm_in = [ee * SCALE, opening * SCALE, a]
        if self.cfg.arm_rest:  # read, not trained, by the arm's loss (as the rest reads the arm below)
            arm_in.append(x[..., P:R].detach())
        d_arm = self.arm(torch.cat(arm_in, -1)) / OUT_SCALE
        if self.cfg.arm_target:  # the hand's deviation from the commanded target, none when nothing is commanded
            d_hand = self.cfg.ee_step * a[..., :3]
            d_arm = torch.cat([d_hand + d_arm[..., :3] * a[..., :3].norm(dim=-1, keepdim=True), d_arm[..., 3:]], -1)
        cubes = x[..., 4 : self.cfg.n_arm_objects].reshape(M, N, self.cfg.n_cubes, 3)
        d_cmd = (a[..., :3] * self.cfg.ee_step)[:, :, None].expand(-1, -1, self.cfg.n_cubes, -1)
        # with detach_hand the cube's loss does not train the arm through the hand's position (see the config)
        rel = cubes - (ee.detach() if self.cfg.detach_hand else ee)[:, :, None]
        a_cube = a[:, :, None].expand(-1, -1, self.cfg.n_cubes, -1)
        other = nearest_other(cubes) if self.cfg.pairs else None
        vel = x[..., R:].reshape(M, N, self.cfg.n_cubes, 3) if self.cfg.velocity else None
        if self.cfg.hand_frame:
            axes = hand_frame_axes(rel[..., :2])
            rel, a_cube, d_cmd = _rotate_xy(axes, rel), _rotate_xy(axes, a_cube), _rotate_xy(axes, d_cmd)
            other = _rotate_xy(axes, other) if other is not None else None
            vel = _rotate_xy(axes, vel) if vel is not None else None
        feats = [rel * SCALE, cubes[..., 2:] * SCALE, opening[:, :, None].expand(-1, -1, self.cfg.n_cubes, -1) * SCALE,
                 a_cube, d_cmd * SCALE]
        if other is not None:
            feats.append(other * SCALE)
        if vel is not None:
            feats.append(vel * OUT_SCALE)  # in cm: a kicked cube slides up to ~10 cm in a step
        feats = torch.cat(feats, -1)
        out = self.cube(feats.reshape(M, N * self.cfg.n_cubes, -1)).reshape(M, N, self.cfg.n_cubes, 4)
        logit = out[..., 3]
        p = torch.sigmoid(logit)
        if gate == "hard":
            g = (p > 0.5).float()
        elif gate == "soft":
            g = p
        else:  # a contact drawn per step (and member: "sample"); below GATE_FLOOR the cube stays exactly still
            shape = p.shape if gate == "sample" else p.shape[1:]
            u = torch.rand(shape, device=p.device, generator=generator)
            g = ((u < p) & (p > GATE_FLOOR)).float()
        d_cube = out[..., :3]
        if self.cfg.hand_frame:
            d_cube = _rotate_xy(axes.mT, d_cube)
        d_cube = d_cube / OUT_SCALE * g[..., None]
        if rest_z is not None:
            d_cube = settle(cubes, ee, opening, d_cube, rest_z, hold_radius)
        parts = [ee + d_arm[..., :3], opening + d_arm[..., 3:], (cubes + d_cube).flatten(2)]
        if self.rest is not None:
            # the rest reads the arm's pose but does not train it: its loss (larger, in other units) would pull the
            # arm's prediction toward what helps the joints instead of toward the true pose
            rest, arm = x[..., P:R], torch.cat([ee, opening], -1).detach() * SCALE
            parts.append(rest + self.rest(torch.cat([rest, arm, a], -1)) / REST_SCALE)
        if self.cfg.velocity:
            parts.append(d_cube.flatten(2))
        return torch.cat(parts, -1), logit

    def commanded_step(self, ee: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The hand's commanded displacement (..., 3) m: the controller's target minus ee (`arm_target`)."""
        return clipped_target(ee, a, self.cfg.ee_step, self.cfg.workspace_low, self.cfg.workspace_high) - ee

    def unrolled_loss(self, x: torch.Tensor, a: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Multi-step loss on real sequences: x (M, N, L+1, D), a (M, N, L, A), mask (M, N, L) of real steps.
        Each member predicts from its own previous prediction (not the real state), so errors compound in training
        as they will in imagination. Position error in cm (Huber, 1 cm), plus the contact gate's BCE, plus the rest's
        error in hundredths (Huber, 1). Windows in which a cube has fallen off the table are masked."""
        L, P, R = a.shape[2], self.cfg.n_arm_objects, self.cfg.n_arm_objects + self.cfg.n_rest
        height = torch.zeros(P, dtype=torch.bool, device=x.device)
        if self.cfg.height_loss == "l1":  # the cubes' z entries: the median change (HEIGHT_LOSSES)
            height[6:P:3] = True
        delta = torch.ones(P, device=x.device)  # Huber thresholds in cm: the cubes' x and y their own (CUBE_HUBER_CM)
        delta[4:P:3] = delta[5:P:3] = self.cfg.cube_huber_cm
        # a cube pushed off the table falls without end (metres per step): such steps teach nothing about the task
        on_table = (x[..., 4:P].reshape(*x.shape[:3], -1, 3)[..., 2] > OFF_TABLE_Z).all(-1)  # (M, N, L+1)
        mask = mask * on_table[:, :, 1:] * on_table[:, :, :1]
        cur = x[:, :, 0]
        rest_z = x[:, :, 0, 6:P:3] if self.cfg.settle_unroll else None  # (M, N, cubes): where each cube starts
        err, bce, rest = 0.0, 0.0, 0.0
        n = mask.sum().clamp(min=1)
        for t in range(L):
            nxt, logit = self.next(cur, a[:, :, t], gate="soft", rest_z=rest_z)
            m = mask[:, :, t]
            # Huber in cm: quadratic below 1 cm, linear above, so rare violent contacts do not dominate
            pred, real = nxt[..., :P] * OUT_SCALE, x[:, :, t + 1, :P] * OUT_SCALE
            e = torch.where(height, (pred - real).abs(), huber(pred - real, delta))
            err = err + (e.mean(-1) * m).sum()
            if self.rest is not None:
                rest = rest + (F.huber_loss(nxt[..., P:R] * REST_SCALE, x[:, :, t + 1, P:R] * REST_SCALE, reduction="none",
                                            delta=1.0).mean(-1) * m).sum()
            moved = ((x[:, :, t + 1, 4:P] - x[:, :, t, 4:P]).reshape(*logit.shape, 3).norm(dim=-1) > MOVE_EPS).float()
            bce = bce + (F.binary_cross_entropy_with_logits(logit, moved, reduction="none").mean(-1) * m).sum()
            cur = torch.where(m[..., None] > 0, nxt, x[:, :, t + 1])  # past an episode's end: stay on real data
        loss = (err + bce + rest) / n
        info = {"state_huber_cm": (err / n).detach(), "gate_bce": (bce / n).detach()}
        if self.rest is not None:
            info["rest_huber"] = (rest / n).detach()
        return loss, info

    @torch.no_grad()
    def rollout_step(self, x: torch.Tensor, a: torch.Tensor, gate: str = "hard",
                     generator: torch.Generator | None = None, rest_z: torch.Tensor | None = None,
                     hold_radius: float = 0.02) -> torch.Tensor:
        """x (M, B, D), a (B, A) -> x' (M, B, D), contact gates as `gate` says; with `rest_z` (B, cubes) the cubes
        the hand does not hold rest there (`settle`)."""
        return self.next(x, a, gate=gate, generator=generator, rest_z=rest_z, hold_radius=hold_radius)[0]

    @staticmethod
    def consensus(x: torch.Tensor, which: torch.Tensor) -> torch.Tensor:
        """x (M, B, D) with the rollouts `which` (B,) bool put on the members' mean: the `consensus` readout (READOUTS)
        steps every member from that one state, so the ensemble acts as one model whose step is the mean of its
        members' steps (their spread after it is the disagreement), instead of M worlds that drift apart and are
        averaged afterwards."""
        return torch.where(which[None, :, None], x.mean(0, keepdim=True).expand_as(x), x)

    @staticmethod
    def readout(x: torch.Tensor, member: torch.Tensor | None = None) -> torch.Tensor:
        """The state a rollout reports (B, D): the ensemble mean, or with `member` (B,) each rollout's own member
        (PETS's TS-infinity trajectory sampling, Chua et al. 2018): once members disagree about a push, their mean is
        a state none of them is in, and a reactive policy acting on it pushes no member's cube consistently."""
        if member is None:
            return x.mean(0)
        return x[member, torch.arange(x.shape[1], device=x.device)]

    def summary(self, x: torch.Tensor, member: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The reported state (B, D) (`readout`) and disagreement (B,): the largest per-cube std of the members'
        cube centres, in cm."""
        mean = self.readout(x, member)
        cubes = x[..., 4 : self.cfg.n_arm_objects].reshape(*x.shape[:2], -1, 3)
        dis = cubes.std(0, unbiased=False).norm(dim=-1).amax(-1) * 100 if x.shape[0] > 1 else torch.zeros(x.shape[1])
        return mean, dis
