import json

import numpy as np
import pytest

from wmrl.cli import main
from wmrl.datasets import LeRobotV3Dataset


def test_collect_writes_a_dataset_and_refuses_to_clobber(tmp_path, capsys):
    out = tmp_path / "ds"
    assert main(["collect", "--task", "lift-red", "--episodes", "3", "--out", str(out), "--failures", "0.5"]) == 0
    ds = LeRobotV3Dataset(out)
    assert ds.num_episodes == 3 and "observation.images.wrist" in ds.features and "qpos" in ds.features
    assert main(["collect", "--task", "lift-red", "--episodes", "1", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["collect", "--task", "lift-red", "--episodes", "1", "--out", str(out), "--resume"]) == 0
    assert LeRobotV3Dataset(out).num_episodes == 4
    from wmrl.eval.record import recorded_seeds

    assert recorded_seeds(out) == [0, 1, 2, 3]  # the layouts, kept so a ranking can refuse to score on them


def test_collect_records_a_learned_policy_of_any_type_and_refuses_an_unknown_one(tiny_estimated_state, tmp_path, capsys):
    """`--policy-path` with `--policy-type estimated-state`: the episodes are the policy's (source and id kept), so
    a world model's data can hold the states the policies it will rank visit."""
    out = tmp_path / "pol-ds"
    assert main(["collect", "--task", "push-red", "--episodes", "2", "--out", str(out), "--max-episode-steps", "6",
                 "--policy-path", str(tiny_estimated_state), "--policy-type", "estimated-state", "--seed", "7"]) == 0
    ds = LeRobotV3Dataset(out)
    eps = [ds.episode(i, decode=False) for i in range(2)]
    assert ds.num_episodes == 2 and {str(x) for e in eps for x in np.ravel(e["source"])} == {"policy"}
    assert {str(x) for e in eps for x in np.ravel(e["policy_id"])} == {str(tiny_estimated_state)}
    assert main(["collect", "--task", "push-red", "--episodes", "1", "--out", str(tmp_path / "x"),
                 "--policy-path", str(tiny_estimated_state), "--policy-type", "scripted"]) == 2
    assert "--policy-type: expected one of" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_unknown_names_list_valid_ones(tmp_path, capsys):
    assert main(["eval", "--task", "juggle-red", "--episodes", "1", "--out", str(tmp_path / "r")]) == 2
    assert "valid tasks" in capsys.readouterr().err
    assert main(["eval", "--policy", "genius", "--task", "reach-red", "--episodes", "1", "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err
    assert "unknown policy 'genius'" in err
    assert all(name in err for name in ("act", "diffusion", "random", "scripted", "vla"))
    assert main(["bench", "nope"]) == 2
    assert main(["bench", "replay", "--options", "size=base"]) == 2  # replay takes no options
    assert "valid: none" in capsys.readouterr().err
    assert main(["bench", "world-model", "--options", "size"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2


def test_eval_writes_metrics_videos_and_plot(tmp_path):
    out = tmp_path / "run"
    assert main(["eval", "--task", "reach-green", "--episodes", "2", "--out", str(out), "--videos", "2"]) == 0
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["pc_success"] == 100.0 and rec["n_episodes"] == 2
    assert (out / "videos/grid.gif").exists() and (out / "episodes.png").exists() and (out / "config.yaml").exists()


def test_config_file_supplies_defaults(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"task: reach-red\nepisodes: 1\nout: {tmp_path / 'o'}\nvideos: 0\npolicy:\n  type: random\n")
    assert main(["eval", "--config", str(cfg)]) == 0
    rec = json.loads((tmp_path / "o/metrics.jsonl").read_text())
    assert rec["task"] == "reach-red" and rec["policy"] == "random"
    assert main(["eval", "--config", str(cfg), "--policy.type", "scripted", "--out", str(tmp_path / "p")]) == 0
    assert json.loads((tmp_path / "p/metrics.jsonl").read_text())["pc_success"] == 100.0
    cfg.write_text("bogus: 1\n")
    assert main(["eval", "--config", str(cfg)]) == 2


def test_tasks_lists_gymnasium_ids(capsys):
    assert main(["tasks", "--json"]) == 0
    ids = json.loads(capsys.readouterr().out)
    assert "wmrl/tabletop-push-red-v0" in ids and "wmrl/tabletop-real-push-red-v0" in ids


def test_demo_quick_runs_the_whole_loop_and_writes_every_report_section(quick_demo):
    out = quick_demo
    html = (out / "report.html").read_text()
    for section in ("before and after RL in imagination", "Learning curves", "real | imagined", "Co-evolution",
                    "Policy ranking", "per-window gain over copy-last and success AUROC"):
        assert section in html
    for media in ("bc_curve.png", "policy_rl/learning_curves.png", "world_model/videos/real_vs_imagined.gif",
                  "eval_policy_rl/push-red/videos/grid.gif", "ranking/ranking.png", "world_model_eval/psnr_gain.png",
                  "world_model_eval/auroc_pairs.png"):
        assert media in html and (out / media).exists(), media
    s = json.loads((out / "summary.json").read_text())
    assert "mirror: true" in (out / "world_model" / "config.yaml").read_text()  # tabletop data: reflections by default
    population = json.loads((out / "ranking" / "ranking.json").read_text())["policies"]
    learned = [p for p in population if p["policy"].partition(":")[0] not in ("scripted", "random")]
    assert s["true_env_steps_during_rl"] == 0 and len(population) >= 8 and s["n_policies"] == len(learned) >= 2
    assert 0 <= s["success_bc"] <= 1
    h, n_imagined = s["hallucinated_success_after"], s["hallucination_imagined_successes"][1]
    assert h != h if n_imagined == 0 else 0 <= h <= 1  # undefined (NaN) exactly when nothing succeeded in imagination
    stages = [json.loads(l)["stage"] for l in (out / "metrics.jsonl").read_text().splitlines() if "stage" in json.loads(l)]
    ev = json.loads((out / "stages/world_model_eval.json").read_text())["result"]
    assert ev["n_windows"] == len(ev["windows"]) >= 1 and ev["success_source"] == "state"
    assert ev["n_pairs"] >= 1 and ev["success_auroc_real_ceiling"] == 1.0
    # the world model's fits after training read episodes it never trained on: other reset seeds, recorded as such
    from pathlib import Path

    import yaml
    seeds = {d: set(json.loads((out / d / "meta/wmrl.json").read_text())["episode_seeds"]) for d in ("dataset", "calibration")}
    assert len(seeds["calibration"]) == 3 and not seeds["calibration"] & seeds["dataset"]
    wm_cfg = yaml.safe_load((out / "world_model/config.yaml").read_text())
    assert Path(wm_cfg["calibration_data"]) == out / "calibration"
    assert Path(yaml.safe_load((out / "coevolution/world_model/config.yaml").read_text())["calibration_data"]) == out / "calibration"
    expected = ["collect", "world_model", "world_model_eval", "bc", "rl", "coevolution", "rl_after_coevolution",
                "evaluation", "ranking", "done"]
    # a resumed run (the imagination benchmark's test shares this demo) only adds another "done"
    assert stages[: len(expected)] == expected and set(stages[len(expected):]) <= {"done"}
    assert main(["demo", "--out", str(out), "--quick", "--resume"]) == 0  # every stage cached: nothing re-runs
    assert main(["demo", "--out", str(out)]) == 2  # an existing run folder is refused


def test_offline_commands_refuse_bad_names_with_the_valid_ones(tmp_path, capsys):
    assert main(["datasets", "make", "--env", "PointEdge-v0", "--kind", "expertish", "--out", str(tmp_path / "d")]) == 2
    assert "kind: expected one of random, medium" in capsys.readouterr().err
    assert main(["offline", "--algo", "cql", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "r")]) == 2
    assert "ravl" in capsys.readouterr().err
    assert main(["finetune", "--algo", "naive-retain", "--agent", str(tmp_path / "a"), "--out", str(tmp_path / "f")]) == 2
    assert "--data" in capsys.readouterr().err
    assert main(["pgd", "--agent", "sac", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "p")]) == 2
    assert "agent: expected one of td3bc, iql" in capsys.readouterr().err


def test_calibrate_twin_refuses_missing_logs_and_unknown_parameters(tmp_path, capsys):
    assert main(["calibrate-twin", "--logs", str(tmp_path / "none"), "--out", str(tmp_path / "t.yaml")]) == 2
    assert "not a wmrl LeRobot v3 dataset" in capsys.readouterr().err
    assert main(["calibrate-twin", "--logs", str(tmp_path), "--params", "gravity"]) == 2
    assert "not identifiable" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["collect", "--num-envs", "0"], "--num-envs must be >= 1"),
    (["collect", "--image-size", "0"], "--image-size must be >= 1"),
    (["collect", "--noise", "nan"], "--noise: NaN is not a setting"),
    (["collect", "--codec", "xvid"], "video codec: expected one of"),
    (["train-wm", "--data", "nowhere", "--holdout", "nan"], "--holdout: NaN is not a setting"),
    (["train-wm", "--data", "nowhere", "--holdout", "1.5"], "--holdout must be in [0, 1]"),
    (["demo", "--calibration-episodes", "-1"], "--calibration-episodes must be >= 0"),
    (["demo", "--rank-workers", "slurm"], "--rank-workers: expected one of ('local', 'ray')"),
    (["deploy", "--safety.joint-margin", "nan"], "NaN"),
    (["deploy", "--safety.gripper-high", "inf"], "--unsafe"),
    (["serve-robot", "--address", "tcp://0.0.0.0:5599", "--allow-remote"], "without authentication"),
])
def test_bad_input_is_one_line_rc_2_and_leaves_no_folder(tmp_path, capsys, args, message):
    out = tmp_path / "run"
    assert main([*args, "--out", str(out)] if args[0] != "serve-robot" else args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists()  # a run that fails during set-up leaves no folder behind


def test_yaml_values_are_type_checked_like_flags(tmp_path, capsys):
    for text, message in (("episodes: many\n", "episodes: expected an integer, got 'many'"),
                          ("noise: [1, 2]\n", "noise: expected a number"), ("overwrite: 1\n", "expected true or false"),
                          ("- a list\n", "expected a mapping of settings"), ("out: {\n", "--config")):
        (tmp_path / "c.yaml").write_text(text)
        assert main(["collect", "--config", str(tmp_path / "c.yaml")]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


def test_overwrite_only_deletes_runs_and_datasets(tmp_path, capsys):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    for cmd in (["collect", "--episodes", "1", "--num-envs", "1"], ["eval", "--episodes", "1"]):
        assert main([*cmd, "--out", str(precious), "--overwrite"]) == 2
        assert "refuses" in capsys.readouterr().err
        assert (precious / "notes.txt").read_text() == "mine"
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["collect", "--episodes", "1", "--out", str(afile / "sub")]) == 2
    assert "a parent of it is a file" in capsys.readouterr().err


def test_resume_with_a_different_config_is_refused(tmp_path):
    from dataclasses import dataclass

    from wmrl.core.run import prepare_run_dir, save_config

    @dataclass
    class Cfg:
        lr: float = 1e-3
        steps: int = 10
        device: str = "cpu"
        resume: bool = False

    run = prepare_run_dir(tmp_path / "r")
    save_config(run, Cfg())
    save_config(prepare_run_dir(run, resume=True), Cfg(steps=20, device="cuda", resume=True))  # longer, elsewhere: fine
    with pytest.raises(ValueError, match=r"config differs .*lr: 0.001 -> 0.01"):
        save_config(run, Cfg(lr=1e-2, steps=20, resume=True))
    with pytest.raises(ValueError, match=r"steps: 20 -> 5"):
        save_config(run, Cfg(steps=5, resume=True))
    assert "lr: 0.001" in (run / "config.yaml").read_text()  # the refused config was not written
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("1")
    with pytest.raises(FileExistsError, match="not a wmrl run"):
        prepare_run_dir(tmp_path / "x", resume=True)


def test_bench_json_stdout_is_the_json_alone(tmp_path, capsys, monkeypatch):
    import wmrl.commands.bench

    (tmp_path / "noisy.py").write_text(
        "print('INFO a library logs on import')\n"
        "def main(quick=False):\n"
        "    print('INFO some library says hello')\n"  # as torchrl's logger does, on stdout
        "    return {'benchmark': 'noisy', 'value': 1}\n")
    monkeypatch.setattr(wmrl.commands.bench, "BENCHMARKS", tmp_path)
    assert main(["bench", "noisy", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"benchmark": "noisy", "value": 1} and "hello" in err  # the log went to stderr
