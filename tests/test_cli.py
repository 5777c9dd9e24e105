import json

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


def test_unknown_names_list_valid_ones(tmp_path, capsys):
    assert main(["eval", "--task", "juggle-red", "--episodes", "1", "--out", str(tmp_path / "r")]) == 2
    assert "valid tasks" in capsys.readouterr().err
    assert main(["eval", "--policy", "genius", "--task", "reach-red", "--episodes", "1", "--out", str(tmp_path / "q")]) == 2
    assert "valid: random, scripted" in capsys.readouterr().err
    assert main(["bench", "nope"]) == 2
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


def test_demo_writes_report_with_videos_and_world_model(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--episodes", "6", "--eval-episodes", "2", "--wm-steps", "8"]) == 0
    html = (out / "report.html").read_text()
    assert "eval_scripted/videos/grid.gif" in html and "real_vs_imagined.gif" in html
    assert (out / "world_model/videos/real_vs_imagined.gif").exists()
    stages = [json.loads(l)["stage"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert stages == ["collect", "replay", "eval_scripted", "eval_random", "world_model", "done"]
    assert main(["demo", "--out", str(out)]) == 2  # an existing run folder is refused
