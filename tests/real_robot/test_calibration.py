"""Twin calibration: a known perturbation of the arm's gain is recovered on a tiny budget, the replay error drops,
and logs without the needed fields are refused with the list of what is missing."""

import numpy as np
import pytest
import yaml


def test_calibration_recovers_a_known_gain_perturbation(tmp_path):
    from real_robot.calibration import CalibrateConfig, calibrate, collect_logs
    from sim.tabletop.twin import TwinParams

    truth = TwinParams().replace(arm_kp=1.3)
    collect_logs(tmp_path / "logs", episodes=2, steps=25, noise_std=0.0, twin=truth)
    r = calibrate(CalibrateConfig(logs=tmp_path / "logs", out=tmp_path / "twin.yaml", params=("arm_kp",),
                                  generations=6, popsize=6, progress=False))
    assert abs(r["fitted"]["arm_kp"] - 1.3) / 1.3 < 0.05
    assert r["traj_error_after"] < 0.1 * r["traj_error_before"]
    twin = TwinParams.from_dict(yaml.safe_load((tmp_path / "twin.yaml").read_text()))
    assert twin.arm_kp == pytest.approx(r["fitted"]["arm_kp"])  # a usable TwinParams file


def test_logs_without_the_needed_fields_are_refused(tmp_path):
    from real_robot.calibration import load_logs
    from wmrl.core.episode import build_episode, features_for
    from wmrl.datasets.lerobot_v3 import LeRobotV3Writer, write_episode

    obs = [{"observation.state": np.zeros(8, np.float32), "task": "reach the red cube"} for _ in range(3)]
    ep = build_episode(obs, [np.zeros(5, np.float32)] * 2, [0.0] * 2, [False] * 2, [False, True], [False] * 2)
    w = LeRobotV3Writer(tmp_path / "d", fps=10, features=features_for(ep), extra_meta={})
    write_episode(w, ep)
    w.finalize()
    with pytest.raises(ValueError, match="missing: layout_seed, task"):
        load_logs(tmp_path / "d")
    with pytest.raises(ValueError, match="not identifiable"):
        from real_robot.calibration import ParamBox

        ParamBox(("light_intensity",))
