"""The in-memory episode: one dict of arrays with a leading time axis, shared by the dataset writer, the replay
buffer and the evaluation loop.

An episode of T environment steps holds T+1 frames (RLDS's layout, in LeRobot's names): frame t < T holds the
observation o_t, the action a_t taken from it and what that step returned (`next.reward`, `next.terminated`, ...).
The final frame holds o_T, the observation the last action led to (for a success, the frame that shows it); it has
`is_last` set, its action repeats a_{T-1} (padding with the last real action, never zeros) and its reward is 0.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from wmrl.core.features import (ACTION, DONE, INTERVENTION, IS_LAST, POLICY_ID, REWARD, SOURCE, SOURCES, SUCCESS,
                                TASK, TERMINATED, TRUNCATED, is_image_key)

STEP_FEATURES = {
    ACTION: None,  # shape from the env
    REWARD: {"dtype": "float32", "shape": [1], "names": None},
    DONE: {"dtype": "bool", "shape": [1], "names": None},
    TERMINATED: {"dtype": "bool", "shape": [1], "names": None},
    TRUNCATED: {"dtype": "bool", "shape": [1], "names": None},
    SUCCESS: {"dtype": "bool", "shape": [1], "names": None},
    IS_LAST: {"dtype": "bool", "shape": [1], "names": None},
    SOURCE: {"dtype": "string", "shape": [1], "names": None},
    INTERVENTION: {"dtype": "bool", "shape": [1], "names": None},
    POLICY_ID: {"dtype": "string", "shape": [1], "names": None},
}


def build_episode(observations: Sequence[dict[str, Any]], actions: Sequence[np.ndarray], rewards: Sequence[float],
                  terminated: Sequence[bool], truncated: Sequence[bool], successes: Sequence[bool],
                  source: str = "policy", policy_id: str = "", intervention: Sequence[bool] | None = None,
                  extras: dict[str, Sequence[np.ndarray]] | None = None) -> dict[str, Any]:
    """Assemble T steps (T+1 observations) into the episode dict. `extras` are per-observation arrays (T+1), e.g.
    the simulator's qpos/qvel."""
    T = len(actions)
    if T == 0:
        raise ValueError("an episode needs at least one step")
    if len(observations) != T + 1:
        raise ValueError(f"observations: expected T+1 = {T + 1} (one more than actions), got {len(observations)}")
    for name, seq in (("rewards", rewards), ("terminated", terminated), ("truncated", truncated), ("successes", successes)):
        if len(seq) != T:
            raise ValueError(f"{name}: expected {T} entries (one per action), got {len(seq)}")
    if source not in SOURCES:
        raise ValueError(f"source: expected one of {SOURCES}, got {source!r}")
    ep: dict[str, Any] = {}
    for k in observations[0]:
        if k == TASK:
            ep[TASK] = [o[TASK] for o in observations]
        else:
            ep[k] = np.stack([np.asarray(o[k]) for o in observations])
    acts = np.stack([np.asarray(a, dtype=np.float32) for a in actions])
    ep[ACTION] = np.concatenate([acts, acts[-1:]])
    ep[REWARD] = np.append(np.asarray(rewards, dtype=np.float32), 0.0).astype(np.float32)
    term = np.asarray(terminated, dtype=bool)
    trunc = np.asarray(truncated, dtype=bool)
    ep[TERMINATED] = np.append(term, term[-1])
    ep[TRUNCATED] = np.append(trunc, trunc[-1])
    ep[DONE] = np.append(term | trunc, True)
    ep[SUCCESS] = np.append(np.asarray(successes, dtype=bool), bool(successes[-1]))
    ep[IS_LAST] = np.append(np.zeros(T, bool), True)
    ep[SOURCE] = [source] * (T + 1)
    ep[POLICY_ID] = [policy_id] * (T + 1)
    iv = np.zeros(T, bool) if intervention is None else np.asarray(intervention, dtype=bool)
    ep[INTERVENTION] = np.append(iv, iv[-1])
    for k, seq in (extras or {}).items():
        if len(seq) != T + 1:
            raise ValueError(f"{k}: expected T+1 = {T + 1} entries (one per observation), got {len(seq)}")
        ep[k] = np.stack([np.asarray(x) for x in seq])
    return ep


def episode_length(ep: dict[str, Any]) -> int:
    """Number of frames (T+1 for an episode built here)."""
    return len(ep[ACTION])


def features_for(ep: dict[str, Any], fps: int | None = None) -> dict[str, dict]:
    """LeRobot feature specs for an episode dict (images become videos)."""
    feats = {}
    for k, v in ep.items():
        if k == TASK:
            continue
        if isinstance(v, list):
            feats[k] = {"dtype": "string", "shape": [1], "names": None}
        elif is_image_key(k):
            feats[k] = {"dtype": "video", "shape": list(v.shape[1:]), "names": ["height", "width", "channels"]}
        else:
            dtype = "bool" if v.dtype == bool else ("int64" if np.issubdtype(v.dtype, np.integer) else "float32")
            shape = list(v.shape[1:]) or [1]
            feats[k] = {"dtype": dtype, "shape": shape, "names": None}
    return feats
