import os

os.environ.setdefault("MUJOCO_GL", "egl")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on two cores: each torch keeps one thread (two at two threads each oversubscribe
    # the cores, and OpenMP's spinning made some tests 10-20x slower). Set before torch is imported.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")

import pytest

from tests.helpers import make_episode, tiny_wm_config


@pytest.fixture
def episode_factory():
    return make_episode


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """8 push-red episodes, half of them near-successes (shared by world-model, policy and RL tests)."""
    from wmrl.commands.collect import CollectConfig, collect

    out = tmp_path_factory.mktemp("wm") / "data"
    collect(CollectConfig(task="push-red", episodes=8, out=out, failures=0.5, num_envs=1), progress=False)
    return out


@pytest.fixture(scope="session")
def trained(tiny_data, tmp_path_factory):
    """A tiny world model trained for a few steps on `tiny_data` (a run folder)."""
    from world_models.video.train import train_world_model

    run = tmp_path_factory.mktemp("wm") / "run"
    train_world_model(tiny_wm_config(tiny_data, run, videos=1), progress=False)
    return run


@pytest.fixture(scope="session")
def tiny_policy(tiny_data, tmp_path_factory):
    """A tiny VLA policy (gaussian head) behaviour-cloned for two steps on `tiny_data` (a run folder)."""
    from wmrl.commands.train_policy import TrainPolicyConfig, train_policy

    out = tmp_path_factory.mktemp("pol") / "run"
    train_policy(TrainPolicyConfig(data=(tiny_data,), out=out, steps=2, batch_size=4, eval_episodes=0,
                                   extra={"vision_width": 8, "hidden": 32, "text_dim": 8, "init_log_std": 0.0}),
                 progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_estimated_state(tiny_data, tmp_path_factory):
    """A tiny `estimated-state` policy trained through `wmrl train-policy --type estimated-state` on `tiny_data`
    (a run folder)."""
    from wmrl.commands.train_policy import TrainPolicyConfig, train_policy

    out = tmp_path_factory.mktemp("pol") / "estimated"
    train_policy(TrainPolicyConfig(data=(tiny_data,), out=out, type="estimated-state", steps=20, estimator_steps=4,
                                   eval_episodes=0, extra={"width": 8, "hidden": 32, "layers": 2, "holdout_episodes": 2}),
                 progress=False)
    return out


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory):
    """`wmrl demo --quick` run once through the CLI (shared by the CLI test and the imagination benchmark's test,
    which resumes it: every stage cached). Returns the run folder."""
    from wmrl.cli import main

    out = tmp_path_factory.mktemp("quick-demo") / "demo"
    assert main(["demo", "--out", str(out), "--quick"]) == 0
    return out


@pytest.fixture(scope="session")
def lerobot_checkpoints(tmp_path_factory):
    """{"act": DIR, "diffusion": DIR}: tiny random LeRobot checkpoints for the push-red env's spaces."""
    from policies.lerobot.act import ACTPolicy
    from policies.lerobot.diffusion import DiffusionPolicy
    from tests.helpers import lerobot_act_config, lerobot_dp_config, lerobot_stats, write_tiny_lerobot

    root = tmp_path_factory.mktemp("lerobot")
    return {"act": write_tiny_lerobot(root, ACTPolicy, lerobot_act_config(), lerobot_stats(), name="act"),
            "diffusion": write_tiny_lerobot(root, DiffusionPolicy, lerobot_dp_config(), lerobot_stats("MIN_MAX"), name="dp")}


# Session fixtures too slow to build once per xdist worker: the tests that use one run on one worker
# (`pytest -n 3 --dist loadgroup`, the README's test command).
# (`ies_quick`: 25-33 s; `point_data`: 10 s, built on both workers before.)
ONE_WORKER_FIXTURES = ("quick_demo", "ies_quick", "point_data")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in ONE_WORKER_FIXTURES:
            if name in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(name))
                break  # one group per test
