"""Action-chunk execution on a fixed-rate control loop: synchronous, or asynchronous with a merge strategy.

Actions are keyed by absolute control step. A chunk predicted from the observation of step k holds the actions for
steps k .. k+H-1; it arrives d steps later (d is *measured* with the monotonic clock, never assumed), so its first
d actions are already in the past and are dropped. How the rest joins the queue (`ChunkQueue.add`):

    replace              the new chunk's actions replace the queue from the current step on
    temporal_ensemble    ACT (Zhao et al. 2023): every step averages all chunks' predictions for it with weights
                         exp(-m i), i = 0 for the oldest prediction
    aligned              Xiaomi-Robotics-0 / real-time chunking (Black et al. 2025) without inpainting: the steps that
                         passed during inference stay frozen to the previous chunk (they were executed from it), and
                         over the next `blend` steps the command moves linearly from the previous chunk's action to
                         the new chunk's (weights (j+1)/(blend+1)); a previous chunk that ran out is padded with its
                         last real action, never zeros

Modes: `sync` (infer in the loop when the queue is empty: the loop blocks), `async` (inference in a worker thread,
a new chunk requested when `threshold` or fewer queued actions remain, the threshold raised to the measured delay in
steps + 1 so the next chunk can arrive before the queue runs dry; merge `replace` unless told otherwise),
`aligned` (async with the aligned merge). An injectable `latency` (seconds, per call) models inference time, so
the same executor runs against `SimRealRobot`, a remote robot or a world model.

Recorded per step: deadline, send time, whether the deadline was missed (sent more than `miss_tolerance` of a
period late), whether the queue was starved (the robot got a held command instead of a policy action), chunk
boundaries, and what the safety layer did.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from wmrl.core.features import OBS_STATE

STRATEGIES = ("replace", "temporal_ensemble", "aligned")
MODES = ("sync", "async", "aligned")


class ChunkQueue:
    """Actions by absolute step, merged from chunks by `strategy` (see the module docstring)."""

    def __init__(self, strategy: str = "replace", blend: int = 4, ensemble_m: float = 0.1):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if blend < 0 or ensemble_m < 0:
            raise ValueError(f"blend and ensemble_m must be >= 0, got {blend}, {ensemble_m}")
        self.strategy, self.blend, self.m = strategy, blend, ensemble_m
        self.actions: dict[int, np.ndarray] = {}
        self.preds: dict[int, list[np.ndarray]] = {}  # temporal ensemble: all predictions per step, oldest first
        self.last_action: np.ndarray | None = None

    def remaining(self, now: int) -> int:
        return sum(1 for s in self.actions if s >= now)

    def add(self, chunk: np.ndarray, start: int, now: int) -> None:
        """Merge `chunk` (H, A), predicted for steps start .. start+H-1, at control step `now` (>= start)."""
        chunk = np.asarray(chunk, np.float64)
        if chunk.ndim != 2 or not np.all(np.isfinite(chunk)):
            raise ValueError(f"chunk: expected a finite (H, A) array, got shape {chunk.shape}")
        new = {start + i: chunk[i] for i in range(len(chunk)) if start + i >= now}
        old = {s: a for s, a in self.actions.items() if s >= now}
        if self.strategy == "temporal_ensemble":
            for s, a in new.items():
                self.preds.setdefault(s, []).append(a)
            self.actions = {s: self._ensemble(s) for s in set(old) | set(new)}
        elif self.strategy == "aligned" and (old or self.last_action is not None):
            pad = old[max(old)] if old else self.last_action  # the previous chunk's last real action
            self.actions = {s: ((1 - (s - now + 1) / (self.blend + 1)) * old.get(s, pad) + (s - now + 1) / (self.blend + 1) * a
                                if s - now < self.blend else a) for s, a in new.items()}
        else:
            self.actions = new
        self.preds = {s: p for s, p in self.preds.items() if s >= now}

    def _ensemble(self, s: int) -> np.ndarray:
        p = self.preds[s]
        w = np.exp(-self.m * np.arange(len(p)))
        return np.tensordot(w / w.sum(), np.stack(p), axes=1)

    def pop(self, step: int) -> np.ndarray | None:
        """The action for `step`, or None when starved. Older steps are discarded."""
        a = self.actions.pop(step, None)
        self.actions = {s: v for s, v in self.actions.items() if s > step}
        if a is not None:
            self.last_action = a
        return a


@dataclass
class ExecutorConfig:
    mode: str = "aligned"  # sync | async | aligned
    strategy: str = ""  # merge for async mode: replace (default) | temporal_ensemble; aligned mode uses aligned
    control_hz: float = 10.0
    threshold: int = 3  # async: request a new chunk when this many queued actions or fewer remain
    adaptive_threshold: bool = True  # raise the threshold to the measured delay in steps + 1 (arrive before running dry)
    blend: int = 4
    ensemble_m: float = 0.1
    miss_tolerance: float = 0.5  # fraction of a period a command may be late before it counts as a missed deadline

    def validate(self) -> str:
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}")
        if self.control_hz <= 0 or self.threshold < 0:
            raise ValueError(f"control_hz must be > 0 and threshold >= 0, got {self.control_hz}, {self.threshold}")
        strategy = "aligned" if self.mode == "aligned" else (self.strategy or "replace")
        if self.mode == "aligned" and self.strategy not in ("", "aligned"):
            raise ValueError(f"mode aligned uses the aligned merge; got strategy {self.strategy!r}")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
        return strategy


def run_episode(robot, infer: Callable[[dict], np.ndarray], cfg: ExecutorConfig, steps: int,
                latency: Callable[[], float] | None = None, stop: Callable[[dict], bool] | None = None,
                clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                record: bool = False, operator=None) -> dict:
    """Run `steps` control periods. `infer(obs) -> (H, A)` chunk of absolute commands; `latency()` adds modelled
    inference time; `stop(obs)` ends the episode early (e.g. success). Returns the per-step log and summary rates;
    `record` also keeps every observation the loop acted on (`log["obs"]`, plus the final one). `operator` (see
    `real_robot.intervention.JointOperator`) may override any step's command; `log["phase"]` says who acted
    (0 policy, 1 recovery, 2 correction), and the next policy chunk blends from the operator's last command."""
    strategy = cfg.validate()
    dt = 1.0 / cfg.control_hz
    queue = ChunkQueue(strategy, cfg.blend, cfg.ensemble_m)
    pool = cf.ThreadPoolExecutor(max_workers=1) if cfg.mode != "sync" else None

    def timed_infer(obs: dict, start: int) -> tuple[np.ndarray, int, float]:
        t = clock()
        chunk = np.asarray(infer(obs))
        extra = latency() if latency else 0.0
        if extra > 0:
            sleep(extra)
        return chunk, start, clock() - t

    log = {"deadline": [], "sent_at": [], "missed": [], "starved": [], "boundary": [], "action": [], "sent": [],
           "trips": [], "delays": [], "obs": [], "phase": []}
    inflight = None
    last = None
    started = False
    obs = robot.get_observation()
    t0 = clock()
    k = 0
    try:
        for k in range(steps):
            deadline = t0 + k * dt
            wait = deadline - clock()
            if wait > 0:
                sleep(wait)
            obs = robot.get_observation()
            if stop is not None and stop(obs):
                break
            boundary = False
            if cfg.mode == "sync":
                if queue.remaining(k) == 0:
                    chunk, start, d = timed_infer(obs, k)
                    queue.add(chunk, start, k)  # a blocking loop executes the chunk from its first action, late
                    log["delays"].append(d)
                    boundary = True
            else:
                if inflight is not None and inflight.done():
                    chunk, start, d = inflight.result()
                    queue.add(chunk, start, k)
                    log["delays"].append(d)
                    inflight, boundary = None, True
                threshold = cfg.threshold
                if cfg.adaptive_threshold and log["delays"]:
                    threshold = max(threshold, math.ceil(max(log["delays"][-5:]) / dt) + 1)
                if inflight is None and queue.remaining(k) <= threshold:
                    inflight = pool.submit(timed_infer, obs, k)
            a = queue.pop(k)
            started = started or boundary
            starved = a is None and started  # waiting for the very first chunk is start-up, not starvation
            if a is None:  # hold: the last real action (absolute targets), or the measured pose before any action
                a = last if last is not None else _hold_from(obs, getattr(robot, "dim", 5))
                queue.last_action = a  # what the next chunk blends from (aligned): the command really in force
            phase = 0
            if operator is not None:
                a_op, phase = operator.step(obs, a)
                if a_op is not None:  # the operator has the arm: the policy's plan for now is dropped
                    a = np.asarray(a_op, np.float64)
                    starved = False  # nobody waits for the policy while the operator drives
                    queue.actions = {}
                    queue.last_action = a
            log["phase"].append(phase)
            sent = robot.send_action(a.astype(np.float32))
            t_sent = clock()
            log["deadline"].append(deadline - t0)
            log["sent_at"].append(t_sent - t0)
            log["missed"].append(t_sent - deadline > cfg.miss_tolerance * dt)
            log["starved"].append(starved)
            log["boundary"].append(boundary)
            log["action"].append(np.asarray(a, np.float64))
            log["sent"].append(np.asarray(sent, np.float64))
            log["trips"].append(list(getattr(robot, "step_trips", [])))
            if record:
                log["obs"].append(obs)
            last = a
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return {**summarise(log, dt), "log": log, "final_observation": obs}


def _hold_from(obs: dict, dim: int = 5) -> np.ndarray:
    """The measured arm joints (the first dim - 1 state entries: both arms' states begin with them) and the
    gripper command in force."""
    s = np.asarray(obs[OBS_STATE], np.float64)
    return np.concatenate([s[: dim - 1], [float(obs.get("gripper_command", -1.0))]])


def summarise(log: dict, dt: float) -> dict:
    """Deadline-miss and stall rates, and the action discontinuity at chunk boundaries against within chunks."""
    n = len(log["sent"])
    if n == 0:
        return {"steps": 0}
    def split(key):  # mean |a_t - a_{t-1}| over the arm joints, at chunk boundaries and within chunks
        jumps = [float(np.abs(log[key][i] - log[key][i - 1])[:-1].mean()) for i in range(1, n)]
        at = [j for j, b in zip(jumps, log["boundary"][1:]) if b]
        within = [j for j, b in zip(jumps, log["boundary"][1:]) if not b]
        return (float(np.mean(at)) if at else math.nan), (float(np.mean(within)) if within else math.nan)

    # what the executor commanded (the merge strategy's doing) and what the safety layer let through
    at_boundary, within = split("action" if "action" in log else "sent")
    sent_boundary, _ = split("sent")
    gaps = np.diff([0.0] + log["sent_at"])
    blocked = float(np.sum(np.maximum(np.round(gaps / dt) - 1, 0)))  # periods that passed with no command at all
    return {"steps": n, "deadline_miss_rate": float(np.mean(log["missed"])),
            "stall_rate": float((np.sum(log["starved"]) + blocked) / (n + blocked)),
            "boundary_jump": at_boundary, "within_chunk_jump": within, "boundary_jump_sent": sent_boundary,
            "inference_delay_s": float(np.median(log["delays"])) if log["delays"] else math.nan,
            "safety_trips": int(sum(len(t) for t in log["trips"]))}


__all__ = ["ChunkQueue", "ExecutorConfig", "run_episode", "summarise", "STRATEGIES", "MODES"]
