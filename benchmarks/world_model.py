"""Video world model on held-out tabletop episodes (push-red): fidelity, controllability, state error, success
detection on generated frames, sampling steps and imagination throughput, against copy-last-frame and a
deterministic latent predictor with the same backbone, trained on the same data in the same run.

Work folder: runs/bench-world-model/full/ (dataset, the diffusion model, the deterministic baseline). Finished
trainings are reused (resume), so re-running only re-measures; delete the folder to retrain from scratch.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from wmrl.benchutil import finish

WORK = Path(__file__).resolve().parent.parent / "runs" / "bench-world-model"


def _auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels], scores[~labels]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    return float(((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean())


def _prefix_pairs(n_seeds: int, seed0: int = 50_000) -> list[dict]:
    """Success / near-success episode pairs from the same start (same seed): they share a prefix and diverge when
    the expert's failure mode kicks in (the push stops just outside the zone)."""
    import sim
    from sim.tabletop.experts import ScriptedExpert
    from wmrl.eval import evaluate

    eps = []
    for s in range(n_seeds):
        for failure in (0.0, 1.0):
            env = sim.make_env("push-red").unwrapped
            r = evaluate(ScriptedExpert(failure_prob=failure, seed=s), env, 1, seed=seed0 + s, record=True, progress=False)
            ep = r.episodes[0]
            ep["_success"] = r.per_episode[0]["success"]
            eps.append(ep)
            env.close()
    return eps


@torch.no_grad()
def _imagine_episode(model, ep: dict, steps: int | None = None) -> tuple[np.ndarray, dict]:
    """Roll a recorded episode out in the model from its first frame; returns success probs (T,) and frames."""
    K, H = model.cfg.context, model.cfg.chunk
    cams = [f"observation.images.{c}" for c in model.cfg.cameras]
    state = model.encode({**{c: np.repeat(ep[c][:1], K, 0)[None] for c in cams},
                          "observation.state": ep["observation.state"][:1], "task": [ep["task"][0]]})
    T = len(ep["action"]) - 1
    acts = torch.as_tensor(ep["action"][:T][None])
    probs, lats = [], []
    g = torch.Generator().manual_seed(0)
    for i in range(0, T, H):
        state, p = model.step(state, acts[:, i : i + H], steps=steps, generator=g)
        probs.append(p["success"][0])
        lats.append(p["latents"][0])
    return torch.cat(probs).numpy(), model.decode(torch.cat(lats))


def main(quick: bool = False, size: str = "small", device: str = "cpu", steps_scale: float = 1.0,
         batch_size: int = 32) -> dict:
    """The defaults are the committed CPU numbers. Anything else (e.g. `--size base --device cuda --steps-scale 5`)
    trains in its own work folder and writes `world-model-SIZE-DEVICE.json`, never the CPU result."""
    from world_models.env import WorldModelEnv
    from world_models.video.classifier import SuccessClassifier
    from world_models.video.evaluate import psnr, rollout, ssim, windows
    from world_models.video.model import VideoWorldModel
    from world_models.video.train import TrainWMConfig, load_split, train_world_model
    from wmrl.commands.collect import CollectConfig, collect

    default = (size, device, steps_scale, batch_size) == ("small", "cpu", 1.0, 32)
    tag = "full" if default else f"{size}-{device.split(':')[0]}"
    work = Path(tempfile.mkdtemp(prefix="wmrl-bench-wm-")) if quick else WORK / tag  # quick: always fresh
    n_eps = 16 if quick else 200
    base = TrainWMConfig(data=Path("."), out=Path("."))
    steps = dict(ae_steps=20, dyn_steps=20, cls_steps=10, size="tiny", batch_size=8) if quick else dict(
        size=size, device=device, batch_size=batch_size, ae_steps=int(base.ae_steps * steps_scale),
        dyn_steps=int(base.dyn_steps * steps_scale), cls_steps=int(base.cls_steps * steps_scale))
    data = work / "data"
    if not (data / "meta/info.json").exists():
        collect(CollectConfig(task="push-red", episodes=n_eps, out=data, failures=0.3, noise=0.05, overwrite=True,
                              post_success_steps=3), progress=not quick)
    diff_run, det_run = work / "diffusion", work / "deterministic"
    resume = lambda run: (run / "checkpoints/last/train_state.json").exists()
    tcfg = TrainWMConfig(data=data, out=diff_run, videos=3, resume=resume(diff_run), overwrite=not resume(diff_run), **steps)
    train_world_model(tcfg, progress=not quick)
    dcfg = TrainWMConfig(data=data, out=det_run, deterministic=True, init_from=diff_run, videos=0,
                         resume=resume(det_run), overwrite=not resume(det_run), **{**steps, "ae_steps": 0, "cls_steps": 0})
    train_world_model(dcfg, progress=not quick)
    train_seconds = json.loads((diff_run / "checkpoints/last/train_state.json").read_text())["seconds"]

    model = VideoWorldModel.load(diff_run / "checkpoints/last")
    det = VideoWorldModel.load(det_run / "checkpoints/last")
    from safetensors.torch import load_file

    clf = SuccessClassifier(model.cfg.cameras, model.cfg.task_vocab)
    clf.load_state_dict(load_file(str(diff_run / "checkpoints/last/classifier.safetensors")))
    clf.eval()
    _, _, held = load_split(data, 0.1)
    torch.manual_seed(0)
    n_win = 8 if quick else 48
    H16 = 16
    starts = windows(held, n_win, H16, model.cfg.context, seed=0)
    out: dict = {"dataset_episodes": n_eps, "heldout_episodes": held.num_episodes, "windows": n_win}

    def fidelity(m, steps_=None, tag=""):
        t = time.perf_counter()
        r = rollout(m, held, starts, H16, steps=steps_)
        res = {"seconds": time.perf_counter() - t}
        for c in m.cfg.cameras:
            key = f"observation.images.{c}"
            p, s = psnr(r["pred"][key], r["real"][key]), ssim(r["pred"][key], r["real"][key])
            for h in (1, 4, 16):
                res[f"psnr_h{h}_{c}"] = float(p[:, h - 1].mean())
                res[f"ssim_h{h}_{c}"] = float(s[:, h - 1].mean())
        for h in (1, 4, 16):
            res[f"psnr_h{h}"] = float(np.mean([res[f"psnr_h{h}_{c}"] for c in m.cfg.cameras]))
            res[f"ssim_h{h}"] = float(np.mean([res[f"ssim_h{h}_{c}"] for c in m.cfg.cameras]))
        res["state_error_h16"] = float(np.abs(r["pred_state"][:, H16 - 1] - r["real_state"][:, H16 - 1]).mean())
        return res, r

    # the autoencoder's reconstruction of the real target frames: a ceiling for every latent model here
    keys = [f"observation.images.{c}" for c in model.cfg.cameras]
    targets = {k: np.stack([held.data[k][held.episodes[e][0] + t0 + 1] for e, t0 in starts]) for k in keys}
    with torch.no_grad():
        rec = model.decode_frames(model.encode_frames(targets))
    ae = [float(psnr(rec[k].numpy(), targets[k]).mean()) for k in keys]
    out["psnr_autoencoder"] = float(np.mean(ae))
    diff3, r3 = fidelity(model)
    out.update({k: v for k, v in diff3.items() if k != "seconds"})
    diff1, _ = fidelity(model, steps_=1)
    out["psnr_h16_1step"], out["psnr_h16_3step"] = diff1["psnr_h16"], diff3["psnr_h16"]
    detr, _ = fidelity(det)
    out["psnr_h16_deterministic"] = detr["psnr_h16"]
    out["psnr_h1_deterministic"] = detr["psnr_h1"]
    out["state_error_h16_deterministic"] = detr["state_error_h16"]
    # copy-last-frame: the last real context frame, held for every horizon
    copy = []
    for c in model.cfg.cameras:
        key = f"observation.images.{c}"
        last = np.stack([held.data[key][held.episodes[e][0] + t0] for e, t0 in starts])
        copy.append(psnr(np.repeat(last[:, None], H16, 1), r3["real"][key]))
    copy = np.mean(copy, axis=0)
    for h in (1, 4, 16):
        out[f"psnr_h{h}_copy_last"] = float(copy[:, h - 1].mean())

    # controllability (Genie): true actions vs actions shuffled across episodes, horizon 8
    rt = rollout(model, held, starts, 8, seed=1)
    rs = rollout(model, held, starts, 8, shuffle_actions=True, seed=1)
    pt = np.mean([psnr(rt["pred"][f"observation.images.{c}"], rt["real"][f"observation.images.{c}"])[:, 7] for c in model.cfg.cameras])
    ps = np.mean([psnr(rs["pred"][f"observation.images.{c}"], rs["real"][f"observation.images.{c}"])[:, 7] for c in model.cfg.cameras])
    out["delta_t_psnr_h8"] = float(pt - ps)

    # success detection on generated frames: success / near-success pairs sharing a prefix
    pairs = _prefix_pairs(4 if quick else 20)
    truth = np.array([ep["_success"] for ep in pairs])
    head, pix = [], []
    for ep in pairs:
        probs, frames = _imagine_episode(model, ep)
        head.append(probs.max())
        with torch.no_grad():
            logits = clf(frames, [ep["task"][0]] * len(probs))
        pix.append(torch.sigmoid(logits).max().item())
    head, pix = np.array(head), np.array(pix)
    out["success_auroc_generated"] = _auroc(head, truth)
    out["classifier_auroc_generated"] = _auroc(pix, truth)
    out["head_classifier_agreement"] = float(np.mean((head >= 0.5) == (pix >= 0.5)))
    out["head_accuracy_at_0.9"] = float(np.mean((head >= 0.9) == truth))
    out["prefix_pairs"] = int(len(pairs) // 2)

    # imagination throughput at batch 32, vs the true simulator (step + render 2 cameras) in the same run
    envs = {}
    for decode in (False, True):
        venv = WorldModelEnv(model, held, num_envs=32, decode_images=decode, max_episode_steps=10**6)
        venv.reset(seed=0)
        chunk = np.zeros((32, model.cfg.chunk, model.cfg.action_dim), np.float32)
        n = 3 if quick else 10
        venv.step(chunk)
        t = time.perf_counter()
        for _ in range(n):
            venv.step(chunk)
        envs[decode] = 32 * model.cfg.chunk * n / (time.perf_counter() - t)
    out["imagined_steps_per_s_nodecode"], out["imagined_steps_per_s_decode"] = envs[False], envs[True]
    from sim.tabletop.env import TabletopEnv

    env = TabletopEnv("push-red", max_episode_steps=10**6)
    env.reset(seed=0)
    n = 30 if quick else 200
    t = time.perf_counter()
    for _ in range(n):
        env.step(env.action_space.sample())
    out["true_sim_steps_per_s_render"] = n / (time.perf_counter() - t)
    # sampling cost per model step, 1 vs 3 Euler steps (batch 32)
    st = model.encode({**{f"observation.images.{c}": held.data[f"observation.images.{c}"][:32, None].repeat(2, 1)
                          for c in model.cfg.cameras}, "observation.state": held.data["observation.state"][:32],
                       "task": ["push the red cube to the yellow zone"] * 32})
    a = torch.zeros(32, model.cfg.chunk, model.cfg.action_dim)
    for k in (1, 3):
        t = time.perf_counter()
        for _ in range(3):
            model.step(st, a, steps=k)
        out[f"imagined_steps_per_s_{k}step"] = 32 * model.cfg.chunk * 3 / (time.perf_counter() - t)
    out["train_minutes"] = train_seconds / 60
    out["config"] = {"size": model.cfg.size, "context": model.cfg.context, "chunk": model.cfg.chunk,
                     "latent": [model.cfg.frame_channels, model.cfg.latent_size, model.cfg.latent_size],
                     "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
                     "ae_steps": tcfg.ae_steps, "dyn_steps": tcfg.dyn_steps, "batch_size": tcfg.batch_size}
    out["videos"] = str((diff_run / "videos").relative_to(WORK.parent.parent)) if not quick else ""
    out["config"]["device"] = device
    if default:
        return finish("world-model", out, quick)
    opts = f"size={size} device={device} steps_scale={steps_scale} batch_size={batch_size}"
    return finish(f"world-model-{tag}", out, quick, command=f"wmrl bench world-model --json --options {opts}")
