import json

import pytest

from wmrl.eval.rank import RankConfig, parse_policy_spec, rank_statistics, run_rank, score_population


def test_rank_statistics_on_known_inputs():
    s = rank_statistics([0.1, 0.5, 0.9, 0.3], [0.0, 0.6, 1.0, 0.2])
    assert s["rank_spearman"] == pytest.approx(1.0) and s["rank_kendall"] == pytest.approx(1.0)
    assert s["success_abs_error"] == pytest.approx((0.1 + 0.1 + 0.1 + 0.1) / 4)
    s = rank_statistics([0.9, 0.5, 0.1], [0.1, 0.5, 0.9])
    assert s["rank_spearman"] == pytest.approx(-1.0) and s["rank_kendall"] == pytest.approx(-1.0)
    s = rank_statistics([0.2, 0.4, 0.6, 0.8], [0.2, 0.8, 0.4, 0.6])  # one swap of two neighbours... and one more
    assert s["rank_spearman"] == pytest.approx(0.4) and s["rank_kendall"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="at least 2"):
        rank_statistics([0.5], [0.5])


def test_policy_specs_are_parsed_and_bad_ones_refused(tmp_path):
    p = parse_policy_spec("scripted:noise=0.3,failure_prob=0.5")
    assert (p.type, p.noise, p.failure_prob) == ("scripted", 0.3, 0.5)
    assert parse_policy_spec("random").type == "random"
    with pytest.raises(ValueError, match="unknown option 'speed'"):
        parse_policy_spec("scripted:speed=2")
    with pytest.raises(ValueError, match="not scripted"):
        parse_policy_spec(str(tmp_path / "missing"))


def test_a_world_model_of_another_task_is_refused_with_both_names(trained, tiny_data, tiny_policy, tmp_path):
    from policies.vla import VLAPolicy
    from wmrl.core.checkpoint import resolve_checkpoint
    from wmrl.rl.imagine import ImagineConfig, imagine

    with pytest.raises(ValueError, match=r"(?s)--task lift-blue is for task\(s\) \['lift-blue'\].*trained on \['push-red'\]"):
        run_rank(RankConfig(policies=("random",), world_model=trained, data=tiny_data, task="lift-blue",
                            out=tmp_path / "rank"), progress=False)
    assert not (tmp_path / "rank").exists()  # refused before anything was written
    assert VLAPolicy.load(resolve_checkpoint(tiny_policy)).cfg.tasks == ["push-red"]
    other = VLAPolicy.load(resolve_checkpoint(tiny_policy))
    other.cfg.tasks = ["lift-blue"]
    other.save(tmp_path / "lift_policy")
    with pytest.raises(ValueError, match=r"is for task\(s\) \['lift-blue'\].*trained on \['push-red'\]"):
        imagine(ImagineConfig(policy=tmp_path / "lift_policy", world_model=trained, data=tiny_data,
                              out=tmp_path / "im"), progress=False)


def test_rank_writes_statistics_and_scatter(trained, tiny_data, tmp_path):
    r = run_rank(RankConfig(policies=("scripted", "scripted:failure_prob=1.0", "random"), world_model=trained,
                            data=tiny_data, episodes=2, num_envs=2, out=tmp_path / "rank"), progress=False)
    assert r["n_policies"] == 3 and (tmp_path / "rank/ranking.png").exists()
    rows = {x["policy"]: x for x in r["policies"]}
    assert rows["scripted"]["true_success"] == 1.0 and rows["scripted:failure_prob=1.0"]["true_success"] == 0.0
    assert all(0 <= x["imagined_success"] <= 1 for x in r["policies"])
    saved = json.loads((tmp_path / "rank/ranking.json").read_text())
    assert saved["success_abs_error"] == pytest.approx(r["success_abs_error"])


def test_ray_workers_give_the_same_metrics_as_in_process(trained, tiny_data):
    pytest.importorskip("ray")
    specs = ["scripted:noise=0.3", "random"]
    args = dict(world_model=str(trained), data=str(tiny_data), task="push-red", episodes=2, num_envs=2, seed=3)
    local = score_population(specs, **args, progress=False)
    remote = score_population(specs, **args, workers="ray", num_workers=2)
    keys = ["policy", "imagined_success", "true_success", "imagined_ci95", "true_ci95"]
    assert [{k: r[k] for k in keys} for r in remote] == [{k: r[k] for k in keys} for r in local]
