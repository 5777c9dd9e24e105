"""Where the expert's imagined failures go wrong: scenes the true simulator cannot recover from, or scenes it would
finish?

The noisy scripted expert (noise 0.1) acts closed-loop in each model's state channel from `starts` fresh layouts
(state only, the chosen readout), as in `state-channel-closed-loop`. For every imagined *failure*, the imagined scene
at steps 0, 20, 40 and 60 is put in the true simulator (`TabletopEnv.place`: the hand by inverse kinematics, the
cubes' centres, at rest) and the expert runs there for the episode's remaining steps. The share of those true
continuations that succeed is the `recoverable` curve:
- high late in the episode: the channel failed from scenes the simulator finishes from (it does not complete
  pushes: a model problem from there on);
- falling with the step: the channel steered the scene somewhere the simulator cannot finish from in the time left
  either (the failure was made earlier, e.g. a cube pushed the wrong way).
The time left shrinks with the step, so the curve's reference is the true simulator's own: the expert's true
episodes from the same layouts, their scenes at the same steps placed and continued the same way
(`true_recoverable`, over all episodes; those that succeeded have ended, so later steps hold the slower ones).
Step 0 is the check: the placed start scene must give about the expert's true success (the start is at rest).
Each step also says what the finishable and the unfinishable scenes look like: the share with the pushed cube
within 3 cm of the hand's workspace bounds (`edge`: the expert cannot get beyond it to push it back), with the hand
above 6 cm (`high`: re-aligning, not pushing), and with the cube further from its zone than at the start
(`further`).

    wmrl bench state-channel-failure-trace --json --options world_models=RUN[,RUN] [starts=200 readout=mean]
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish

STEPS = (0, 20, 40, 60)


def true_episodes(task: str, seeds: list[int], horizon: int, noise: float = 0.1) -> dict:
    """The expert's true episodes from the same layouts: scenes at every step, the actions taken, the scene the last
    action led to (`final`), success, and each layout's target (the pushed cube's and its zone's x index in
    observation.environment_state)."""
    import sim
    from sim.experts import ScriptedExpert
    from wmrl.core.features import OBS_ENV_STATE, OBS_STATE, TASK

    from sim.tabletop.env import ENV_STATE_NAMES
    from sim.tabletop.tasks import parse_instruction

    env = sim.make_env(task, cameras=()).unwrapped
    policy = ScriptedExpert(noise=noise, seed=0)
    scenes, finals, actions, success, targets = [], [], [], [], []
    try:
        for s in seeds:
            obs, _ = env.reset(seed=s)
            _, cube, zone = parse_instruction(obs[TASK])
            targets.append((ENV_STATE_NAMES.index(f"{cube}_x"), ENV_STATE_NAMES.index(f"zone_{zone}_x")))
            policy.reset()
            sc, acts, ok = [], [], False
            for _ in range(horizon):
                sc.append((obs[OBS_STATE].copy(), obs[OBS_ENV_STATE].copy()))
                a = policy.select_action({OBS_STATE: obs[OBS_STATE][None], OBS_ENV_STATE: obs[OBS_ENV_STATE][None],
                                          TASK: [obs[TASK]]})
                acts.append(np.asarray(a, np.float32)[0])
                obs, _, term, trunc, info = env.step(acts[-1])
                ok |= bool(info["success"])
                if term or trunc:
                    break
            scenes.append(sc)
            finals.append((obs[OBS_STATE].copy(), obs[OBS_ENV_STATE].copy()))
            actions.append(acts)
            success.append(ok)
    finally:
        env.close()
    return {"scenes": scenes, "final": finals, "actions": actions, "success": np.array(success), "targets": targets}


def finishes_from(task: str, scenes: list[tuple], horizon: int) -> list[bool | None]:
    """For each (layout seed, step, observation.state, observation.environment_state): the true simulator put in the
    scene, the expert for the `horizon - step` steps left; whether it succeeds (None: the placement was refused, a
    cube thrown more than 3 cm or off the table in the first step, as state DAgger refuses it)."""
    import sim
    from sim.experts import ScriptedExpert
    from wmrl.core.features import OBS_ENV_STATE, OBS_STATE, TASK
    from wmrl.core.arm import OFF_TABLE_Z
    from world_models.video.state_dagger import REFUSE_JUMP

    env = sim.make_env(task, cameras=()).unwrapped
    policy = ScriptedExpert(noise=0.1, seed=0)
    out: list[bool | None] = []
    try:
        for seed, step, state, env_state in scenes:
            env.reset(seed=int(seed))
            obs = env.place(state, env_state)
            policy.reset()
            ok, first = False, None
            for k in range(horizon - step):
                a = policy.select_action({OBS_STATE: obs[OBS_STATE][None], OBS_ENV_STATE: obs[OBS_ENV_STATE][None],
                                          TASK: [obs[TASK]]})
                before = obs[OBS_ENV_STATE][:9].reshape(3, 3).copy()
                obs, _, term, trunc, info = env.step(np.asarray(a, np.float32)[0])
                if k == 0:
                    cubes = obs[OBS_ENV_STATE][:9].reshape(3, 3)
                    first = np.linalg.norm(cubes - before, axis=-1).max() > REFUSE_JUMP or (cubes[:, 2] < OFF_TABLE_Z).any()
                    if first:
                        break
                ok |= bool(info["success"])
                if term or trunc:
                    break
            out.append(None if first else ok)
    finally:
        env.close()
    return out


EDGE = 0.03  # m: a cube this close to the hand's workspace bounds (xy) cannot be pushed back from beyond it
HIGH = 0.06  # m: a hand above this is not pushing (the expert rises to re-align)


def scene_kind(state: np.ndarray, env_state: np.ndarray, start_env_state: np.ndarray, target: tuple[int, int]) -> dict:
    """What a scene looks like: the pushed cube near the workspace's edge, the hand high, the cube further from its
    zone than at the start."""
    from sim.tabletop.env import STATE_NAMES
    from sim.tabletop.model import WORKSPACE_HIGH, WORKSPACE_LOW

    c, z = target
    cube, zone, hand_z = env_state[c : c + 2], env_state[z : z + 2], state[STATE_NAMES.index("ee_z")]
    edge = bool(((cube - WORKSPACE_LOW[:2]) < EDGE).any() or ((WORKSPACE_HIGH[:2] - cube) < EDGE).any())
    further = np.linalg.norm(cube - zone) > np.linalg.norm(start_env_state[c : c + 2] - zone)
    return {"edge": edge, "high": bool(hand_z > HIGH), "further": bool(further)}


def curve(task: str, seeds: list[int], episodes: list[list], which: np.ndarray, horizon: int, targets: list) -> dict:
    """Per step: scenes, refused, the finishable share, and the kinds of finishable and unfinishable scenes."""
    rows = {}
    for t in STEPS:
        idx = [i for i in np.flatnonzero(which) if len(episodes[i]) > t]
        picked = [(seeds[i], t, *episodes[i][t]) for i in idx]
        outcome = finishes_from(task, picked, horizon)
        ok = [o for o in outcome if o is not None]
        row = {"scenes": len(picked), "refused": len(picked) - len(ok), "recoverable": float(np.mean(ok)) if ok else None}
        for name, want in (("finishable", True), ("unfinishable", False)):
            kinds = [scene_kind(*episodes[i][t], episodes[i][0][1], targets[i]) for i, o in zip(idx, outcome) if o is want]
            row[name] = {"n": len(kinds), **{f"share_{k}": float(np.mean([d[k] for d in kinds])) if kinds else None
                                             for k in ("edge", "high", "further")}}
        rows[str(t)] = row
    return rows


def options(world_models: str, readout: str, starts: int, quick: bool) -> tuple[list[str], list[int]]:
    """The runs named and the layouts (reset seeds) to imagine from, or one line saying which option is wrong."""
    runs = [r for r in world_models.split(",") if r]
    if not runs:
        raise ValueError("options world_models=RUN[,RUN...] is required (runs with a state channel)")
    from world_models.video.state_channel import READOUTS

    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
    n = 4 if quick else int(starts)
    if n < 1:
        raise ValueError(f"starts must be >= 1, got {starts}")
    return runs, list(range(70_000, 70_000 + n))  # the closed-loop benchmark's layouts


def imagine(run: str, seeds: list[int], readout: str, gate: str = "", noise: float = 0.1,
            settle: bool | None = None) -> tuple:
    """A run's model and the expert's closed loop in its state channel (state only) from the layouts `seeds`:
    (model, per-episode scenes, success). `gate`: the contact gate of the rollouts (default: the run's own);
    `settle`: whether rollouts settle the cubes the hand does not hold (`state_settle`; None: the run's own)."""
    from world_models.factory import make_world_model
    from world_models.video.state_dagger import imagined_closed_loop
    from world_models.video.train import load_split, world_model_data

    model = make_world_model("video", run, state_gate=gate or None, state_settle=settle)
    if model.state_channel is None or not model.frames_optional:
        raise ValueError(f"{run} needs a state channel that predicts all of observation.state (state_rest)")
    _, _, held = load_split(world_model_data(run), 0.1)
    return (model, *imagined_closed_loop(model, held, "push-red", seeds, noise, seed=0, readout=readout, frames=False))


def main(quick: bool = False, world_models: str = "", starts: int = 200, readout: str = "mean", name: str = "") -> dict:
    """`readout`: the state channel's ensemble `mean` or one `member` per episode."""
    runs, seeds = options(world_models, readout, starts, quick)
    n, horizon = len(seeds), 80
    t0 = time.time()
    true = true_episodes("push-red", seeds, horizon)
    out: dict = {"task": "push-red", "policy": "scripted expert, noise 0.1", "starts": n, "readout": readout,
                 "steps": list(STEPS), "true_success": float(true["success"].mean()),
                 "true_recoverable": curve("push-red", seeds, true["scenes"], np.ones(n, bool), horizon, true["targets"]),
                 "rows": []}
    for run in runs:
        model, scenes, success = imagine(run, seeds, readout)
        fail = ~success
        out["rows"].append({"world_model": run, "imagined_success": float(success.mean()),
                            "imagined_failures": int(fail.sum()),
                            "failures_true_success": float(true["success"][fail].mean()) if fail.any() else None,
                            "recoverable": curve("push-red", seeds, scenes, fail, horizon, true["targets"])})
    out["minutes"] = (time.time() - t0) / 60
    label = name or "-".join(Path(r).parent.name if Path(r).name == "model" else Path(r).name for r in runs)
    return finish(f"state-channel-failure-trace-{label}" if not quick else "state-channel-failure-trace", out, quick,
                  command=f"wmrl bench state-channel-failure-trace --json --options world_models={world_models} "
                          f"starts={n} readout={readout}" + (f" name={name}" if name else ""))
