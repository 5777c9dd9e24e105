"""ZeroMQ + msgpack transport for robots (and anything else with methods): never pickle, safety where the arm is.

    serve(obj, address, methods)          request loop: {"method", "args"} -> {"ok": result} | {"error": message}
    serve_robot(robot, address, safety)   the same for a robot driver, behind a server-side `SafeRobot` + watchdog
    RemoteRobot(address, keys=...)        the `Robot` protocol over the wire; a missing or bad reply: ConnectionError
    spawn_sim_robot(address, **kwargs)    a `SimRealRobot(realtime=True)` served in its own process
    make_keys(folder)                     CURVE key pairs for a server and its clients (`wmrl robot-keys`)

The server is a ROUTER socket: every request must be exactly one frame of at most `max_request_bytes`; anything
else is answered with an error or dropped, and no message (random bytes, several frames, an oversized one, a pickle,
an object array, an unknown msgpack extension) can stop the loop or execute code. numpy arrays travel as msgpack
extension type 1 (dtype, shape, raw bytes) with numeric dtypes only; every other extension code is refused.

Authentication: with `keys`, the link uses ZeroMQ CURVE (encrypted, and only clients whose public key is in
`KEYS/allowed/` get through the handshake). Without keys the server listens on the loopback interface only;
listening anywhere else needs `allow_remote=True` *and* keys. Key layout (as `make_keys` writes it):

    KEYS/server/server.key, server.key_secret       the server's pair (the secret stays on the robot's machine)
    KEYS/allowed/<client>.key                       the allow-list of client public keys
    KEYS/clients/<client>.key, <client>.key_secret  each client's pair (copy to that client with server.key)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import msgpack
import numpy as np
import zmq

log = logging.getLogger("wmrl.transport")
ND_EXT = 1
ROBOT_METHODS = ("connect", "get_observation", "send_action", "disconnect", "reset_episode", "describe", "trips")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
MAX_REQUEST_BYTES = 64 * 1024  # a command is ~100 bytes; observations only travel server -> client
NUMERIC_KINDS = "?biufc"


# ---------------------------------------------------------------------- serialisation
def _default(obj: Any):
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in NUMERIC_KINDS:
            raise TypeError("cannot send object arrays over the transport (plain types and numpy arrays only)")
        return msgpack.ExtType(ND_EXT, msgpack.packb([obj.dtype.str, list(obj.shape), np.ascontiguousarray(obj).tobytes()]))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"cannot send {type(obj).__name__} over the transport (plain types and numpy arrays only)")


def _ext_hook(code: int, data: bytes):
    if code != ND_EXT:
        raise ValueError(f"unknown msgpack extension code {code}")
    dtype, shape, raw = msgpack.unpackb(data)
    if not isinstance(dtype, str) or not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError("malformed array")
    dt = np.dtype(dtype)
    if dt.kind not in NUMERIC_KINDS:
        raise ValueError(f"array dtype {dtype!r} refused (numeric arrays only)")
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


# ---------------------------------------------------------------------- keys
def make_keys(folder: str | Path, clients: tuple[str, ...] = ("client",)) -> Path:
    """CURVE key pairs: one for the server, one per client, and the allow-list; secret files get mode 0600."""
    import zmq.auth

    folder = Path(folder)
    if not clients or any(not c or "/" in c or c.startswith(".") or c == "server" for c in clients):
        raise ValueError(f"client names: plain, non-empty file names other than 'server', got {clients}")
    if (folder / "server" / "server.key_secret").exists():
        raise FileExistsError(f"{folder} already holds a server key; remove it first to make new keys")
    for sub in ("server", "allowed", "clients"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(folder / sub, 0o700)
    zmq.auth.create_certificates(folder / "server", "server")
    for c in clients:
        public, _ = zmq.auth.create_certificates(folder / "clients", c)
        shutil.copyfile(public, folder / "allowed" / f"{c}.key")
    for secret in folder.rglob("*.key_secret"):
        os.chmod(secret, 0o600)
    return folder


def _load(path: Path, secret: bool) -> tuple[bytes, bytes | None]:
    import zmq.auth

    if not path.is_file():
        raise FileNotFoundError(f"{path}: key file not found (make keys with `wmrl robot-keys --out KEYS`)")
    if secret and path.stat().st_mode & 0o077:
        raise PermissionError(f"{path}: a secret key readable by others is refused; chmod 600 it")
    try:
        public, sec = zmq.auth.load_certificate(path)
    except (ValueError, OSError, KeyError) as e:
        raise ValueError(f"{path}: not a CURVE key file ({e})") from None
    if secret and sec is None:
        raise ValueError(f"{path}: holds no secret key")
    return public, sec


def _host(address: str) -> str | None:
    scheme, _, rest = address.partition("://")
    if scheme != "tcp":
        return None  # ipc:// and inproc:// never leave the machine
    return rest.rsplit(":", 1)[0]


def check_bind(address: str, keys: Path | None, allow_remote: bool) -> None:
    host = _host(address)
    if host is None or host in LOOPBACK_HOSTS:
        return
    if not allow_remote:
        raise ValueError(f"{address} listens beyond this machine; the default is loopback only "
                         f"(pass --allow-remote, with --keys, to listen on {host})")
    if keys is None:
        raise ValueError(f"refusing to listen on {host} without authentication: make keys with "
                         f"`wmrl robot-keys --out KEYS` and pass --keys KEYS")


# ---------------------------------------------------------------------- the server loop
def _handle(obj: Any, methods: tuple[str, ...], body: list[bytes]) -> tuple[dict, bool]:
    """(reply, stop) for one request's frames; never raises."""
    if len(body) != 1:
        return {"error": f"bad request: exactly one frame expected, got {len(body)}"}, False
    try:
        req = unpack(body[0])
    except Exception as e:  # noqa: BLE001 - anything a hostile byte string can make msgpack raise
        return {"error": f"bad request: {type(e).__name__}: {e}"}, False
    if not isinstance(req, dict) or not isinstance(req.get("method"), str) or not isinstance(req.get("args", []), list):
        return {"error": "bad request: expected {'method': str, 'args': list}"}, False
    method, args = req["method"], req.get("args", [])
    if method == "shutdown":
        return {"ok": None}, True
    if method not in methods:
        return {"error": f"unknown method {method!r}; valid: {', '.join(methods)}"}, False
    try:
        return {"ok": getattr(obj, method)(*args)}, False
    except Exception as e:  # noqa: BLE001 - errors are returned, never raised across the wire
        return {"error": f"{type(e).__name__}: {e}"}, False


def serve(obj: Any, address: str, methods: tuple[str, ...] = ROBOT_METHODS, ready=None, keys: str | Path | None = None,
          allow_remote: bool = False, max_request_bytes: int = MAX_REQUEST_BYTES, tick: Callable[[], Any] | None = None,
          tick_s: float = 0.05) -> dict:
    """Answer requests until a "shutdown" request; `tick()` runs at least every `tick_s` (the watchdog). Returns
    counts of what arrived (requests, errors, dropped messages)."""
    keys = None if keys is None else Path(keys)
    check_bind(address, keys, allow_remote)
    ctx = zmq.Context()  # its own context: the authenticator must not apply to other sockets of the process
    auth = None
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_request_bytes)  # a bigger message closes that peer's connection
    if keys is not None:
        from zmq.auth.thread import ThreadAuthenticator

        public, secret = _load(keys / "server" / "server.key_secret", secret=True)
        if not (keys / "allowed").is_dir() or not any((keys / "allowed").glob("*.key")):
            raise FileNotFoundError(f"{keys / 'allowed'}: no client public keys allowed; nobody could connect")
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve(domain="*", location=str(keys / "allowed"))
        sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True
    counts = {"requests": 0, "errors": 0, "dropped": 0}
    try:
        sock.bind(address)
        if ready is not None:
            ready.set()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while True:
            if tick is not None:
                try:
                    tick()
                except Exception as e:  # noqa: BLE001 - the loop outlives a failing tick; it is logged
                    log.error("server tick failed: %s: %s", type(e).__name__, e)
            if not poller.poll(int(tick_s * 1000)):
                continue
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                counts["dropped"] += 1
                continue
            counts["requests"] += 1
            # ROUTER framing: [peer id, (b"" from REQ), body...]; reply along the same envelope
            split = frames.index(b"", 1) + 1 if b"" in frames[1:] else 1
            envelope, body = frames[:split], frames[split:]
            reply, stop = _handle(obj, methods, body)
            counts["errors"] += "error" in reply
            try:
                payload = pack(reply)
            except Exception as e:  # noqa: BLE001 - a result that cannot travel
                payload = pack({"error": f"reply could not be sent: {e}"})
            try:
                sock.send_multipart(envelope + [payload], zmq.NOBLOCK)
            except zmq.ZMQError as e:  # a vanished peer: nothing to answer, the loop goes on
                counts["dropped"] += 1
                log.warning("reply not delivered: %s", e)
            if stop:
                break
    finally:
        sock.close()
        if auth is not None:
            auth.stop()
        ctx.term()
    return counts


class RobotService:
    """What `serve_robot` exposes: the driver behind a server-side `SafeRobot`, so that limits, rate, workspace,
    gripper, finiteness, the stale-observation check and the watchdog hold where the arm is, whoever the client is."""

    def __init__(self, robot, safety=None, fk: Callable | None = None, clock: Callable[[], float] = time.monotonic):
        from real_robot.safety import SafeRobot

        self.safe = SafeRobot(robot, safety, fk=fk, clock=clock)
        self.connected = False

    def connect(self) -> None:
        if self.connected:  # a second client (or a reconnect): take the arm's pose as the held target again
            self.safe.resync()
            return
        self.safe.connect()
        self.connected = True

    def get_observation(self) -> dict:
        return self.safe.get_observation()

    def send_action(self, action) -> np.ndarray:
        if not self.connected:
            raise RuntimeError("connect() before send_action()")
        return self.safe.send_action(action).astype(np.float32)

    def reset_episode(self, seed: int | None = None) -> dict:
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32):
            raise ValueError(f"seed: an integer in [0, 2**32) or None, got {seed!r}")
        return self.safe.reset_episode(seed)

    def disconnect(self) -> None:
        if self.connected:
            self.connected = False
            self.safe.disconnect()

    def describe(self) -> dict:
        return {"action_dim": self.safe.dim, "safety": dataclasses.asdict(self.safe.cfg)}

    def trips(self, since: int = 0) -> list[dict]:
        return [dataclasses.asdict(t) for t in self.safe.trips[int(since):]]

    def tick(self) -> None:
        if self.connected:
            self.safe.check_watchdog()


def serve_robot(robot, address: str, safety=None, ready=None, keys: str | Path | None = None,
                allow_remote: bool = False, fk: Callable | None = None) -> dict:
    """Serve a robot driver with the safety layer in front of it (see `RobotService`)."""
    service = RobotService(robot, safety, fk=fk)
    try:
        return serve(service, address, ROBOT_METHODS, ready=ready, keys=keys, allow_remote=allow_remote,
                     tick=service.tick)
    finally:
        service.disconnect()


# ---------------------------------------------------------------------- the client
class RemoteRobot:
    """A robot in another process or on another machine. Timeouts, lost servers and replies that are not a valid
    answer raise ConnectionError (which `SafeRobot` turns into a latched e-stop); errors the server reports (a
    refused command) raise RuntimeError."""

    def __init__(self, address: str, timeout_s: float = 2.0, keys: str | Path | None = None, client: str = "client",
                 max_reply_bytes: int = 256 * 1024 * 1024):
        self.address, self.timeout_ms, self.max_reply_bytes = address, int(timeout_s * 1000), max_reply_bytes
        self._curve = None
        if keys is not None:
            keys = Path(keys)
            public, secret = _load(keys / "clients" / f"{client}.key_secret", secret=True)
            server_public, _ = _load(keys / "server" / "server.key", secret=False)
            self._curve = (public, secret, server_public)
        self._ctx = zmq.Context.instance()
        self._sock = None
        self.action_dim: int | None = None

    def _socket(self):
        if self._sock is None:
            self._sock = self._ctx.socket(zmq.REQ)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
            self._sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
            self._sock.setsockopt(zmq.MAXMSGSIZE, self.max_reply_bytes)
            if self._curve is not None:
                self._sock.curve_publickey, self._sock.curve_secretkey, self._sock.curve_serverkey = self._curve
            self._sock.connect(self.address)
        return self._sock

    def _lost(self, why: str):
        self.close()  # a REQ socket that missed its reply is unusable: start over next call
        return ConnectionError(f"{why} from the robot at {self.address}")

    def call(self, method: str, *args):
        sock = self._socket()
        try:
            sock.send(pack({"method": method, "args": list(args)}))
            frames = sock.recv_multipart()
        except zmq.Again:
            hint = "" if self._curve else "; if the server uses CURVE keys, pass --keys"
            raise self._lost(f"no reply within {self.timeout_ms} ms (calling {method}{hint})") from None
        except zmq.ZMQError as e:
            raise self._lost(f"transport error ({e}; calling {method})") from None
        try:
            if len(frames) != 1:
                raise ValueError(f"{len(frames)} frames")
            rep = unpack(frames[0])
            if not isinstance(rep, dict) or ("ok" not in rep and not isinstance(rep.get("error"), str)):
                raise ValueError("not a reply")
        except Exception as e:  # noqa: BLE001 - whatever a corrupt reply makes msgpack raise
            raise self._lost(f"bad reply ({type(e).__name__}: {e}; calling {method})") from None
        if "error" in rep:
            raise RuntimeError(f"robot at {self.address}: {rep['error']}")
        return rep["ok"]

    def connect(self) -> None:
        self.call("connect")
        d = self.call("describe")
        if not isinstance(d, dict) or not isinstance(d.get("action_dim"), int):
            raise self._lost("bad reply to describe")
        self.action_dim = d["action_dim"]

    def get_observation(self) -> dict:
        obs = self.call("get_observation")
        if not isinstance(obs, dict):
            raise self._lost(f"an observation that is not a dict ({type(obs).__name__})")
        return obs

    def send_action(self, action) -> np.ndarray:
        sent = self.call("send_action", np.asarray(action, np.float32))
        if not isinstance(sent, np.ndarray) or sent.dtype.kind not in "fiu":
            raise self._lost("a reply to send_action that is not a numeric array")
        return sent

    def reset_episode(self, seed: int | None = None) -> dict:
        return self.call("reset_episode", seed)

    def trips(self, since: int = 0) -> list[dict]:
        return self.call("trips", since)

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


__all__ = ["pack", "unpack", "serve", "serve_robot", "RobotService", "RemoteRobot", "make_keys",
           "check_bind", "ROBOT_METHODS"]
