"""Does the state channel let the scripted expert do in imagination what it does in the simulator?

The noisy scripted expert (noise 0.1) acts closed-loop in each world model's imagination (the state channel; success
from the task's rules on predicted state) from the same true-simulator layouts it is then run from in the simulator.
A model whose pushes behave like the simulator's lets it succeed as often; the gap is what ranking and RL in
imagination inherit. Per model and per readout of the channel's ensemble (`mean`, or one `member` followed per
episode): imagined and true success with Wilson 95% intervals, their difference, the hallucinated share (imagined
successes whose actions fail when replayed in the simulator), each model's paired gain in imagined success over the
first model listed (same layouts, bootstrap 95% interval over layouts), the per-layout agreement with the
simulator (and the share of its failures imagination also fails; `true_vs_true`: the same between two true runs
under other draws of the expert's noise, the most a model can reach), and, for a run trained with state DAgger,
the expert's imagined success its training logged at the start of each round. It also times imagination with and
without generating frames on the first model (`state_only_speed`): the closed loop here needs only the state channel.

`noises`: the expert's action noise (default 0.1); several (`noises=0.1,0.3,1.0`) give every row at each level,
with its own true run: a model should order the levels as the simulator does (a noisier expert succeeds less).

    wmrl bench state-channel-closed-loop --json --options world_models=RUN_A,RUN_B [starts=200 readouts=mean,member]
"""

from __future__ import annotations

import json
import runpy
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish

# the paired gain over layouts with its bootstrap interval, as the RL benchmarks report it
paired_gain = runpy.run_path(str(Path(__file__).with_name("imagination_estimated_state.py")),
                             run_name="wmrl_bench_sibling")["paired_gain"]


def dagger_log(run: Path) -> list[dict]:
    """The `dagger_*` records a `wmrl train-wm --state-dagger-rounds` run logged, one per round."""
    path = Path(run) / "metrics.jsonl"
    if not path.exists():
        return []
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if k.startswith("dagger_")} for r in recs if "dagger_round" in r]


REPEAT_NOISE = 1_000_000  # the expert's noise seeds of the second true run (the first uses 0..starts-1)


def outcome_agreement(true: list[bool], imagined: list[bool]) -> dict:
    """Per layout: the share where imagination and the simulator agree, and the share of the simulator's failures
    (successes) that imagination also fails (succeeds). A model that always succeeds scores 0 on the failures
    however close its rate is."""
    t, i = np.asarray(true, bool), np.asarray(imagined, bool)
    return {"agreement": float((t == i).mean()),
            "true_failures_failed": float((~i[~t]).mean()) if (~t).any() else None,
            "true_successes_succeeded": float(i[t].mean()) if t.any() else None}


def state_only_speed(model, replay, envs: int = 50, steps: int = 40, seed: int = 0) -> dict:
    """Seconds for the same imagined steps (same starts, same random actions) with the chunk's frames generated and
    with the state channel alone (`WorldModelEnv.frames`), and the largest difference between the states they
    report (0 up to float error: skipping the frames must not change the state trajectory)."""
    from sim import success_and_reward
    from world_models.env import WorldModelEnv

    acts = np.random.default_rng(seed).uniform(-1, 1, (steps, envs, model.cfg.action_dim)).astype(np.float32)
    seconds, states = {}, {}
    for frames in (True, False):
        venv = WorldModelEnv(model, replay, num_envs=envs, max_episode_steps=10 * steps, decode_images=False,
                             sampling_steps=1, rules=success_and_reward)
        venv.frames = frames
        venv.reset(seed=seed)
        t0 = time.perf_counter()
        seen = [venv.step(a)[0]["observation.environment_state"] for a in acts]  # the model steps without gradients
        seconds[frames], states[frames] = time.perf_counter() - t0, np.stack(seen)
    return {"envs": envs, "steps": steps, "seconds_with_frames": seconds[True], "seconds_state_only": seconds[False],
            "speedup": seconds[True] / seconds[False],
            "max_state_difference_m": float(np.abs(states[True] - states[False]).max())}


def main(quick: bool = False, world_models: str = "", starts: int = 200, readouts: str = "mean,member",
         name: str = "", first_layout: int = 70_000, gate: str = "", noises: str = "0.1") -> dict:
    """`gate`: the contact gate the rollouts use (`state_channel.GATES`; default: each run's own `state_gate`), or
    several (`gate=hard,sample`): every run under each, with each row's paired gain over the first gate listed
    (same run and readout, `paired_vs_first_gate`).
    `first_layout`: the first layout seed (default: the world-model benchmark's closed-loop layouts, which no
    model trained on); 0 gives the benchmark dataset's own layouts (seeds 0..269 are its training episodes), which
    separates what the channel failed to learn from what it learned and does not carry to new layouts."""
    from wmrl.eval.loop import wilson_interval
    from wmrl.eval.world_model import hallucination, true_closed_loop
    from world_models.factory import make_world_model
    from world_models.video.train import load_split, world_model_data

    runs = [r for r in world_models.split(",") if r]
    if not runs:
        raise ValueError("options world_models=RUN[,RUN...] is required (runs with a state channel)")
    n = 4 if quick else int(starts)
    seeds = list(range(int(first_layout), int(first_layout) + n))
    t0 = time.time()
    rows, gates, levels = [], gate.split(",") if gate else [None], [float(x) for x in str(noises).split(",")]
    if any(not 0 <= x < 10 for x in levels):
        raise ValueError(f"noises: expected action noise levels in [0, 10), got {noises!r}")
    truth = {x: true_closed_loop("push-red", seeds, noise=x) for x in levels}  # the same for every model and readout
    for run, g in [(r, g) for r in runs for g in gates]:
        model = make_world_model("video", run, state_gate=g)
        if model.state_channel is None:
            raise ValueError(f"{run} has no state channel")
        _, _, held = load_split(world_model_data(run), 0.1)
        for readout, noise in [(ro, x) for ro in readouts.split(",") for x in levels]:
            h = hallucination(model, held, "push-red", "expert", seeds, state_readout=readout, noise=noise,
                              true_run=truth[noise])
            k_im, k_true = round(h["imagined_success"] * n), round(h["true_success"] * n)
            rows.append({"world_model": run, "readout": readout, "gate": model.cfg.state_gate, "noise": noise,
                         "imagined_success": h["imagined_success"],
                         "imagined_ci95": wilson_interval(k_im, n), "true_success": h["true_success"],
                         "true_ci95": wilson_interval(k_true, n), "imagined_minus_true": h["imagined_success"] - h["true_success"],
                         "hallucinated_share": h["hallucinated_share"], "median_disagreement_cm": h["median_disagreement_cm"],
                         **outcome_agreement(h["true_per_start"], h["imagined_per_start"]),
                         "dagger_rounds": dagger_log(Path(run)), "per_start": h["imagined_per_start"],
                         "true_per_start": h["true_per_start"]})
    # what a perfect model could reach: the simulator (the run every row was scored against) against itself under
    # other draws of the expert's noise
    repeat = outcome_agreement(h["true_per_start"],  # the last row's noise level (the last listed)
                               true_closed_loop("push-red", seeds, noise_seed0=REPEAT_NOISE, noise=levels[-1])["true_per_start"])
    first = make_world_model("video", runs[0])
    speed = state_only_speed(first, load_split(world_model_data(runs[0]), 0.1)[2], envs=4 if quick else 50,
                             steps=4 if quick else 40)
    for row in rows:  # against the first model (same readout, gate and noise), and the first gate, layout by layout
        same = lambda r, *keys: all(r[k] == row[k] for k in keys)
        first = next(r for r in rows if same(r, "readout", "gate", "noise"))
        row["paired_vs_first"] = paired_gain(first["per_start"], row["per_start"])
        if len(gates) > 1:
            first = next(r for r in rows if same(r, "readout", "world_model", "noise"))
            row["paired_vs_first_gate"] = paired_gain(first["per_start"], row["per_start"])
    # each later gate against the first, all runs' layouts pooled (one readout and noise level at a time)
    pick = lambda g, ro, x: sum((r["per_start"] for r in rows if (r["gate"], r["readout"], r["noise"]) == (g, ro, x)), [])
    pooled = {f"{g}_vs_{gates[0]}_{ro}" + (f"_noise{x}" if len(levels) > 1 else ""): paired_gain(pick(gates[0], ro, x), pick(g, ro, x))
              for g in gates[1:] for ro in readouts.split(",") for x in levels}
    out = {"task": "push-red", "policy": f"scripted expert, noise {noises}", "starts": n, "first_layout": seeds[0], "rows": rows,
           **({"pooled_vs_first_gate": pooled} if pooled else {}),
           "true_vs_true": repeat, "state_only_speed": speed, "minutes": (time.time() - t0) / 60}
    label = (name or "-".join(Path(r).name for r in runs)) + (f"-from{seeds[0]}" if seeds[0] != 70_000 else "")
    return finish(f"state-channel-closed-loop-{label}" if not quick else "state-channel-closed-loop", out, quick,
                  command=f"wmrl bench state-channel-closed-loop --json --options world_models={world_models} "
                          f"starts={n} readouts={readouts}" + (f" gate={gate}" if gate else "")
                          + (f" first_layout={seeds[0]}" if seeds[0] != 70_000 else "")
                          + (f" noises={noises}" if str(noises) != "0.1" else ""))
