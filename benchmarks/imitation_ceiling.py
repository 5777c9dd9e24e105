"""The imitation ceiling on push-red: how well does a policy that *sees the true state* clone the scripted expert?

The pixel VLA stays far below the expert on push-red (`benchmarks/policy.py`: 0-4% on CPU budgets, 23% after 8,000
GPU steps, expert 98%). This separates perception from imitation. The learner is an MLP on the privileged state
(`observation.state` and `observation.environment_state`: arm, cubes, zones; nothing to perceive), trained by MSE on
DART labels (the clean expert's action at every recorded state, `sim.experts.expert_labels`), executed one action at
a time (receding horizon), evaluated in the true simulator on the layouts `policy.py` uses. Variants:

- `reach_small`: reach-red at the small budget: the check that the probe can clone a controller at all;
- `push_small`: push-red at the small budget (256 x 2 units, 4,000 steps of batch 256);
- `push_large`: push-red with 512 x 3 units and 30,000 steps: the same data, fitted;
- `push_large_noisy`: `push_large` on data collected as `policy.py` collects it (noise 0.3, 20% perturbed);
- `push_large_5x_layouts`: `push_large` on 5x the episodes (5x the cube/zone layouts), the same steps;
- `push_large_dagger` (`--options variants=push_large_dagger,push_large_more_steps`): `push_large`, then DAgger
  rounds (the learner's own episodes on new layouts, relabelled by the expert, aggregated, training continued),
  against `push_large_more_steps`, the same total steps on the base data alone;
- `push_large_noisy_trimmed`, `push_large_dagger_trimmed`: those two with every episode cut at the first frame
  whose target cube is out of reach (`_reachable_frames`);
- `push_large_flow`: `push_large` with a flow-matching head (held-out "MSE" is of sampled actions);
  `push_large_flow_dagger`: the same followed by `push_large_dagger`'s rounds;
- `push_5x_state_noise`: `push_large_5x_layouts`, then evaluated again with its object channel perturbed as an
  imperfect perception would perturb it (`StateNoise`: a per-episode offset, the bias of a position estimate, or
  fresh noise each step, its jitter; sigma per coordinate in metres): how precise must a pixel policy's
  perception of the cubes and zones be for this learner to keep its success?
- `push_pixels_estimated`: the same learner behind a perception module, so that it acts from pixels: the
  `estimated-state` policy (`policies/estimated_state`): a `StateEstimator` (the VLA's per-camera `VisionEncoder`s
  and the proprioceptive state) regresses the object channel from the front and wrist images, supervised by the
  simulator's state; the actor is trained on the estimator's outputs for the training frames (so it meets the
  estimator's errors in training), then acts on the true simulator's rendered frames through it. Reported beside
  the same learner on the true state, same data, same run. `push_pixels_estimated_long` (15,000 estimator steps of
  batch 128, for a lent GPU), `_2x_layouts` (the same on twice the episodes) and `_short` (1,000 estimator steps,
  5,000 actor steps: an RL start and a weak member of a ranking population) are its budget variants; with
  `--options device=cuda train_only=true policies=DIR` they train on a lent device and are measured here from DIR.
  `_unmasked` (`push_pixels_estimated_short_unmasked`, `push_pixels_estimated_short_noisy_unmasked`): the estimator
  as it was before 2026-12-05, fitting and scaled by the position of a cube that has fallen off the table (the
  ablation of `mask_off_table`; every other variant masks it); `_noisy`: on data where cubes fall (noise 0.3, 20%
  perturbed, 400 episodes). `push_pixels_estimated_short_mirror`: the short one with half of each estimator batch
  reflected through the cell's plane of symmetry y = 0 (images flipped left-right, y coordinates and the base's yaw
  negated: `sim.tabletop.env.MIRROR_*`): a second layout for every recorded frame, with absolute positions kept;
  `_mirror_actor`: the actor also learns every frame's reflection (the expert is symmetric: its label of a reflected
  scene is the reflected label: exactly, on 3,000 frames of clean push episodes). `_600`, `_600_mirror_actor`: the
  plain and the reflected short recipe on 600 episodes.

Per variant: success with a 95% Wilson interval and per evaluation seed, the share of stalled episodes, the label
MSE on the training frames and on held-out frames (30 other layouts, clean expert with the same noise), frames, and
the collection's make-up: the share of frames that come from failed episodes and the share of failed episodes that
ended with the target cube out of reach (off the table or outside the arm's workspace: no action can succeed
from there, yet every later frame is a training frame). The clean expert on the same layouts is the ceiling.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from wmrl.benchutil import device_name, finish, portable, success_in_task

VARIANTS = {
    "reach_small": dict(task="reach-red", hidden=256, layers=2, steps=4000, noise=0.1, perturbed=0.0),
    "push_small": dict(task="push-red", hidden=256, layers=2, steps=4000, noise=0.1, perturbed=0.0),
    "push_large": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.1, perturbed=0.0),
    "push_large_noisy": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.3, perturbed=0.2),
    "push_large_5x_layouts": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.1, perturbed=0.0,
                                  layouts=5),
    # DAgger on top of push_large, and the same number of extra steps without it (longer training is not DAgger)
    "push_large_dagger": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.1, perturbed=0.0,
                              dagger_rounds=3, dagger_episodes=200, dagger_steps=10_000),
    "push_large_more_steps": dict(task="push-red", hidden=512, layers=3, steps=60_000, noise=0.1, perturbed=0.0),
    # the same two with every episode cut where its target cube left reach (`_reachable_frames`)
    "push_large_noisy_trimmed": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.3, perturbed=0.2,
                                     trim=True),
    "push_large_dagger_trimmed": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.1, perturbed=0.0,
                                      dagger_rounds=3, dagger_episodes=200, dagger_steps=10_000, trim=True),
    # push_large with a flow-matching head instead of the regressor
    "push_large_flow": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.1, perturbed=0.0, head="flow"),
    # and DAgger on top of it: does a head that keeps the expert's phases apart profit from the learner's states?
    "push_large_flow_dagger": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.1, perturbed=0.0,
                                   head="flow", dagger_rounds=3, dagger_episodes=200, dagger_steps=10_000),
    "push_5x_state_noise": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.1, perturbed=0.0,
                                layouts=5, state_noise=(0.0025, 0.005, 0.01, 0.02)),
    # from pixels: estimator (front + wrist) -> learner, on 2.5x the layouts (what a 2-core CPU renders in minutes)
    "push_pixels_estimated": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.1, perturbed=0.0,
                                  layouts=2.5, cameras=("front", "wrist"), estimator_steps=6000),
    # the same with 5x the estimator's samples (a lent GPU's budget), and a short one (an RL start, a weaker
    # member of a ranking population)
    "push_pixels_estimated_long": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.1, perturbed=0.0,
                                       layouts=2.5, cameras=("front", "wrist"), estimator_steps=15_000,
                                       estimator_batch=128),
    # the long one on 2x the layouts: its estimator overfits 1,000 episodes (training loss 0.0002 in standard units
    # while the held-out cube error stays at 1.2 cm)
    "push_pixels_estimated_2x_layouts": dict(task="push-red", hidden=512, layers=3, steps=30_000, noise=0.1,
                                             perturbed=0.0, layouts=5, cameras=("front", "wrist"),
                                             estimator_steps=15_000, estimator_batch=128),
    "push_pixels_estimated_short": dict(task="push-red", hidden=512, layers=3, steps=5000, noise=0.1, perturbed=0.0,
                                        layouts=2.5, cameras=("front", "wrist"), estimator_steps=1000),
    # the estimator before 2026-12-05: it regressed (and was scaled by) a cube that fell off the table
    "push_pixels_estimated_short_unmasked": dict(task="push-red", hidden=512, layers=3, steps=5000, noise=0.1,
                                                 perturbed=0.0, layouts=2.5, cameras=("front", "wrist"),
                                                 estimator_steps=1000, mask_off_table=False),
    # the short one with half of the estimator's batches reflected through the cell's plane of symmetry
    "push_pixels_estimated_short_mirror": dict(task="push-red", hidden=512, layers=3, steps=5000, noise=0.1,
                                               perturbed=0.0, layouts=2.5, cameras=("front", "wrist"),
                                               estimator_steps=1000, mirror=0.5),
    # and the actor on every frame's reflection too
    "push_pixels_estimated_short_mirror_actor": dict(task="push-red", hidden=512, layers=3, steps=5000, noise=0.1,
                                                     perturbed=0.0, layouts=2.5, cameras=("front", "wrist"),
                                                     estimator_steps=1000, mirror=0.5, mirror_actor=True),
    # both on 600 episodes (1.5x the layouts): what a demo could collect beside its world model's data
    "push_pixels_estimated_short_600": dict(task="push-red", hidden=512, layers=3, steps=5000, noise=0.1,
                                            perturbed=0.0, layouts=1.5, cameras=("front", "wrist"), estimator_steps=1000),
    "push_pixels_estimated_short_600_mirror_actor": dict(task="push-red", hidden=512, layers=3, steps=5000, noise=0.1,
                                                         perturbed=0.0, layouts=1.5, cameras=("front", "wrist"),
                                                         estimator_steps=1000, mirror=0.5, mirror_actor=True),
    # the same on data where cubes do fall (policy.py's collection: noise 0.3, 20% perturbed; the demo's is alike)
    "push_pixels_estimated_short_noisy": dict(task="push-red", hidden=512, layers=3, steps=5000, noise=0.3,
                                              perturbed=0.2, cameras=("front", "wrist"), estimator_steps=1000),
    "push_pixels_estimated_short_noisy_unmasked": dict(task="push-red", hidden=512, layers=3, steps=5000, noise=0.3,
                                                       perturbed=0.2, cameras=("front", "wrist"), estimator_steps=1000,
                                                       mask_off_table=False),
}
DEFAULT = ("reach_small", "push_small", "push_large", "push_large_noisy", "push_large_5x_layouts")


class PrivilegedStatePolicy(torch.nn.Module):
    """`Policy` on [observation.state, observation.environment_state, the instruction's words] (`state_features`)
    with one of two heads:
    `mse`: a `DeterministicActor` (tanh MLP) regressing the label, i.e. the mean action of look-alike states;
    `flow`: pi0's flow matching (x_t = t noise + (1 - t) a, regress u = noise - a, Euler from t = 1 to 0 in
    `flow_steps`), which can keep the expert's modes apart where a regressor averages them.
    The actor's input statistics (set from the training data) standardise the state for both heads."""

    chunk_size = 1

    def __init__(self, obs_dim: int, hidden: int, layers: int, head: str = "mse", flow_steps: int = 10,
                 vocab: list[str] = ()):
        super().__init__()
        self.vocab = list(vocab)
        from policies.state.networks import DeterministicActor

        if head not in ("mse", "flow"):
            raise ValueError(f"head: expected 'mse' or 'flow', got {head!r}")
        self.head, self.flow_steps = head, flow_steps
        self.actor = DeterministicActor(obs_dim, 4, hidden=hidden, layers=layers)
        if head == "flow":
            dims = [obs_dim + 4 + 1] + [hidden] * layers
            mods: list[torch.nn.Module] = []
            for a, b in zip(dims[:-1], dims[1:]):
                mods += [torch.nn.Linear(a, b), torch.nn.ReLU()]
            self.velocity = torch.nn.Sequential(*mods, torch.nn.Linear(hidden, 4))

    def _v(self, x: torch.Tensor, a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        s = (x - self.actor.obs_mean) / self.actor.obs_std
        return self.velocity(torch.cat([s, a, t], -1))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.head == "mse":
            return ((self.actor.mu(x) - y) ** 2).mean()
        noise, t = torch.randn_like(y), torch.rand(len(y), 1)
        return ((self._v(x, t * noise + (1 - t) * y, t) - (noise - y)) ** 2).mean()

    def act(self, x: torch.Tensor) -> torch.Tensor:
        if self.head == "mse":
            return self.actor.mu(x)
        a = torch.randn(len(x), 4)
        for i in range(self.flow_steps):  # dx/dt = v from t = 1 (noise) to t = 0 (action)
            a = a - self._v(x, a, torch.full((len(x), 1), 1 - i / self.flow_steps)) / self.flow_steps
        return a.clamp(-1, 1)

    def reset(self) -> None:
        pass

    @torch.no_grad()
    def select_action(self, obs: dict) -> np.ndarray:
        return self.act(torch.as_tensor(state_features(obs, self.vocab))).numpy()


def state_features(obs: dict, vocab: list[str]) -> np.ndarray:
    """The learner's input: [observation.state, observation.environment_state, the instruction's words over `vocab`]
    (the words say which zone a push goes to: the object channel lists both zones in a fixed order). Cube positions
    are clipped to the table's box, as the estimated-state actor reads them (since 2026-12-06): a cube that fell off
    the table reads at its edge instead of metres below, where it set the input's standardisation."""
    from wmrl.core.arm import N_CUBES, clip_to_table
    from wmrl.core.features import OBS_ENV_STATE, OBS_STATE, TASK
    from wmrl.core.text import word_presence

    s, e = np.asarray(obs[OBS_STATE], np.float32), np.asarray(obs[OBS_ENV_STATE], np.float32)
    if e.shape[-1] >= 3 * N_CUBES:  # the tabletop's channel (a shorter one: the learner's own checks on synthetic inputs)
        e = clip_to_table(e)
    s, e = s.reshape(-1, s.shape[-1]), e.reshape(-1, e.shape[-1])
    parts = [s, e] + ([word_presence(obs[TASK], vocab).reshape(len(s), -1)] if vocab else [])
    return np.concatenate(parts, 1)


def task_vocab(task: str) -> list[str]:
    """Every word of the task's instructions (one per zone)."""
    from sim.tabletop.tasks import parse_task, instruction
    from sim.tabletop.twin import ZONE_COLOURS
    from wmrl.core.text import words

    return sorted({w for z in ZONE_COLOURS for w in words(instruction(parse_task(task), z))})


class StateNoise:
    """A policy acting on a perturbed `observation.environment_state` (cube and zone positions): Gaussian noise of
    `sigma` metres per coordinate, drawn once per episode (`per_episode`: the bias of a position estimate) or anew
    every step (its jitter). Stands for a perception module with that error in front of the privileged learner."""

    def __init__(self, policy, sigma: float, per_episode: bool, seed: int = 0):
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"sigma must be a finite number >= 0, got {sigma}")
        self.policy, self.sigma, self.per_episode = policy, sigma, per_episode
        self.rng = np.random.default_rng(seed)
        self.offset: np.ndarray | None = None

    def reset(self) -> None:
        self.offset = None
        self.policy.reset()

    def select_action(self, obs: dict) -> np.ndarray:
        from wmrl.core.features import OBS_ENV_STATE

        e = np.asarray(obs[OBS_ENV_STATE], np.float32)
        if self.offset is None or not self.per_episode or self.offset.shape != e.shape:
            self.offset = self.rng.normal(0.0, self.sigma, e.shape).astype(np.float32)
        return self.policy.select_action({**obs, OBS_ENV_STATE: e + self.offset})


def _reachable_frames(ep: dict, task: str) -> int:
    """Frames of an episode before its target cube is first out of reach: below the table top (pushed off) or
    outside the box the arm's end-effector is limited to. No action succeeds from there on, yet the expert still
    labels those frames (a chase of a cube the hand cannot get behind)."""
    from sim.tabletop.model import WORKSPACE_HIGH, WORKSPACE_LOW
    from wmrl.core.features import OBS_ENV_STATE

    i = 3 * ["red", "green", "blue"].index(task.split("-")[1])
    c = np.asarray(ep[OBS_ENV_STATE])[:, i : i + 3]
    out = (c[:, 2] < 0) | np.any(c[:, :2] < np.asarray(WORKSPACE_LOW)[:2], 1) | np.any(c[:, :2] > np.asarray(WORKSPACE_HIGH)[:2], 1)
    return int(np.argmax(out)) if out.any() else len(c)


def _features_and_labels(episodes: list[dict], task: str, trim: bool) -> tuple[list, list]:
    """Per episode: the learner's inputs and the clean expert's labels (DART), cut where the target cube left reach
    when `trim`."""
    from sim.experts import expert_labels
    from wmrl.core.features import ACTION

    X, Y, vocab = [], [], task_vocab(task)
    for ep in episodes:
        n = _reachable_frames(ep, task) if trim else len(ep[ACTION])
        X.append(state_features(ep, vocab)[:n])  # one action per recorded observation
        Y.append(expert_labels(ep)[ACTION][:n])
    return X, Y


def _collect(task: str, episodes: int, noise: float, perturbed: float, seed: int, trim: bool = False,
             cameras: tuple[str, ...] = (), num_envs: int = 1) -> tuple[np.ndarray, np.ndarray, dict, dict | None]:
    """Features and DART labels of `episodes` noisy-expert episodes, the collection's make-up (before trimming),
    and with `cameras` the frames a perception module learns from (images per camera, state, object channel;
    untrimmed). `num_envs` > 1: parallel simulator processes (other noise draws than one env: other data)."""
    import sim
    from sim.experts import ScriptedExpert
    from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE, TASK, image_key
    from wmrl.eval import evaluate

    if cameras and trim:
        raise ValueError("trimming is for the state learner's data; the perception frames are kept whole")
    env = (sim.make_vector_env(task, num_envs, cameras=tuple(cameras)) if num_envs > 1
           else sim.make_env(task, cameras=tuple(cameras)))
    try:
        r = evaluate(ScriptedExpert(noise=noise, perturb_prob=perturbed, seed=seed), env, episodes, seed=seed,
                     record=True, progress=False)
    finally:
        env.close()
    X, Y = _features_and_labels(r.episodes, task, trim)
    frames = sum(len(ep[ACTION]) for ep in r.episodes)
    failed = [ep for ep, rec in zip(r.episodes, r.per_episode) if not rec["success"]]
    out = sum(_reachable_frames(ep, task) < len(ep[ACTION]) for ep in failed)
    X, Y = np.concatenate(X), np.concatenate(Y).astype(np.float32)
    pixels = None
    if cameras:  # `train_on_frames`' layout: one DART label per recorded frame
        pixels = {"images": {c: np.concatenate([np.asarray(ep[image_key(c)]) for ep in r.episodes]) for c in cameras},
                  TASK: np.concatenate([np.asarray(ep[TASK], dtype=object).reshape(-1) for ep in r.episodes]),
                  **{k: np.concatenate([np.asarray(ep[k], np.float32) for ep in r.episodes]) for k in (OBS_STATE, OBS_ENV_STATE)},
                  ACTION: Y, "has_action": np.ones(len(Y), bool)}
    return X, Y, {"frames": len(X), "frames_recorded": frames, "expert_success": r.pc_success / 100,
                  "failed_frame_share": sum(len(ep[ACTION]) for ep in failed) / frames,
                  "failed_out_of_reach_share": out / len(failed) if failed else 0.0}, pixels


def _train(policy: PrivilegedStatePolicy, X: np.ndarray, Y: np.ndarray, steps: int, batch: int = 256, seed: int = 0,
           normalise: bool = True) -> float:
    """MSE on the labels (or the flow loss), Adam with a cosine schedule; `normalise`: set the input statistics
    from X (not when training continues)."""
    from policies.estimated_state.train import fit

    if normalise:
        policy.actor.obs_mean.copy_(torch.as_tensor(X).mean(0))
        policy.actor.obs_std.copy_(torch.as_tensor(X).std(0) + 1e-3)
    fit(policy.loss, policy.parameters(), X, Y, steps, batch, seed=seed)
    return _mse(policy, X, Y)


@torch.no_grad()
def _mse(policy, X, Y) -> float:
    return float(((policy.act(torch.as_tensor(X)) - torch.as_tensor(Y)) ** 2).mean())


def _dagger(policy, task: str, X: np.ndarray, Y: np.ndarray, rounds: int, episodes: int, steps: int,
            trim: bool = False) -> tuple[float, list]:
    """DAgger (Ross et al., 2011): each round the learner acts on `episodes` new layouts, every state it visits is
    labelled with the clean expert's action (up to where the cube left reach when `trim`), the data is aggregated
    and training continues for `steps`."""
    import sim
    from wmrl.eval import evaluate

    env = sim.make_env(task, cameras=())
    log = []
    try:
        for r in range(rounds):
            res = evaluate(policy, env, episodes, seed=50_000 + 10_000 * r, record=True, progress=False)
            Xn, Yn = _features_and_labels(res.episodes, task, trim)
            X, Y = np.concatenate([X] + Xn), np.concatenate([Y] + Yn).astype(np.float32)
            mse = _train(policy, X, Y, steps, seed=r + 1, normalise=False)
            log.append({"round": r + 1, "learner_success": res.pc_success / 100, "frames": len(X), "train_mse": mse})
    finally:
        env.close()
    return mse, log


def _learner(v: dict, obs_dim: int) -> PrivilegedStatePolicy:
    """The variant's untrained learner (size, head, the task's instruction words)."""
    return PrivilegedStatePolicy(obs_dim, v["hidden"], v["layers"], v.get("head", "mse"), vocab=task_vocab(v["task"])).eval()


def _state_learner(v: dict, X, Y, Xv, Yv, episodes: int, quick: bool) -> dict:
    """The variant's learner on the simulator's own state: the reference a perception module is measured against."""
    policy = _learner(v, X.shape[1])
    train_mse = _train(policy, X, Y, 4 if quick else v["steps"])
    return {**success_in_task(policy, v["task"], episodes), "train_mse": train_mse, "heldout_mse": _mse(policy, Xv, Yv)}


def _pixel_learner(v: dict, pixels: dict, held: dict, Yv, episodes: int, quick: bool, device: str = "cpu",
                   folder: Path | None = None, train_only: bool = False) -> dict:
    """The `estimated-state` policy (`policies/estimated_state`): the estimator fitted on the collection's frames,
    the actor on its estimates (`train_on_frames`, on `device`), evaluated on this machine's CPU from the true
    simulator's rendered frames. `folder`: where the trained policy is kept (with its training record); one already
    there is loaded instead of trained (trained on a lent device, measured here)."""
    from policies.estimated_state import EstimatedStatePolicy
    from policies.estimated_state.train import train_on_frames
    from wmrl.core.arm import cubes_on_table
    from wmrl.core.features import OBS_ENV_STATE, OBS_STATE, TASK

    if folder is not None and (folder / "model.safetensors").exists() and not (folder / "record.json").exists():
        raise FileNotFoundError(f"{folder} holds a policy without this benchmark's record.json: not overwritten; "
                                "name another `policies` folder")
    if folder is not None and (folder / "record.json").exists():
        policy, record = EstimatedStatePolicy.load(folder), json.loads((folder / "record.json").read_text())
    else:
        policy, record = train_on_frames(pixels, held, sorted(set(pixels[TASK].tolist())),
                                         4 if quick else v["estimator_steps"], 4 if quick else v["steps"],
                                         hidden=v["hidden"], layers=v["layers"], device=device, progress=not quick,
                                         estimator_batch=v.get("estimator_batch", 64), task_vocab=task_vocab(v["task"]),
                                         log_every=2 if quick else 500, mask_off_table=v.get("mask_off_table", True),
                                         mirror=v.get("mirror", 0.0), mirror_actor=v.get("mirror_actor", False))
        record["device"] = device_name(device)
        if folder is not None:
            policy.save(folder)
            (folder / "record.json").write_text(json.dumps(portable(record), indent=2) + "\n")
    if train_only:
        return {"trained": str(folder), **{k: record[k] for k in ("estimator_minutes", "actor_minutes", "device")}}
    policy = policy.to("cpu").eval()
    held_out = policy.act_from_estimate(held[OBS_STATE], policy.estimator.estimate(held["images"], held[OBS_STATE]),
                                        held[TASK])
    return {**success_in_task(policy, v["task"], episodes, tuple(v["cameras"])), "estimator": record["estimator"],
            "train_mse": record["actor_train_mse"], "heldout_mse": float(((held_out - Yv) ** 2).mean()), "head": "mse",
            "estimator_steps": record["estimator_steps"], "estimator_batch": record["estimator_batch"],
            "trained_on": record["device"], "train_minutes": record["estimator_minutes"] + record["actor_minutes"],
            "estimator_minutes": record["estimator_minutes"], "actor_minutes": record["actor_minutes"],
            "mask_off_table": record.get("mask_off_table", True),  # policies trained before 2026-12-05 did not
            "mirror": record.get("mirror", 0.0), "mirror_actor": record.get("mirror_actor", False),
            # what the mask has to act on: training and held-out frames in which some cube has left the table
            "frames_with_a_fallen_cube": int((~cubes_on_table(pixels[OBS_ENV_STATE])).any(1).sum()),
            "heldout_frames_with_a_fallen_cube": int((~cubes_on_table(held[OBS_ENV_STATE])).any(1).sum())}


def main(quick: bool = False, episodes: int = 150, data_episodes: int = 400, heldout_episodes: int = 30,
         variants: str = "all", device: str = "cpu", policies: str = "", train_only: bool = False,
         num_envs: int = 1) -> dict:
    """`variants`: comma-separated names (default all). For the pixel variants: `device` trains them there;
    `policies` is a folder that keeps each trained pixel policy (`POLICIES/<variant>`) and is read back when run
    again; `train_only` collects and trains them and measures nothing (on a lent device, whose time is short: copy
    the folder back and run the same options without `train_only` to measure here). `num_envs`: collection
    processes (1, the default, gives the committed results' data)."""
    import gymnasium as gym

    from policies.factory import make_policy

    episodes, data_episodes, heldout_episodes = int(episodes), int(data_episodes), int(heldout_episodes)
    names = list(DEFAULT) if variants == "all" else str(variants).split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
    if quick:
        episodes, data_episodes, heldout_episodes = 3, 3, 2
    if train_only and (not policies or any(not VARIANTS[n].get("cameras") for n in names)):
        raise ValueError("train_only trains pixel variants into a `policies` folder: name one, and pixel variants only")
    if not quick:  # quick (the tests): the process's own threads (one per xdist worker; two would oversubscribe)
        torch.set_num_threads(2)
    t0 = time.time()
    results, minutes, data = {}, {}, {}
    for name in names:
        v = VARIANTS[name]
        t = time.time()
        n_data = int(data_episodes * v.get("layouts", 1))
        trim, cameras = v.get("trim", False), v.get("cameras", ())
        key = (v["task"], v["noise"], v["perturbed"], n_data, trim, cameras)
        if key not in data:  # variants on the same data share it
            data[key] = (_collect(v["task"], n_data, v["noise"], v["perturbed"], seed=1000, trim=trim, cameras=cameras,
                                  num_envs=int(num_envs)),
                         _collect(v["task"], heldout_episodes, v["noise"], 0.0, seed=20_000, cameras=cameras,
                                  num_envs=int(num_envs)))
        (X, Y, info, pixels), (Xv, Yv, _, held) = data[key]
        extra = {}
        if cameras:
            folder = Path(policies) / name if policies else None
            pixel = _pixel_learner(v, pixels, held, Yv, episodes, quick, device, folder, train_only)
            if train_only:
                results[name] = pixel
                continue
            extra["true_state"] = _state_learner(v, X, Y, Xv, Yv, episodes, quick)
            results[name] = {**pixel, **extra,
                             **{f"data_{k}": x for k, x in info.items()}, "data_episodes": n_data, "cameras": list(cameras),
                             **{k: v[k] for k in ("hidden", "layers", "steps", "noise", "perturbed")}}
            minutes[name] = (time.time() - t) / 60
            continue
        policy = _learner(v, X.shape[1])
        train_mse = _train(policy, X, Y, 4 if quick else v["steps"])
        if v.get("dagger_rounds"):
            train_mse, extra["dagger"] = _dagger(policy, v["task"], X, Y, v["dagger_rounds"],
                                                 1 if quick else v["dagger_episodes"], 2 if quick else v["dagger_steps"], trim)
            extra["total_steps"] = v["steps"] + v["dagger_rounds"] * v["dagger_steps"]
        for sigma in v.get("state_noise", ()):
            for mode, per_episode in (("offset", True), ("jitter", False)):
                r = success_in_task(StateNoise(policy, sigma, per_episode), v["task"], episodes)
                extra.setdefault("state_noise", []).append({"sigma_m": sigma, "mode": mode, **r})
        results[name] = {**success_in_task(policy, v["task"], episodes), "train_mse": train_mse, **extra,
                         "heldout_mse": _mse(policy, Xv, Yv), **{f"data_{k}": x for k, x in info.items()},
                         "data_episodes": n_data, "trim": trim, "head": policy.head,
                         **{k: v[k] for k in ("hidden", "layers", "steps", "noise", "perturbed")}}
        minutes[name] = (time.time() - t) / 60
    if train_only:
        return {"trained": results, "minutes": (time.time() - t0) / 60}
    for task in sorted({VARIANTS[n]["task"] for n in names}):
        results[f"scripted_expert_{task}"] = success_in_task(make_policy("scripted", gym.spaces.Box(-1, 1, (4,), np.float32)),
                                                       task, episodes)
    minutes["total"] = (time.time() - t0) / 60
    out = {"results": results, "minutes": minutes,
           "budgets": {"episodes": episodes, "data_episodes": data_episodes, "heldout_episodes": heldout_episodes}}
    for name in names:
        out[f"success_{name}"] = results[name]["success"]
    # the default set is the committed result; another set is written beside it, named by its variants
    name = "imitation_ceiling" if names == list(DEFAULT) else "imitation_ceiling-" + "-".join(names)
    options = ("" if names == list(DEFAULT) else f" variants={','.join(names)}") + (
        f" episodes={episodes}" if episodes != 150 and not quick else "") + (f" policies={policies}" if policies else "") + (
        f" num_envs={num_envs}" if int(num_envs) != 1 else "")
    if episodes != 150 and not quick:
        name += f"-ep{episodes}"
    if int(num_envs) != 1:  # other collection processes draw other data: another file
        name += f"-envs{int(num_envs)}"
    return finish(name, out, quick, command="wmrl bench imitation-ceiling --json" + (" --quick" if quick else "")
                  + (f" --options{options}" if options else ""))
