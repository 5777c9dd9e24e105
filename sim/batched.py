"""A vector env for many envs on a few cores: K worker processes, each stepping its slice of the envs synchronously.

gymnasium's `AsyncVectorEnv` starts one process per env, which stops scaling long before the 1,000 envs of a
large-batch RL iteration (and costs a process each); one `SyncVectorEnv` uses one core. `BatchedVectorEnv` sits
between: envs 0..N-1 are split into K contiguous slices, worker k holds a `SyncVectorEnv` of its slice, and a step
sends every worker its actions before waiting for any. Semantics are the synchronous env's (NEXT_STEP autoreset),
so the same seeds and actions give the same observations, rewards and infos as `SyncVectorEnv` (tested).
"""

from __future__ import annotations

import multiprocessing as mp
import traceback

import gymnasium as gym
import numpy as np


def _worker(conn, task: str, num_envs: int, kwargs: dict) -> None:
    import sim

    try:
        env = sim.make_vector_env(task, num_envs, asynchronous=False, **kwargs)
    except Exception:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
        conn.close()
        return
    conn.send(("ok", (env.single_observation_space, env.single_action_space, env.metadata)))
    while True:
        cmd, arg = conn.recv()
        try:
            if cmd == "reset":
                out = env.reset(seed=arg[0], options=arg[1])
            elif cmd == "step":
                out = env.step(arg)
            elif cmd == "close":
                env.close()
                conn.send(("ok", None))
                break
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(("ok", (out, sim.true_steps_taken())))
        except Exception:  # noqa: BLE001
            conn.send(("error", traceback.format_exc()))
    conn.close()


def _concat(parts: list):
    if isinstance(parts[0], tuple):  # e.g. the 'task' strings
        return tuple(x for p in parts for x in p)
    return np.concatenate(parts, axis=0)


def _merge_infos(infos: list[dict], sizes: list[int]) -> dict:
    """Concatenate the workers' vector infos; a key one worker lacks is zero there, with its `_key` mask False."""
    keys = list(dict.fromkeys(k for i in infos for k in i))
    out = {}
    for k in keys:
        ref = next(i[k] for i in infos if k in i)
        if isinstance(ref, dict):
            out[k] = _merge_infos([i.get(k, {}) for i in infos], sizes)
            continue
        ref = np.asarray(ref)
        out[k] = np.concatenate([np.asarray(i[k]) if k in i else np.zeros((n,) + ref.shape[1:], ref.dtype)
                                 for i, n in zip(infos, sizes)], axis=0)
    return out


class BatchedVectorEnv(gym.vector.VectorEnv):
    """`num_envs` envs of `task` in `workers` processes (see the module's docstring); `**kwargs` go to each env."""

    def __init__(self, task: str, num_envs: int, workers: int, **kwargs):
        if not 1 <= workers <= num_envs:
            raise ValueError(f"workers must be in [1, num_envs={num_envs}], got {workers}")
        self.num_envs = num_envs
        base, extra = divmod(num_envs, workers)
        self.sizes = [base + (k < extra) for k in range(workers)]
        import sim  # the package's __init__; this module is imported from it only lazily

        ctx = mp.get_context(sim.worker_start_method())
        self._conns, self._procs, self._steps = [], [], [0] * workers
        for n in self.sizes:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child, task, n, kwargs), daemon=True)
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)
        self.closed = False
        try:
            obs_space, act_space, metadata = self._gather()[0]
        except Exception:
            self.close(terminate=True)
            raise
        self.single_observation_space, self.single_action_space = obs_space, act_space
        self.observation_space = gym.vector.utils.batch_space(obs_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(act_space, num_envs)
        self.metadata = dict(metadata)

    def _gather(self) -> list:
        replies = [c.recv() for c in self._conns]
        errors = [r[1] for r in replies if r[0] == "error"]
        if errors:
            raise RuntimeError("a BatchedVectorEnv worker failed:\n" + errors[0])
        return [r[1] for r in replies]

    def _slices(self):
        start = 0
        for n in self.sizes:
            yield slice(start, start + n)
            start += n

    def _merge(self, outs: list) -> list:
        results = [o for o, _ in outs]
        self._steps = [s for _, s in outs]
        merged = []
        for j in range(len(results[0])):
            parts = [r[j] for r in results]
            if isinstance(parts[0], dict) and j == len(results[0]) - 1:  # the info dict
                merged.append(_merge_infos(parts, self.sizes))
            elif isinstance(parts[0], dict):  # a dict observation
                merged.append({k: _concat([p[k] for p in parts]) for k in parts[0]})
            else:
                merged.append(_concat(parts))
        return merged

    def reset(self, *, seed=None, options=None):
        if seed is None or isinstance(seed, (int, np.integer)):
            seeds = [None] * self.num_envs if seed is None else [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset: {len(seeds)} seeds for {self.num_envs} envs")
        for c, s in zip(self._conns, self._slices()):
            c.send(("reset", (seeds[s], options)))
        obs, info = self._merge(self._gather())
        return obs, info

    def step(self, actions):
        actions = np.asarray(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"step: {len(actions)} actions for {self.num_envs} envs")
        for c, s in zip(self._conns, self._slices()):
            c.send(("step", actions[s]))
        obs, reward, term, trunc, info = self._merge(self._gather())
        return obs, reward, term, trunc, info

    def true_steps_taken(self) -> int:
        """Simulator steps the workers have taken (`sim.true_steps_taken` counts this process only)."""
        return int(sum(self._steps))

    def close(self, terminate: bool = False, **kwargs) -> None:
        if getattr(self, "closed", True):
            return
        self.closed = True
        for c, p in zip(self._conns, self._procs):
            try:
                if not terminate and p.is_alive():
                    c.send(("close", None))
                    c.recv()
            except (BrokenPipeError, EOFError, OSError):
                pass
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
            c.close()
