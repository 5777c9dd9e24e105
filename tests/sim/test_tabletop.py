import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import sim
from sim.tabletop import model as M
from sim.tabletop.env import TabletopEnv
from sim.experts import ScriptedExpert
from sim.tabletop.tasks import FAMILIES, parse_instruction, instruction, TaskSpec
from sim.tabletop.twin import REAL_WORLD, TwinParams
from policies.random_policy import RandomPolicy
from wmrl.eval import evaluate


@pytest.mark.parametrize("env_id", [i for i in sim.env_ids() if i.startswith("wmrl/tabletop")])
def test_check_env_every_task(env_id):
    env = gym.make(env_id, disable_env_checker=True).unwrapped
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert obs["observation.images.front"].shape == (64, 64, 3)
    assert obs["observation.images.wrist"].dtype == np.uint8
    assert obs["observation.state"].shape == (8,)
    env.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_expert_succeeds_95_percent(family):
    successes = 0
    n = 24
    for i, colour in enumerate(["red", "green", "blue"] * (n // 3)):
        env = TabletopEnv(f"{family}-{colour}", cameras=())
        r = evaluate(ScriptedExpert(seed=i), env, 1, seed=100 + i, progress=False)
        successes += r.pc_success / 100
    assert successes / n >= 0.95


@pytest.mark.parametrize("family", FAMILIES)
def test_failure_mode_is_a_near_success(family):
    env = TabletopEnv(f"{family}-red", cameras=())
    r = evaluate(ScriptedExpert(failure_prob=1.0), env, 6, seed=7, progress=False)
    rand = evaluate(RandomPolicy(env.action_space), env, 6, seed=7, progress=False)
    assert r.pc_success <= 20.0
    assert r.avg_max_reward > rand.avg_max_reward + 0.05  # it got close: well above a random policy's reward


def test_ik_matches_forward_kinematics():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = rng.uniform([0.25, -0.2, 0.03], [0.55, 0.2, 0.2])  # the region the tasks use; all reachable
        q = M.inverse_kinematics(p)
        assert np.allclose(M.forward_kinematics(q), p, atol=1e-6)
        assert np.isclose(q[1] + q[2] + q[3], 0.0)  # hand points down


def test_instruction_round_trip():
    for f in FAMILIES:
        text = instruction(TaskSpec(f, "blue"), "purple")
        fam, cube, zone = parse_instruction(text)
        assert (fam, cube) == (f, "blue") and zone in (None, "purple")


def test_bad_actions_name_the_field():
    env = TabletopEnv("reach-red", cameras=())
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action: expected shape"):
        env.step(np.zeros(3))
    with pytest.raises(ValueError, match="action: contains NaN"):
        env.step(np.array([0, np.nan, 0, 0]))
    with pytest.raises(ValueError, match="action: contains NaN or inf"):
        env.step(np.array([0, 0, np.inf, 0]))


def test_unknown_task_lists_valid_ones():
    with pytest.raises(ValueError, match="valid tasks: .*push-red"):
        sim.make_env("shove-red")
    with pytest.raises(ValueError, match="valid tasks"):
        TabletopEnv("push-pink")


def test_twin_params_apply_and_real_world_differs():
    nominal = TabletopEnv("lift-red", cameras=())
    real = gym.make("wmrl/tabletop-real-lift-red-v0").unwrapped
    nominal.reset(seed=0), real.reset(seed=0)
    bid = nominal.model.body("cube_red").id
    assert np.isclose(nominal.model.body_mass[bid], TwinParams().cube_mass)
    assert np.isclose(real.model.body_mass[bid], REAL_WORLD.cube_mass)
    p = TwinParams().perturb(cube_mass=0.5)
    assert np.isclose(p.cube_mass, 0.075)
    r1 = TwinParams().randomize(np.random.default_rng(0), 0.2)
    r2 = TwinParams().randomize(np.random.default_rng(1), 0.2)
    assert r1 != r2 and abs(np.log(r1.cube_mass / 0.05)) <= 0.2
    assert TwinParams.from_dict(REAL_WORLD.to_dict()) == REAL_WORLD


def test_control_latency_delays_motion():
    moved = {}
    for lat in (0.0, 0.08):
        env = TabletopEnv("reach-red", cameras=(), twin=TwinParams(latency_s=lat))
        env.reset(seed=0)
        z0 = env.ee_pos()[2]
        env.step(np.array([0, 0, -1, 0]))
        moved[lat] = z0 - env.ee_pos()[2]
    assert moved[0.08] < 0.9 * moved[0.0]


def test_joint_control_mode_tracks_targets():
    env = TabletopEnv("reach-red", cameras=(), control="joint")
    env.reset(seed=0)
    target = M.inverse_kinematics(np.array([0.4, 0.1, 0.15]))
    for _ in range(10):
        env.step(np.concatenate([target, [-1.0]]))
    assert np.allclose(env.ee_pos(), [0.4, 0.1, 0.15], atol=0.01)


def test_async_vector_env_two_workers():
    venv = sim.make_vector_env("push-green", 2)
    obs, _ = venv.reset(seed=3)
    assert obs["observation.images.front"].shape == (2, 64, 64, 3)
    assert len(obs["task"]) == 2 and all("green" in t for t in obs["task"])
    r = evaluate(ScriptedExpert(), venv, 2, seed=3, progress=False)
    venv.close()
    assert r.pc_success == 100.0


def test_post_success_steps_extend_the_episode_with_success_frames():
    env = TabletopEnv("reach-red", cameras=(), post_success_steps=3)
    r = evaluate(ScriptedExpert(), env, 1, seed=0, record=True, progress=False)
    base = evaluate(ScriptedExpert(), TabletopEnv("reach-red", cameras=()), 1, seed=0, progress=False)
    ep = r.episodes[0]
    assert r.per_episode[0]["length"] == base.per_episode[0]["length"] + 3
    assert ep["next.success"][:-1].sum() >= 3 and ep["next.terminated"][-2] and not ep["next.terminated"][:-2].any()


@pytest.mark.parametrize("asynchronous", [True, False])
def test_vector_env_episodes_start_from_their_seeded_reset_and_replay_exactly(asynchronous):
    """Every recorded episode of a batched collection (several batches, so workers that ended an episode are reset
    again) starts from its seeded reset, and its actions replayed open-loop reproduce its last state exactly
    (gymnasium's NEXT_STEP autoreset used to turn the first step of later batches into an unseeded reset in the
    asynchronous env; the synchronous one must also let the batch's other episodes run on after one ended)."""
    venv = sim.make_vector_env("push-red", 2, asynchronous=asynchronous, cameras=())
    r = evaluate(ScriptedExpert(noise=0.05, seed=1), venv, 6, seed=11, record=True, progress=False)
    venv.close()
    env = TabletopEnv("push-red", cameras=())
    for rec, ep in zip(r.per_episode, r.episodes):
        start, _ = env.reset(seed=rec["seed"])
        assert np.array_equal(ep["observation.environment_state"][0], start["observation.environment_state"])
        _, end = sim.replay_open_loop("push-red", ep["action"][:-1], seed=rec["seed"], until_done=False)
        assert np.allclose(end, ep["observation.environment_state"][-1], atol=1e-6)
    # the ceiling measurement: a 1 mm shift of the start changes where a pushed cube ends
    shifted = [sim.replay_open_loop("push-red", ep["action"][:-1], seed=rec["seed"], cube_shift=1e-3, until_done=False)[1]
               for rec, ep in zip(r.per_episode, r.episodes)]
    assert max(np.abs(s - ep["observation.environment_state"][-1]).max() for s, ep in zip(shifted, r.episodes)) > 1e-3


def test_batched_vector_env_equals_the_synchronous_env():
    """`make_vector_env(workers=K)`: the envs split over K processes step exactly as one `SyncVectorEnv` of them
    (observations, rewards, ends and every info entry, across an episode's end and its NEXT_STEP reset), and the
    workers' simulator steps are counted."""
    kw = dict(cameras=())
    sync = sim.make_vector_env("push-red", 5, asynchronous=False, **kw)
    batched = sim.make_vector_env("push-red", 5, workers=2, **kw)
    assert batched.sizes == [3, 2]
    try:
        a, b = sync.reset(seed=[3, 4, 5, 6, 7]), batched.reset(seed=[3, 4, 5, 6, 7])
        rng, ended = np.random.default_rng(0), False
        for _ in range(90):  # past the 80-step horizon: every env ends and is reset by its next step
            act = rng.uniform(-1, 1, (5, 4)).astype(np.float32)
            ra, rb = sync.step(act), batched.step(act)
            for x, y in zip(ra[:4], rb[:4]):
                if isinstance(x, dict):
                    assert x.keys() == y.keys() and all(np.array_equal(np.asarray(x[k]), np.asarray(y[k])) for k in x)
                else:
                    assert np.array_equal(x, y)
            assert ra[4].keys() == rb[4].keys()
            assert all(np.array_equal(np.asarray(ra[4][k]), np.asarray(rb[4][k])) for k in ra[4])
            ended |= bool((ra[2] | ra[3]).any())
        assert ended
        assert 0 < batched.true_steps_taken() <= 5 * 90
        with pytest.raises(ValueError, match="2 seeds for 5 envs"):
            batched.reset(seed=[1, 2])
    finally:
        sync.close()
        batched.close()


def test_part_masks_split_the_moving_mask_into_arm_and_cubes():
    """`part_masks_at`: the arm's and the cubes' pixels are disjoint and together are `moving_mask_at`'s; moving a
    cube (its qpos only) moves the cube mask and leaves the arm's alone."""
    env = sim.make_env("push-red").unwrapped
    env.reset(seed=3)
    qpos = env.data.qpos.copy()
    parts, whole = env.part_masks_at(qpos), env.moving_mask_at(qpos)
    for c in whole:
        assert not (parts["arm"][c] & parts["objects"][c]).any()
        np.testing.assert_array_equal(parts["arm"][c] | parts["objects"][c], whole[c])
    assert parts["objects"]["observation.images.front"].sum() > 20 and parts["arm"]["observation.images.front"].sum() > 20
    moved = qpos.copy()
    adr = env._cube_qpos["red"]
    moved[adr : adr + 2] += [0.06, 0.04]
    after = env.part_masks_at(moved)
    front = "observation.images.front"
    np.testing.assert_array_equal(after["arm"][front], parts["arm"][front])
    assert (after["objects"][front] != parts["objects"][front]).sum() > 10
    env.close()


def test_a_restored_tabletop_steps_bit_for_bit_as_the_original():
    a, b = sim.make_env("push-red", cameras=()).unwrapped, sim.make_env("push-red", cameras=()).unwrapped
    try:
        a.reset(seed=3)
        acts = np.random.default_rng(0).uniform(-1, 1, (30, 4))
        for x in acts[:10]:
            a.step(x)
        snap = a.snapshot()
        ref = [a.step(x)[0]["observation.environment_state"] for x in acts[10:]]
        b.reset(seed=99)  # another layout: restore brings the snapshot's
        b.restore(snap)
        got = [b.step(x)[0]["observation.environment_state"] for x in acts[10:]]
        np.testing.assert_array_equal(np.array(got), np.array(ref))
        assert b._t == a._t == 30
    finally:
        a.close()
        b.close()


def test_a_state_only_env_gives_the_cameras_geometry_without_rendering():
    """`camera_geometry(cameras)` on an env without cameras equals the rendering env's own (training reads it so, and
    so trains where no GL context can be made); a camera the cell lacks is refused by name."""
    seen = sim.make_env("push-red").unwrapped
    seen.reset(seed=4)
    blind = sim.make_env("push-red", cameras=()).unwrapped
    blind.reset(seed=4)
    assert blind.camera_geometry(("front", "wrist")) == seen.camera_geometry()
    assert blind._renderer is None and seen._renderer is not None  # no GL context made
    assert blind.camera_geometry() == {}
    with pytest.raises(ValueError, match="no camera 'top'"):
        blind.camera_geometry(("top",))
    seen.close(), blind.close()


def test_the_mirror_signs_reflect_a_scene_through_the_cells_plane_of_symmetry():
    """The reflected layout, driven by the reflected actions (y negated), gives the reflected channels step after
    step, the red cube sits where the left-right flipped image puts it (the perception augmentation's premise), and
    the scripted expert's label of the reflected scene is the reflected label (the actor's)."""
    from dataclasses import replace

    from sim.experts import expert_action
    from sim.tabletop.env import MIRROR_ACTION_SIGN, MIRROR_ENV_STATE_SIGN, MIRROR_STATE_SIGN, mirror_episode

    def red_columns(img):
        red = (img[..., 0] > 120) & (img[..., 1] < 60) & (img[..., 2] < 60)
        return np.nonzero(red.any(0))[0].mean()

    a, b = (TabletopEnv("push-red", cameras=("front",)) for _ in range(2))
    obs, _ = a.reset(seed=3)
    lay = a.layout
    flip = lambda xy: {k: v * np.array([1, -1]) for k, v in xy.items()}  # noqa: E731
    mirrored = replace(lay, cube_xy=flip(lay.cube_xy), cube_yaw={c: -y for c, y in lay.cube_yaw.items()},
                       zone_xy=flip(lay.zone_xy))
    mobs, _ = b.reset(seed=3, options={"layout": mirrored})
    rng = np.random.default_rng(0)
    keys = ("observation.state", "observation.environment_state", "observation.images.front")
    rec = {side: {k: [] for k in (*keys, "action", "next.reward", "next.success")} for side in "ab"}
    for t in range(12):
        np.testing.assert_allclose(mobs["observation.state"], obs["observation.state"] * MIRROR_STATE_SIGN, atol=2e-3)
        np.testing.assert_allclose(mobs["observation.environment_state"],
                                   obs["observation.environment_state"] * MIRROR_ENV_STATE_SIGN, atol=2e-3)
        assert abs(red_columns(obs["observation.images.front"][:, ::-1]) - red_columns(mobs["observation.images.front"])) < 1.0
        label = expert_action(obs["task"], obs["observation.state"], obs["observation.environment_state"], False)
        np.testing.assert_allclose(expert_action(mobs["task"], mobs["observation.state"],
                                                 mobs["observation.environment_state"], False),
                                   label * MIRROR_ACTION_SIGN, atol=1e-2)
        act = rng.uniform(-1, 1, 4) if t % 2 else label  # the expert's own steps move the cube
        for side, o, x in (("a", obs, act), ("b", mobs, act * MIRROR_ACTION_SIGN)):
            for k in keys:
                rec[side][k].append(o[k])
            rec[side]["action"].append(np.float32(x))
        obs, r, *_, info = a.step(act)
        mobs, mr, *_, minfo = b.step(act * MIRROR_ACTION_SIGN)
        for side, rr, inf in (("a", r, info), ("b", mr, minfo)):
            rec[side]["next.reward"].append(np.float32(rr))
            rec[side]["next.success"].append(bool(inf["is_success"]))
    assert np.abs(obs["observation.state"][[0, 6]]).min() > 1e-3  # the arm left the plane: the check had teeth
    # a recorded episode's reflection (what `train-wm --mirror` adds) is the reflected layout's episode
    ep_a, ep_b = ({k: np.stack(v) for k, v in rec[s].items()} for s in ("a", "b"))
    m = mirror_episode(ep_a)
    for k in ("observation.state", "observation.environment_state", "next.reward"):
        np.testing.assert_allclose(m[k], ep_b[k], atol=2e-3)
    np.testing.assert_allclose(m["action"], ep_b["action"], atol=1e-6)
    np.testing.assert_array_equal(m["next.success"], ep_b["next.success"])
    assert max(abs(red_columns(x) - red_columns(y)) for x, y in zip(m["observation.images.front"], ep_b["observation.images.front"])) < 1.0
    assert not np.allclose(m["observation.state"], ep_a["observation.state"], atol=1e-2)  # the reflection is another episode


def test_mirror_episode_is_an_involution_and_refuses_what_it_cannot_reflect():
    from sim.tabletop.env import mirror_episode

    rng = np.random.default_rng(0)
    ep = {"observation.images.front": rng.integers(0, 255, (3, 8, 6, 3), dtype=np.uint8),
          "observation.state": rng.normal(size=(3, 8)).astype(np.float32),
          "observation.environment_state": rng.normal(size=(3, 13)).astype(np.float32),
          "action": rng.normal(size=(3, 4)).astype(np.float32), "next.reward": np.ones(3, np.float32),
          "task": ["push the red cube to the blue zone"] * 3}
    m = mirror_episode(ep)
    assert m["observation.images.front"][0, 2, 0, 1] == ep["observation.images.front"][0, 2, 5, 1]  # columns flipped
    np.testing.assert_array_equal(m["action"][:, 1], -ep["action"][:, 1])
    np.testing.assert_array_equal(m["observation.state"][:, 0], -ep["observation.state"][:, 0])  # the base's yaw
    assert m["task"] == ep["task"] and m["observation.state"].dtype == np.float32
    back = mirror_episode(m)
    for k, v in ep.items():
        np.testing.assert_array_equal(np.asarray(back[k]), np.asarray(v))
    with pytest.raises(ValueError, match=r"no reflection known for the columns \['qpos'\]"):
        mirror_episode({**ep, "qpos": np.zeros((3, 27), np.float32)})
    with pytest.raises(ValueError, match="actions 7"):  # another suite's 7-D actions
        mirror_episode({**ep, "action": np.zeros((3, 7), np.float32)})
    with pytest.raises(ValueError, match="got cameras \\('side',\\)"):
        mirror_episode({"observation.images.side": ep["observation.images.front"]})
