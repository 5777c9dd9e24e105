"""RL in imagination: a policy improved inside the video world model, with zero true-simulator steps.

    wmrl imagine --policy BC_RUN --world-model WM_RUN --out RUN [--algo grpo|ppo] [--policy-type vla|estimated-state]

Two kinds of policy learn here. A VLA (Gaussian head) acts on the generated frames. An `estimated-state` policy's
actor acts on the world model's state channel (the predicted object channel, with the perception's measured error
added as noise by the env), while its estimator, which reads the cameras at deployment, is left as trained: RL
improves the control, not the perception, and the frames are not generated into pixels at all.

The loop: each iteration rolls the policy out in a `WorldModelEnv` (`wmrl.rl.rollouts`; groups of G rollouts share
a start, a real first frame or, with probability `keyframe_prob`, a real keyframe: WoVR's KIR), then runs `epochs`
passes of minibatches of whole rollouts with the algorithm's objective: `wmrl.rl.grpo` (WoVR; the default) or
`wmrl.rl.ppo`. The reward is the world model's relative success (the change in success probability); no KL term
by default. One policy decision is one action chunk (H actions), which is also one world-model step.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from policies.estimated_state import EstimatedStatePolicy
from policies.lerobot.common import lerobot_policy_type
from policies.vla import VLAPolicy
import sim
from wmrl.core.checkpoint import (commit_checkpoint, load_train_state, resolve_checkpoint, resume_checkpoint,
                                  save_train_state)
from wmrl.core.features import TASK
from wmrl.datasets import LeRobotV3Dataset
from wmrl.core.report import plot_curves
from wmrl.core.run import Tracker, start_run
from wmrl.eval import evaluate_on_tasks
from wmrl.rl import grpo, ppo
from wmrl.rl.grpo import rollout_mean
from wmrl.rl.ppo import clipped_fraction
from wmrl.rl.rollouts import Rollouts, collect_rollouts, step_logp, take
from world_models.env import make_imagination_env
from world_models.factory import make_world_model
from world_models.video.model import OBJECT_LAYERS
from world_models.video.train import check_world_model_task, world_model_data


ALGOS = {"grpo": grpo, "ppo": ppo}  # each module: prepare(policy, rollouts, cfg) and loss(...)
POLICY_TYPES = ("vla", "estimated-state")


@dataclass
class ImagineConfig:
    policy: Path = Path("runs/policy")
    """A `wmrl train-policy` run (or checkpoint): a VLA with the gaussian head, or an estimated-state policy."""
    policy_type: str = "vla"
    """vla (acts on generated frames) or estimated-state (its actor acts on the state channel's objects)."""
    world_model: Path = Path("runs/wm")
    """A `wmrl train-wm` run (or checkpoint)."""
    data: Optional[Path] = None
    """Real episodes for resets and keyframes; default: the dataset the world model was trained on."""
    out: Path = Path("runs/imagine")
    algo: str = "grpo"
    iterations: int = 30
    groups: int = 4
    """Start states per iteration (GRPO); the batch is groups * group_size imagined rollouts."""
    group_size: int = 8
    max_steps: Optional[int] = None
    """Control steps per imagined episode; default: the task's own episode length (as evaluation and ranking use),
    e.g. 80 for the tabletop's pushes, 150 for Meta-World. Shorter than the demonstrations, no rollout but a
    keyframe-started one can succeed."""
    keyframe_prob: float = 0.3
    """Share of resets that start mid-episode from a real keyframe (KIR)."""
    reward: str = "success"
    """GRPO's rollout reward: success (binary outcome within the horizon), progress (summed relative success), or
    shuffled (a placebo control: outcomes permuted within each group; as many updates, no signal)."""
    success_threshold: float = 0.9
    stop_cm: float = 0.0
    """The hallucination flag: end an imagined episode where the state channel's members disagree on an object's
    position by more than this (cm; 0: off); its success from there on does not count. Logged as flagged_share."""
    state_readout: str = "mean"
    """What imagined episodes report of the state channel's ensemble: mean, member (one member drawn per episode
    and followed to its end, PETS's TS-infinity: each rollout is one consistent world, not the members' average), or
    consensus (the members stepped from their mean state)."""
    state_gate: str = ""
    """How the state channel's rollouts apply the contact gate (hard | soft | sample | shared); default: the model's own."""
    state_settle: Optional[bool] = None
    """Whether objects the hand does not hold rest at their starting height in imagination (`state_channel.settle`);
    default: the model's own (on for models of tabletop data trained since it exists, off for older checkpoints)."""
    object_layer: str = ""
    """How the generated frames a VLA acts on show the objects: blend | reproject (`model.OBJECT_LAYERS`: reproject
    draws every pixel whose ray meets a cube from the start frame, where the state channel carries it); default: the
    model's own. An estimated-state policy's actor reads the state channel, not frames."""
    sampling_steps: int = 1
    """Euler steps of the world model per step (1 is about 2.5x faster than 3 at similar quality)."""
    epochs: int = 2
    minibatch_rollouts: int = 16
    lr: float = 3e-5
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    """Weight of KL(pi || pi_BC) (0: none, as WoVR)."""
    target_kl: Optional[float] = None
    """Stop an iteration's updates once a minibatch's approx-KL to the rollout policy exceeds 1.5x this (the
    early stop of Stable-Baselines3's PPO): one Adam step moves every weight by about lr, which can shift a small
    sigma's log-probability by tens of nats. None: off."""
    residual_hidden: int = 0
    """estimated-state only: RL trains a zero-initialised residual actor of this width on top of the frozen
    behaviour-cloned one (ResiP, Ankile et al., 2024; 0: the whole actor learns)."""
    residual_scale: float = 0.1
    """The residual's output scale in action units."""
    gamma: float = 0.99
    gae_lambda: float = 0.95
    vf_coef: float = 0.5
    eval_episodes: int = 0
    """True-simulator episodes before and after RL (evaluation only; never used for learning)."""
    ckpt_every: int = 5
    seed: int = 0
    device: str = "cpu"
    threads: Optional[int] = None
    overwrite: bool = False
    resume: bool = False


# ---------------------------------------------------------------------------------------------- updates
def _kl_to_ref(policy, ref, ro: Rollouts, ids: np.ndarray) -> torch.Tensor:
    kls = []
    for t, o in enumerate(ro.obs[: len(ro.actions)]):
        ob = take(o, ids)
        kls.append(torch.distributions.kl_divergence(policy.dist(policy.features(ob)), ref.dist(ref.features(ob))).sum((-1, -2)))
    return rollout_mean(torch.stack(kls), ro.valid[:, ids]).mean()


def update(policy, opt, ro: Rollouts, cfg: ImagineConfig, ref=None, seed: int | None = None) -> dict:
    """`epochs` passes over the rollouts in minibatches of whole rollouts, with the objective of `cfg.algo`
    (`wmrl.rl.grpo` or `wmrl.rl.ppo`) and an optional KL to the reference policy."""
    algo = ALGOS[cfg.algo]
    targets, ids_all, info = algo.prepare(policy, ro, cfg)
    if len(ids_all) == 0:
        return {**info, "updates": 0}
    rng = np.random.default_rng(seed)
    stats = {"loss": [], "approx_kl": [], "clip_frac": []}
    stopped, skipped = False, 0
    for _ in range(cfg.epochs):
        perm = rng.permutation(ids_all)
        for i in range(0, len(perm), cfg.minibatch_rollouts):
            ids = perm[i : i + cfg.minibatch_rollouts]
            logp = step_logp(policy, ro, ids)
            old, valid = ro.logp[:, ids], ro.valid[:, ids]
            with torch.no_grad():  # the minibatch's approx-KL to the rollout policy, before this step (Schulman's k3)
                log_ratio = (logp - old)[valid]
                ratio = torch.exp(log_ratio)
                kl = float(((ratio - 1) - log_ratio).mean())
            if cfg.target_kl is not None and not kl <= 1.5 * cfg.target_kl:  # also stops on a non-finite KL
                stopped = True
                break
            loss = algo.loss(policy, ro, ids, logp, targets, cfg)
            if ref is not None and cfg.kl_coef > 0:
                loss = loss + cfg.kl_coef * _kl_to_ref(policy, ref, ro, ids)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            if not (torch.isfinite(loss) and torch.isfinite(norm)):  # one bad minibatch must not poison the weights
                skipped += 1
                continue
            opt.step()
            stats["loss"].append(loss.item())
            stats["approx_kl"].append(kl)
            stats["clip_frac"].append(clipped_fraction(ratio, targets["adv"][:, ids][valid], *algo.clip_range(cfg)).item())
        if stopped:
            break
    return {**info, **{k: float(np.mean(v)) if v else 0.0 for k, v in stats.items()}, "updates": len(stats["loss"]),
            "kl_stopped": stopped, "skipped_nonfinite": skipped}


# ---------------------------------------------------------------------------------------------- the command
def load_rl_policy(kind: str, path: Path, device: str = "cpu"):
    """A policy with an exact action log-probability, set to act in imagination."""
    if kind not in POLICY_TYPES:
        raise ValueError(f"policy_type: expected one of {POLICY_TYPES}, got {kind!r}")
    if kind == "vla":
        policy = VLAPolicy.load(path, device=device)
        if policy.cfg.head != "gaussian":
            raise ValueError(f"RL needs the gaussian head's exact log-probability; {path} has the {policy.cfg.head} head")
        return policy
    policy = EstimatedStatePolicy.load(path, device=device)
    policy.read_object_channel = True  # the actor reads the world model's objects; the estimator is not trained here
    return policy


def in_true_world(policy):
    """The same policy acting as deployed (an estimated-state policy reads its cameras again)."""
    if isinstance(policy, EstimatedStatePolicy):
        policy.read_object_channel = not policy.cfg.cameras
    return policy


def imagined_horizon(data: Path, max_steps: int | None = None) -> int:
    """Control steps per imagined episode: `max_steps`, else the longest own episode length of the dataset's tasks,
    the horizon the policy is evaluated and ranked on (a shorter one leaves slower successes unrewarded)."""
    return max_steps or max(sim.episode_horizon(sim.task_from_instruction(t)) for t in LeRobotV3Dataset(data).tasks)


def imagine(cfg: ImagineConfig, progress: bool = True) -> dict:
    if cfg.algo not in ALGOS:
        raise ValueError(f"algo: expected one of {tuple(ALGOS)}, got {cfg.algo!r}")
    if cfg.policy_type not in POLICY_TYPES:
        raise ValueError(f"policy_type: expected one of {POLICY_TYPES}, got {cfg.policy_type!r}")
    if cfg.reward not in grpo.REWARDS:
        raise ValueError(f"reward: expected one of {grpo.REWARDS}, got {cfg.reward!r}")
    if cfg.target_kl is not None and not cfg.target_kl > 0:
        raise ValueError(f"target_kl must be positive (or unset: no early stop), got {cfg.target_kl}")
    if cfg.object_layer and cfg.object_layer not in OBJECT_LAYERS:
        raise ValueError(f"object_layer: expected one of {OBJECT_LAYERS} (or empty: the model's own), got {cfg.object_layer!r}")
    if cfg.residual_hidden and cfg.policy_type != "estimated-state":
        raise ValueError(f"residual_hidden: a residual actor is built for the estimated-state policy, not {cfg.policy_type!r}")
    if cfg.max_steps is not None and cfg.max_steps <= 0:
        raise ValueError(f"max_steps must be positive (or unset: the task's episode length), got {cfg.max_steps}")
    kind = lerobot_policy_type(cfg.policy)
    if kind is not None:
        raise ValueError(f"{cfg.policy} is a LeRobot {kind} checkpoint: {cfg.algo} needs an exact action "
                         "log-probability, which ACT and Diffusion Policy do not have; evaluate, rank or deploy it "
                         "(--policy.type " + kind + "), or train a VLA here (wmrl train-policy)")
    run = start_run(cfg)
    torch.manual_seed(cfg.seed)
    ck, _ = resume_checkpoint(run / "checkpoints") if cfg.resume else (None, 0)
    resuming = ck is not None
    policy = load_rl_policy(cfg.policy_type, ck if resuming else resolve_checkpoint(cfg.policy), cfg.device)
    if cfg.residual_hidden and not resuming:  # a resumed run's checkpoint carries its residual
        policy.add_residual(cfg.residual_hidden, cfg.residual_scale)
    model = make_world_model("video", str(cfg.world_model), device=cfg.device, state_gate=cfg.state_gate or None,
                             state_settle=cfg.state_settle, object_layer=cfg.object_layer or None)
    data = cfg.data or world_model_data(cfg.world_model)
    check_world_model_task(cfg.world_model, data, policy.cfg.tasks, f"policy {cfg.policy}")
    on_objects = cfg.policy_type == "estimated-state"
    if on_objects and model.state_channel is None:
        raise ValueError(f"an estimated-state policy acts in imagination on the state channel's objects; "
                         f"{cfg.world_model} has no state channel (trained with --no-state-channel or on data without "
                         "observation.environment_state)")
    env = make_imagination_env(model, data, cfg.groups * cfg.group_size, imagined_horizon(data, cfg.max_steps), cfg.keyframe_prob,
                               cfg.success_threshold, cfg.sampling_steps, stop_cm=cfg.stop_cm, decode_images=not on_objects,
                               object_noise=policy.cfg.estimate_noise if on_objects else None,
                               state_readout=cfg.state_readout)
    policy.check_spaces(env.single_observation_space, env.single_action_space)
    if policy.cfg.chunk_size > model.cfg.chunk:
        raise ValueError(f"policy chunk {policy.cfg.chunk_size} exceeds the world model's chunk {model.cfg.chunk}")
    ref = copy.deepcopy(policy).eval() if cfg.kl_coef > 0 else None
    opt = torch.optim.AdamW(policy.parameters(), cfg.lr, weight_decay=0.0)
    start, result = 0, {}
    if resuming:
        start = load_train_state(ck, {"policy": opt}, cfg.device)["step"]
    tracker = Tracker(run)
    tasks = sorted(set(env.starts.vocab[TASK]))
    if cfg.eval_episodes and not resuming:
        result["eval_before"] = evaluate_on_tasks(in_true_world(copy.deepcopy(policy)), tasks, cfg.eval_episodes,
                                                  run / "eval_before", seed=20_000 + cfg.seed, progress=progress)
        tracker.log({"stage": "eval_before", **{f"{t}/{k}": v for t, m in result["eval_before"].items() for k, v in m.items()}})
    true_steps0 = sim.true_steps_taken()
    t0 = time.time()
    G = cfg.group_size if cfg.algo == "grpo" else 1
    for it in tqdm(range(start, cfg.iterations), initial=start, total=cfg.iterations, desc=f"imagine-{cfg.algo}",
                   disable=not progress):
        policy.eval()  # rollouts without augmentation
        ro = collect_rollouts(policy, env, G, seed=cfg.seed * 100_003 + it)
        policy.train()
        info = update(policy, opt, ro, cfg, ref, seed=cfg.seed * 100_003 + it)
        policy.eval()
        rec = {"iteration": it + 1, "imagined_success": float(ro.success.float().mean()),
               "imagined_return": float(ro.returns.mean()), "episode_chunks": float(ro.valid.float().sum(0).mean()),
               "flagged_share": float(ro.flagged.float().mean()),
               "log_std": float(policy.log_std.detach().mean()), "true_env_steps": sim.true_steps_taken() - true_steps0,
               "seconds": time.time() - t0, **info}
        tracker.log(rec, step=it + 1)
        if (it + 1) % cfg.ckpt_every == 0 or it + 1 == cfg.iterations:
            commit_checkpoint(run / "checkpoints", it + 1,
                              lambda d: (policy.save(d), save_train_state(d, it + 1, {"policy": opt})))
    result.update({"run_dir": str(run), "iterations": cfg.iterations, "rl_minutes": (time.time() - t0) / 60,
                   "true_env_steps_during_rl": sim.true_steps_taken() - true_steps0})
    plot_curves(run / "metrics.jsonl", run / "learning_curves.png", ["imagined_success", "imagined_return", "log_std", "approx_kl", "clip_frac"],
                title=f"{cfg.algo} in imagination")
    if cfg.eval_episodes:
        result["eval_after"] = evaluate_on_tasks(in_true_world(copy.deepcopy(policy)), tasks, cfg.eval_episodes,
                                                 run / "eval_after", seed=20_000 + cfg.seed, progress=progress)
    tracker.log({"stage": "done", **{k: v for k, v in result.items() if not isinstance(v, dict)}})
    tracker.close()
    return result
