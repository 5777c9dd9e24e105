"""The world-model benchmark's open-loop state checks for state channels, per readout of the ensemble, in minutes.

`wmrl bench world-model` scores its state channel on open-loop replays (recorded actions from a recorded start)
through the ensemble mean, with frames generated alongside. The closed-loop benchmarks read one member per episode
(PETS's TS-infinity), and the two readouts disagree about which channel is better (README, state channel). Here
every channel replays with the state channel alone (`replay_states`: no frames, so a channel costs seconds), under
the mean and under each member in turn:

- success AUROC on the benchmark's prefix-sharing success / near-success pairs (130 seeds), each pair scored over
  the same number of steps (max of the task's shaped reward on predicted state); a random scorer's value on the same
  pairs is reported. `members`: each member's AUROC, and the AUROC of the score averaged over the members (the
  expected score of a rollout that draws its member);
- the red cube's error at the end of each held-out episode (median, p90, cm) and the end-effector's error after
  4 and 16 steps (median, cm), replayed from the episode's first frame; `members`: pooled over members and episodes.
`consensus`: the same under the members stepped from their mean state at every step (`state_channel.READOUTS`).

Same model, same gate (each run's own, or `gate=`), same pairs and episodes for every run.

    wmrl bench state-channel-open-loop --json --options world_models=RUN[,RUN] [pairs=130 gate=sample name=...]
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish


def readout_scores(model, pairs, eps, member, matched, consensus: bool = False) -> dict:
    """One readout (`member` None: the mean, or with `consensus` the consensus) on the pairs and the held-out
    episodes: per-pair scores and per-episode errors, unsummarised, so members can be pooled."""
    from sim.tabletop.twin import CUBE_COLOURS
    from wmrl.core.features import OBS_ENV_STATE, OBS_STATE
    from wmrl.eval.world_model import replay_states
    from world_models.video.evaluate import matched_max

    p = replay_states(model, pairs, member=member, consensus=consensus)
    r = replay_states(model, eps, member=member, seed=1, consensus=consensus)
    i = 3 * CUBE_COLOURS.index("red")
    ee_idx = list(model.cfg.ee_index)
    cube = np.array([np.linalg.norm(e[-1, i : i + 3] - ep[OBS_ENV_STATE][-1, i : i + 3]) * 100 for e, ep in zip(r["env"], eps)])
    ee = {h: np.array([np.linalg.norm(x[h - 1] - ep[OBS_STATE][h, ee_idx]) * 100 for x, ep in zip(r["ee"], eps)
                       if len(x) >= h]) for h in (4, 16)}
    return {"scores": matched_max(p["reward"], matched), "cube": cube, "ee": ee}


def summarise(s: dict, truth) -> dict:
    from world_models.video.evaluate import auroc

    med = lambda x: float(np.median(x)) if len(x) else float("nan")  # no episode that long (the tiny test data)
    return {"success_auroc_matched_state": auroc(s["scores"], truth),
            "cube_error_cm_end": med(s["cube"]), "cube_error_cm_end_p90": float(np.percentile(s["cube"], 90)),
            "ee_error_cm_h4": med(s["ee"][4]), "ee_error_cm_h16": med(s["ee"][16])}


def main(quick: bool = False, world_models: str = "", pairs: int = 130, gate: str = "", name: str = "") -> dict:
    from wmrl.core.features import image_key
    from wmrl.eval.world_model import held_episodes, pair_lengths, success_pairs
    from world_models.factory import make_world_model
    from world_models.video.evaluate import auroc
    from world_models.video.train import load_split, world_model_data

    runs = [r for r in world_models.split(",") if r]
    if not runs:
        raise ValueError("options world_models=RUN[,RUN...] is required (runs with a state channel)")
    t0 = time.time()
    prs = success_pairs("push-red", 6 if quick else int(pairs))
    truth, _, matched, check = pair_lengths(prs)  # the same pairs, steps and random scorer as `pair_auroc`
    out: dict = {"task": "push-red", **check, "rows": []}
    for run in runs:
        model = make_world_model("video", run, state_gate=gate or None)
        if model.state_channel is None:
            raise ValueError(f"{run} has no state channel")
        _, _, held = load_split(world_model_data(run), 0.1)
        eps = held_episodes(held, [image_key(c) for c in model.cfg.cameras])
        if quick:
            eps = eps[:4]
        mean = readout_scores(model, prs, eps, None, matched)
        per = [readout_scores(model, prs, eps, m, matched) for m in range(model.cfg.state_members)]
        pooled = {"scores": np.mean([p["scores"] for p in per], 0), "cube": np.concatenate([p["cube"] for p in per]),
                  "ee": {h: np.concatenate([p["ee"][h] for p in per]) for h in (4, 16)}}
        out["rows"].append({"world_model": run, "gate": model.cfg.state_gate, "heldout_episodes": len(eps),
                            "mean": summarise(mean, truth), "members": summarise(pooled, truth),
                            "consensus": summarise(readout_scores(model, prs, eps, None, matched, True), truth),
                            "member_aurocs": [auroc(p["scores"], truth) for p in per]})
    out["minutes"] = (time.time() - t0) / 60
    label = name or "-".join(Path(r).name for r in runs)
    return finish(f"state-channel-open-loop-{label}" if not quick else "state-channel-open-loop", out, quick,
                  command=f"wmrl bench state-channel-open-loop --json --options world_models={world_models}"
                          + (f" pairs={pairs}" if int(pairs) != 130 else "") + (f" gate={gate}" if gate else "")
                          + (f" name={name}" if name else ""))
