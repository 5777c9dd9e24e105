"""`SimRealRobot`: the MuJoCo-backed stand-in for a physical arm, behind the same `Robot` interface a real driver has.

It runs `tabletop-real` (hidden `TwinParams` that differ from nominal: masses, friction, damping, gains, actuation
latency, camera pose) under joint-position control. Like a real arm's controller, in `realtime` mode a thread steps
the physics at the control rate on monotonic deadlines, always toward the latest target: a late or missing command
means the arm keeps its previous target. Observations arrive `obs_latency_s` late (the newest frame at least that
old) with Gaussian noise on `observation.state`, and carry their capture time (`timestamp_monotonic`).
With `realtime=False`, each `send_action` advances one control period (deterministic tests and benchmarks).

Reach it from another process with `real_robot.transport` (`serve_robot` / `RemoteRobot`).
"""

from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import numpy as np

from real_robot.safety import SafetyConfig
from real_robot.transport import check_bind, serve_robot
from sim.tabletop.env import TabletopEnv, validate_action
from wmrl.core.features import OBS_STATE


class SimRealRobot:
    action_dim = 5  # [4 arm joint targets, gripper]

    def __init__(self, task: str = "reach-red", control_hz: float = 10.0, obs_latency_s: float = 0.0,
                 noise_std: float = 0.002, realtime: bool = False, seed: int = 0, image_size: int = 64,
                 cameras: tuple[str, ...] = ("front", "wrist"), twin="real"):
        """`twin`: "real" (the hidden parameters), None (nominal) or any `TwinParams` (tests of calibration)."""
        if control_hz <= 0 or obs_latency_s < 0 or noise_std < 0:
            raise ValueError(f"control_hz > 0, obs_latency_s >= 0 and noise_std >= 0 needed; got {control_hz}, "
                             f"{obs_latency_s}, {noise_std}")
        self.task, self.control_hz, self.obs_latency_s, self.noise_std = task, control_hz, obs_latency_s, noise_std
        self.realtime, self.seed, self.image_size, self.cameras, self.twin = realtime, seed, image_size, tuple(cameras), twin
        self.env = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._frames: collections.deque = collections.deque(maxlen=64)  # (capture time, obs, info)
        self._target: np.ndarray | None = None
        self._rng = np.random.default_rng(seed)
        self._ready = threading.Event()
        self._reset_request: tuple | None = None  # (seed, done event), served by the controller thread
        self._failure: BaseException | None = None
        self.steps = 0
        self.commands = 0

    # ------------------------------------------------------------------ Robot protocol
    def connect(self, timeout_s: float = 60.0) -> None:
        if not self.realtime:
            self._make_env()
            self._reset(self.seed)
            return
        # The renderer's GL context belongs to the thread that made it: the controller thread owns the simulator.
        self._stop.clear()
        self._thread = threading.Thread(target=self._control_loop, name="sim-real-controller", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._failure is not None:
            raise ConnectionError(f"the simulated robot did not start: {self._failure}")

    def _make_env(self) -> None:
        self.env = TabletopEnv(task=self.task, control="joint", twin=self.twin, image_size=self.image_size,
                               cameras=self.cameras, control_hz=self.control_hz, max_episode_steps=10**9)

    def _check_alive(self) -> None:
        if self._failure is not None:
            raise ConnectionError(f"the robot controller stopped: {type(self._failure).__name__}: {self._failure}")
        if self.env is None:
            raise ConnectionError("robot not connected")

    def reset_episode(self, seed: int | None = None) -> dict:
        """An operator resets the cell: new object layout, arm at home. Returns the first observation."""
        self._check_alive()
        if self.realtime:
            done = threading.Event()
            self._reset_request = (seed, done)
            if not done.wait(10.0):
                raise ConnectionError("the robot controller did not reset the cell within 10 s")
        else:
            self._reset(seed)
        return self.get_observation()

    def _reset(self, seed: int | None) -> None:
        with self._lock:
            obs, info = self.env.reset(seed=seed)
            self._target = np.concatenate([obs[OBS_STATE][:4], [-1.0]]).astype(np.float64)
            self._frames.clear()
            self._frames.append((time.monotonic(), obs, {**info, "success": False}))
            self.steps = 0

    def get_observation(self) -> dict:
        self._check_alive()
        now = time.monotonic()
        with self._lock:
            ready = [f for f in self._frames if f[0] <= now - self.obs_latency_s]
            stamp, obs, info = ready[-1] if ready else self._frames[0]
            obs = dict(obs)
        state = np.asarray(obs[OBS_STATE], np.float32).copy()
        if self.noise_std:
            state += self._rng.normal(0, self.noise_std, state.shape).astype(np.float32)
        obs[OBS_STATE] = state
        obs["timestamp_monotonic"] = stamp
        obs["gripper_command"] = float(self._target[-1])
        obs["success"] = bool(info.get("success", False))
        obs["step"] = int(info.get("step", 0))
        return obs

    def send_action(self, action) -> np.ndarray:
        self._check_alive()
        a = validate_action(action, (5,), "joint command")  # a driver refuses malformed commands too
        with self._lock:
            self._target = a.copy()
            self.commands += 1
        if not self.realtime:
            self._step()
        return a.astype(np.float32)

    def disconnect(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        elif self.env is not None:
            self.env.close()
        self.env = None

    # ------------------------------------------------------------------ the controller
    def _step(self) -> None:
        with self._lock:
            obs, _, _, _, info = self.env.step(self._target)
            self.steps += 1
            self._frames.append((time.monotonic(), obs, info))

    def _control_loop(self) -> None:
        try:
            self._make_env()
            self._reset(self.seed)
            self._ready.set()
            dt = 1.0 / self.control_hz
            nxt = time.monotonic() + dt
            while not self._stop.is_set():
                if self._reset_request is not None:
                    seed, done = self._reset_request
                    self._reset_request = None
                    self._reset(seed)
                    done.set()
                    nxt = time.monotonic() + dt
                delay = nxt - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self._step()
                nxt = max(nxt + dt, time.monotonic())  # after an overrun, restart the schedule rather than burst
        except BaseException as e:  # reported to callers as a lost connection
            self._failure = e
            self._ready.set()
        finally:
            if self.env is not None and self._stop.is_set():
                self.env.close()


__all__ = ["SimRealRobot"]


def _serve_sim_robot(address: str, kwargs: dict, safety, keys, ready) -> None:
    os.environ.setdefault("MUJOCO_GL", "egl")
    logging.getLogger("wmrl.safety").setLevel(logging.ERROR)  # the client logs its own trips; these are kept
    serve_robot(SimRealRobot(realtime=True, **kwargs), address, safety=safety, keys=keys, ready=ready)


def spawn_sim_robot(address: str = "tcp://127.0.0.1:5599", start_timeout_s: float = 60.0, safety=None,
                    keys: str | Path | None = None, **kwargs) -> mp.Process:
    """Start a real-time `SimRealRobot` server (with its own safety layer, `safety` or the defaults at its control
    rate) in its own process (spawned, so no state is inherited)."""
    if safety is None:
        safety = SafetyConfig(control_hz=kwargs.get("control_hz", 10.0))
    safety.validate()
    check_bind(address, None if keys is None else Path(keys), allow_remote=False)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_serve_sim_robot, args=(address, kwargs, safety, keys, ready), daemon=True)
    proc.start()
    t0 = time.monotonic()
    while not ready.wait(0.1):
        if not proc.is_alive() or time.monotonic() - t0 > start_timeout_s:
            proc.kill()
            raise ConnectionError(f"the robot server did not start at {address} (exit code {proc.exitcode})")
    return proc
