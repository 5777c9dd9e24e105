"""Feature names shared by every part of wmrl. They are LeRobot's, so users' data and habits carry over."""

from __future__ import annotations

OBS_IMAGES = "observation.images"  # + ".<camera>": uint8 (H, W, 3)
OBS_STATE = "observation.state"  # float32 proprioception
OBS_ENV_STATE = "observation.environment_state"  # float32 privileged simulator state (scripted experts, critics)
TASK = "task"  # str language instruction
ACTION = "action"  # float32 (A,)
REWARD = "next.reward"
DONE = "next.done"
TERMINATED = "next.terminated"
TRUNCATED = "next.truncated"
SUCCESS = "next.success"
IS_LAST = "is_last"  # RLDS's name: the frame holds the final observation and no step is taken from it
SOURCE = "source"
INTERVENTION = "intervention"
POLICY_ID = "policy_id"

SOURCES = ("expert", "policy", "human", "world_model", "twin")

# Per-frame bookkeeping columns of LeRobot v3 (every dataset has them).
INDEX_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")


def image_key(camera: str) -> str:
    return f"{OBS_IMAGES}.{camera}"


def camera_of(key: str) -> str:
    return key[len(OBS_IMAGES) + 1 :]


def is_image_key(key: str) -> bool:
    return key.startswith(OBS_IMAGES + ".")


def check_spaces(want: dict, action_dim: int, observation_space, action_space, what: str = "policy",
                 noun: str = "policy") -> None:
    """Refuse, at start, an environment (true or imagined) whose observation shapes (`want`: key -> shape) or action
    size a policy cannot use; both specs are printed. A space given as None is not checked."""
    have = {k: tuple(getattr(v, "shape", None) or ()) for k, v in getattr(observation_space, "spaces", {}).items()}
    bad = observation_space is not None and any(have.get(k) != tuple(s) for k, s in want.items())
    bad |= action_space is not None and tuple(action_space.shape) != (action_dim,)
    if bad:
        raise ValueError(f"{what} and environment do not match.\n  {noun} expects observations {want}, actions "
                         f"({action_dim},)\n  environment gives observations {have}, actions "
                         f"{None if action_space is None else tuple(action_space.shape)}")
