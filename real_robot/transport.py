"""ZeroMQ + msgpack transport for robots (and anything else with methods): never pickle.

    serve(obj, address, methods)          REP loop: {"method", "args"} -> {"ok": result} | {"error": message}
    RemoteRobot(address, timeout_s)       the `Robot` protocol over the wire; a missing reply raises ConnectionError
    spawn_sim_robot(address, **kwargs)    a `SimRealRobot(realtime=True)` in its own process, served at `address`

numpy arrays travel as msgpack extension type 1 (dtype, shape, raw bytes); only plain types otherwise, so a message
can never execute code on receipt.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import msgpack
import numpy as np
import zmq

ND_EXT = 1
ROBOT_METHODS = ("connect", "get_observation", "send_action", "disconnect", "reset_episode")


def _default(obj: Any):
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError("cannot send object arrays over the transport (plain types and numpy arrays only)")
        return msgpack.ExtType(ND_EXT, msgpack.packb([obj.dtype.str, list(obj.shape), np.ascontiguousarray(obj).tobytes()]))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"cannot send {type(obj).__name__} over the transport (plain types and numpy arrays only)")


def _ext_hook(code: int, data: bytes):
    if code != ND_EXT:
        return msgpack.ExtType(code, data)
    dtype, shape, raw = msgpack.unpackb(data)
    if np.dtype(dtype).hasobject:
        raise ValueError("object arrays are refused")
    return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def serve(obj: Any, address: str, methods: tuple[str, ...] = ROBOT_METHODS, ready=None) -> None:
    """Answer requests until a "shutdown" request. Errors are returned, never raised across the wire."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    if ready is not None:
        ready.set()
    try:
        while True:
            try:
                req = unpack(sock.recv())
                method, args = req["method"], req.get("args", [])
            except Exception as e:  # a malformed message gets an error reply, the server keeps running
                sock.send(pack({"error": f"bad request: {e}"}))
                continue
            if method == "shutdown":
                sock.send(pack({"ok": None}))
                break
            if method not in methods:
                sock.send(pack({"error": f"unknown method {method!r}; valid: {', '.join(methods)}"}))
                continue
            try:
                sock.send(pack({"ok": getattr(obj, method)(*args)}))
            except Exception as e:
                sock.send(pack({"error": f"{type(e).__name__}: {e}"}))
    finally:
        sock.close()


class RemoteRobot:
    """A robot in another process or on another machine. Timeouts and lost servers raise ConnectionError (which
    `SafeRobot` turns into a latched e-stop)."""

    def __init__(self, address: str, timeout_s: float = 2.0):
        self.address, self.timeout_ms = address, int(timeout_s * 1000)
        self._ctx = zmq.Context.instance()
        self._sock = None

    def _socket(self):
        if self._sock is None:
            self._sock = self._ctx.socket(zmq.REQ)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
            self._sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
            self._sock.connect(self.address)
        return self._sock

    def call(self, method: str, *args):
        sock = self._socket()
        try:
            sock.send(pack({"method": method, "args": list(args)}))
            rep = unpack(sock.recv())
        except zmq.Again:
            self._sock.close()  # a REQ socket that missed its reply is unusable: start over next call
            self._sock = None
            raise ConnectionError(f"no reply from the robot at {self.address} within {self.timeout_ms} ms "
                                  f"(calling {method})") from None
        if "error" in rep:
            raise RuntimeError(f"robot at {self.address}: {rep['error']}")
        return rep["ok"]

    def connect(self) -> None:
        self.call("connect")

    def get_observation(self) -> dict:
        return self.call("get_observation")

    def send_action(self, action) -> np.ndarray:
        return np.asarray(self.call("send_action", np.asarray(action, np.float32)))

    def reset_episode(self, seed: int | None = None) -> dict:
        return self.call("reset_episode", seed)

    def disconnect(self) -> None:
        try:
            self.call("disconnect")
        finally:
            self.close()

    def shutdown_server(self) -> None:
        self.call("shutdown")
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _serve_sim_robot(address: str, kwargs: dict, ready) -> None:
    import os

    os.environ.setdefault("MUJOCO_GL", "egl")
    from real_robot.sim_robot import SimRealRobot

    serve(SimRealRobot(realtime=True, **kwargs), address, ready=ready)


def spawn_sim_robot(address: str = "tcp://127.0.0.1:5599", start_timeout_s: float = 60.0, **kwargs) -> mp.Process:
    """Start a real-time `SimRealRobot` server in its own process (spawned, so no state is inherited)."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_serve_sim_robot, args=(address, kwargs, ready), daemon=True)
    proc.start()
    t0 = time.monotonic()
    while not ready.wait(0.1):
        if not proc.is_alive() or time.monotonic() - t0 > start_timeout_s:
            proc.kill()
            raise ConnectionError(f"the robot server did not start at {address} (exit code {proc.exitcode})")
    return proc


__all__ = ["pack", "unpack", "serve", "RemoteRobot", "spawn_sim_robot", "ROBOT_METHODS"]
