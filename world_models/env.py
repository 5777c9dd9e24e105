"""`WorldModelEnv`: a learned world model behind gymnasium's VectorEnv API, so policies and the evaluation loop run in
imagination unchanged (RLinf's BaseWorldEnv / DIAMOND's WorldModelEnv, with WoVR's keyframe-initialised resets).

- `reset` draws start contexts from real episodes: the first frame (repeated as context), or with probability
  `keyframe_prob` a real mid-episode keyframe with its real preceding frames (WoVR's KIR). WoVR's keyframe rule is not
  public; here keyframes are drawn uniformly from the frames that have a full real context.
- `step` takes one action (B, A) or a whole chunk (B, h, A), h <= the model's chunk.
- Success: with a state channel and the task's `rules` (e.g. `sim.tabletop.tasks.success_and_reward`), the task's
  own definition applied to the predicted state (`success_source == "state"`); otherwise the success head on the
  generated latents reaching `success_threshold` (0.9) (`"frames"`). Success terminates the episode.
- Reward: `relative_success` (WoVR: the change in success probability, 0/1 on the state path) or `head` (the
  reward head's prediction; on the state path the task's shaped reward on predicted state).
- `info["task_reward"]` (state path): the task's dense reward on the predicted state, the best over the chunk,
  whatever the reward mode: how far an episode got (the evaluation loop's `progress`).
- `info["disagreement"]`: the state channel's ensemble spread of object positions (cm, max over the chunk): a
  hallucination flag. With `stop_cm` > 0 an episode whose chunk exceeds it is truncated there (`info["flagged"]`),
  and neither that chunk's reward nor a success in it counts: RL and ranking are not taught or scored by what the
  model cannot vouch for (a pessimism in the spirit of MOPO's uncertainty penalty).
- `state_readout`: what a rollout reports of the state channel's ensemble: `mean` (default), the members' average,
  or `member`, one member drawn per episode and followed for its whole length (PETS's TS-infinity), so each
  imagined episode is one consistent world. Measured on the scripted expert, 200 true starts: imagined success 46.5%
  (mean) and 43% (member) against 94% in the simulator (README, world-model section): the readout alone is not
  the gap (after state DAgger the member readout gains more than the mean). `consensus`: every step starts all members
  from their mean, so the ensemble steps as one model (`state_channel.READOUTS`).
- `object_noise` (std per object-channel dimension, metres): the observed `observation.environment_state` carries
  Gaussian noise of that size, the model's own state does not: a policy that perceives objects through an estimator
  meets the estimator's error in imagination as it will at deployment.
- Images are decoded only when `decode_images` is set (decoding is the costly part); otherwise observations carry
  `observation.state` and `task` only. Without images, with success from the task's rules and a state channel that
  predicts all of `observation.state`, no frames are generated at all (`frames` is False: ~10x fewer seconds per
  step on a CPU; the state trajectory is the same either way).
- Autoreset follows gymnasium's NEXT_STEP mode, like the true simulator's vector envs.
- `reset(options={"group_size": G})` gives each group of G consecutive envs the same start (GRPO's groups);
  `reset(options={"observations": obs})` starts from given observations (e.g. true-simulator resets, so that an
  imagined rollout can be replayed in the true simulator).
"""

from __future__ import annotations

import string
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from sim import success_and_reward
from wmrl.core.features import OBS_ENV_STATE, OBS_STATE
from world_models.video.model import VideoWorldModel, imagined_success
from world_models.video.state_channel import READOUTS
from world_models.video.train import load_split

STATE, ENV_STATE = OBS_STATE, OBS_ENV_STATE
TEXT_CHARSET = string.ascii_lowercase + string.digits + " '-,."  # every suite's instructions (LIBERO's too)


class WorldModelEnv(gym.vector.VectorEnv):
    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_fps": 10}

    def __init__(self, model: VideoWorldModel, starts, num_envs: int = 8, keyframe_prob: float = 0.0,
                 reward: str = "relative_success", success_threshold: float = 0.9, max_episode_steps: int = 80,
                 decode_images: bool = True, sampling_steps: int | None = None, action_low: float = -1.0,
                 action_high: float = 1.0, rules=None, stop_cm: float = 0.0, object_noise=None,
                 state_readout: str = "mean", sampler_seed: int = 0):
        if state_readout not in READOUTS:
            raise ValueError(f"state_readout: expected one of {READOUTS}, got {state_readout!r}")
        if reward not in ("relative_success", "head"):
            raise ValueError(f"reward: expected 'relative_success' or 'head', got {reward!r}")
        if not 0.0 <= keyframe_prob <= 1.0:
            raise ValueError(f"keyframe_prob must be in [0, 1], got {keyframe_prob}")
        if num_envs <= 0:
            raise ValueError(f"num_envs must be positive, got {num_envs}")
        if not stop_cm >= 0:
            raise ValueError(f"stop_cm must be >= 0 (0: off), got {stop_cm}")
        if stop_cm > 0 and (model.state_channel is None or model.cfg.state_members < 2):
            raise ValueError("stop_cm needs a world model whose state channel has 2+ members (their disagreement is "
                             "the flag); pass stop_cm=0")
        if sampler_seed < 0:
            raise ValueError(f"sampler_seed must be >= 0, got {sampler_seed}")
        self.stop_cm = stop_cm
        # another draw of the imagination's noise (the sampler's, the state channel's, a member or object-noise draw)
        # for the same reset seed; starts drawn from the replay change with it, given ones (`observations`) do not
        self.sampler_seed = int(sampler_seed)
        self.state_readout = state_readout if model.state_channel is not None else "mean"
        self.object_noise = None if object_noise is None or not len(object_noise) else np.asarray(object_noise, np.float32)
        if self.object_noise is not None and (self.object_noise.shape != (model.cfg.env_state_dim,)
                                              or not np.all(self.object_noise >= 0) or model.state_channel is None):
            raise ValueError(f"object_noise: expected {model.cfg.env_state_dim} stds >= 0 for a world model with a state "
                             f"channel, got shape {self.object_noise.shape}")
        self.model = model.eval()
        self.rules = rules if model.state_channel is not None else None
        self.success_source = "state" if self.rules is not None else "frames"
        self.starts = starts  # an EpisodeReplay of real episodes
        self.max_chunk = model.cfg.chunk  # `step` takes up to this many actions at once (chunked evaluation)
        if not starts.episodes:
            raise ValueError("starts: the replay of real episodes is empty")
        self.num_envs = num_envs
        self.keyframe_prob, self.reward_mode = keyframe_prob, reward
        self.success_threshold, self.max_episode_steps = success_threshold, max_episode_steps
        self.decode_images, self.sampling_steps = decode_images, sampling_steps
        # generate frames only when something reads them: images, or success from the frame head
        self.frames = decode_images or self.rules is None or not getattr(model, "frames_optional", False)
        cfg = model.cfg
        obs = {}
        if decode_images:
            for c in cfg.cameras:
                obs[f"observation.images.{c}"] = spaces.Box(0, 255, (cfg.image_size, cfg.image_size, 3), np.uint8)
        obs[STATE] = spaces.Box(-np.inf, np.inf, (cfg.state_dim,), np.float32)
        if model.state_channel is not None:  # predicted by the state channel (scripted policies act on it)
            obs[ENV_STATE] = spaces.Box(-np.inf, np.inf, (cfg.env_state_dim,), np.float32)
        obs["task"] = spaces.Text(max_length=160, min_length=1, charset=TEXT_CHARSET)
        self.single_observation_space = spaces.Dict(obs)
        self.single_action_space = spaces.Box(action_low, action_high, (cfg.action_dim,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._rng = np.random.default_rng()
        self._gen = torch.Generator(device=model.device)
        # the state channel's sampled contacts draw from their own stream, so whether frames are generated (which
        # draws noise) does not change the state trajectory
        self._state_gen = torch.Generator(device=model.device)
        self._state: dict | None = None
        self._t = np.zeros(num_envs, np.int64)
        self._p = np.zeros(num_envs)
        self._env_state = np.zeros((num_envs, cfg.env_state_dim), np.float32)
        self._needs_reset = np.zeros(num_envs, bool)
        self.start_info: list[dict] = [{} for _ in range(num_envs)]
        self._last_frames: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ starts
    def _draw_start(self) -> tuple[dict, dict]:
        eids = list(self.starts.episodes)
        e = eids[self._rng.integers(len(eids))]
        lo, T = self.starts.episodes[e]
        K = self.model.cfg.context
        keyframe = self._rng.random() < self.keyframe_prob and T - 1 > K - 1
        t = int(self._rng.integers(K - 1, T - 1)) if keyframe else 0
        idx = np.arange(t - K + 1, t + 1).clip(0) + lo  # before the first frame: repeat it
        d = self.starts.data
        obs = {f"observation.images.{c}": d[f"observation.images.{c}"][idx] for c in self.model.cfg.cameras}
        obs[STATE] = d[STATE][lo + t]
        if ENV_STATE in d:
            obs[ENV_STATE] = d[ENV_STATE][lo + t]
        obs["task"] = self.starts.vocab["task"][d["task"][lo + t]]
        for c in self.model.cfg.cameras:  # the scene anchor: the episode's first frame
            obs[f"anchor.{c}"] = d[f"observation.images.{c}"][lo]
        return obs, {"episode": int(e), "frame": t, "keyframe": bool(keyframe)}

    def _given_starts(self, obs: dict) -> list[tuple[dict, dict]]:
        """Start contexts from observations the caller provides, e.g. true-simulator resets (B == num_envs)."""
        K = self.model.cfg.context
        out = []
        for i in range(self.num_envs):
            o = {}
            for c in self.model.cfg.cameras:
                img = np.asarray(obs[f"observation.images.{c}"][i])
                o[f"observation.images.{c}"] = np.repeat(img[None], K, 0) if img.ndim == 3 else img[-K:]
            o[STATE] = np.asarray(obs[STATE][i], np.float32)
            if ENV_STATE in obs:
                o[ENV_STATE] = np.asarray(obs[ENV_STATE][i], np.float32)
            o["task"] = obs["task"][i] if not isinstance(obs["task"], str) else obs["task"]
            out.append((o, {"episode": -1, "frame": 0, "keyframe": False}))
        return out

    @torch.no_grad()
    def _reset_envs(self, ids: np.ndarray, starts: list | None = None) -> None:
        starts = starts if starts is not None else [self._draw_start() for _ in ids]
        batch = {k: np.stack([s[0][k] for s in starts]) for k in starts[0][0] if k != "task" and not k.startswith("anchor.")}
        batch["task"] = [s[0]["task"] for s in starts]
        anchor = None
        if all(f"anchor.{c}" in s[0] for s in starts for c in self.model.cfg.cameras):
            anchor = {f"observation.images.{c}": np.stack([s[0][f"anchor.{c}"] for s in starts]) for c in self.model.cfg.cameras}
        new = self.model.encode(batch, anchor=anchor)
        if self.state_readout == "member":  # one member per episode, drawn at its start
            new["member"] = torch.as_tensor(self._rng.integers(self.model.cfg.state_members, size=len(ids)),
                                            device=self.model.device)
        elif self.state_readout == "consensus":  # the members stepped from their mean state
            new["consensus"] = torch.ones(len(ids), dtype=torch.bool, device=self.model.device)
        if self._state is None:
            self._state = new
        else:
            self._state.pop("base_correction", None)  # the decode's memo of the old starts (`VideoWorldModel.decode`)
            idx = torch.as_tensor(ids)
            for k, v in new.items():
                if k == "task":
                    for j, i in enumerate(ids):
                        self._state["task"][i] = v[j]
                elif k == "x":  # (members, B, D)
                    self._state[k][:, idx] = v
                elif k == "frames0":  # {camera: uint8 (B, H, W, 3)}
                    for c, f in v.items():
                        self._state[k][c][ids] = f
                else:
                    self._state[k][idx] = v
        with torch.no_grad():
            heads = self.model.heads(new["ctx"][:, -1], self.model.task(new["task"]))
        self._p[ids] = torch.sigmoid(heads["success_logit"]).cpu().numpy()
        if self.model.state_channel is not None:
            self._env_state[ids] = np.asarray(batch[ENV_STATE], np.float32)
            if self.rules is not None:
                self._p[ids] = self.rules(batch["task"], batch[STATE][:, list(self.model.cfg.ee_index)],
                                          batch[STATE][:, self.model.cfg.gripper_index], batch[ENV_STATE])[0]
        self._t[ids] = 0
        for j, i in enumerate(ids):
            self.start_info[i] = starts[j][1]
            for k in batch:
                if k.startswith("observation.images."):
                    self._last_frames.setdefault(k, np.zeros((self.num_envs, *batch[k].shape[2:]), np.uint8))
                    self._last_frames[k][i] = batch[k][j, -1]

    def _obs(self) -> dict:
        obs = {}
        if self.decode_images:
            obs.update({k: v.copy() for k, v in self._last_frames.items()})
        obs[STATE] = self._state["proprio"].cpu().numpy().astype(np.float32)
        if self.model.state_channel is not None:  # without one nothing predicts it (and the space has no entry)
            obs[ENV_STATE] = self._env_state.copy()
            if self.object_noise is not None:
                obs[ENV_STATE] += (self._rng.standard_normal(obs[ENV_STATE].shape) * self.object_noise).astype(np.float32)
        obs["task"] = tuple(self._state["task"])
        return obs

    @property
    def predicted_environment_state(self) -> np.ndarray:
        """The state channel's prediction of `observation.environment_state` (num_envs, D) as it stands, before the
        `object_noise` the observations carry (what a measurement of the imagined scene should read)."""
        return self._env_state.copy()

    # ------------------------------------------------------------------ VectorEnv API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            if self.sampler_seed:  # the same starts (the caller's seed), other noise
                seed = int(np.random.SeedSequence([seed, self.sampler_seed]).generate_state(1)[0])
            self._rng = np.random.default_rng(seed)
            self._gen.manual_seed(seed)
            self._state_gen.manual_seed(seed + 1)
        options = options or {}
        unknown = set(options) - {"group_size", "observations"}
        if unknown:
            raise ValueError(f"reset options: unknown {sorted(unknown)}; valid: group_size, observations")
        starts = None
        if "observations" in options:
            starts = self._given_starts(options["observations"])
        elif options.get("group_size", 1) > 1:  # GRPO: groups of G envs share one start
            G = int(options["group_size"])
            if self.num_envs % G:
                raise ValueError(f"group_size {G} does not divide num_envs {self.num_envs}")
            starts = [s for s in (self._draw_start() for _ in range(self.num_envs // G)) for _ in range(G)]
        self._state = None
        self._needs_reset[:] = False
        self._reset_envs(np.arange(self.num_envs), starts)
        return self._obs(), {"success": np.zeros(self.num_envs, bool), "keyframe": np.array([s["keyframe"] for s in self.start_info])}

    def step(self, actions):
        a = np.asarray(actions, dtype=np.float32)
        if a.ndim == 2:
            a = a[:, None]
        A = self.model.cfg.action_dim
        if a.ndim != 3 or a.shape[0] != self.num_envs or a.shape[2] != A or not 1 <= a.shape[1] <= self.model.cfg.chunk:
            raise ValueError(f"actions: expected ({self.num_envs}, {A}) or ({self.num_envs}, h<={self.model.cfg.chunk}, {A}), "
                             f"got {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError("actions: contain NaN or inf")
        a = np.clip(a, self.single_action_space.low, self.single_action_space.high)
        resetting = np.flatnonzero(self._needs_reset)
        kw = {} if self.frames else {"frames": False}
        self._state, preds = self.model.step(self._state, torch.from_numpy(a), steps=self.sampling_steps,
                                             generator=self._gen, state_generator=self._state_gen, **kw)
        ok = imagined_success(self.model, preds, self._state["task"], self.rules, self.success_threshold)  # (B, h)
        p = ok.astype(np.float64) if self.rules is not None else preds["success"].cpu().numpy()
        task_reward = None
        if self.rules is not None:  # the task's dense reward on the predicted state, every step of the chunk
            B, h = ok.shape
            task_reward = self.rules([t for t in self._state["task"] for _ in range(h)],
                                     preds["ee"].cpu().numpy().reshape(B * h, 3),
                                     preds["gripper_opening"].cpu().numpy().reshape(-1),
                                     preds[ENV_STATE].cpu().numpy().reshape(B * h, -1))[1].reshape(B, h)
        if self.reward_mode == "relative_success":
            reward = p[:, -1] - self._p
        elif task_reward is not None:
            reward = task_reward.sum(axis=1)
        else:
            reward = preds["reward"].sum(dim=1).cpu().numpy()
        success = ok.any(axis=1)
        self._p = p[:, -1].copy()
        if ENV_STATE in preds:
            self._env_state = preds[ENV_STATE][:, -1].cpu().numpy().astype(np.float32)
        self._t += a.shape[1]
        if self.decode_images:
            frames = self.model.decode(preds["latents"][:, -1], self._state, preds["pose"][:, -1],
                                       preds["points"][:, -1] if "points" in preds else None)
            for k, v in frames.items():
                self._last_frames[k] = v
        dis = preds["disagreement"].max(dim=1).values.cpu().numpy() if "disagreement" in preds else None
        flagged = dis > self.stop_cm if self.stop_cm > 0 else np.zeros(self.num_envs, bool)
        success &= ~flagged
        reward = np.where(flagged, 0.0, reward)
        if task_reward is not None:
            task_reward = np.where(flagged, 0.0, task_reward.max(axis=1))
        terminated = success.copy()
        truncated = ~terminated & ((self._t >= self.max_episode_steps) | flagged)
        if len(resetting):  # NEXT_STEP autoreset: these envs ignore the action and start a new episode
            self._reset_envs(resetting)
            reward[resetting], terminated[resetting], truncated[resetting], success[resetting] = 0.0, False, False, False
            flagged[resetting] = False
            if task_reward is not None:
                task_reward[resetting] = 0.0
        self._needs_reset = terminated | truncated
        info = {"success": success, "success_prob": p[:, -1], "step": self._t.copy(), "flagged": flagged}
        if dis is not None:
            info["disagreement"] = dis
        if task_reward is not None:
            info["task_reward"] = task_reward
        return self._obs(), reward.astype(np.float64), terminated, truncated, info


class WorldModelSingleEnv(gym.Env):
    """One-env view of `WorldModelEnv` (for `check_env` and single-env code)."""

    def __init__(self, model: VideoWorldModel, starts, **kwargs):
        self.venv = WorldModelEnv(model, starts, num_envs=1, **kwargs)
        self.observation_space = self.venv.single_observation_space
        self.action_space = self.venv.single_action_space
        self.metadata = {"render_modes": []}

    @staticmethod
    def _one(obs: dict) -> dict:
        return {k: (v[0] if k != "task" else v[0]) for k, v in obs.items()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        obs, info = self.venv.reset(seed=seed if seed is not None else int(self.np_random.integers(2**31)))
        return self._one(obs), {k: v[0] for k, v in info.items()}

    def step(self, action):
        obs, r, term, trunc, info = self.venv.step(np.asarray(action, dtype=np.float32)[None])
        return self._one(obs), float(r[0]), bool(term[0]), bool(trunc[0]), {k: v[0] for k, v in info.items()}


def require_success_head(model) -> None:
    if not getattr(model, "has_success_head", False):
        raise ValueError(f"{type(model).__name__}: this world model has no success head, so imagined episodes cannot "
                         "be scored (reward, success); train one with heads (`wmrl train-wm`)")


def make_imagination_env(model, data: Path, num_envs: int, max_steps: int, keyframe_prob: float = 0.0,
                         success_threshold: float = 0.9, sampling_steps: int | None = 1, stop_cm: float = 0.0,
                         decode_images: bool = True, object_noise=None, state_readout: str = "mean",
                         sampler_seed: int = 0):
    require_success_head(model)
    _, train, _ = load_split(data, holdout=0.0)
    return WorldModelEnv(model, train, num_envs=num_envs, keyframe_prob=keyframe_prob, max_episode_steps=max_steps,
                         success_threshold=success_threshold, sampling_steps=sampling_steps, decode_images=decode_images,
                         rules=success_and_reward,  # success from the task's rules where the model has a state channel
                         stop_cm=stop_cm, object_noise=object_noise, state_readout=state_readout,
                         sampler_seed=sampler_seed)
