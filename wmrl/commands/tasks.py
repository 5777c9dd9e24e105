"""`wmrl tasks [--json]`: list the registered tasks."""

from __future__ import annotations

import json
from dataclasses import dataclass

import sim


@dataclass
class TasksConfig:
    json: bool = False
    """Print the task list as JSON."""


def tasks(cfg: TasksConfig) -> dict:
    ids = sim.env_ids()
    if cfg.json:
        print(json.dumps(ids))
    else:
        for i in ids:
            print(i)
    return {"tasks": ids}
