"""The SO-101 cell: the deployment side's kinematics against MuJoCo's, the IK, the simplified meshes, the env contract
and the scripted expert on this arm."""

import mujoco
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import sim
import sim.so101
from sim.experts import ScriptedExpert
from wmrl.core import so101 as K
from wmrl.core.features import OBS_STATE

ARM_BODIES = ("base", "shoulder", "upper_arm", "lower_arm", "wrist", "gripper", "moving_jaw_so101_v1")
pytestmark = pytest.mark.skipif(not sim.so101.available(), reason="the SO-101 model is not installed (pip install 'wmrl[so101]')")


@pytest.fixture(scope="module")
def original():
    from sim.so101.model import asset_dir

    m = mujoco.MjModel.from_xml_path(str(asset_dir() / "so101_new_calib.xml"))
    return m, mujoco.MjData(m)


def test_joint_names_are_lerobots_so101_motors(original):
    from real_robot.lerobot_adapter import SO_ARM_JOINTS

    m, _ = original
    names = [m.joint(i).name for i in range(m.njnt)]
    assert names == list(SO_ARM_JOINTS) + ["gripper"] == list(K.JOINTS) + [K.GRIPPER]
    np.testing.assert_allclose(m.jnt_range[:5], np.stack([K.JOINT_LOW, K.JOINT_HIGH], 1), atol=1e-5)


def test_numpy_kinematics_match_mujoco(original):
    m, d = original
    rng = np.random.default_rng(0)
    for _ in range(50):
        q = rng.uniform(K.JOINT_LOW, K.JOINT_HIGH)
        g = rng.uniform(K.GRIPPER_CLOSED, K.GRIPPER_OPEN)
        d.qpos[:5], d.qpos[5] = q, g
        mujoco.mj_kinematics(m, d)
        np.testing.assert_allclose(K.forward_kinematics(q), d.site("gripperframe").xpos, atol=1e-9)
        pads = np.linalg.norm(d.geom("fixed_jaw_pad").xpos - d.geom("moving_jaw_pad").xpos)
        assert K.jaw_opening(g) == pytest.approx(pads, abs=1e-9)


def test_ik_is_exact_inside_the_workspace_and_keeps_clear_of_the_limits():
    kin = K.SO101Kinematics()
    rng = np.random.default_rng(1)
    for target in rng.uniform(K.WORKSPACE_LOW, K.WORKSPACE_HIGH, (60, 3)):
        q = kin.ik(target)
        assert np.linalg.norm(K.forward_kinematics(q) - target) < 5e-4
        assert np.all(q[:4] >= K.JOINT_LOW[:4] + 0.08 - 1e-9) and np.all(q[:4] <= K.JOINT_HIGH[:4] - 0.08 + 1e-9)
    low = kin.ik([0.22, 0.0, 0.03])  # jaws vertical where the arm can hold them so
    assert abs(K.jaw_tilt(low)) < np.radians(2)
    far = kin.ik([0.5, 0.0, 0.03])  # outside: clipped to the box, still a valid pose
    np.testing.assert_allclose(K.forward_kinematics(far), [K.WORKSPACE_HIGH[0], 0.0, 0.03], atol=5e-4)


def test_simplified_meshes_keep_the_arms_silhouette(original):
    """Vertex clustering cuts the faces by > 20x; the arm's pixels in a 64x64 view barely move (IoU > 0.9)."""
    from sim.so101.model import build_model

    m_full, _ = original
    m_simple = build_model()
    assert m_full.mesh_facenum.sum() > 20 * m_simple.mesh_facenum.sum()
    masks = []
    for m in (m_full, m_simple):
        d = mujoco.MjData(m)
        d.qpos[:5] = [0.3, -0.5, 0.6, 1.2, 0.4]
        mujoco.mj_forward(m, d)
        r = mujoco.Renderer(m, 64, 64)
        r.enable_segmentation_rendering()
        cam = mujoco.MjvCamera()  # the same free camera for both models
        cam.lookat[:], cam.distance, cam.azimuth, cam.elevation = [0.15, 0.0, 0.1], 0.6, 150.0, -25.0
        r.update_scene(d, camera=cam)
        seg = r.render()
        arm_geoms = [g for g in range(m.ngeom) if m.body(m.geom_bodyid[g]).name in ARM_BODIES]  # not the cubes
        arm = np.isin(seg[..., 0], arm_geoms) & (seg[..., 1] == mujoco.mjtObj.mjOBJ_GEOM)
        masks.append(arm)
        r.close()
    full, simple = masks
    assert full.sum() > 100
    assert (full & simple).sum() / (full | simple).sum() > 0.9


def test_every_so101_id_passes_gymnasiums_checker_and_keeps_the_tabletop_layout():
    ids = sim.so101.env_ids()
    assert ids == [f"wmrl/so101-reach-{c}-v0" for c in ("red", "green", "blue")] and set(ids) <= set(sim.env_ids())
    env = sim.make_env("so101-reach-red").unwrapped
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=3)
    s = obs[OBS_STATE]
    np.testing.assert_allclose(s[5:8], env.ee_pos(), atol=1e-6)  # the hand where the tabletop's is
    np.testing.assert_allclose(s[:5], K.policy_state(env.arm_joints()[:5], K.gripper_command(env.arm_joints()[5]))[:5], atol=1e-5)
    assert s[4] == pytest.approx(env.gripper_opening(), abs=1e-6)
    env.close()
    with pytest.raises(ValueError, match="reach"):
        sim.so101.env.SO101Env(task="push-red")


def test_the_tabletop_expert_reaches_on_the_so101_arm():
    env = sim.make_env("so101-reach-green", cameras=()).unwrapped
    expert = ScriptedExpert()
    wins = 0
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        expert.reset()
        for _ in range(env.max_episode_steps):
            a = expert.select_action({k: ([v] if isinstance(v, str) else v[None]) for k, v in obs.items()})[0]
            obs, _, term, trunc, info = env.step(a)
            if term or trunc:
                break
        wins += bool(info["success"])
    assert wins == 5
    # an ee-delta action moves the tip by EE_STEP per unit, where the arm can follow
    obs, _ = env.reset(seed=0)
    before = obs[OBS_STATE][5:8].copy()
    for _ in range(3):
        obs, *_ = env.step(np.array([0.0, 0.0, -0.5, -1.0], np.float32))
    assert before[2] - obs[OBS_STATE][7] == pytest.approx(3 * 0.5 * K.EE_STEP, abs=0.01)
    env.close()
    # post_success_steps: the episode goes on that many steps after the first success, as the tabletop's does
    env = sim.make_env("so101-reach-green", cameras=(), post_success_steps=2).unwrapped
    obs, _ = env.reset(seed=0)
    expert.reset()
    flags = []
    while not flags or not (term or trunc):
        a = expert.select_action({k: ([v] if isinstance(v, str) else v[None]) for k, v in obs.items()})[0]
        obs, _, term, trunc, info = env.step(a)
        flags.append(info["success"])
    assert term and flags.index(True) == len(flags) - 3
    env.close()
