"""The one-step conditional-mean path of the video world model (`WorldModelConfig.mean_share`), ablated on the same
data, autoencoder, budget and seed.

Imagination, ranking and GRPO sample the world model with one Euler step. A pure EDM model (mean_share 0) then
returns D(x; sigma_max) at a random x, a point it trains on a few percent of the time (ln sigma ~ N(-0.4, 1.2)); with
mean_share > 0 a share of the training samples regresses the change at sigma_max from a zero input, and one-step
sampling starts there (the conditional mean; multi-step sampling is unchanged).

- Source: a run folder with `world_model/` and `dataset/` (default: the imagination benchmark's demo,
  `runs/bench-imagination/demo`). Its last world-model checkpoint is copied into the work folder on the first run
  (`runs/bench-world-model-mean-path/source`), so later runs compare against the same autoencoder.
- Two trainings from that autoencoder and its latent statistics (`init_from`, no autoencoder steps), the demo's
  budget (1000 state-channel, 2000 dynamics, 500 unrolled steps, batch 32, seed 0): `pure` (mean_share 0) and
  `mean` (mean_share 0.25). Finished trainings are reused.
- Both measured by `window_fidelity` on the same 240 fixed held-out windows (seed 0) at 1 Euler step (as imagination
  samples) and at 3 (the model's default): motion-window PSNR gain over copy-last at h16 (bootstrap CI), masked
  gain, static gap to the autoencoder's ceiling, Delta-t PSNR at h8, per-camera PSNR. Keys `<variant>_steps<n>_*`
  and the paired differences `mean_minus_pure_steps1_*`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish, tiny_world_model

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("motion_psnr_gain_h16", "motion_psnr_gain_h16_ci", "static_psnr_gain_h16", "masked_psnr_gain_h16",
        "static_psnr_gap_to_ceiling", "delta_t_psnr_h8_motion", "motion_psnr_gain_h1", "motion_psnr_gain_h4",
        "psnr_h16_model_motion_front", "psnr_h16_model_static_front", "psnr_h16_model_motion_wrist",
        "psnr_h16_model_static_wrist", "psnr_h16_copy_motion_wrist", "psnr_h16_copy_static_wrist")


def main(quick: bool = False, source: str = "runs/bench-imagination/demo", windows: int = 240) -> dict:
    from wmrl.eval.world_model import window_fidelity
    from world_models.video.model import VideoWorldModel
    from world_models.video.evaluate import bootstrap_ci
    from world_models.video.train import TrainWMConfig, load_split, train_world_model

    windows = int(windows)
    work = Path(tempfile.mkdtemp(prefix="wmrl-bench-mean-")) if quick else ROOT / "runs" / "bench-world-model-mean-path"
    src = work / "source"
    data = work / "data" if quick else (ROOT / source / "dataset")
    if quick:
        _tiny_source(work)
    elif not (src / "model.safetensors").exists():
        ck = ROOT / source / "world_model" / "checkpoints" / "last"
        if not (ck / "model.safetensors").exists() or not (data / "meta/info.json").exists():
            raise ValueError(f"{ROOT / source}: no world_model/checkpoints/last and dataset/ there; run "
                             "`wmrl bench imagination --json` first or pass source=<a demo run folder>")
        shutil.copytree(ck, src)
    budget = dict(state_steps=4, dyn_steps=6, unroll_steps=2, size="tiny", batch_size=4) if quick else dict(
        state_steps=1000, dyn_steps=2000, unroll_steps=500, size="small", batch_size=32)
    _, _, held = load_split(data, 0.1, keep=("qpos",))
    out: dict = {"source": "tiny" if quick else source, "budget": budget, "n_windows": None}
    fid = {}
    for name, share in (("pure", 0.0), ("mean", 0.25)):
        run = work / name
        done = (run / "checkpoints/last/train_state.json").exists() and json.loads(
            (run / "checkpoints/last/train_state.json").read_text())["step"] >= sum(
            budget[k] for k in ("state_steps", "dyn_steps", "unroll_steps"))
        if not done:
            train_world_model(TrainWMConfig(data=data, out=run, init_from=src, ae_steps=0, mean_share=share, videos=0,
                                            overwrite=True, **budget, **(dict(change_mask_steps=5, change_mask_windows=2, head_rollout_steps=0) if quick else {})),
                              progress=not quick)
        model = VideoWorldModel.load(run / "checkpoints/last").eval()
        for steps in (1, 3):
            f = window_fidelity(model, held, "push-red", 8 if quick else windows, 16, seed=0, steps=steps)
            out["n_windows"], out["n_motion_windows"] = f["n_windows"], f["n_motion_windows"]
            fid[name, steps] = f
            for k in KEYS:
                if k in f:
                    out[f"{name}_steps{steps}_{k}"] = f[k]
    a, b = fid["mean", 1], fid["pure", 1]
    gm, gp = a["per_window"]["gain"], b["per_window"]["gain"]
    motion = a["per_window"]["motion"]
    out["mean_minus_pure_steps1_motion_gain"] = float(np.mean((gm - gp)[motion]))
    out["mean_minus_pure_steps1_motion_gain_ci"] = bootstrap_ci((gm - gp)[motion])
    out["mean_minus_pure_steps1_static_gain"] = float(np.mean((gm - gp)[~motion])) if (~motion).any() else None
    out["mean_wins_steps1_motion"] = float(np.mean((gm > gp)[motion]))
    if not quick:
        wins = a["windows"]
        pick = [w[:2] for w in wins if w[2]][:2] + [w[:2] for w in wins if not w[2]][:2]  # 2 motion, 2 static
        out["picture"] = _picture({n: VideoWorldModel.load(work / n / "checkpoints/last").eval() for n in ("pure", "mean")},
                                  held, pick, ROOT / "docs" / "wm_mean_path.png")
    return finish("world-model-mean-path", out, quick,
                  command=None if quick else f"wmrl bench world-model-mean-path --json --options source={source}")


def _tiny_source(work: Path) -> None:
    """Quick mode: a tiny dataset and world model as the source (a smoke test of the pipeline, not a result)."""
    tiny_world_model(work, long=True)  # 80-step episodes: the held-out episode fits 16-step windows
    shutil.copytree(work / "model" / "checkpoints" / "last", work / "source")


def _picture(models: dict, held, starts: list, path: Path) -> str:
    """One row per window: for each camera, real | pure EDM | mean path at h4 and h16, all sampled with 1 step."""
    from PIL import Image

    from world_models.video.evaluate import rollout

    rs = {n: rollout(m, held, [tuple(s) for s in starts], 16, steps=1, seed=0) for n, m in models.items()}
    rows = []
    for i in range(len(starts)):
        row = []
        for c in rs["pure"]["real"]:
            for h in (4, 16):
                row += [rs["pure"]["real"][c][i, h - 1], rs["pure"]["pred"][c][i, h - 1], rs["mean"]["pred"][c][i, h - 1]]
        rows.append(np.concatenate(row, 1))
    img = np.concatenate(rows, 0)
    Image.fromarray(img).resize((img.shape[1] * 2, img.shape[0] * 2), Image.NEAREST).save(path)
    return str(path.relative_to(ROOT))
