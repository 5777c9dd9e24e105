"""DAgger for the state channel: true data from the states the model's own rollouts visit.

Ross & Bagnell (2012), "Agnostic system identification for model-based reinforcement learning": a model trained only
on the data's state distribution is queried, inside rollouts, on the states *it* leads a policy to; collect the true
transitions there and train on the union. Here, each round:

1. the round's actor acts closed-loop in imagination (the state channel, one ensemble member followed per episode)
   from `starts` true-simulator layouts, and every `every`-th step's predicted scene is kept;
2. the true simulator is put in up to `per_round` of those scenes (`TabletopEnv.place`: the hand by inverse
   kinematics, the cubes' centres, at rest) and the same actor's true continuation of `length` steps is recorded;
   a continuation whose first step throws a cube more than `REFUSE_JUMP` (a placed cube intersecting the hand or
   another cube, resolved violently by the contact solver) or off the table is refused and counted;
3. the channel trains `steps` more steps on the recorded episodes plus every round's continuations.

Why: the recorded pushes mostly go straight to the zone. In imagination a push that drifts a little sends the expert
round the cube, through states the data rarely holds (the hand sweeping low over a cube), where the channel's guesses
drag cubes along; the expert succeeded in about 45% of imagined episodes against 92% in the simulator (README,
world-model section), and neither a 10x larger dataset of the same kind nor velocity or cube-yaw inputs changed that.

The actor of round r is `actors[r % len(actors)]`: `expert` (the scripted expert, action noise `noise`) or a learned
policy that acts on state (an estimated-state checkpoint without cameras), sampling its actions as RL's rollouts do.
The expert's rounds cover the states imagination drifts into when the task is done well; a policy's rounds cover the
states that policy, and RL started from it, will visit (Ross & Bagnell's exploration and policy distributions).

The continuations need a simulator that can be put in a given state: the tabletop suite's (a digital twin plays this
part for a real cell); other suites are refused with one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import sim
from sim import success_and_reward
from sim.experts import ScriptedExpert
from wmrl.core.arm import OFF_TABLE_Z
from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE, TASK
from wmrl.core.io import atomic_path

REFUSE_JUMP = 0.03  # m: a cube moving further than this in a continuation's first step was placed intersecting
EXPERT = "expert"  # the scripted expert as a round's actor


@dataclass
class StateDaggerConfig:
    rounds: int = 0
    starts: int = 150  # true layouts the expert is imagined from, per round
    every: int = 3  # every k-th imagined step's scene is a candidate
    per_round: int = 1500  # true continuations per round, drawn among the candidates
    length: int = 12  # control steps of each continuation (the channel's unroll length)
    steps: int = 1500  # channel training steps per round, on the union
    noise: float = 0.1  # the expert's action noise, in imagination and in the simulator
    actors: tuple[str, ...] = (EXPERT,)  # round r's actor: actors[r % len(actors)] (`expert` or a policy folder)

    def validate(self) -> None:
        for k in ("rounds", "starts", "every", "per_round", "length", "steps"):
            if getattr(self, k) < (0 if k == "rounds" else 1):
                raise ValueError(f"state DAgger: {k} must be >= {0 if k == 'rounds' else 1}, got {getattr(self, k)}")
        if not self.noise >= 0:
            raise ValueError(f"state DAgger: noise must be >= 0, got {self.noise}")
        if not self.actors:
            raise ValueError(f"state DAgger: actors must name at least one actor ({EXPERT!r} or a policy folder)")
        for a in self.actors:  # loaded once here so a wrong path fails before any training, not at round r
            if a != EXPERT:
                dagger_actor(a, seed=0, noise=self.noise)

    def actor(self, round_index: int) -> str:
        return self.actors[round_index % len(self.actors)]


def dagger_actor(name: str, seed: int, noise: float):
    """The policy a round imagines and continues with: the scripted expert (`expert`, action noise `noise`) or an
    estimated-state policy without cameras (it acts on the object channel, which both imagination and the simulator
    give), sampling its actions (seeded) as RL's rollouts do."""
    if name == EXPERT:
        return ScriptedExpert(noise=noise, seed=seed)
    from policies.estimated_state import EstimatedStatePolicy
    from wmrl.core.checkpoint import resolve_checkpoint

    try:
        policy = EstimatedStatePolicy.load(resolve_checkpoint(name))
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"state DAgger actor {name!r}: expected {EXPERT!r} or an estimated-state policy folder ({e})") from e
    if policy.cfg.cameras:
        raise ValueError(f"state DAgger actor {name!r} reads cameras {list(policy.cfg.cameras)}; the rounds imagine "
                         "no pixels and continue in a simulator without cameras: use a policy that acts on the object channel")
    policy.stochastic = True
    policy.generator = torch.Generator().manual_seed(seed)
    return policy


def check_placeable(task: str) -> None:
    env = sim.make_env(task, cameras=()).unwrapped
    try:
        if not hasattr(env, "place"):
            raise ValueError(f"state DAgger needs a simulator that can be put in a given state; {task}'s "
                             f"{type(env).__name__} cannot (the tabletop suite's can): pass --state-dagger-rounds 0")
    finally:
        env.close()


def imagined_closed_loop(model, replay, task: str, seeds: list[int], noise: float, seed: int, readout: str = "member",
                         frames: bool = True, actor: str = EXPERT) -> tuple[list[list[tuple]], np.ndarray]:
    """The expert (or `actor`, `dagger_actor`) closed-loop in imagination from the true layouts `seeds`. Returns, per
    episode, its scenes [(observation.state, observation.environment_state)] at every step while it ran, and whether
    it succeeded. `readout`: the state channel's ensemble `mean` or one `member` per episode; `frames=False` skips
    generating the chunk's latents (the actor reads state only; the states stay the same)."""
    from world_models.env import WorldModelEnv  # here: world_models.env imports the training module, which imports this one

    env = sim.make_env(task, image_size=model.cfg.image_size).unwrapped  # the model's context needs the start frames
    try:
        starts = [env.reset(seed=s)[0] for s in seeds]
        horizon = int(env.max_episode_steps)
    finally:
        env.close()
    batch = {k: np.stack([o[k] for o in starts]) for k in starts[0] if k != TASK}
    batch[TASK] = [o[TASK] for o in starts]
    n = len(seeds)
    venv = WorldModelEnv(model, replay, num_envs=n, max_episode_steps=horizon, decode_images=False, sampling_steps=1,
                         rules=success_and_reward, state_readout=readout)
    venv.frames = frames
    obs, _ = venv.reset(seed=seed, options={"observations": batch})
    policy = dagger_actor(actor, seed, noise)
    policy.reset()
    alive, success = np.ones(n, bool), np.zeros(n, bool)
    scenes: list[list[tuple]] = [[] for _ in range(n)]
    for _ in range(horizon):
        for i in np.flatnonzero(alive):
            scenes[i].append((obs[OBS_STATE][i].copy(), obs[OBS_ENV_STATE][i].copy()))
        obs, _, term, trunc, info = venv.step(np.asarray(policy.select_action(obs), np.float32))
        success |= alive & info["success"]
        alive &= ~(term | trunc)  # an ended env autoresets to a start from the replay: not one of ours
        if not alive.any():
            break
    return scenes, success


def imagined_visits(model, replay, task: str, seeds: list[int], noise: float, every: int, seed: int,
                    actor: str = EXPERT) -> tuple[list, float]:
    """The expert (or `actor`) closed-loop in imagination (one member per episode) from the true layouts `seeds`.
    Returns every `every`-th step's scenes [(layout seed, observation.state, observation.environment_state)], step by
    step, and the imagined success rate."""
    # the actors read state only (`dagger_actor`), so no latents are generated: the states are the same without them
    scenes, success = imagined_closed_loop(model, replay, task, seeds, noise, seed, frames=False, actor=actor)
    kept = [(seeds[i], *ep[t]) for t in range(0, max(map(len, scenes)), every) for i, ep in enumerate(scenes) if len(ep) > t]
    return kept, float(success.mean())


def true_continuations(task: str, scenes: list, noise: float, length: int, seed: int,
                       actor: str = EXPERT) -> tuple[list[dict], int]:
    """The true simulator put in each scene, then `length` steps of the expert (or `actor`) acting on the true state. Returns
    episodes ({observation.state, observation.environment_state, action}, the last frame's action zero: it leads
    nowhere) and the number refused."""
    env = sim.make_env(task, cameras=()).unwrapped
    policy = dagger_actor(actor, seed, noise)
    episodes, refused = [], 0
    try:
        for layout_seed, state, env_state in scenes:
            env.reset(seed=int(layout_seed))
            obs = env.place(state, env_state)
            policy.reset()
            S, E, A = [obs[OBS_STATE]], [obs[OBS_ENV_STATE]], []
            for _ in range(length):
                a = np.asarray(policy.select_action({OBS_STATE: obs[OBS_STATE][None], OBS_ENV_STATE: obs[OBS_ENV_STATE][None],
                                                     TASK: [obs[TASK]]}), np.float32)[0]
                obs, _, term, trunc, _ = env.step(a)
                A.append(a)
                S.append(obs[OBS_STATE])
                E.append(obs[OBS_ENV_STATE])
                if term or trunc:
                    break
            A.append(np.zeros_like(A[0]))
            ep = {OBS_STATE: np.stack(S).astype(np.float32), OBS_ENV_STATE: np.stack(E).astype(np.float32),
                  ACTION: np.stack(A).astype(np.float32)}
            cubes = ep[OBS_ENV_STATE][:, :9].reshape(len(S), 3, 3)
            if np.linalg.norm(cubes[1] - cubes[0], axis=-1).max() > REFUSE_JUMP or (cubes[..., 2] < OFF_TABLE_Z).any():
                refused += 1
                continue
            episodes.append(ep)
    finally:
        env.close()
    return episodes, refused


def dagger_round(model, replay, tasks: list[str], cfg: StateDaggerConfig, round_index: int, seed: int) -> tuple[list[dict], dict]:
    """One round's new episodes and what it saw: imagined success of the round's actor before the round, scenes kept,
    continuations recorded and refused. Layout seeds are apart from evaluation seeds (70,000+) and per round."""
    training = model.training  # the imagination env puts the model in eval mode; training resumes after the round
    try:
        return _round(model, replay, tasks, cfg, round_index, seed)
    finally:
        model.train(training)


def round_layouts(round_index: int, seed: int, tasks: list[str], starts: int) -> dict[str, list[int]]:
    """The true layouts (reset seeds) that round `round_index` of a run with training seed `seed` imagines the
    expert from, per task (the `starts` shared out over the tasks). The model learns these layouts' dynamics, so a
    ranking must not be scored on them (`wmrl.eval.rank.learned_layouts` reads them from here)."""
    base = 1_000_000 + 10_000 * round_index + 1_000 * (seed % 10)
    out = {}
    for k, task in enumerate(tasks):
        n = starts // len(tasks) + (k < starts % len(tasks))
        if n:
            out[task] = list(range(base + 100 * k, base + 100 * k + n))
    return out


def _round(model, replay, tasks: list[str], cfg: StateDaggerConfig, round_index: int, seed: int) -> tuple[list[dict], dict]:
    rng = np.random.default_rng(seed)
    actor = cfg.actor(round_index)
    episodes, scenes, succ, refused = [], 0, [], 0
    for task, layouts in round_layouts(round_index, seed, tasks, cfg.starts).items():
        n = len(layouts)
        kept, s = imagined_visits(model, replay, task, layouts, cfg.noise, cfg.every, seed, actor=actor)
        succ.append(s)
        scenes += len(kept)
        m = min(len(kept), max(1, cfg.per_round * n // cfg.starts))
        pick = [kept[i] for i in rng.choice(len(kept), m, replace=False)]
        eps, r = true_continuations(task, pick, cfg.noise, cfg.length, seed, actor=actor)
        episodes, refused = episodes + eps, refused + r
    info = {"dagger_round": round_index, "dagger_actor": actor, "dagger_imagined_success": float(np.mean(succ)), "dagger_scenes": scenes,
            "dagger_episodes": len(episodes), "dagger_refused": refused}
    return episodes, info


KEYS = (OBS_STATE, OBS_ENV_STATE, ACTION)


def save_episodes(path: Path, episodes: list[dict]) -> None:
    """A round's episodes as one .npz (arrays and lengths; no pickles), written atomically."""
    lens = np.array([len(e[ACTION]) for e in episodes], np.int64)
    arrays = {k: np.concatenate([e[k] for e in episodes]) if episodes else np.zeros((0,), np.float32) for k in KEYS}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, lengths=lens, **arrays)


def load_episodes(path: Path) -> list[dict]:
    with np.load(path, allow_pickle=False) as z:
        lens, arrays = z["lengths"], {k: z[k] for k in KEYS}
    cut = np.cumsum(lens)[:-1]
    return [dict(zip(KEYS, parts)) for parts in zip(*(np.split(arrays[k], cut) for k in KEYS))] if len(lens) else []
