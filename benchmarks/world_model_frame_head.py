"""Frames-only success (the path for data without an environment-state channel): is its AUROC bound by how the
frame heads are fitted, or by what the generated latents hold?

One trained world model (a `wmrl demo` run, or any folder with `world_model/` and `dataset/`) rolls out the success /
near-success pairs of its demo evaluation (`success_pairs`, seeds 60000 + seed; 1 Euler step per chunk, as
imagination samples) once; the generated latents are kept. Then its frame heads are refitted on rollouts of its
training episodes in several ways (`rollout_heads.fit_heads_on_rollouts`), and each variant's success head scores
the same generated latents (`frames`: matched-length AUROC, bootstrap interval over pairs) and the same episodes'
real latents (`real`: the head on real frames):

- `trained`: the heads as training left them (training ends with one such refit);
- `refit_again`: another refit with the defaults, from `trained`;
- `pos_weight_1`: the same without up-weighting the rare success frames (false firing in a shared prefix caps the
  max-over-steps score);
- `horizon_80`: rollouts to 80 steps (the near-successes' length);
- `fresh`: heads reinitialised and fitted on rollouts only.

The check of the metric: a random scorer on the same pairs (`random_scorer_auroc_matched`, near 0.5). `spread`: the
largest minus the smallest variant's frames AUROC; when it is well inside one variant's interval, the head's fitting
is not the lever.

`holds`: each variant's scores read as a frames-path `WorldModelEnv(success_hold=k)` thresholds them, the max of the
level the head holds for k generated frames in a row (`held_level`; k=1 is the peak, the `frames` above), on the
generated and the real latents, with a random scorer under the same readout; `hold_gain` is the trained heads' k=2
and k=3 AUROC minus their k=1, with a bootstrap interval over the same pairs.

`pixels`: is the resolution the limit, or the head on 16x16 latents? A small CNN (`pixel_classifier`) on the real
64x64 frames of both cameras of the same training episodes, with the same labels, scores the pairs' real frames and
the same rollouts' generated frames decoded as policies see them (`pixels_minus_trained`: its generated-frame AUROC
minus the trained latent head's, on the same pairs).

`pixel_ladder`: where between the real and the generated frames the pixel classifier loses success, on the same
pairs: `real`; `reconstructed`, the real frames' latents decoded through the identity path (the start frame plus
the decoded change, no mask: what the latent space keeps of the cube); `generated_exact_points`, the generated
latents decoded with each object's patch placed at its recorded position (the state channel's points made exact at
the decode only, where the mask has object sources); `generated`, as policies see them.

`pixels_trained_on_rollouts`: World-VLA-Loop's reward head on decoded frames, the same classifier fitted on the
model's own rollouts of the training episodes (from each first frame, under the recorded actions, 1 Euler step;
labels as recorded), alone (`rollouts`) and with the real frames (`rollouts_and_real`); `frames_minus_real_trained`
is its generated-frame AUROC minus the real-frame classifier's, on the same pairs.

    wmrl bench world-model-frame-head --json --options run=runs/demo    # -> results/world-model-frame-head-demo.json
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish, tiny_world_model

ROOT = Path(__file__).resolve().parent.parent
HOLDS = (1, 2, 3, 4)
VARIANTS = {"trained": None, "refit_again": {}, "pos_weight_1": {"pos_weight": 1.0}, "horizon_80": {"horizon": 80},
            "fresh": {"fresh": True}}


def recorded_frames(replay, cams: list[str]) -> tuple[list[dict], list[np.ndarray]]:
    """Per episode of `replay`: its frames after each action {camera key: uint8 (T - 1, H, W, 3)} and each step's
    `next.success` (T - 1,): frame t + 1 is what step t's success describes."""
    from wmrl.core.features import SUCCESS

    frames, labels = [], []
    for lo, T in replay.episodes.values():
        frames.append({c: np.asarray(replay.data[c][lo + 1 : lo + T]) for c in cams})
        labels.append(np.asarray(replay.data[SUCCESS][lo : lo + T - 1], np.float32))
    return frames, labels


def pixel_classifier(frames: list[dict], labels: list[np.ndarray], cams: list[str], steps: int, seed: int = 0,
                     batch: int = 64):
    """A success classifier on pixels: per episode its frames {camera key: uint8 (T, H, W, 3)} and labels (T,); all
    `cams` stacked as channels, uint8 -> [-1, 1] -> logit; +-2 px shifts; the rare successes up-weighted as the frame
    heads do."""
    import torch
    from torch import nn

    x = torch.from_numpy(np.concatenate([np.concatenate([f[c] for c in cams], -1) for f in frames]))
    x = x.permute(0, 3, 1, 2).contiguous()
    y = torch.from_numpy(np.concatenate(labels).astype(np.float32))
    if len(x) != len(y):
        raise ValueError(f"pixel_classifier: {len(x)} frames but {len(y)} labels")
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(x.shape[1], 16, 3, padding=1), nn.SiLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1), nn.SiLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 3, padding=1), nn.SiLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.LazyLinear(128), nn.SiLU(), nn.Linear(128, 1))
    net(x[:1].float())  # materialises the lazy layer before the optimiser sees it
    opt = torch.optim.Adam(net.parameters(), 3e-4)
    pos_weight = torch.tensor(min(20.0, max(1.0, float((len(y) - y.sum()) / max(float(y.sum()), 1.0)))))
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        b = torch.randint(len(x), (batch,), generator=g)
        dx, dy = torch.randint(-2, 3, (2,), generator=g).tolist()
        logit = net(torch.roll(x[b].float() / 127.5 - 1, (dx, dy), (2, 3)))[:, 0]
        loss = nn.functional.binary_cross_entropy_with_logits(logit, y[b], pos_weight=pos_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    net.eval()

    @torch.no_grad()
    def probabilities(frames: dict) -> np.ndarray:  # {camera key: uint8 (T, H, W, 3)} -> (T,)
        f = torch.from_numpy(np.concatenate([frames[c] for c in cams], -1)).permute(0, 3, 1, 2).float() / 127.5 - 1
        return torch.sigmoid(torch.cat([net(f[i : i + 512])[:, 0] for i in range(0, len(f), 512)])).numpy()

    return probabilities, {"train_frames": len(y), "positives": int(y.sum()), "steps": steps}


def reset_heads(heads) -> None:
    for m in heads.modules():
        if m is not heads and hasattr(m, "reset_parameters"):
            m.reset_parameters()


def main(quick: bool = False, run: str = "runs/demo", pairs: int = 100, seed: int = 0, task: str = "push-red",
         pixel_steps: int = 2500, heads: int = 1, rollout_pixels: int = 1) -> dict:
    import torch

    from wmrl.core.checkpoint import resolve_checkpoint
    from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE, TASK, image_key
    from wmrl.eval.world_model import held_episodes, imagine_recorded, pair_lengths, success_pairs
    from world_models.video.change_mask import paste_objects
    from world_models.video.evaluate import auroc, matched_max, recorded_points, pair_auroc_ci, pair_auroc_difference
    from world_models.video.model import VideoWorldModel
    from world_models.video.rollout_heads import fit_heads_on_rollouts
    from world_models.video.train import load_split

    pairs, seed, pixel_steps = int(pairs), int(seed), int(pixel_steps)  # --options: strings
    heads, rollout_pixels = int(heads), int(rollout_pixels)  # 0: only the trained heads / no rollout-fitted pixels
    if quick:
        work = tiny_world_model(Path(tempfile.mkdtemp(prefix="wmrl-bench-head-")))
        model_dir, data, pairs, fit = work / "model", work / "data", 3, {"steps": 20, "episodes": 4}
    else:
        folder = Path(run) if Path(run).is_absolute() else ROOT / run
        model_dir, data, fit = folder / "world_model", folder / "dataset", {}
        if not (model_dir / "checkpoints").exists() or not (data / "meta/info.json").exists():
            raise ValueError(f"{folder}: expected a demo run's world_model/ and dataset/ (`wmrl demo` writes them)")
    model = VideoWorldModel.load(resolve_checkpoint(model_dir)).eval()
    _, train, _ = load_split(data, 0.1)
    eps = success_pairs(task, pairs, seed0=60_000 + seed)
    truth, _, matched, checks = pair_lengths(eps, seed)
    t0 = time.time()
    exact = bool(model.cfg.change_objects)
    im = imagine_recorded(model, eps, seed, steps=1, keep_latents=True, keep_frames=True, exact_points=exact)
    gen = im["latents"]
    cams = [image_key(c) for c in model.cfg.cameras]
    with torch.no_grad():
        real = [model.encode_frames({c: ep[c][1:] for c in cams}) for ep in eps]
    tasks = [ep[TASK][0] for ep in eps]

    @torch.no_grad()
    def probabilities(latents: list) -> list[np.ndarray]:
        return [torch.sigmoid(model.heads(z, model.task([t] * len(z)))["success_logit"]).numpy()
                for z, t in zip(latents, tasks)]

    def scores(latents: list, hold: int = 1) -> np.ndarray:
        return matched_max(probabilities(latents), matched, hold)

    rng = np.random.default_rng(seed)
    rand = [rng.random(len(z)) for z in gen]

    trained = copy.deepcopy(model.heads.state_dict())
    variants = {}
    for name, kw in (VARIANTS if heads else {"trained": None}).items():
        t = time.time()
        model.heads.load_state_dict(trained)
        if kw is not None:
            kw = dict(kw)
            if kw.pop("fresh", False):
                reset_heads(model.heads)
            fit_heads_on_rollouts(model, train, seed=seed, **{**fit, **kw})
            model.eval()
        s = scores(gen)
        variants[name] = {"frames": auroc(s, truth), "frames_ci": pair_auroc_ci(s, truth),
                          "real": auroc(scores(real), truth), "minutes": (time.time() - t) / 60, "holds": {}}
        gen_p, real_p = probabilities(gen), probabilities(real)
        for k in HOLDS:
            g = matched_max(gen_p, matched, k)
            variants[name]["holds"][str(k)] = {"frames": auroc(g, truth), "frames_ci": pair_auroc_ci(g, truth),
                                          "real": auroc(matched_max(real_p, matched, k), truth)}
        if name == "trained":
            peak = matched_max(gen_p, matched)
            hold_gain = {str(k): pair_auroc_difference(peak, matched_max(gen_p, matched, k), truth) for k in HOLDS[1:3]}
    t = time.time()
    px_steps = 20 if quick else pixel_steps
    real_frames, real_labels = recorded_frames(train, cams)
    pixel_p, pixels = pixel_classifier(real_frames, real_labels, cams, px_steps, seed)
    pix_gen = matched_max([pixel_p(f) for f in im["frames"]], matched)
    real_frames_pairs = [{c: ep[c][1 : len(ep[ACTION])] for c in cams} for ep in eps]
    pix_real = matched_max([pixel_p(f) for f in real_frames_pairs], matched)
    pixels.update({"frames": auroc(pix_gen, truth), "frames_ci": pair_auroc_ci(pix_gen, truth),
                   "real": auroc(pix_real, truth), "real_ci": pair_auroc_ci(pix_real, truth),
                   "minutes": (time.time() - t) / 60})
    with torch.no_grad():  # the real latents through the identity path, anchored on each episode's real first frame
        recon = [model.decode_frames(z, (model.encode_frames({c: ep[c][:1] for c in cams}), {c: ep[c][:1] for c in cams}),
                                     mask=False) for z, ep in zip(real, eps)]
    rungs = {"real": pix_real, "reconstructed": matched_max([pixel_p({c: f[c].numpy() for c in cams}) for f in recon], matched)}
    if exact:
        rungs["generated_exact_points"] = matched_max([pixel_p(f) for f in im["frames_recorded_points"]], matched)
    rungs["generated"] = pix_gen
    if exact:  # the rigid object layer over the generated frames, at the state channel's points and the recorded ones
        f0s = [{c: ep[c][0] for c in cams} for ep in eps]
        rec = [recorded_points(model, {k: ep[k][: len(f) + 1] for k in (OBS_STATE, OBS_ENV_STATE)})
               for ep, f in zip(eps, im["points"])]
        for name, pts in {"rigid_objects": im["points"], "rigid_objects_exact_points": [r[1:] for r in rec]}.items():
            rungs[name] = matched_max([pixel_p(paste_objects(model, f, f0, r[0], q)) for f, f0, r, q
                                       in zip(im["frames"], f0s, rec, pts)], matched)
    ladder = {k: {"auroc": auroc(v, truth), "ci": pair_auroc_ci(v, truth)} for k, v in rungs.items()}
    # World-VLA-Loop's reward head on decoded frames: the classifier fitted on the model's own rollouts of the
    # training episodes (1 Euler step, as imagination samples), alone and with the real frames
    # (each variant's minutes include the one shared rollout's)
    on_rollouts = {}
    if rollout_pixels:
        t = time.time()
        roll = imagine_recorded(model, held_episodes(train, cams), seed, steps=1, keep_frames=True)["frames"]
        rollout_minutes = (time.time() - t) / 60
        for name, (fr, lb) in {"rollouts": (roll, real_labels), "rollouts_and_real": (roll + real_frames, real_labels * 2)}.items():
            t = time.time()
            p, info = pixel_classifier(fr, lb, cams, px_steps, seed)
            g, r = matched_max([p(f) for f in im["frames"]], matched), matched_max([p(f) for f in real_frames_pairs], matched)
            on_rollouts[name] = {**info, "frames": auroc(g, truth), "frames_ci": pair_auroc_ci(g, truth), "real": auroc(r, truth),
                                 "frames_minus_real_trained": pair_auroc_difference(pix_gen, g, truth),
                                 "minutes": (time.time() - t) / 60 + rollout_minutes}
    chain = [n for n in rungs if not n.startswith("rigid")]
    for a, b in zip(chain, chain[1:]):  # each step down the ladder, paired over the same pairs
        ladder[f"{b}_minus_{a}"] = pair_auroc_difference(rungs[a], rungs[b], truth)
    for b in (n for n in rungs if n.startswith("rigid")):  # the rigid layers against the frames they are pasted on
        ladder[f"{b}_minus_generated"] = pair_auroc_difference(rungs["generated"], rungs[b], truth)
    frames = [v["frames"] for v in variants.values()]
    out = {"run": run if not quick else "tiny", "n_pairs": int(truth.sum()), "sampling_steps": 1,
           "random_scorer_auroc_matched": checks["random_scorer_auroc_matched"], "variants": variants,
           "spread": float(max(frames) - min(frames)), "hold_gain": hold_gain, "pixels": pixels, "pixel_ladder": ladder,
           "pixels_trained_on_rollouts": on_rollouts,
           "pixels_minus_trained": pair_auroc_difference(peak, pix_gen, truth),
           "random_scorer_auroc_matched_hold": {str(k): auroc(matched_max(rand, matched, k), truth) for k in HOLDS},
           "best_hold_frames": {name: max(HOLDS, key=lambda k: v["holds"][str(k)]["frames"]) for name, v in variants.items()},
           # the kept latents are the rollout's: `trained` scored on them equals the rollout's own success head
           "check_rollout_head_frames": auroc(matched_max(im["head"], matched), truth),
           "trained_ci_width": float(np.diff(variants["trained"]["frames_ci"])[0]),
           "minutes": (time.time() - t0) / 60}
    part = "" if heads and rollout_pixels else "-part"  # a partial run does not replace the run's full result
    return finish(f"world-model-frame-head-{Path(run).name}{part}", out, quick,  # one result file per run measured
                  command=f"wmrl bench world-model-frame-head --json --options run={run} pairs={pairs} seed={seed} "
                          f"pixel_steps={pixel_steps}" + (f" heads={heads} rollout_pixels={rollout_pixels}" if part else "")
                  if not quick else None)
