"""How the pushed cube moves in each phase of the expert's push, in imagination and in the simulator.

The failure trace (`state-channel-failure-trace`) found the state channel sending the pushed cube to the workspace's
edge several times as often as the simulator. This benchmark says in which part of the push that happens. The noisy
scripted expert (noise 0.1) runs closed-loop in each model's state channel (state only, the chosen readout) and in
the simulator from the same `starts` fresh layouts (the closed-loop benchmark's). Every step is labelled with the
expert's own phase (`sim.tabletop.experts.push_phase`: `push`, `realign`: low behind the cube but off the push line,
so the hand moves sideways at pushing height, `approach`, `done`). Per phase, over the steps in that phase:

- `steps_per_episode`, `moved_share` (the pushed cube moved > 0.5 mm in the step) and, over moving steps, the cube's
  displacement along the push direction (mean, median and p90) and across it, signed positive when it goes the way the hand went across
  (`lateral_with_hand_cm`: a cube that follows a sideways sweep of the hand);
- for the failed episodes: how many bring the pushed cube within 3 cm of the hand's workspace bounds and in which
  phase the step that gets it there was taken (`edge_reached_in`).

Then the one-step check on the *true* episodes (`one_step`): every recorded transition is predicted by each model's
channel from the true state under the recorded action (all ensemble members), and the same displacements are
compared, per phase, with the true ones. Read it as a bias: a channel that carries the cube across with the hand
more than the simulator does on the recorded data will do so more in imagination, where the expert re-aligns
more often.

`noise`: the expert's action noise (default 0.1) on both sides; a noisier expert shows where jittery pushing
succeeds in imagination and not in the simulator.

`settle`: the settling rule in the imagined rollouts (`state_settle`): empty, each run's own; `off,on`, a row for each on
every run (the rule changes no weight; the one-step check from true states does not settle, so it is computed once
per run and shared by its rows).

    wmrl bench state-channel-push-phases --json --options world_models=RUN[,RUN] [starts=400 readout=member noise=0.1
        settle=off,on]
"""

from __future__ import annotations

import runpy
import time
from pathlib import Path

import numpy as np

from sim.tabletop.experts import PUSH_PHASES as PHASES  # the expert's own phase names
from wmrl.benchutil import finish, on_off, on_off_word

_trace = runpy.run_path(str(Path(__file__).with_name("state_channel_failure_trace.py")), run_name="wmrl_bench_sibling")
true_episodes, scene_kind, options, imagine = (_trace[k] for k in ("true_episodes", "scene_kind", "options", "imagine"))

MOVE = 5e-4  # m: the pushed cube moved in a step (the channel's contact-gate label)


def step_motion(state: np.ndarray, env_state: np.ndarray, nxt_state: np.ndarray, nxt_env: np.ndarray,
                target: tuple[int, int]) -> tuple[str, float, float]:
    """One step of a push: the expert's phase before it, and the pushed cube's displacement (cm) along the push
    direction and across it (positive: the way the hand moved across)."""
    from sim.tabletop.env import STATE_NAMES
    from sim.tabletop.experts import push_phase

    c, z = target
    e = STATE_NAMES.index("ee_x")
    phase, u, _, _ = push_phase(state[e : e + 3].astype(np.float64), env_state[c : c + 3].astype(np.float64),
                                env_state[z : z + 2].astype(np.float64))
    return (phase, *_along_across(nxt_env[c : c + 2] - env_state[c : c + 2], nxt_state[e : e + 2] - state[e : e + 2], u))


def _along_across(d: np.ndarray, hand: np.ndarray, u: np.ndarray) -> tuple[float, float]:
    perp = np.array([-u[1], u[0]])
    side = np.sign(float(hand @ perp)) or 1.0
    return float(d @ u) * 100, float(d @ perp) * side * 100


def phase_table(episodes: list[list[tuple]], finals: list[tuple | None], success: np.ndarray,
                targets: list[tuple[int, int]]) -> dict:
    """Per phase: steps per episode, moved share, mean along / across-with-hand displacement on moving steps; and for
    failures, how many reach the workspace edge and in which phase's step."""
    rows: dict = {p: {"steps": 0, "moved": 0, "along": [], "across": []} for p in PHASES}
    edge_in: dict = {p: 0 for p in PHASES}
    for ep, last, ok, target in zip(episodes, finals, success, targets):
        seq = list(ep) + ([last] if last is not None else [])
        hit = False
        for (s, e), (s2, e2) in zip(seq, seq[1:]):
            phase, along, across = step_motion(s, e, s2, e2, target)
            r = rows[phase]
            r["steps"] += 1
            if np.hypot(along, across) > MOVE * 100:
                r["moved"] += 1
                r["along"].append(along)
                r["across"].append(across)
            if not ok and not hit and scene_kind(s2, e2, seq[0][1], target)["edge"]:
                hit = True
                edge_in[phase] += 1
    n = max(len(episodes), 1)
    out = {p: {"steps_per_episode": r["steps"] / n, "moved_share": r["moved"] / r["steps"] if r["steps"] else None,
               "along_cm": float(np.mean(r["along"])) if r["along"] else None,
               # a push step's change is heavy-tailed (a kicked cube slides on): its median and p90 beside the mean
               "along_median_cm": float(np.median(r["along"])) if r["along"] else None,
               "along_p90_cm": float(np.percentile(r["along"], 90)) if r["along"] else None,
               "lateral_with_hand_cm": float(np.mean(r["across"])) if r["across"] else None} for p, r in rows.items()}
    fails = int((~np.asarray(success, bool)).sum())
    return {"phases": out, "failures": fails, "failures_reaching_edge": sum(edge_in.values()), "edge_reached_in": edge_in}


def one_step(model, true: dict) -> dict:
    """The channel's one-step prediction (every member) of each recorded transition of the true episodes, from the
    true state under the recorded action: mean along / across-with-hand displacement of the pushed cube per phase,
    predicted and true, over all the phase's steps."""
    import torch

    from world_models.video.model import channel_states

    sc = model.state_channel
    acc: dict = {p: {"true": [], "pred": []} for p in PHASES}
    for ep, last, acts, target in zip(true["scenes"], true["final"], true["actions"], true["targets"]):
        seq = list(ep) + [last]
        S = torch.tensor(np.stack([s for s, _ in seq[:-1]]))
        E = torch.tensor(np.stack([e for _, e in seq[:-1]]))
        x = channel_states(model.cfg, S, E).float()
        with torch.no_grad():
            nxt = sc.rollout_step(x[None].expand(sc.cfg.members, -1, -1).contiguous(), torch.tensor(np.stack(acts)),
                                  gate=model.cfg.state_gate)
        k = 4 + 3 * model.cfg.object_xyz.index(target[0])  # the pushed cube's place in the channel's state
        for t, ((s, e), (s2, e2)) in enumerate(zip(seq, seq[1:])):
            phase, along, across = step_motion(s, e, s2, e2, target)
            acc[phase]["true"].append((along, across))
            for m in range(sc.cfg.members):
                pe = e.copy()
                pe[target[0] : target[0] + 2] = nxt[m, t, k : k + 2].numpy()
                # signed by the hand's way across as the simulator moved it, like the true displacement
                acc[phase]["pred"].append(step_motion(s, e, s2, pe, target)[1:])
    out = {}
    for p, d in acc.items():
        if d["true"]:
            t, q = np.array(d["true"]), np.array(d["pred"])
            out[p] = {"steps": len(t), "true_along_cm": float(t[:, 0].mean()), "pred_along_cm": float(q[:, 0].mean()),
                      "true_lateral_with_hand_cm": float(t[:, 1].mean()),
                      "pred_lateral_with_hand_cm": float(q[:, 1].mean())}
    return out


def settle_options(settle) -> list[bool | None]:
    """`settle` as the rollouts to run: empty, each run's own setting; else on, off or a comma list of them, one row
    per run and setting (the rule changes no weight, so one model serves both)."""
    if isinstance(settle, bool) or settle in ("", None):  # the options parser reads a single on/off as a bool
        return [on_off(settle, "settle")]
    return [on_off(v.strip().lower() or "?", "settle") for v in str(settle).split(",")]


def main(quick: bool = False, world_models: str = "", starts: int = 400, readout: str = "member", name: str = "",
         gate: str = "", noise: float = 0.1, settle: str = "") -> dict:
    """`readout`: the state channel's readout (`state_channel.READOUTS`); `gate`: the contact gate of the
    rollouts and the one-step check (`state_channel.GATES`; default: each run's own); `noise`: the expert's;
    `settle`: the settling rule in the rollouts (`settle_options`; e.g. `off,on` measures both on each run)."""
    runs, seeds = options(world_models, readout, starts, quick)
    n, t0 = len(seeds), time.time()
    noise = float(noise)
    if not 0 <= noise < 10:
        raise ValueError(f"noise: expected an action noise level in [0, 10), got {noise}")
    settles = settle_options(settle)
    true = true_episodes("push-red", seeds, 80, noise=noise)
    out: dict = {"task": "push-red", "policy": f"scripted expert, noise {noise}", "starts": n, "readout": readout,
                 "true": {"success": float(true["success"].mean()),
                          **phase_table(true["scenes"], true["final"], true["success"], true["targets"])},
                 "rows": []}
    for run in runs:
        checked = None  # the one-step check never settles: one per run serves each setting's row
        for rule in settles:
            model, scenes, success = imagine(run, seeds, readout, gate, noise, settle=rule)
            checked = checked or one_step(model, true)
            # an imagined episode's scenes stop at its last step: the scene after it is not kept, so its last step is
            # not counted
            out["rows"].append({"world_model": run, "gate": model.cfg.state_gate, "settle": model.cfg.state_settle,
                                "imagined_success": float(success.mean()),
                                **phase_table(scenes, [None] * n, success, true["targets"]), "one_step": checked})
    out["minutes"] = (time.time() - t0) / 60
    label = name or "-".join(Path(r).parent.name if Path(r).name == "model" else Path(r).name for r in runs)
    return finish(f"state-channel-push-phases-{label}" if not quick else "state-channel-push-phases", out, quick,
                  command=f"wmrl bench state-channel-push-phases --json --options world_models={world_models} "
                          f"starts={n} readout={readout}" + (f" name={name}" if name else "")
                          + (f" gate={gate}" if gate else "") + (f" noise={noise}" if noise != 0.1 else "")
                          + (f" settle={','.join(on_off_word(v) for v in settles)}" if settles != [None] else ""))
