"""Shared offline-RL data: one small point-task dataset per test session."""

import pytest

ENV = "PointEdge-v0"


@pytest.fixture(scope="session")
def point_data(tmp_path_factory):
    """3,000 transitions of the point task, 70% random policy and 30% from a briefly trained SAC ("mixed"), with
    qpos/qvel and reference returns."""
    from wmrl.rl.d4rl import MakeDatasetConfig, make_dataset

    root = tmp_path_factory.mktemp("offline")
    res = make_dataset(MakeDatasetConfig(env=ENV, kind="mixed", out=root / "data", transitions=3000, sac_steps=2500,
                                         expert_fraction=0.3,
                                         sac_hidden=32, cache=root / "cache", progress=False, reference_episodes=20))
    return root / "data", res
