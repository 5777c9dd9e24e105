"""Replay buffer: wmrl's EpisodeReplay against torchrl's ReplayBuffer (LazyTensorStorage + RandomSampler for
transitions, + SliceSampler for windows), same data, same run. Two 64x64 cameras per frame."""

from __future__ import annotations

import time

import numpy as np

from wmrl.benchutil import finish, median_time


def _episode(T: int, rng, start: int) -> dict:
    return {
        "observation.images.front": rng.integers(0, 255, (T, 64, 64, 3), dtype=np.uint8),
        "observation.images.wrist": rng.integers(0, 255, (T, 64, 64, 3), dtype=np.uint8),
        "observation.state": rng.normal(size=(T, 8)).astype(np.float32),
        "action": rng.normal(size=(T, 4)).astype(np.float32),
        "next.reward": rng.normal(size=T).astype(np.float32),
        "next.terminated": np.zeros(T, bool),
        "next.truncated": np.zeros(T, bool),
        "is_last": np.arange(T) == T - 1,
    }


def main(quick: bool = False) -> dict:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers.samplers import RandomSampler, SliceSampler

    from wmrl.replay import EpisodeReplay

    torch.set_num_threads(1)
    T, n_eps = 50, (8 if quick else 200)  # 10,000 frames at full size
    reps = 5 if quick else 30
    rng = np.random.default_rng(0)
    eps = [_episode(T, rng, i * T) for i in range(n_eps)]
    N = T * n_eps
    raw_bytes_per_frame = 2 * 64 * 64 * 3

    # ---- wmrl
    ours = EpisodeReplay(N)
    t = time.perf_counter()
    for ep in eps:
        ours.add_episode(ep)
    ours_insert = N / (time.perf_counter() - t)
    ours.sample(8)  # builds the index once, as the first real sample would
    ours_sample = median_time(lambda: ours.sample(256), reps)
    ours_window = median_time(lambda: ours.sample_windows(32, 16), reps)
    held = []  # a loop that keeps every batch alive: no output can be recycled, every sample faults in new pages
    ours_sample_held = median_time(lambda: held.append(ours.sample(256)), reps)
    held.clear()
    ours_bytes = ours.nbytes

    # ---- torchrl: transitions carry their next observation (torchrl's layout), windows use frames + SliceSampler
    def td_transitions(ep):
        n = len(ep["action"]) - 1
        obs = {k: torch.from_numpy(ep[k][:n]) for k in ("observation.images.front", "observation.images.wrist", "observation.state")}
        nxt = {k: torch.from_numpy(ep[k][1 : n + 1]) for k in obs}
        return TensorDict({**obs, "action": torch.from_numpy(ep["action"][:n]),
                           "next": TensorDict({**nxt, "reward": torch.from_numpy(ep["next.reward"][:n]),
                                               "terminated": torch.from_numpy(ep["next.terminated"][:n]),
                                               "truncated": torch.from_numpy(ep["next.truncated"][:n])}, [n])}, [n])

    trl = ReplayBuffer(storage=LazyTensorStorage(N), sampler=RandomSampler(), batch_size=256)
    tds = [td_transitions(ep) for ep in eps]
    t = time.perf_counter()
    for td in tds:
        trl.extend(td)
    trl_insert = sum(td.batch_size[0] for td in tds) / (time.perf_counter() - t)
    trl_sample = median_time(lambda: trl.sample(), reps)
    held = []
    trl_sample_held = median_time(lambda: held.append(trl.sample()), reps)
    held.clear()
    trl_bytes = sum(x.nbytes for x in trl.storage._storage.values(include_nested=True, leaves_only=True))

    def td_frames(ep, i):
        return TensorDict({**{k: torch.from_numpy(ep[k]) for k in ("observation.images.front", "observation.images.wrist",
                                                                  "observation.state", "action")},
                           "episode": torch.full((len(ep["action"]),), i)}, [len(ep["action"])])

    trl_w = ReplayBuffer(storage=LazyTensorStorage(N), sampler=SliceSampler(slice_len=16, traj_key="episode"),
                         batch_size=32 * 16)
    for i, ep in enumerate(eps):
        trl_w.extend(td_frames(ep, i))
    trl_window = median_time(lambda: trl_w.sample(), reps)

    result = {
        "frames": N,
        "insert_transitions_per_s": ours_insert, "torchrl_insert_transitions_per_s": trl_insert,
        "sample_256_per_s": 256 / ours_sample, "torchrl_sample_256_per_s": 256 / trl_sample,
        "window_32x16_per_s": 1 / ours_window, "torchrl_window_32x16_per_s": 1 / trl_window,
        "sample_256_batches_kept_per_s": 256 / ours_sample_held,
        "sample_ratio_vs_torchrl": trl_sample / ours_sample,
        "window_sample_ratio_vs_torchrl": trl_window / ours_window,
        "sample_ratio_vs_torchrl_batches_kept": trl_sample_held / ours_sample_held,
        "insert_ratio_vs_torchrl": ours_insert / trl_insert,
        "bytes_per_frame": ours_bytes / N, "torchrl_bytes_per_frame": trl_bytes / N,
        "bytes_per_frame_ratio": ours_bytes / N / raw_bytes_per_frame,
        "torchrl_bytes_per_frame_ratio": trl_bytes / N / raw_bytes_per_frame,
        "units": "transitions/s for insert and sample; windows batches/s; medians over repeats",
        "note": "outputs are recycled once the caller drops a batch; *_batches_kept: the caller keeps every batch",
    }
    return finish("replay", result, quick)
