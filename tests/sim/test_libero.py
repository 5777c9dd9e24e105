"""LIBERO behind wmrl's env contract (skipped, with the reason, when the optional package is absent).

Building a LIBERO env takes about 5 s, so each test builds at most one or two."""

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import sim
import sim.libero

pytestmark = pytest.mark.skipif(not sim.libero.available(), reason="LIBERO not installed (pip install 'wmrl[libero]')")

ENV_STATE = "observation.environment_state"


def instruction_of(task: str) -> str:
    from sim.libero.env import instruction

    return instruction(task)


@pytest.fixture(scope="module")
def object0():
    env = gym.make("wmrl/libero-object-0-v0", disable_env_checker=True).unwrapped
    yield env
    env.close()


def test_every_task_of_the_five_suites_is_registered_with_its_files_and_official_starts():
    from sim.libero.env import bddl_file, initial_states, instruction

    ids = sim.libero.env_ids()
    assert len(ids) == 130 and set(ids) <= set(sim.env_ids()) and ids[0] == "wmrl/libero-spatial-0-v0"
    for t in sim.libero.task_names():
        assert bddl_file(t).is_file(), t
        assert initial_states(t).shape[0] == 50, t  # LIBERO's evaluation runs exactly these 50 per task
        assert sim.task_from_instruction(instruction(t)).startswith("libero-"), t
    assert sim.task_from_instruction("pick up the alphabet soup and place it in the basket") == "libero-object-0"


def test_check_env_and_lerobot_observations(object0):
    env = object0
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert obs["observation.images.front"].shape == (64, 64, 3) and obs["observation.images.wrist"].dtype == np.uint8
    assert obs["observation.state"].shape == (8,)  # LeRobot's LIBERO state: eef xyz, axis-angle, two fingers
    assert obs[ENV_STATE].shape == (7 * len(env.object_names()),)
    assert env.object_names()[:2] == ["alphabet_soup_1", "basket_1"]
    assert obs["task"] == "pick up the alphabet soup and place it in the basket"
    assert env.action_space.shape == (7,) and env.max_episode_steps == 280
    control = env.metadata["control"]
    assert control["gripper_action"] == 6 and control["object_state"] == "libero"  # its goal has a rule on poses
    # upright images: the floor (bottom rows) is brighter than the dark background above the table in agentview
    front = obs["observation.images.front"].astype(float)
    assert front[-16:].mean() > front[:8].mean()


@pytest.mark.parametrize("task", ["spatial-0", "goal-0", "90-0", "10-0"])
def test_one_task_of_each_other_suite_passes_the_checker(task):
    """The other four suites' first tasks (object-0 above): building an env takes seconds, so one per suite; every
    one of the 130 is registered with its files and starts (above); the cameras are checked on object-0. The
    checker's reset-twice test caught LIBERO re-drawing fixtures (goal-0's stove) on every reset."""
    env = gym.make(f"wmrl/libero-{task}-v0", disable_env_checker=True, cameras=()).unwrapped
    check_env(env, skip_render_check=True)
    outside = np.random.get_state()[1].copy()
    obs, _ = env.reset(seed=0)
    assert np.array_equal(np.random.get_state()[1], outside)  # the fixtures' draw leaves numpy's global RNG alone
    assert obs["observation.state"].shape == (8,) and obs["task"] and env.action_space.shape == (7,)
    env.close()


def test_lerobot_image_convention_matches_liberos_own_arrays_turned_as_lerobot_does():
    """LeRobot's and OpenVLA's LIBERO data are LIBERO's arrays turned by 180 degrees; `image_convention="lerobot"`
    must give that picture from our renderer (shadows differ: a correlation, not equality)."""
    import contextlib
    import io

    from sim.libero.env import LiberoEnv, bddl_file, initial_states

    with contextlib.redirect_stdout(io.StringIO()):
        from libero.libero.envs import OffScreenRenderEnv

        own = OffScreenRenderEnv(bddl_file_name=str(bddl_file("object-0")), camera_heights=64, camera_widths=64)
    own.reset()
    raw = own.set_init_state(initial_states("object-0")[0])
    for _ in range(10):  # the settle steps our reset takes
        raw, *_ = own.step(np.r_[np.zeros(6), -1.0])
    own.close()
    theirs = raw["agentview_image"][::-1, ::-1].astype(float)  # as LeRobot's / OpenVLA's LIBERO code turns it
    images = {}
    for conv in ("camera", "lerobot"):
        env = LiberoEnv("object-0", cameras=("front",), image_convention=conv)
        obs, _ = env.reset(seed=0)
        env.close()
        images[conv] = obs["observation.images.front"].astype(float)
    np.testing.assert_array_equal(images["lerobot"], images["camera"][:, ::-1])
    cam = images["camera"]  # which of the four flips of ours is theirs: the left-right mirror, clearly
    corr = {name: np.corrcoef(img.ravel(), theirs.ravel())[0, 1] for name, img in
            (("none", cam), ("up-down", cam[::-1]), ("left-right", cam[:, ::-1]), ("180", cam[::-1, ::-1]))}
    assert corr["left-right"] > 0.7 and all(corr["left-right"] > c + 0.2 for k, c in corr.items() if k != "left-right"), corr
    with pytest.raises(ValueError, match="image_convention"):
        LiberoEnv("object-0", image_convention="opengl")


def test_a_seed_is_an_official_initial_state_and_restarts_exactly(object0):
    env = object0
    from sim.libero.env import initial_states

    a, info = env.reset(seed=7)
    assert info["init_state"] == 7
    env.step(np.r_[np.ones(3), np.zeros(3), -1.0])
    b, _ = env.reset(seed=57)  # 57 % 50: the same official start
    c, _ = env.reset(options={"init_state": 8})
    assert np.array_equal(a[ENV_STATE], b[ENV_STATE]) and np.array_equal(a["observation.state"], b["observation.state"])
    assert np.abs(a[ENV_STATE] - c[ENV_STATE]).max() > 1e-3
    starts = initial_states("object-0")
    assert not np.array_equal(starts[7], starts[8])
    with pytest.raises(ValueError, match="init_state"):
        env.reset(options={"init_state": 50})


def test_the_scripted_expert_puts_the_soup_in_the_basket_and_fails_near_it_in_failure_mode(object0):
    """Success is LIBERO's own goal check; the near-success failure ends with the can outside the basket."""
    from sim.experts import ScriptedExpert
    from wmrl.eval import evaluate

    env = object0
    ok = evaluate(ScriptedExpert(seed=0), env, 1, seed=0, record=False, progress=False)
    bad = evaluate(ScriptedExpert(seed=0, failure_prob=1.0), env, 1, seed=0, record=True, progress=False)
    assert ok.pc_success == 100.0 and bad.pc_success == 0.0
    final = bad.episodes[0][ENV_STATE][-1].reshape(-1, 7)
    soup, basket = final[0, :3], final[1, :3]
    assert 0.06 < np.linalg.norm(soup[:2] - basket[:2]) < 0.25 and soup[2] < 0.05  # released beside it, on the floor


def test_bad_input_is_refused_with_the_valid_names(object0):
    env = object0
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.r_[np.zeros(6), np.nan])
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(4))
    with pytest.raises(ValueError, match="spatial, object, goal, 10, 90"):
        sim.resolve_task("libero-kitchen-0")
    with pytest.raises(ValueError, match=r"tasks 0\.\.9"):
        sim.resolve_task("libero-object-10")
    from sim.libero.experts import expert_action
    from sim.libero.env import instruction

    with pytest.raises(ValueError, match="pick-and-place only"):
        expert_action(instruction("goal-0"), np.zeros(8), np.zeros(7 * 20), False)


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(sim.libero, "available", lambda: False)
    with pytest.raises(ValueError, match=r"pip install 'wmrl\[libero\]'"):
        sim.resolve_task("libero-object-0")


def test_collect_writes_a_lerobot_dataset_and_a_world_model_imagines_it_under_7d_pose_actions(tmp_path):
    """The loop's first two steps on LIBERO: `wmrl collect` writes LeRobot v3 with LIBERO's 7-D OSC_POSE actions,
    `wmrl train-wm` builds a world model whose frames are conditioned on [target xyz, rotation step, gripper] and,
    since object-0's goal has a rule on body poses, a state channel whose predicted poses give success by LIBERO's
    goal check; imagination takes 7-D actions."""
    from wmrl.commands.collect import CollectConfig, collect
    from wmrl.datasets import LeRobotV3Dataset
    from world_models.env import WorldModelSingleEnv
    from world_models.video.model import VideoWorldModel
    from world_models.video.train import TrainWMConfig, load_split, train_world_model

    out = tmp_path / "data"
    collect(CollectConfig(task="libero-object-0", episodes=3, out=out, noise=0.1, num_envs=1, max_episode_steps=40),
            progress=False)
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["fps"] == 20 and info["robot_type"] == "panda" and info["features"]["action"]["shape"] == [7]
    ep = LeRobotV3Dataset(out).episode(0)
    assert ep["observation.images.front"].shape[1:] == (64, 64, 3) and ep["task"][0].startswith("pick up the alphabet")
    train_world_model(TrainWMConfig(data=out, out=tmp_path / "wm", size="tiny", ae_steps=2, state_steps=2,
                                    dyn_steps=2, unroll_steps=0, batch_size=2, holdout=0.34, videos=0, overwrite=True,
                                    change_mask_steps=5, change_mask_windows=2, head_rollout_steps=0),
                      progress=False)
    model = VideoWorldModel.load(tmp_path / "wm" / "checkpoints" / "last")
    assert model.cfg.action_dim == 7 and model.cfg.pose_dim == 7 and model.success_source == "state"
    _, _, held = load_split(out, 0.34)
    env = WorldModelSingleEnv(model, held, max_episode_steps=8, rules=sim.success_and_reward)
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=0)
    obs, *_, info = env.step(np.array([0.2, 0, -0.3, 0.1, 0, 0, -1], np.float32))
    assert obs["observation.images.front"].shape == (64, 64, 3) and obs["task"].startswith("pick up")
    assert obs[ENV_STATE].shape == (7 * 7,) and np.isfinite(info["disagreement"])


def test_the_goal_rule_on_observation_level_state_equals_liberos_own_check():
    """`sim.success_and_reward` on a LIBERO-Object task (In soup basket_contain_region, from the bodies' poses in
    observation.environment_state) equals LIBERO's check at every step of an expert episode (successes included:
    it keeps recording after success) and a failure-mode one; tasks whose goals are not such an In have no rule."""
    import mujoco

    from sim.experts import expert_action
    from sim.libero.tasks import quat_wxyz_to_mat

    q = np.array([0.9, 0.1, -0.3, 0.2])
    want = np.zeros(9)
    mujoco.mju_quat2Mat(want, q / np.linalg.norm(q))
    assert np.allclose(quat_wxyz_to_mat(q), want.reshape(3, 3))
    assert sim.has_task_rules(instruction_of("object-0")) and not sim.has_task_rules(instruction_of("goal-0"))
    env = sim.make_env("libero-object-0", cameras=(), post_success_steps=8).unwrapped
    ours, theirs = [], []
    for failure in (False, True):
        obs, _ = env.reset(seed=1)
        for _ in range(140):
            a = expert_action(obs["task"], obs["observation.state"], obs[ENV_STATE], failure)
            obs, _, term, trunc, _ = env.step(np.clip(a, -1, 1))
            ok, rew = sim.success_and_reward(obs["task"], obs["observation.state"][None, :3],
                                             obs["observation.state"][None, 6], obs[ENV_STATE][None])
            ours.append(bool(ok[0]))
            theirs.append(bool(env.lib.check_success()))
            assert (rew[0] == 1.0) == ok[0]
            if term or trunc:
                break
    env.close()
    assert ours == theirs and sum(theirs) >= 5 and len(theirs) - sum(theirs) >= 100


def test_the_benchmark_checks_its_metric():
    """`wmrl bench libero` in quick mode: the expert is the ceiling, its failure mode and a random policy the floor."""
    import runpy
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "libero.py"
    r = runpy.run_path(str(bench), run_name="bench")["main"](quick=True)
    soup = r["tasks"]["object-0"]
    assert soup["expert"]["success"] == 1.0 and soup["expert_failure_mode"]["success"] == 0.0
    assert r["random_success_max"] == 0.0
    tp = r["throughput"]
    assert tp["steps_per_s_state_only"] > tp["steps_per_s_two_cameras_64px"] > 0
    assert tp["steps_per_s_tabletop_two_cameras_64px"] > tp["steps_per_s_two_cameras_64px"]  # LIBERO's meshes cost


def test_the_imagination_benchmark_runs_bc_and_grpo_with_no_simulator_step_and_pairs_the_starts():
    """`wmrl bench libero-imagination` in quick mode (tiny world model, 2 GRPO iterations): RL takes no simulator
    step, and both policies are scored on the same official starts in both worlds."""
    import runpy
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "libero_imagination.py"
    r = runpy.run_path(str(bench), run_name="bench")["main"](quick=True)
    assert r["true_env_steps_during_rl"] == 0
    assert [len(c) for c in r["imagined_success_per_iteration"].values()] == [r["iterations"]] == [2]
    for name in ("bc", "rl_s0"):
        assert len(r[f"outcomes_{name}"]) == len(r[f"imagined_outcomes_{name}"]) == r["starts"] == 2
        assert r[f"success_{name}"] == r[f"outcomes_{name}"].count("1") / 2
        assert r[f"outcomes_{name}"] == "00"  # 16 control steps cannot put the soup in the basket
    assert r["success_gain_points_per_seed"] == [0.0] and r["starts_won_rl_s0"] == r["starts_lost_rl_s0"] == 0
