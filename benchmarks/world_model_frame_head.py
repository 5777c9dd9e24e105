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


def reset_heads(heads) -> None:
    for m in heads.modules():
        if m is not heads and hasattr(m, "reset_parameters"):
            m.reset_parameters()


def main(quick: bool = False, run: str = "runs/demo", pairs: int = 100, seed: int = 0, task: str = "push-red") -> dict:
    import torch

    from wmrl.core.checkpoint import resolve_checkpoint
    from wmrl.core.features import TASK, image_key
    from wmrl.eval.world_model import imagine_recorded, pair_lengths, success_pairs
    from world_models.video.evaluate import auroc, matched_max, pair_auroc_ci, pair_auroc_difference
    from world_models.video.model import VideoWorldModel
    from world_models.video.rollout_heads import fit_heads_on_rollouts
    from world_models.video.train import load_split

    pairs, seed = int(pairs), int(seed)  # --options: strings
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
    im = imagine_recorded(model, eps, seed, steps=1, keep_latents=True)
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
    for name, kw in VARIANTS.items():
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
    frames = [v["frames"] for v in variants.values()]
    out = {"run": run if not quick else "tiny", "n_pairs": int(truth.sum()), "sampling_steps": 1,
           "random_scorer_auroc_matched": checks["random_scorer_auroc_matched"], "variants": variants,
           "spread": float(max(frames) - min(frames)), "hold_gain": hold_gain,
           "random_scorer_auroc_matched_hold": {str(k): auroc(matched_max(rand, matched, k), truth) for k in HOLDS},
           "best_hold_frames": {name: max(HOLDS, key=lambda k: v["holds"][str(k)]["frames"]) for name, v in variants.items()},
           # the kept latents are the rollout's: `trained` scored on them equals the rollout's own success head
           "check_rollout_head_frames": auroc(matched_max(im["head"], matched), truth),
           "trained_ci_width": float(np.diff(variants["trained"]["frames_ci"])[0]),
           "minutes": (time.time() - t0) / 60}
    return finish(f"world-model-frame-head-{Path(run).name}", out, quick,  # one result file per run measured
                  command=f"wmrl bench world-model-frame-head --json --options run={run} pairs={pairs} seed={seed}"
                  if not quick else None)
