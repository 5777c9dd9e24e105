import numpy as np
import pytest
import torch
import yaml

import sim
from policies.vla import VLAPolicy
from sim.experts import ScriptedExpert
from wmrl.core.checkpoint import resolve_checkpoint
from wmrl.eval import evaluate
from wmrl.rl.coevolve import (evolve_world_model, hallucination_rate, imagine_from, imagined_success_sft,
                              replay_in_true_sim, _true_starts)
from world_models.video.model import VideoWorldModel
from world_models.video.train import recorded_recipe


def test_replay_in_the_true_simulator_reproduces_a_seeded_episode():
    env = sim.make_env("push-red").unwrapped
    r = evaluate(ScriptedExpert(seed=0), env, 1, seed=123, record=True, progress=False)
    actions = r.episodes[0]["action"][:-1]  # the last row pads the final observation
    assert r.per_episode[0]["success"]
    assert replay_in_true_sim("push-red", 123, actions)
    assert not replay_in_true_sim("push-red", 123, np.zeros_like(actions))


def test_imagined_rollouts_stop_at_success_and_record_every_step(trained, tiny_policy):
    model = VideoWorldModel.load(resolve_checkpoint(trained))
    policy = VLAPolicy.load(resolve_checkpoint(tiny_policy)).eval()
    starts, _ = _true_starts("push-red", [1, 2, 3])
    r = imagine_from(policy, model, starts, max_steps=10, record=True)
    assert all(len(a) == 10 for a, s in zip(r["actions"], r["success"]) if not s)
    assert all(len(f) == len(a) + 1 for f, a in zip(r["frames"], r["actions"]))
    assert r["frames"][0][3]["observation.images.front"].shape == (64, 64, 3)
    r0 = imagine_from(policy, model, starts, max_steps=10, success_threshold=0.0, rules=None)  # frames path
    assert r0["success"].all() and all(len(a) == 1 for a in r0["actions"])  # success on the first imagined frame


def test_hallucination_rate_counts_imagined_successes_that_fail_in_the_true_sim(trained, tiny_policy):
    model = VideoWorldModel.load(resolve_checkpoint(trained))
    policy = VLAPolicy.load(resolve_checkpoint(tiny_policy)).eval()
    h = hallucination_rate(policy, model, "push-red", n=3, success_threshold=0.0, rules=None)
    # every rollout "succeeds" after one imagined step; one action never solves a push in the true simulator
    assert h["imagined_success"] == 1.0 and h["replayed_true_success"] == 0.0 and h["hallucinated_success"] == 1.0
    # nothing succeeds in imagination: the share is undefined, not 0 (which would read as "no hallucination")
    h = hallucination_rate(policy, model, "push-red", n=2, success_threshold=2.0, rules=None)
    assert h["n_imagined_success"] == 0 and np.isnan(h["hallucinated_success"])


def test_imagined_success_sft_clones_the_kept_trajectories(trained, tiny_policy, tmp_path):
    model = VideoWorldModel.load(resolve_checkpoint(trained))
    policy = VLAPolicy.load(resolve_checkpoint(tiny_policy))
    before = [p.detach().clone() for p in policy.parameters()]
    r = imagined_success_sft(policy, model, "push-red", n=3, steps=3, batch_size=4, success_threshold=0.0,
                             progress=False, rules=None)
    assert r["imagined_successes"] == 3 and r["steps"] == 3 and np.isfinite(r["loss_last"])
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))
    r = imagined_success_sft(policy, model, "push-red", n=2, steps=3, success_threshold=1.01, progress=False, rules=None)
    assert r["imagined_successes"] == 0 and r["steps"] == 0


def test_evolve_world_model_fine_tunes_on_true_rollouts_of_the_policy(trained, tiny_policy, tmp_path):
    out = evolve_world_model(trained, tiny_policy, "push-red", budget=2, out=tmp_path / "evo", steps=5, progress=False)
    from wmrl.datasets import LeRobotV3Dataset

    ds = LeRobotV3Dataset(tmp_path / "evo/rollouts")
    assert ds.num_episodes == 2
    new = VideoWorldModel.load(resolve_checkpoint(out))
    old = VideoWorldModel.load(resolve_checkpoint(trained))
    assert new.cfg == old.cfg
    assert torch.equal(new.ae.enc[0].weight, old.ae.enc[0].weight)  # autoencoder kept (no AE steps)
    assert not torch.equal(new.unet.out.weight, old.unet.out.weight)  # dynamics fine-tuned from the old weights
    # the change mask is refitted from the base's fitted mask with a quarter of the base's steps (rounded up)
    base_steps = yaml.safe_load((trained / "config.yaml").read_text())["change_mask_steps"]
    assert base_steps > 4 and yaml.safe_load((out / "config.yaml").read_text())["change_mask_steps"] == -(-base_steps // 4)


def test_a_fine_tune_keeps_its_sources_recipe_and_an_older_configs_options_stay_off():
    """The co-evolution fine-tune takes the source run's model options (today's defaults would retrain a frames model
    built without them), not its run's own (paths, device, seed), and options a config predates were off."""
    recipe = recorded_recipe({"size": "tiny", "frame_blobs": False, "state_members": 3, "device": "cuda", "seed": 7,
                            "data": "d", "out": "o", "threads": 2, "not_an_option": 1})
    assert recipe["size"] == "tiny" and recipe["state_members"] == 3 and recipe["frame_blobs"] is False
    assert recipe["change_objects"] is False and recipe["head_rollout_steps"] == 0  # absent: off when recorded
    assert not {"device", "seed", "data", "out", "threads", "not_an_option"} & set(recipe)
    assert recorded_recipe({"change_objects": True, "head_rollout_steps": 1500}) == {
        "frame_blobs": False, "change_objects": True, "head_rollout_steps": 1500, "change_pose_layer": False,
        "change_bf16": False, "mirror": False}
