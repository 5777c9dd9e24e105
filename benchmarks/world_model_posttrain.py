"""Long-horizon post-training of the video world model (PersistWorld with DiffusionNFT, `wmrl post-train-wm`),
measured against its base on the same fixed held-out windows.

- Base: a world-model benchmark run (`runs/bench-world-model/<base>/model` and its dataset `.../data`; `base=full`
  is the committed CPU run of `wmrl bench world-model`, `base=base-cuda-x2` the lent-GPU one), or a `wmrl demo` run
  folder (`base=runs/demo62`: its `world_model` and `dataset`). Post-training works in
  `runs/bench-world-model-posttrain/<base's name>/` (resumed when there).
- Both models roll out from the same held-out windows (`fixed_windows`, seed 0) for 32 control steps under the
  recorded actions, sampled as imagination samples (`steps` Euler steps), `seeds` sampling seeds per model averaged
  per window. Per window: PSNR (mean over cameras) at h4 (the first chunk), h16 and h32, SSIM at h32, copy-last's
  PSNR at the same frames.
- Keys: `paired_wins_h32` (share of windows where the post-trained model's h32 PSNR beats the base's; motion
  windows: `paired_wins_h32_motion`), `psnr_gain_h32_motion` (post minus base, dB, bootstrap CI), the same at h16,
  `one_chunk_psnr_change` (h4, all windows), both models' gains over copy-last, per-seed gains, and the check of
  the metric: the base against itself with other sampling seeds (its paired wins must sit near 0.5, its gain near 0);
  the headroom: `ceiling_over_base_h32_motion`, the identity ceiling (the real latents at h32 decoded through the
  model's identity path: a perfect dynamics model) minus the base, and the same after one chunk from real
  context (`ceiling_over_base_h4_motion`: what is not drift); `state_oracle_over_base_h32_motion`, the base
  with its state channel put back on the recorded state after every chunk (`evaluate.rollout(state_oracle=True)`)
  minus the base: how much of the h32 error is the state channel's drift, which post-training the denoiser cannot
  reach (`psnr_h32_state_oracle_motion` what the frames model scores without it).
Options: `iterations`, `lr`, `histories` (real histories per iteration), `candidates` (rollouts per history),
`moving_weight` (the moving pixels' PSNR in the reward), `old_ema` (DiffusionNFT's soft-updated old model;
`PostTrainWMConfig`), `candidate_steps` (Euler steps when sampling the candidates, default `steps`: a 1-step sample
sits near the conditional mean, so one history's candidates hardly differ; the comparison still samples at `steps`),
`spread` (e.g. 1,3,8: no post-training, only how much one history's candidates differ at each number of Euler
steps, `candidate_spread`; written to world-model-posttrain-spread-<base>.json), `objective` (`nft`, or `forcing`: the
denoising loss on the real future with the model's own rollout as context), `min_horizon` / `horizon` (post-training's
rollout lengths; `objective=forcing min_horizon=4 horizon=4` is the control: the same number of steps of plain
teacher-forced training); a non-default setting gets its own work folder and result file.

The downstream check (`rankings=A,B`): two ranking runs of the same policies on the same paired starts, A on the base
and B on this setting's post-trained model (`runs/bench-world-model-posttrain/<tag>/post`), e.g.

    wmrl bench rank-state-population --json --options world_model=BASE_RUN pixels=P1,P2,P3 tag=base
    wmrl bench rank-state-population --json --options world_model=runs/bench-world-model-posttrain/TAG/post pixels=P1,P2,P3 tag=post

fill `rank_spearman_base` / `_post`, `rank_mmrv_*`, `success_abs_error_*`, `hallucinated_base` / `_post` (imagined
successes whose closed-loop true episode from the same layout failed: `wmrl.eval.rank.paired_hallucination`) and
their paired differences with bootstrap intervals (`rank_paired`, `wmrl bench rank-report`'s pairing); nothing is
imagined or simulated again. Runs on other world models or other true episodes are refused. Without `rankings`
those keys are None.
"""

from __future__ import annotations

import json
import runpy
import tempfile
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish, tiny_world_model, world_model_run_folders

ROOT = Path(__file__).resolve().parent.parent
H_MAX = 32  # the long horizon the keys name (h32)

def _source(base: str) -> tuple[Path, Path]:
    """(world model run, dataset) of the base: a world-model benchmark run (`runs/bench-world-model/<base>`) or a
    `wmrl demo` run folder."""
    try:
        return world_model_run_folders(base, ROOT / "runs" / "bench-world-model")
    except ValueError as e:
        raise ValueError(f"{e}: run `wmrl bench world-model --json` first (it trains runs/bench-world-model/full), or "
                         "pass base=<a folder there> or base=<a demo run folder>") from None


def _run_folder(p: str | Path) -> Path:
    """A world model's run folder, from the folder or one of its checkpoints, resolved against the project root."""
    p = Path(p) if Path(p).is_absolute() else ROOT / p
    if p.parent.name == "checkpoints":
        p = p.parent.parent
    return p.resolve()


def downstream(rankings: str, base_run: Path, post_run: Path) -> dict:
    """The downstream keys from two ranking run folders `A,B` (module docstring): A must have ranked on `base_run`,
    B on `post_run`, both the same policies on the same true episodes."""
    report = runpy.run_path(str(Path(__file__).with_name("rank_report.py")), run_name="wmrl_bench_sibling")
    folders = [Path(x) for x in str(rankings).split(",") if x]
    if len(folders) != 2:
        raise ValueError(f"rankings: expected two ranking run folders A,B (base, post-trained), got {rankings!r}")
    rows = [report["report"](f) for f in folders]
    for r, f, want, what in zip(rows, folders, (base_run, post_run), ("base", "post-trained")):
        if not r["world_model"] or _run_folder(r["world_model"]) != _run_folder(want):
            raise ValueError(f"rankings: {f} ranked on {r['world_model'] or 'an unnamed world model'}, not the "
                             f"{what} model {want}")
    (a, pa), (b, pb) = ((r, r.pop("policies")) for r in rows)
    if not report["same_true_episodes"](pa, pb):
        raise ValueError(f"rankings: {folders[0]} and {folders[1]} did not rank the same policies on the same true "
                         "episodes (same population, layouts and episodes per policy)")
    out = {"rankings": [str(f) for f in folders], "rank_n_policies": a["n_policies"],
           "rank_episodes_per_policy": a["episodes_per_policy"], "rank_first_layout_seed": a["first_layout_seed"]}
    for key in ("rank_spearman", "rank_mmrv", "success_abs_error", "hallucinated_success",
                "hallucinated_success_independent", "n_imagined_successes"):
        name = key.replace("hallucinated_success", "hallucinated")  # the key names
        out[f"{name}_base"], out[f"{name}_post"] = a[key], b[key]
    out["rank_spearman_ci_base"], out["rank_spearman_ci_post"] = a["rank_spearman_ci"], b["rank_spearman_ci"]
    out["rank_noise_ceiling"] = a.get("rank_noise_ceiling")
    out["rank_paired"] = report["paired_difference"](pa, pb)  # post minus base, on the shared true episodes
    return out


def _logged_minutes(run: Path) -> float | None:
    """The post-training minutes of a finished run, from its last logged iteration (`seconds` since it started; a
    resumed run counts from its last start)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"seconds"' in x]
    return rows[-1]["seconds"] / 60 if rows else None


def candidate_spread(src: tuple[Path, Path], counts: list[int], histories: int, candidates: int, horizon: int, seed: int = 0) -> dict:
    """How much one history's post-training candidates differ, by the Euler steps they are sampled with: the same
    histories (train split, as post-training draws them) rolled out `candidates` times each for `horizon` control
    steps at every count in `counts`, scored by the post-training reward (`post_train.fidelity`). The within-group
    std is what DiffusionNFT's group advantages can learn from; the between-history std is the scale next to it."""
    import torch

    from world_models.video.model import VideoWorldModel
    from world_models.video.post_train import rollouts
    from world_models.video.train import WindowSampler, encode_all, load_split

    model = VideoWorldModel.load(src[0] / "checkpoints" / "last").eval()
    _, train, _ = load_split(src[1], 0.1, seed)
    sampler = WindowSampler(train, "cpu", model.cfg, lat=encode_all(model, train))
    rows = []
    for n in counts:
        t0 = time.time()
        _, r = rollouts(model, sampler, histories, candidates, horizon, n, torch.Generator().manual_seed(seed))
        r = r.reshape(histories, candidates)
        rows.append({"euler_steps": n, "reward_mean": float(r.mean()), "within_group_std": float(r.std(1).mean()),
                     "between_history_std": float(r.mean(1).std()), "seconds": time.time() - t0})
    return {"histories": histories, "candidates": candidates, "horizon": horizon, "rows": rows}


def _per_window(model, held, starts, steps: int, seeds: list[int], H: int, state_oracle: bool = False) -> dict[str, np.ndarray]:
    """Per sampling seed and window (seeds, N): PSNR at the first chunk ("first"), H/2 ("mid") and H ("end") and
    SSIM at H, each the mean over cameras. `state_oracle`: the state channel put back on the recorded state after
    every chunk (`evaluate.rollout`)."""
    from world_models.video.evaluate import psnr, rollout, ssim
    from world_models.video.post_train import PostTrainWMConfig, moving_mask

    threshold = PostTrainWMConfig.moving_threshold

    at = {"first": model.cfg.chunk, "mid": H // 2, "end": H}
    acc: dict[str, list] = {k: [] for k in (*at, "ssim_end", "moving_end")}
    d = held.data
    for s in seeds:
        r = rollout(model, held, starts, H, steps=steps, seed=s, state_oracle=state_oracle)
        cams = list(r["real"])
        for k, h in at.items():
            acc[k].append(np.mean([psnr(r["pred"][c][:, h - 1], r["real"][c][:, h - 1]) for c in cams], 0))
        acc["ssim_end"].append(np.mean([ssim(r["pred"][c][:, H - 1], r["real"][c][:, H - 1]) for c in cams], 0))
        moving = []  # on the pixels that moved by H (the post-training reward's `moving_weight` term): NaN where none
        for c in cams:
            start = np.stack([d[c][held.episodes[e][0] + t] for e, t in starts])
            mask = moving_mask(r["real"][c][:, H - 1], start, threshold)
            moving.append(psnr(r["pred"][c][:, H - 1], r["real"][c][:, H - 1], mask))
        with np.errstate(all="ignore"):
            acc["moving_end"].append(np.nanmean(np.stack(moving), 0))
    return {k: np.stack(v) for k, v in acc.items()}


def main(quick: bool = False, base: str = "full", iterations: int = 40, windows: int = 120, seeds: int = 2,
         steps: int = 1, lr: float = 3e-5, histories: int = 8, candidates: int = 4, moving_weight: float = 0.0,
         old_ema: float = 0.0, candidate_steps: int = 0, spread: str = "", objective: str = "nft",
         min_horizon: int = 8, horizon: int = H_MAX, rankings: str = "") -> dict:
    import torch

    from world_models.video.evaluate import bootstrap_ci, fixed_windows, psnr
    from world_models.video.model import VideoWorldModel
    from world_models.video.post_train import PostTrainWMConfig, post_train_world_model
    from world_models.video.train import load_split

    iterations, windows, seeds, steps, lr = int(iterations), int(windows), int(seeds), int(steps), float(lr)  # --options: strings
    histories, candidates, moving_weight, old_ema = int(histories), int(candidates), float(moving_weight), float(old_ema)
    candidate_steps = int(candidate_steps) or steps  # Euler steps of the candidates; the comparison samples at `steps`
    min_horizon, horizon = int(min_horizon), int(horizon)  # post-training's rollout lengths (evaluated at H_MAX)
    if quick:
        tmp = Path(tempfile.mkdtemp(prefix="wmrl-bench-post-"))
        src, work, iterations, windows, seeds = (tmp / "model", tmp / "data"), tiny_world_model(tmp), 2, 4, 1
    elif spread:
        src = _source(base)
    else:
        src = _source(base)
        tag = Path(base).name + ("" if (iterations, lr) == (40, 3e-5) else f"-it{iterations}-lr{lr:g}")  # one folder per setting
        if objective == "nft":
            tag += "" if (histories, candidates) == (8, 4) else f"-w{histories}g{candidates}"
        else:  # one rollout per history
            tag += "" if histories == 8 else f"-w{histories}"
        tag += (f"-mw{moving_weight:g}" if moving_weight else "") + (f"-ema{old_ema:g}" if old_ema else "")
        tag += f"-cs{candidate_steps}" if candidate_steps != steps else ""
        tag += (f"-{objective}" if objective != "nft" else "") + (f"-minh{min_horizon}" if min_horizon != 8 else "")
        tag += f"-h{horizon}" if horizon != H_MAX else ""
        work = ROOT / "runs" / "bench-world-model-posttrain" / tag
    if spread:
        counts = [int(x) for x in str(spread).split(",") if x]
        out = candidate_spread(src, counts, 2 if quick else histories, 2 if quick else candidates, 8 if quick else H_MAX)
        return finish(f"world-model-posttrain-spread-{base}", {"base": base, **out}, quick,
                      command=f"wmrl bench world-model-posttrain --json --options base={base} spread={spread}"
                      + (f" histories={histories}" if histories != 8 else "") + (f" candidates={candidates}" if candidates != 4 else ""))
    post = work / "post"
    resume = (post / "checkpoints" / "last").exists()
    t0 = time.time()
    pcfg = PostTrainWMConfig(world_model=src[0], data=src[1], out=post, iterations=iterations,
                             sampling_steps=candidate_steps, horizon=8 if quick else horizon,
                             min_horizon=4 if quick else min_horizon, objective=objective,
                             windows=2 if quick else histories, candidates=2 if quick else candidates, lr=lr,
                             moving_weight=moving_weight, old_ema=old_ema,
                             resume=resume, overwrite=not resume)
    done = resume and json.loads((post / "checkpoints/last/train_state.json").read_text())["step"] >= iterations
    res = {} if done else post_train_world_model(pcfg, progress=not quick)
    minutes = (time.time() - t0) / 60

    base_m = VideoWorldModel.load(src[0] / "checkpoints" / "last").eval()
    post_m = VideoWorldModel.load(post / "checkpoints" / "last").eval()
    _, _, held = load_split(src[1], 0.1)
    H = 8 if quick else H_MAX
    wins = fixed_windows(held, windows, H, base_m.cfg.context, seed=0)
    starts = [(w["episode"], w["start"]) for w in wins]
    motion = np.array([w["motion"] for w in wins])
    ss = list(range(seeds))
    bs, ps = _per_window(base_m, held, starts, steps, ss, H), _per_window(post_m, held, starts, steps, ss, H)
    b, p = ({k: v.mean(0) for k, v in x.items()} for x in (bs, ps))
    b2 = {k: v.mean(0) for k, v in _per_window(base_m, held, starts, steps, [100 + s for s in ss], H).items()}
    d, cams = held.data, [f"observation.images.{c}" for c in base_m.cfg.cameras]
    # camera c's recorded frames h steps after each window's start
    at = lambda c, h: np.stack([d[c][held.episodes[e][0] + t + h] for e, t in starts])  # noqa: E731
    last = {c: at(c, 0) for c in cams}
    copy = {h: np.mean([psnr(last[c], at(c, h)) for c in cams], 0) for h in (H // 2, H)}
    # what a perfect dynamics model could reach at H: the real latents through the identity path the model decodes
    # with (frame0 + dec(z_real) - dec(z0)), as the world-model benchmark's identity ceiling
    def identity_ceiling(h: int) -> np.ndarray:
        real_h = {c: at(c, h) for c in cams}
        with torch.no_grad():
            ident = base_m.decode_frames(base_m.encode_frames(real_h), (base_m.encode_frames(last), last), mask=False)
        return np.mean([psnr(ident[c].numpy(), real_h[c]) for c in cams], 0)

    # at H, and at the first chunk's last frame: the gap there is one chunk's error from real context, not drift
    ceiling, ceiling_first = identity_ceiling(H), identity_ceiling(base_m.cfg.chunk)
    # the frames model alone: the base with its state channel put back on the recorded state after every chunk, so
    # what it still misses at H is the frames' own error, the rest of the gap to the base the state channel's drift
    oracle = (_per_window(base_m, held, starts, steps, ss, H, state_oracle=True)["end"].mean(0)
              if base_m.state_channel is not None else None)
    m = lambda x: float(np.mean(x[motion]))
    hm, he = f"h{H // 2}", f"h{H}"
    out = {"base": str(src[0].resolve().relative_to(ROOT)) if not quick else "tiny", "objective": objective,
           "post_iterations": iterations, "min_horizon": min_horizon, "post_horizon": horizon,
           "lr": lr, "histories": histories, "candidates": candidates, "moving_weight": moving_weight, "old_ema": old_ema,
           "sampling_steps": steps, "candidate_steps": candidate_steps, "sampling_seeds": seeds, "horizon": H, "n_windows": len(wins),
           "n_motion_windows": int(motion.sum()),
           f"paired_wins_{he}": float(np.mean(p["end"] > b["end"])),
           f"paired_wins_{he}_motion": float(np.mean(p["end"][motion] > b["end"][motion])),
           f"psnr_gain_{he}_motion": m(p["end"] - b["end"]),
           f"psnr_gain_{he}_motion_ci": bootstrap_ci((p["end"] - b["end"])[motion]),
           f"psnr_gain_{he}_motion_per_seed": [m(ps["end"][i] - bs["end"][i]) for i in range(seeds)],
           # on the pixels that moved by h32 (windows where some did)
           f"moving_psnr_gain_{he}_motion": float(np.nanmean((p["moving_end"] - b["moving_end"])[motion])),
           f"moving_psnr_gain_{he}_motion_ci": bootstrap_ci((p["moving_end"] - b["moving_end"])[motion]),
           f"psnr_gain_{hm}_motion": m(p["mid"] - b["mid"]),
           f"psnr_gain_{hm}_motion_ci": bootstrap_ci((p["mid"] - b["mid"])[motion]),
           f"psnr_gain_{he}_all": float(np.mean(p["end"] - b["end"])),
           f"ssim_change_{he}": float(np.mean(p["ssim_end"] - b["ssim_end"])),
           "one_chunk_psnr_change": float(np.mean(p["first"] - b["first"])),
           f"base_over_copy_{he}_motion": m(b["end"] - copy[H]), f"post_over_copy_{he}_motion": m(p["end"] - copy[H]),
           f"base_over_copy_{hm}_motion": m(b["mid"] - copy[H // 2]), f"post_over_copy_{hm}_motion": m(p["mid"] - copy[H // 2]),
           f"psnr_{he}_base": float(np.mean(b["end"])), f"psnr_{he}_post": float(np.mean(p["end"])),
           f"psnr_{he}_identity_ceiling_motion": m(ceiling), f"ceiling_over_base_{he}_motion": m(ceiling - b["end"]),
           f"ceiling_over_base_h{base_m.cfg.chunk}_motion": m(ceiling_first - b["first"]),
           **({f"psnr_{he}_state_oracle_motion": m(oracle), f"state_oracle_over_base_{he}_motion": m(oracle - b["end"]),
               f"state_oracle_over_base_{he}_motion_ci": bootstrap_ci((oracle - b["end"])[motion])} if oracle is not None else {}),
           # the metric's check: the base against itself on other sampling seeds (wins near 0.5, gain near 0)
           f"check_base_vs_itself_wins_{he}": float(np.mean(b2["end"] > b["end"])),
           f"check_base_vs_itself_gain_{he}_motion": m(b2["end"] - b["end"]),
           **(downstream(rankings, src[0], post) if rankings else
              {"rank_spearman_base": None, "rank_spearman_post": None, "hallucinated_base": None, "hallucinated_post": None}),
           "post_train_minutes": res["post_train_minutes"] if res else _logged_minutes(post)}
    name = "world-model-posttrain" + ("" if quick or tag == "full" else f"-{tag}")
    return finish(name, out, quick, command=f"wmrl bench world-model-posttrain --json --options base={base} "
                                           f"iterations={iterations} lr={lr:g} histories={histories}"
                                           + (f" candidates={candidates}" if objective == "nft" else "")
                                           + (f" moving_weight={moving_weight:g}" if moving_weight else "")
                                           + (f" old_ema={old_ema:g}" if old_ema else "")
                                           + (f" candidate_steps={candidate_steps}" if candidate_steps != steps else "")
                                           + (f" objective={objective}" if objective != "nft" else "")
                                           + (f" min_horizon={min_horizon}" if min_horizon != 8 else "")
                                           + (f" horizon={horizon}" if horizon != H_MAX else "")
                                           + (f" rankings={rankings}" if rankings else "")
                                           if not quick else None)
