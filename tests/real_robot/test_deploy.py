"""`wmrl deploy` end to end: a real-time robot process, the safety layer, the executor, and the recorded dataset."""

import json

import numpy as np
import pytest


@pytest.mark.timing  # a 20 Hz real-time loop and its measured delays: a busy neighbour worker makes commands late
def test_deploy_runs_records_and_refuses_unsafe_settings(tmp_path, capsys):
    from wmrl.cli import main
    from wmrl.datasets import LeRobotV3Dataset

    out = tmp_path / "dep"
    assert main(["deploy", "--robot", "sim-real", "--policy", "scripted", "--task", "reach-red", "--mode", "aligned",
                 "--episodes", "2", "--control-hz", "20", "--latency-ms", "60", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["success_rate"] == 1.0  # reach: the expert's chunks get there
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert all(0.05 < r["inference_delay_s"] < 0.3 for r in rows)
    ds = LeRobotV3Dataset(out / "dataset")
    ep = ds.episode(0)
    assert ds.num_episodes == 2 and {"safety.trips", "action.commanded", "observation.images.front"} <= set(ep)
    trips = [json.loads(line) for line in (out / "trips.jsonl").read_text().splitlines()] if (out / "trips.jsonl").exists() else []
    client = [t for t in trips if t["side"] == "client"]
    assert sum(int(np.sum(ds.episode(i)["safety.trips"])) for i in range(2)) == len(client)  # every trip in the episode
    # the server's own layer sees the client's already-limited commands: nothing left for it to clamp (its watchdog
    # may hold the arm while the client writes an episode to disk between episodes)
    server = [t for t in trips if t["side"] == "server"]
    assert summary["server_safety_trips"] == len(server) and {t["kind"] for t in server} <= {"watchdog"}
    capsys.readouterr()
    assert main(["deploy", "--safety.max-velocity", "inf", "--out", str(tmp_path / "x")]) == 2
    assert "--unsafe" in capsys.readouterr().err
    assert main(["deploy", "--mode", "fast", "--out", str(tmp_path / "y")]) == 2
    assert "mode: expected one of sync, async, aligned" in capsys.readouterr().err


def test_deploy_with_a_scripted_operator_records_its_corrections(tmp_path):
    from wmrl.cli import main
    from wmrl.datasets import LeRobotV3Dataset

    out = tmp_path / "dep"
    assert main(["deploy", "--policy", "random", "--operator", "scripted", "--task", "reach-red", "--episodes", "1",
                 "--control-hz", "20", "--max-steps", "60", "--out", str(out)]) == 0
    ep = LeRobotV3Dataset(out / "dataset").episode(0)
    phase = ep["intervention.phase"][:-1]
    assert (phase > 0).any()  # a random policy strays: the operator takes over
    np.testing.assert_array_equal(ep["intervention"][:-1], phase > 0)
    row = json.loads((out / "episodes.jsonl").read_text().splitlines()[0])
    assert row["intervention_steps"] == int((phase > 0).sum()) and row["success"]  # the correction reached the cube
