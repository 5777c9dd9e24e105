"""DAgger with the scripted expert as the labeller (Ross, Gordon & Bagnell, 2011, Alg. 3.1, beta_i = 0 after BC).

Behaviour cloning learns the expert's actions on the expert's states; run on its own, the learner drifts to states
the expert never visited and has no label for them (compounding error, O(T^2 eps)). DAgger closes that gap: each
round runs the *current learner* in the true simulator, asks the expert what it would have done at every state the
learner visited, aggregates those labelled states with everything seen so far, and continues training on the
aggregate. The tabletop expert is reactive (its action is a function of the state, `expert_action`), so labelling
costs one call per frame and no expert rollouts.

Each round's learner episodes are a LeRobot v3 dataset (`<run>/dagger/round_<i>`) holding the learner's *own*
actions; the expert labels are computed when the aggregate is loaded (`load_replay(..., labels="expert")`), so the
data keeps what was executed and the labeller can be changed later. `wmrl train-policy --dagger-rounds N` runs it
after the BC steps; one optimiser, one learning-rate schedule and one weight average run through all rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import sim
from policies.vla.bc import bc_train, load_replay, weight_interventions
from wmrl.eval.record import record


@dataclass
class DAggerConfig:
    rounds: int = 0
    """Rounds of: run the learner, label its states with the expert, retrain on the aggregate (0: plain BC)."""
    episodes: int = 50
    """Learner episodes recorded per round (true simulator)."""
    steps: int = 1000
    """Gradient steps per round, on the aggregate of the base data and every round so far."""

    def __post_init__(self):
        for name in ("rounds", "episodes", "steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < (0 if name == "rounds" else 1):
                raise ValueError(f"--dagger-{name}: expected an integer >= {0 if name == 'rounds' else 1}, got {v!r}")


def round_dir(run: Path, i: int) -> Path:
    return run / "dagger" / f"round_{i:02d}"


def dagger(policy, data: tuple[Path, ...], task: str, run: Path, cfg: DAggerConfig, *, bc_steps: int, start_step: int,
           train_kwargs: dict, seed: int = 0, num_envs: int = 2, intervention_weight: float = 1.0,
           progress: bool = True, mirror: bool = False) -> list[dict]:
    """Rounds i = 0..rounds-1 after `bc_steps` of BC: round i's data is recorded at step bc_steps + i*steps and its
    training ends at bc_steps + (i+1)*steps. Resuming at `start_step` skips the rounds already trained and
    re-records a round whose training had not begun (its recording may have been cut short). `mirror`: the
    aggregate is trained on with every episode's reflection too (`load_replay`)."""
    out = []
    for i in range(cfg.rounds):
        begin, end = bc_steps + i * cfg.steps, bc_steps + (i + 1) * cfg.steps
        if start_step >= end:
            continue
        d = round_dir(run, i)
        if start_step <= begin or not d.exists():
            policy.eval()
            stochastic, policy.stochastic = policy.stochastic, False  # the learner as it will be evaluated
            env = sim.make_vector_env(task, num_envs)
            try:
                policy.check_spaces(env.single_observation_space, env.single_action_space)
                res, frames = record(policy, env, cfg.episodes, d, seed=seed + 1_000_000 * (i + 1), source="policy",
                                     policy_id=f"dagger_round_{i}", task=task, mode="overwrite", codec="h264",
                                     progress=progress)
            finally:
                env.close()
                policy.stochastic = stochastic
            out.append({"round": i, "learner_pc_success": res.pc_success, "frames": frames})
        _, replay = load_replay(tuple(data) + tuple(round_dir(run, j) for j in range(i + 1)), seed + i + 1,
                                labels="expert", mirror=mirror)
        weight_interventions(replay, intervention_weight)
        r = bc_train(policy, replay, end, start_step=max(start_step, begin), progress=progress,
                     desc=f"dagger {i + 1}/{cfg.rounds}", **train_kwargs)
        if out and out[-1]["round"] == i:
            out[-1].update({"frames_aggregate": len(replay), "loss_last": r["loss_last"]})
    return out
