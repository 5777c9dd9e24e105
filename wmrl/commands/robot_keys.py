"""`wmrl robot-keys`: CURVE key pairs for an authenticated robot link.

    wmrl robot-keys --out keys --clients lab-pc,laptop
    wmrl serve-robot --keys keys --address tcp://0.0.0.0:5599 --allow-remote      (on the robot's machine)
    wmrl deploy --robot tcp://ROBOT:5599 --keys keys --client lab-pc                (on a client)

Writes keys/server/ (the server's pair), keys/allowed/ (the client public keys the server accepts) and
keys/clients/ (each client's pair); secret files get mode 0600. Give a client machine its own pair and
server/server.key, never the server's secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from real_robot.transport import make_keys


@dataclass
class RobotKeysConfig:
    out: Path = Path("keys")
    clients: tuple[str, ...] = ("client",)
    """names of the client key pairs to make (each is allowed by the server)"""


def robot_keys(cfg: RobotKeysConfig) -> dict:
    folder = make_keys(cfg.out, tuple(cfg.clients))
    return {"keys": str(folder), "server_public": str(folder / "server" / "server.key"),
            "clients": {c: str(folder / "clients" / f"{c}.key_secret") for c in cfg.clients}}


__all__ = ["RobotKeysConfig", "robot_keys"]
