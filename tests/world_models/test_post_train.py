"""World-model post-training on its own rollouts (PersistWorld + DiffusionNFT, `world_models/video/post_train.py`)."""

import hashlib
import json

import numpy as np
import pytest
import torch

from world_models.video import post_train as pt
from world_models.video.post_train import PostTrainWMConfig, nft_loss, nft_targets, optimality, post_train_world_model


def test_nft_targets_and_the_reward_weighted_loss_on_a_hand_example():
    d, d_old, x0 = torch.tensor([[2.0]]), torch.tensor([[1.0]]), torch.tensor([[0.0]])
    pos, neg = nft_targets(d, d_old, 0.5)  # v+ = v_old + b (v - v_old), v- = v_old - b (v - v_old)
    assert pos.item() == pytest.approx(1.5) and neg.item() == pytest.approx(0.5)
    w = torch.tensor([2.0])
    # r = 1: only the positive model is pulled toward the sample; r = 0: only the negative one; in between: the mix
    assert nft_loss(d, d_old, x0, torch.tensor([1.0]), w, 0.5).item() == pytest.approx(2 * 1.5**2)
    assert nft_loss(d, d_old, x0, torch.tensor([0.0]), w, 0.5).item() == pytest.approx(2 * 0.5**2)
    assert nft_loss(d, d_old, x0, torch.tensor([0.25]), w, 0.5).item() == pytest.approx(2 * (0.25 * 2.25 + 0.75 * 0.25))
    # the gradient: a good sample (r = 1) moves D toward x0, a bad one (r = 0) away from it
    for r, sign in ((1.0, -1), (0.0, 1)):
        dd = d.clone().requires_grad_(True)
        nft_loss(dd, d_old, x0, torch.tensor([r]), w, 0.5).sum().backward()
        assert np.sign(-dd.grad.item()) == sign  # the descent direction


def test_optimality_is_relative_within_each_group():
    r = optimality(np.array([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0]), group=4)
    assert np.all(np.diff(r[:4]) > 0) and r[:4].min() >= 0 and r[:4].max() <= 1
    assert np.allclose(r[:4] + r[3::-1], 1.0)  # symmetric around the group mean
    assert np.allclose(r[4:], 0.5)  # a group without differences gives no direction
    assert np.allclose(optimality(np.array([0.0, 1.0]) + 100, 2), optimality(np.array([0.0, 1.0]), 2))  # shift-free
    with pytest.raises(ValueError, match="multiple of 4"):
        optimality(np.zeros(6), 4)


def test_the_moving_pixels_reward_scores_only_where_the_real_future_changes():
    rng = np.random.default_rng(0)
    start = rng.integers(0, 256, (2, 8, 8, 3)).astype(np.uint8)
    real = np.repeat(start[:, None], 3, 1)  # (N=2, L=3, H, W, 3)
    real[0, :, 2:4, 2:4] = 255 - real[0, :, 2:4, 2:4]  # in rollout 0 a 2x2 patch changes; in rollout 1 nothing moves
    good = real.copy()
    bad = real.copy()
    bad[0, :, 2:4, 2:4] = real[0, :, 2:4, 2:4] // 2  # wrong on the moving patch only
    r, s, st = {"c": real}, {"c": start}, None
    base = pt.fidelity({"c": bad}, r)
    w = pt.fidelity({"c": bad}, r, s, moving_weight=2.0)
    mask = np.zeros((3, 8, 8), bool)
    mask[:, 2:4, 2:4] = True
    from world_models.video.evaluate import psnr

    by_hand = np.nanmean(psnr(bad[0], real[0], mask)) / 10.0
    assert w[0] == pytest.approx(base[0] + 2.0 * by_hand) and w[1] == pytest.approx(base[1])  # nothing moved: + 0
    # an exact prediction of the patch gets the capped PSNR there; the wrong one far less
    assert pt.fidelity({"c": good}, r, s, 1.0)[0] - pt.fidelity({"c": good}, r)[0] > w[0] - base[0]
    assert np.array_equal(pt.fidelity({"c": bad}, r, s, 0.0), base)  # weight 0: the whole-frame reward alone
    with pytest.raises(ValueError, match="start frames"):
        pt.fidelity({"c": bad}, r, st, moving_weight=1.0)


def test_a_soft_updated_old_model_moves_by_one_minus_eta_toward_the_trained_one(trained, tiny_data, tmp_path):
    from wmrl.core.checkpoint import resolve_checkpoint
    from world_models.video.model import VideoWorldModel

    post_train_world_model(_cfg(trained, tiny_data, tmp_path / "p", iterations=1, old_ema=0.75), progress=False)
    ck = tmp_path / "p" / "checkpoints" / "last"
    base, post, old = (VideoWorldModel.load(x) for x in (resolve_checkpoint(trained), ck, ck / "old"))
    moved = 0
    for pb, pp, po in zip(*(pt.denoiser_parameters(m) for m in (base, post, old))):
        torch.testing.assert_close(po, 0.75 * pb + 0.25 * pp, rtol=1e-5, atol=1e-6)
        moved += int(not torch.equal(pb, pp))
    assert moved > 0  # the trained model moved, so the check above is not 0 = 0


def _cfg(trained, tiny_data, out, **kw):
    base = dict(world_model=trained, data=tiny_data, out=out, iterations=2, windows=2, candidates=2, horizon=8,
                min_horizon=4, minibatch=4, lr=1e-3, ckpt_every=1, overwrite=True)
    return PostTrainWMConfig(**{**base, **kw})


def test_rewards_score_each_rollout_against_the_real_future_of_its_own_window(trained, tiny_data, monkeypatch, tmp_path):
    seen = {}
    real_sample, real_fidelity = pt.WindowSampler.sample, pt.fidelity

    def sample(self, *a, **kw):
        seen["d"], seen["images"] = (d := real_sample(self, *a, **kw)), self.images
        return d

    def fidelity(pred, real, *a, **kw):
        seen.setdefault("calls", []).append((pred, real, seen["d"]))
        return real_fidelity(pred, real, *a, **kw)

    monkeypatch.setattr(pt.WindowSampler, "sample", sample)
    monkeypatch.setattr(pt, "fidelity", fidelity)
    post_train_world_model(_cfg(trained, tiny_data, tmp_path / "p", iterations=1), progress=False)
    (pred, real, d), = seen["calls"]
    fut = d["fut_idx"].numpy()
    for k, frames in real.items():
        cam = k.removeprefix("observation.images.")
        want = seen["images"][cam].numpy()[fut]  # (W, L, H, W, 3): the recorded frames after each window's start
        assert np.array_equal(frames, np.repeat(want, 2, 0))  # each of the G=2 candidates against its own window
        assert pred[k].shape == frames.shape


def _digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_only_the_denoiser_moves_and_the_base_stays_as_it_was(trained, tiny_data, tmp_path):
    from wmrl.core.checkpoint import resolve_checkpoint
    from world_models.video.model import VideoWorldModel

    base_ck = resolve_checkpoint(trained)
    before = _digest(base_ck)
    r = post_train_world_model(_cfg(trained, tiny_data, tmp_path / "p"), progress=False)
    assert _digest(base_ck) == before  # the frozen reference is the base on disk, untouched
    base, post = VideoWorldModel.load(base_ck), VideoWorldModel.load(tmp_path / "p" / "checkpoints" / "last")
    sb, sp = base.state_dict(), post.state_dict()
    den = {id(p) for p in pt.denoiser_parameters(post)}
    names = {n for n, p in post.named_parameters() if id(p) in den}
    assert any(not torch.equal(sb[n], sp[n]) for n in names)  # the denoiser was trained
    assert all(torch.equal(sb[n], sp[n]) for n in sp if n not in names)  # autoencoder, heads, state channel, stats
    assert r["iterations"] == 2 and np.isfinite(r["loss"])


def test_forcing_trains_on_the_recorded_future_with_the_models_own_chunks_as_context(trained, tiny_data, monkeypatch, tmp_path):
    seen = {"steps": []}
    real_own, real_step = pt.own_rollouts, pt.forcing_step

    def own_rollouts(model, d, *a, **kw):
        seen["d"], (chunks, lat) = d, (out := real_own(model, d, *a, **kw))
        seen["chunks"], seen["lat"] = chunks, lat
        return out

    def forcing_step(model, batch):
        seen["steps"].append(batch)
        return real_step(model, batch)

    monkeypatch.setattr(pt, "own_rollouts", own_rollouts)
    monkeypatch.setattr(pt, "forcing_step", forcing_step)
    post_train_world_model(_cfg(trained, tiny_data, tmp_path / "p", iterations=1, objective="forcing", min_horizon=8,
                                candidates=1, minibatch=3), progress=False)
    d, chunks, lat = seen["d"], seen["chunks"], seen["lat"]
    H, K = 4, d["ctx"].shape[1]
    assert len(chunks) == 2 and lat.shape[1] == 8
    torch.testing.assert_close(chunks[0]["ctx"], d["ctx"])  # the first chunk: real context
    # the second: the model's own first chunk as its context (not the recorded frames), the recorded chunk as target
    torch.testing.assert_close(chunks[1]["ctx"], torch.cat([d["ctx"], lat[:, :H]], 1)[:, -K:])
    assert not torch.allclose(chunks[1]["ctx"][:, -1], d["future"][:, H - 1])
    for c in range(2):
        torch.testing.assert_close(chunks[c]["future"], d["future"][:, c * H : (c + 1) * H])
    # every chunk reaches the loss once, in minibatches
    got = torch.cat([b["future"] for b in seen["steps"]])
    assert [len(b["future"]) for b in seen["steps"]] == [3, 1]
    assert sorted(got.flatten(1).sum(1).tolist()) == pytest.approx(
        sorted(torch.cat([c["future"] for c in chunks]).flatten(1).sum(1).tolist()))


@pytest.mark.parametrize("old_ema", [0.0, 0.5, "forcing"])
def test_resume_reproduces_the_next_iteration(trained, tiny_data, tmp_path, old_ema):
    # with a soft-updated old model, kept in the checkpoint; the forcing objective draws its noise from torch's generator
    kw = dict(objective="forcing") if old_ema == "forcing" else dict(old_ema=old_ema, moving_weight=1.0) if old_ema else {}
    post_train_world_model(_cfg(trained, tiny_data, tmp_path / "a", iterations=3, **kw), progress=False)
    post_train_world_model(_cfg(trained, tiny_data, tmp_path / "b", iterations=2, **kw), progress=False)
    post_train_world_model(_cfg(trained, tiny_data, tmp_path / "b", iterations=3, resume=True, overwrite=False, **kw),
                           progress=False)
    rec = lambda run: [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if '"iteration"' in l]
    a, b = rec(tmp_path / "a"), rec(tmp_path / "b")
    assert [x["iteration"] for x in b] == [1, 2, 3]
    assert b[2]["loss"] == pytest.approx(a[2]["loss"], rel=1e-5) and b[2]["horizon"] == a[2]["horizon"]


def test_bad_configurations_are_refused_before_a_run_folder_exists(trained, tiny_data, tmp_path):
    for kw, msg in (({"candidates": 1}, "candidates must be >= 2"), ({"horizon": 6}, "multiples of the model's chunk"),
                    ({"min_horizon": 12}, "min-horizon <= --horizon"), ({"beta": 0.0}, "beta > 0"),
                    ({"old_ema": 1.0}, "old-ema < 1"), ({"moving_weight": -1.0}, "moving-weight >= 0"),
                    ({"objective": "reward"}, "objective: expected one of"),
                    ({"objective": "forcing", "ref_coef": 1.0}, "belong to nft")):
        with pytest.raises(ValueError, match=msg):
            post_train_world_model(_cfg(trained, tiny_data, tmp_path / "x", **kw), progress=False)
        assert not (tmp_path / "x").exists()
