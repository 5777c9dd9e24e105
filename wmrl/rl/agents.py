"""State-based agents behind one small interface, and their checkpoints.

Every agent is a `torch.nn.Module` with a dataclass `cfg` (holding obs_dim, act_dim and the action box) and
    update(batch: {obs, act, rew, next_obs, term} tensors) -> info      one gradient step
    actor                                                              a `Policy` (the evaluation loop runs it)
    q_values(obs, act) -> (N, B)                                       for Q-value diagnostics
    optimizers() -> {name: optimizer}                                  for resumable checkpoints
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from wmrl.core.checkpoint import load_state, read_config, resolve_checkpoint, save_pretrained
from wmrl.core.io import write_json
from wmrl.core.registry import Registry


AGENTS: Registry = Registry("agent")


def _register() -> None:
    from wmrl.rl.iql import IQL, IQLConfig
    from wmrl.rl.sac import SAC, SACConfig
    from wmrl.rl.td3bc import TD3BC, TD3BCConfig

    for name, pair in (("sac", (SAC, SACConfig)), ("td3bc", (TD3BC, TD3BCConfig)), ("iql", (IQL, IQLConfig))):
        if name not in AGENTS:
            AGENTS.register(name)(pair)


def agent_kinds() -> list[str]:
    """Every registered agent (`--algo` names of the offline and online trainers' networks)."""
    _register()
    return AGENTS.names()


def make_agent(kind: str, spaces: dict, **fields):
    _register()
    cls, cfg_cls = AGENTS.get(kind)
    return cls(cfg_cls(**spaces, **fields))


def agent_kind(agent) -> str:
    _register()
    for name in AGENTS.names():
        if isinstance(agent, AGENTS.get(name)[0]):
            return name
    raise ValueError(f"{type(agent).__name__} is not a registered agent")


def save_agent(agent, path: str | Path) -> Path:
    """The whole agent (actor, critics, targets, temperature) as safetensors + config.json + agent.json."""
    path = save_pretrained(agent, agent.cfg, path)
    write_json(Path(path) / "agent.json", {"kind": agent_kind(agent)})
    return path


def load_agent(path: str | Path, **overrides):
    """Load a saved agent; `overrides` change training-only fields (learning rates, utd, backup_entropy, ...)."""
    import json


    _register()
    path = resolve_checkpoint(path)
    meta = Path(path) / "agent.json"
    kind = json.loads(meta.read_text())["kind"] if meta.exists() else "sac"
    cls, cfg_cls = AGENTS.get(kind)
    cfg = read_config(path, cfg_cls, what=f"{kind} agent checkpoint")
    shape = {"obs_dim", "act_dim", "num_critics", "hidden", "layers", "layer_norm"}
    if bad := shape & set(overrides):
        raise ValueError(f"cannot override the network shape fields {sorted(bad)} when loading {path}")
    return load_state(cls(dataclasses.replace(cfg, **overrides)), path)


__all__ = ["AGENTS", "agent_kinds", "make_agent", "save_agent", "load_agent", "agent_kind"]
