import json
from dataclasses import replace

import pytest

import numpy as np

from wmrl.eval.rank import (RankConfig, acts_on_objects, bootstrap_spearman, mmrv, paired_hallucination, pool_imagined,
                            parse_policy_spec, policy_label, rank_statistics, ranking_report, run_rank, score_population,
                            short_labels)


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


def test_mmrv_on_known_examples():
    assert mmrv([0.1, 0.5, 0.9], [0.2, 0.4, 0.8]) == 0.0  # the same order: no violation, whatever the values
    # every pair reversed: policy 0's worst violation is vs policy 2 (|0.1 - 0.9|), policy 1's vs either (0.4)
    assert mmrv([0.9, 0.5, 0.1], [0.1, 0.5, 0.9]) == pytest.approx((0.8 + 0.4 + 0.8) / 3)
    # policy 1 (true 0.8) is ranked below policies 2 (0.4) and 3 (0.6): violations 0.4 and 0.2
    assert mmrv([0.2, 0.4, 0.6, 0.8], [0.2, 0.8, 0.4, 0.6]) == pytest.approx((0 + 0.4 + 0.4 + 0.2) / 4)
    assert rank_statistics([0.9, 0.5, 0.1], [0.1, 0.5, 0.9])["rank_mmrv"] == pytest.approx(2 / 3)


def test_bootstrap_interval_is_tight_for_separated_policies_and_wide_for_noise():
    rng = np.random.default_rng(0)
    separated = [np.r_[np.zeros(40 - k), np.ones(k)] for k in (0, 20, 40)]
    assert bootstrap_spearman(separated, separated, n_boot=300) == (1.0, 1.0)
    same_rate = [rng.random(40) < 0.5 for _ in range(6)]  # six policies of equal skill, scored twice independently
    lo, hi = bootstrap_spearman(same_rate, [rng.random(40) < 0.5 for _ in range(6)], n_boot=300, paired=False)
    assert lo < 0 < hi and hi - lo > 1.0
    with pytest.raises(ValueError, match="at least 2"):
        bootstrap_spearman(separated[:1], separated[:1])


def test_ranking_report_keeps_anchors_out_of_the_headline():
    def row(policy, imagined, true, repeat):
        return {"policy": policy, "imagined_outcomes": [1] * imagined + [0] * (10 - imagined),
                "true_outcomes": [1] * true + [0] * (10 - true), "true_repeat_outcomes": [1] * repeat + [0] * (10 - repeat)}

    rows = [row("runs/a", 2, 1, 2), row("runs/b", 5, 4, 3), row("runs/c", 8, 7, 8),
            row("scripted", 0, 10, 10), row("random", 9, 0, 0)]  # the world model gets both anchors wrong
    r = ranking_report(rows, n_boot=200)
    assert r["rank_spearman"] == pytest.approx(1.0) and r["n_policies"] == 3 and r["rank_mmrv"] == 0.0
    assert r["rank_spearman_with_anchors"] < 0.5 and r["anchors"] == ["scripted", "random"]
    assert r["rank_noise_ceiling"] == pytest.approx(1.0) and r["episodes_per_policy"] == 10
    assert r["rank_mmrv_noise_ceiling"] == 0.0  # the repeat orders the three learned policies as the first evaluation
    rows[1]["true_repeat_outcomes"] = [1] * 9 + [0]  # the repeat now puts b (0.4 at first) above c (0.7)
    # the violations, weighted by the first evaluation's gaps: b's worst 0.3 (against c), c's 0.3 (against b), a's none
    assert ranking_report(rows, n_boot=20)["rank_mmrv_noise_ceiling"] == pytest.approx((0 + 0.3 + 0.3) / 3)
    assert r["success_abs_error"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="2 learned"):
        ranking_report(rows[2:])
    assert "rank_spearman_progress" not in r  # rows without rewards: no progress score


def test_hallucinated_success_counts_imagined_successes_whose_paired_true_episode_failed():
    rows = [{"policy": "runs/a", "imagined_outcomes": [1, 1, 0, 0], "true_outcomes": [1, 0, 1, 0]},
            {"policy": "runs/b", "imagined_outcomes": [1, 0, 1, 1], "true_outcomes": [1, 0, 0, 0]},
            {"policy": "random", "imagined_outcomes": [1, 1, 1, 1], "true_outcomes": [0, 0, 0, 0]}]
    # learned policies only: 5 imagined successes, of which a's 2nd and b's 3rd and 4th failed in truth (the imagined
    # failure whose true episode succeeded, a's 3rd, is not a hallucination); the anchor's 4 are left out
    r = ranking_report(rows, n_boot=20)
    assert r["hallucinated_success"] == pytest.approx(3 / 5) and r["n_imagined_successes"] == 5
    # independent of the layouts: a's 2 successes on its 1/2 true failure rate, b's 3 on its 3/4
    assert r["hallucinated_success_independent"] == pytest.approx((2 * 0.5 + 3 * 0.75) / 5)
    assert paired_hallucination(rows[:1]) == {"hallucinated_success": 0.5, "hallucinated_success_independent": 0.5,
                                              "n_imagined_successes": 2}
    none = paired_hallucination([{"policy": "runs/c", "imagined_outcomes": [0, 0], "true_outcomes": [1, 0]}])
    assert np.isnan(none["hallucinated_success"]) and none["n_imagined_successes"] == 0
    with pytest.raises(ValueError, match="differ in number"):
        paired_hallucination([{"policy": "runs/c", "imagined_outcomes": [0, 1], "true_outcomes": [1]}])


def test_pooled_rankings_average_each_episodes_imagined_outcome_and_refuse_unpaired_members():
    """Two imagined evaluations of the same policies on the same layouts pool into one ranking: each episode's imagined
    outcome the members' mean, the true side shared; a pooled outcome of 1/2 counts as half a success."""
    def row(policy, imagined, true, progress=0.5):
        return {"policy": policy, "imagined_outcomes": imagined, "true_outcomes": true, "imagined_seeds": [7, 8, 9],
                "imagined_progress": [progress] * 3, "imagined_success": float(np.mean(imagined)), "imagined_ci95": [0, 1]}

    a = [row("runs/a", [1, 0, 0], [1, 0, 0]), row("runs/b", [1, 1, 0], [1, 1, 1]), row("random", [0, 0, 0], [0, 0, 0])]
    b = [row("runs/a", [0, 0, 1], [1, 0, 0], 0.1), row("runs/b", [1, 1, 1], [1, 1, 1]), row("random", [0, 0, 0], [0, 0, 0])]
    pool = pool_imagined([a, b])
    assert pool[0]["imagined_outcomes"] == [0.5, 0.0, 0.5] and pool[1]["imagined_success"] == pytest.approx(5 / 6)
    assert pool[0]["imagined_progress"] == [0.3] * 3 and pool[0]["imagined_members"] == 2
    assert "imagined_ci95" not in pool[0]  # a member's interval is not the pool's
    assert pool[0]["true_outcomes"] == [1, 0, 0] and pool[0]["imagined_seeds"] == [7, 8, 9]
    # learned policies: 1/2 + 1/2 + 5/2 imagined successes, of which a's third (true failure) is a half: 0.5 of 3.5
    h = paired_hallucination(pool[:2])
    assert h["hallucinated_success"] == pytest.approx(0.5 / 3.5) and h["n_imagined_successes"] == pytest.approx(3.5)
    assert ranking_report(pool, n_boot=20)["rank_spearman"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 2"):
        pool_imagined([a])
    with pytest.raises(ValueError, match="other policies"):
        pool_imagined([a, b[::-1]])
    with pytest.raises(ValueError, match="other layouts or true episodes"):
        pool_imagined([a, [row("runs/a", [0, 0, 1], [0, 0, 0]), *b[1:]]])
    moved = [dict(r, imagined_seeds=[1, 2, 3]) for r in b]
    with pytest.raises(ValueError, match="other layouts or true episodes"):
        pool_imagined([a, moved])
    with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
        paired_hallucination([{"imagined_outcomes": [2], "true_outcomes": [1]}])


def test_the_progress_score_ranks_policies_whose_imagined_successes_are_capped():
    """A world model that caps success (every policy 'succeeds' 3 of 10 times in imagination) cannot rank by
    success, but its best dense reward per episode still orders the policies by how far they got."""
    def row(policy, true, progress):
        return {"policy": policy, "imagined_outcomes": [1] * 3 + [0] * 7, "true_outcomes": [1] * true + [0] * (10 - true),
                "imagined_progress": [progress] * 10}

    rows = [row("runs/a", 2, 0.3), row("runs/b", 5, 0.5), row("runs/c", 9, 0.7), row("runs/d", 7, 0.6), row("random", 0, 0.9)]
    r = ranking_report(rows, n_boot=200)
    assert np.isnan(r["rank_spearman"])  # constant imagined success: no ranking from it
    assert r["rank_spearman_progress"] == pytest.approx(1.0)  # the anchor (progress 0.9, true 0) is left out
    # a tie in imagination counts against every policy truly better: (0.7 + 0.4 + 0 + 0.2) / 4 from success alone
    assert r["rank_mmrv_progress"] == 0.0 and r["rank_mmrv"] == pytest.approx((0.7 + 0.4 + 0.0 + 0.2) / 4)
    lo, hi = r["rank_spearman_progress_ci"]
    assert lo <= 1.0 <= hi + 1e-9
    rows[0]["imagined_progress"] = [0.8] * 10  # the weakest now looks best: one policy out of place
    assert ranking_report(rows, n_boot=50)["rank_spearman_progress"] == pytest.approx(1 - 6 * 12 / (4 * 15))  # sum d^2 = 9+1+1+1


def test_paired_starts_are_the_true_simulators_layouts_and_chunks_step_the_world_model(trained, tiny_data, tiny_policy):
    import sim
    from policies.vla import VLAPolicy
    from policies.factory import make_policy
    from wmrl.core.checkpoint import resolve_checkpoint
    from wmrl.eval import evaluate
    from world_models.env import make_imagination_env
    from world_models.factory import make_world_model

    wm = make_imagination_env(make_world_model("video", trained), tiny_data, 2, 12)
    true = sim.make_vector_env("push-red", 2, asynchronous=False)
    try:
        random = make_policy("random", true.single_action_space)
        im = evaluate(random, wm, 3, seed=7, start_from=true, record=True, progress=False)
        tr = evaluate(random, true, 3, seed=7, record=True, progress=False)
        assert [e["seed"] for e in im.per_episode] == [e["seed"] for e in tr.per_episode] == [7, 8, 9]
        for a, b in zip(im.episodes, tr.episodes):  # the same first frame in both, per camera
            for key in ("observation.images.front", "observation.images.wrist"):
                assert np.array_equal(np.asarray(a[key][0]), np.asarray(b[key][0]))
        other = evaluate(random, wm, 1, seed=8, start_from=true, record=True, progress=False)
        assert not np.array_equal(np.asarray(other.episodes[0]["observation.images.front"][0]),
                                  np.asarray(im.episodes[0]["observation.images.front"][0]))

        policy = VLAPolicy.load(resolve_checkpoint(tiny_policy))
        policy.cfg.n_action_steps = k = min(policy.cfg.chunk_size, wm.max_chunk)
        assert k > 1
        shapes = []
        step = wm.step
        wm.step = lambda a: (shapes.append(np.asarray(a).shape), step(a))[1]
        r = evaluate(policy, wm, 2, seed=7, start_from=true, chunked=True, progress=False)
        assert set(shapes) == {(2, k, 4)} and all(n % k == 0 for n in r.episode_lengths)
        with pytest.raises(ValueError, match="cannot record"):
            evaluate(policy, wm, 2, chunked=True, record=True, progress=False)
    finally:
        true.close()


def test_policy_specs_are_parsed_and_bad_ones_refused(tmp_path):
    p = parse_policy_spec("scripted:noise=0.3,failure_prob=0.5")
    assert (p.type, p.noise, p.failure_prob) == ("scripted", 0.3, 0.5)
    assert parse_policy_spec("random").type == "random"
    with pytest.raises(ValueError, match="unknown option 'speed'"):
        parse_policy_spec("scripted:speed=2")
    with pytest.raises(ValueError, match="not scripted"):
        parse_policy_spec(str(tmp_path / "missing"))
    (tmp_path / "ck").mkdir()
    with pytest.raises(ValueError, match="not a LeRobot checkpoint folder"):
        parse_policy_spec(f"act:{tmp_path / 'ck'}")
    (tmp_path / "ck" / "config.json").write_text("{}")
    p = parse_policy_spec(f"diffusion:{tmp_path / 'ck'}")
    assert (p.type, p.path) == ("diffusion", tmp_path / "ck")
    p = parse_policy_spec(f"{tmp_path / 'ck'}:noise=0.5")  # one strong policy at a chosen noise level
    assert (p.type, p.path, p.noise, p.stochastic) == ("vla", tmp_path / "ck", 0.5, False)
    assert parse_policy_spec(f"{tmp_path / 'ck'}:stochastic").stochastic
    p = parse_policy_spec(f"estimated-state:{tmp_path / 'ck'}")
    assert (p.type, p.path, p.noise, p.stochastic) == ("estimated-state", tmp_path / "ck", 0.0, False)
    p = parse_policy_spec(f"estimated-state:{tmp_path / 'ck'}:noise=0.6")  # the actor degraded, as the VLA
    assert (p.type, p.path, p.noise, p.stochastic) == ("estimated-state", tmp_path / "ck", 0.6, False)
    p = parse_policy_spec(f"estimated-state:{tmp_path / 'ck'}:stochastic")
    assert (p.type, p.path, p.stochastic) == ("estimated-state", tmp_path / "ck", True)
    with pytest.raises(ValueError, match=">= 0"):
        parse_policy_spec(f"estimated-state:{tmp_path / 'ck'}:noise=-1")
    with pytest.raises(ValueError, match="does not exist"):
        parse_policy_spec(f"estimated-state:{tmp_path / 'nope'}")
    for bad, msg in (("noise=x", "must be a number"), ("noise=-1", ">= 0")):
        with pytest.raises(ValueError, match=msg):
            parse_policy_spec(f"{tmp_path / 'ck'}:{bad}")
    # suffixes combine in any order; ':objects' is the estimated-state policy's and says where it reads in imagination
    for tail in (":objects:noise=0.3", ":noise=0.3:objects"):
        p = parse_policy_spec(f"estimated-state:{tmp_path / 'ck'}{tail}")
        assert (p.type, p.path, p.noise) == ("estimated-state", tmp_path / "ck", 0.3)
        assert acts_on_objects(f"estimated-state:{tmp_path / 'ck'}{tail}")
        assert policy_label(f"estimated-state:{tmp_path / 'ck'}{tail}") == "ck:noise=0.3:objects"
    assert not acts_on_objects(f"estimated-state:{tmp_path / 'ck'}:noise=0.3")
    with pytest.raises(ValueError, match="':objects' is for estimated-state"):
        parse_policy_spec(f"{tmp_path / 'ck'}:objects")
    specs = [f"estimated-state:{tmp_path / 'push_pixels_long'}:objects", f"estimated-state:{tmp_path / 'push_pixels_short'}",
             "random"]
    assert short_labels(specs) == ["long:objects", "short", "random"]  # the family's shared prefix dropped in plots
    assert short_labels(specs[:1] + ["random"]) == ["push_pixels_long:objects", "random"]
    (tmp_path / "odd:objects").mkdir()  # a folder named with a suffix is a folder
    assert not acts_on_objects(f"estimated-state:{tmp_path / 'odd:objects'}")


def test_an_estimated_state_policy_reads_predicted_objects_in_imagination_only_when_asked(trained, tiny_data, tmp_path,
                                                                                        monkeypatch):
    """`:objects`: the actor reads the state channel's objects in the world model (no frames decoded) and its
    cameras in the true simulator; without it, the estimator reads the generated frames (the same observations in
    both)."""
    from policies.estimated_state import EstimatedStatePolicy
    from policies.estimated_state.train import train_estimated_state
    from wmrl.eval.rank import score_policy

    policy, _ = train_estimated_state([tiny_data], estimator_steps=2, actor_steps=20, holdout_episodes=2, width=8,
                                      hidden=32, layers=2, progress=False)
    policy.save(tmp_path / "pol")
    seen = []
    features = EstimatedStatePolicy.features

    def spy(self, obs):
        seen.append((self.read_object_channel, any(k.startswith("observation.images") for k in obs)))
        return features(self, obs)

    monkeypatch.setattr(EstimatedStatePolicy, "features", spy)
    for spec, imagined_on_objects in ((f"estimated-state:{tmp_path / 'pol'}:objects", True),
                                      (f"estimated-state:{tmp_path / 'pol'}", False)):
        seen.clear()
        r = score_policy(spec, str(trained), str(tiny_data), "push-red", 2, 2, seed=0, noise_ceiling=False)
        assert r["imagined_seeds"] == r["true_seeds"]
        on_objects = {with_images for on, with_images in seen if on}
        on_cameras = {with_images for on, with_images in seen if not on}
        if imagined_on_objects:
            assert on_objects == {False} and on_cameras == {True}  # no frames in imagination; cameras in the sim
        else:
            assert not on_objects and on_cameras == {True}  # frames everywhere, the generated ones included


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


def test_rank_refuses_layouts_the_world_models_data_was_recorded_on(trained, tiny_data, tmp_path):
    """`tiny_data` was collected from seed 0 (8 episodes): a ranking from seed 5 would score 3 of its layouts
    (a repeat from seed 5 + 1,000,003 none), and is refused before anything is written unless allowed; the default
    seed is clear of them."""
    from wmrl.eval.rank import FRESH_LAYOUTS, seen_layouts
    from wmrl.eval.record import recorded_seeds

    assert recorded_seeds(tiny_data) == list(range(8))
    assert seen_layouts([tiny_data], 5, 4, repeat=True) == {str(tiny_data): [5, 6, 7]}
    assert seen_layouts([tiny_data, trained], FRESH_LAYOUTS, 4, repeat=True) == {}
    with pytest.raises(ValueError, match=r"3 of the ranking's layouts \(reset seeds 5..7\).*--seed"):
        run_rank(RankConfig(policies=("random",), world_model=trained, data=tiny_data, seed=5, episodes=4,
                            out=tmp_path / "rank"), progress=False)
    assert not (tmp_path / "rank").exists()
    r = run_rank(RankConfig(policies=("scripted", "random"), world_model=trained, data=tiny_data, seed=5, episodes=4, num_envs=2,
                            noise_ceiling=False, allow_seen_layouts=True, max_steps=5, out=tmp_path / "rank"), progress=False)
    assert r["seen_layouts"] == 3 and r["policies"][0]["true_seeds"] == [5, 6, 7, 8]


def _copy_with_seeds(src, dst, seeds):
    """A copy of dataset `src` whose recording says its episodes were reset with `seeds`."""
    import shutil

    shutil.copytree(src, dst)
    meta = json.loads((dst / "meta/wmrl.json").read_text())
    (dst / "meta/wmrl.json").write_text(json.dumps({**meta, "episode_seeds": list(seeds)}))
    return dst


def test_rank_refuses_layouts_a_policy_learned_from(trained, tiny_data, tiny_policy, tmp_path):
    """A policy's lineage is followed: the BC data its config.yaml names, from a checkpoint folder inside the
    run too, and the DAgger rounds recorded inside it. A ranking on those layouts is refused naming the source."""
    import shutil

    import yaml

    from wmrl.eval.rank import FRESH_LAYOUTS, learned_layouts

    bc = _copy_with_seeds(tiny_data, tmp_path / "bc", range(FRESH_LAYOUTS + 2, FRESH_LAYOUTS + 10))
    pol = tmp_path / "pol"
    shutil.copytree(tiny_policy, pol)
    cfg = yaml.safe_load((pol / "config.yaml").read_text())
    (pol / "config.yaml").write_text(yaml.safe_dump({**cfg, "data": [str(bc)]}))
    assert learned_layouts(pol) == {str(bc): list(range(FRESH_LAYOUTS + 2, FRESH_LAYOUTS + 10))}
    assert learned_layouts(pol / "checkpoints" / "last") == learned_layouts(pol)
    _copy_with_seeds(tiny_data, pol / "dagger" / "round_00", range(50, 58))
    assert learned_layouts(pol)[str(pol / "dagger" / "round_00")] == list(range(50, 58))
    with pytest.raises(ValueError, match=rf"2 of the ranking's layouts \(reset seeds {FRESH_LAYOUTS + 2}..{FRESH_LAYOUTS + 3}\)"
                                         rf".*{bc}: 2"):
        run_rank(RankConfig(policies=(str(pol), "random"), world_model=trained, data=tiny_data, episodes=4,
                            noise_ceiling=False, out=tmp_path / "rank"), progress=False)
    assert not (tmp_path / "rank").exists()


def test_learned_layouts_of_a_world_model_include_its_state_dagger_rounds(tiny_data, tmp_path, monkeypatch):
    """A world model run with state-DAgger rounds learned the layouts its rounds imagined the expert from: the
    ones `_round` actually passes to the simulator (spied), by hand: 1,000,000 + 10,000 round + 1,000 (seed % 10)."""
    import yaml

    from wmrl.eval.rank import learned_layouts
    from world_models.video import state_dagger

    run = tmp_path / "wm"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"data": str(tiny_data), "extra_data": [], "seed": 3,
                                                     "state_dagger_rounds": 2, "state_dagger_starts": 5}))
    by_hand = [1_003_000 + j for j in range(5)] + [1_013_000 + j for j in range(5)]
    got = learned_layouts(run)
    assert got[f"{run} (state DAgger)"] == by_hand and got[str(tiny_data)] == list(range(8))
    used = []
    monkeypatch.setattr(state_dagger, "imagined_visits", lambda model, replay, task, seeds, *a, **k: (used.extend(seeds), ([], 0.0))[1])
    monkeypatch.setattr(state_dagger, "true_continuations", lambda *a, **k: ([], 0))
    for r in range(2):
        state_dagger._round(None, None, ["push-red"], state_dagger.StateDaggerConfig(rounds=2, starts=5), r, 3)
    assert used == by_hand


def test_rank_writes_statistics_and_scatter(trained, tiny_data, tmp_path):
    r = run_rank(RankConfig(policies=("scripted", "scripted:failure_prob=1.0", "random"), world_model=trained,
                            data=tiny_data, episodes=2, num_envs=2, out=tmp_path / "rank"), progress=False)
    assert r["n_policies"] == 3 and (tmp_path / "rank/ranking.png").exists()
    rows = {x["policy"]: x for x in r["policies"]}
    assert rows["scripted"]["true_success"] == 1.0 and rows["scripted:failure_prob=1.0"]["true_success"] == 0.0
    assert all(0 <= x["imagined_success"] <= 1 for x in r["policies"])
    saved = json.loads((tmp_path / "rank/ranking.json").read_text())
    assert saved["success_abs_error"] == pytest.approx(r["success_abs_error"])
    for x in r["policies"]:  # paired: the same seeds in both environments, another set for the noise ceiling
        assert x["imagined_seeds"] == x["true_seeds"] != x["true_repeat_seeds"]
        assert np.mean(x["true_outcomes"]) == x["true_success"]


def test_rank_max_steps_cuts_the_episodes_in_both_worlds(trained, tiny_data, tmp_path):
    """The expert that succeeds from these layouts (above) needs 13-33 steps: cut to 2, it fails in both worlds
    (no imagined success either: nothing moved the cube); the length is recorded, and 0 is refused."""
    cfg = RankConfig(policies=("scripted", "random"), world_model=trained, data=tiny_data, episodes=2, num_envs=2,
                     noise_ceiling=False, max_steps=2, out=tmp_path / "rank")
    r = run_rank(cfg, progress=False)
    scripted = next(x for x in r["policies"] if x["policy"] == "scripted")
    assert scripted["true_success"] == 0.0 and scripted["imagined_success"] == 0.0 and r["max_steps"] == 2
    with pytest.raises(ValueError, match="--max-steps"):
        run_rank(replace(cfg, max_steps=0, out=tmp_path / "zero"), progress=False)


def test_rank_reports_the_share_of_imagined_episodes_the_hallucination_flag_stopped(trained, tiny_data):
    from wmrl.eval.rank import score_policy

    r = score_policy("random", str(trained), str(tiny_data), "push-red", 4, 2, 0, noise_ceiling=False, stop_cm=1e-6)
    # any spread at all flags: a flagged episode is a failure, so flagged + successful episodes never exceed all
    assert "imagined_flagged" in r and r["imagined_flagged"] + r["imagined_success"] <= 1.0
    assert "imagined_flagged" not in score_policy("random", str(trained), str(tiny_data), "push-red", 2, 2, 0,
                                                  noise_ceiling=False)


def test_ray_workers_give_the_same_metrics_as_in_process(trained, tiny_data, tmp_path):
    pytest.importorskip("ray")
    specs = ["scripted:noise=0.3", "random"]
    # 20-step episodes: the comparison is of the same episodes run two ways, not of their length
    args = dict(world_model=str(trained), data=str(tiny_data), task="push-red", episodes=2, num_envs=2, seed=3, max_steps=20)
    local = score_population(specs, **args, progress=False)
    remote = score_population(specs, **args, workers="ray", num_workers=2)
    keys = ["policy", "imagined_success", "true_success", "imagined_ci95", "true_ci95"]
    assert [{k: r[k] for k in keys} for r in remote] == [{k: r[k] for k in keys} for r in local]
    # a policy that fails inside a worker is named with the worker's own error, not only Ray's wrapper
    (tmp_path / "empty").mkdir()
    with pytest.raises((ValueError, FileNotFoundError), match=r"policy 'estimated-state:.*empty'"):
        score_population([f"estimated-state:{tmp_path / 'empty'}"], **args, workers="ray", num_workers=1)


def test_rank_passes_the_state_channels_readout_gate_sampler_seed_and_object_layer_to_imagination(trained, tiny_data, tmp_path, monkeypatch):
    import wmrl.eval.rank as rank

    seen = {}
    load, make_env = rank.make_world_model, rank.make_imagination_env
    monkeypatch.setattr(rank, "make_world_model",
                        lambda *a, **kw: (seen.update(gate=kw.get("state_gate"), layer=kw.get("object_layer")), load(*a, **kw))[1])
    monkeypatch.setattr(rank, "make_imagination_env",
                        lambda *a, **kw: (seen.update(readout=kw.get("state_readout"), sampler=kw.get("sampler_seed")),
                                          make_env(*a, **kw))[1])
    rank.score_policy("random", str(trained), str(tiny_data), "push-red", 2, 2, 0, noise_ceiling=False,
                      state_readout="member", state_gate="hard", sampler_seed=4, object_layer="blend")
    assert seen == {"gate": "hard", "layer": "blend", "readout": "member", "sampler": 4}
    for bad, flag in ((dict(state_readout="median"), "--state-readout"), (dict(state_gate="maybe"), "--state-gate"),
                      (dict(sampler_seed=-1), "--sampler-seed"), (dict(object_layer="glued"), "--object-layer")):
        with pytest.raises(ValueError, match=flag):  # refused before any work
            run_rank(RankConfig(policies=("random", "scripted"), world_model=trained, data=tiny_data,
                                out=tmp_path / "r", **bad))
    assert not (tmp_path / "r").exists()
