"""Video world model v2 on held-out push-red episodes, measured the way a policy would lean on it.

- Fidelity on a fixed, stored set of held-out windows (>= 200, chosen by seed), split into motion and static:
  per-window PSNR gain over copy-last-frame at h16 (paired, bootstrap 95% CI), the same on pixels of the arm and
  cubes only (MuJoCo segmentation renders of the real frames), the gap to the autoencoder's ceiling on static
  windows, and Genie's Delta-t PSNR (true vs shuffled actions) at h8 on motion windows.
- State: end-effector error at h4/h16 and target-cube error at the end of whole held-out episodes, in cm.
- Success: AUROC over success / near-success pairs that share a start (same seed), each scored on the *same*
  number of steps (a random scorer gives 0.5 there, checked in the same run); the 80-step AUROC as RL sees it
  (each episode scored to its own end; its random-scorer value is reported too); the ceiling on real data.
- Hallucinated success: imagined rollouts of a noisy scripted expert and of a random policy from true-simulator
  starts, every imagined success's actions replayed open-loop in the true simulator from the same start.

Work folder: runs/bench-world-model/full/ (dataset and model). A finished training is reused (resume), so
re-running only re-measures; delete the folder to retrain from scratch.
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
ROOT = WORK.parent.parent
H16 = 16


def _pairs(n_seeds: int, seed0: int = 50_000) -> list[dict]:
    """Success / near-success episode pairs from the same start (same seed): they share a prefix and diverge when
    the expert's failure mode kicks in (the push stops just outside the zone). Pairs where the nominal expert
    failed or the failure-mode expert succeeded are dropped (they are not contrastive)."""
    import sim
    from sim.tabletop.experts import ScriptedExpert
    from wmrl.eval import evaluate

    out = []
    env = sim.make_env("push-red", post_success_steps=3).unwrapped
    for s in range(n_seeds):
        pair = []
        for failure in (0.0, 1.0):
            r = evaluate(ScriptedExpert(failure_prob=failure, seed=s), env, 1, seed=seed0 + s, record=True, progress=False)
            ep = r.episodes[0]
            ep["_success"], ep["_seed"] = bool(r.per_episode[0]["success"]), seed0 + s
            pair.append(ep)
        if pair[0]["_success"] and not pair[1]["_success"]:
            out.extend(pair)
    env.close()
    return out


@torch.no_grad()
def _imagine_recorded(model, eps: list[dict], seed: int = 0) -> dict:
    """Every recorded episode rolled out in the model from its first frame under its recorded actions (batched,
    padded to the longest). Per episode: success-head probabilities and the task rules' (success, reward) on the
    predicted state, per step (T_i,)."""
    from sim.tabletop.tasks import success_and_reward

    K, Hc = model.cfg.context, model.cfg.chunk
    cams = [f"observation.images.{c}" for c in model.cfg.cameras]
    T = [len(ep["action"]) - 1 for ep in eps]
    Tm = max(T)
    acts = np.stack([np.concatenate([ep["action"][:t], np.repeat(ep["action"][t - 1 : t], Tm - t, 0)]) for ep, t in zip(eps, T)])
    obs = {**{c: np.stack([np.repeat(ep[c][:1], K, 0) for ep in eps]) for c in cams},
           "observation.state": np.stack([ep["observation.state"][0] for ep in eps]),
           "observation.environment_state": np.stack([ep["observation.environment_state"][0] for ep in eps]),
           "task": [ep["task"][0] for ep in eps]}
    state = model.encode(obs)
    g = torch.Generator().manual_seed(seed)
    head, ee, op, env = [], [], [], []
    for i in range(0, Tm, Hc):
        state, p = model.step(state, torch.as_tensor(acts[:, i : i + Hc]), generator=g)
        head.append(p["success"].numpy())
        if "ee" in p:
            ee.append(p["ee"].numpy()), op.append(p["gripper_opening"].numpy()), env.append(p["observation.environment_state"].numpy())
    head = np.concatenate(head, 1)
    out = {"head": [head[i, :t] for i, t in enumerate(T)]}
    if ee:
        ee, op, env = np.concatenate(ee, 1), np.concatenate(op, 1), np.concatenate(env, 1)
        rs = []
        for i, t in enumerate(T):
            ok, rew = success_and_reward(obs["task"][i], ee[i, :t], op[i, :t], env[i, :t])
            rs.append((ok, rew))
        out["state_success"] = [r[0] for r in rs]
        out["state_reward"] = [r[1] for r in rs]
        out["env"] = [env[i, :t] for i, t in enumerate(T)]
    return out


def _hallucination(model, held, policy_name: str, seeds: list[int], max_steps: int = 80) -> dict:
    """Closed-loop imagined episodes of a policy from true-simulator starts; every imagined success's actions are
    replayed in the true simulator from the same start. For the random policy, every episode is replayed (its
    actions do not depend on what it sees), which gives its true success rate on the very same action sequences."""
    import sim
    from policies.random_policy import RandomPolicy
    from sim.tabletop.experts import ScriptedExpert
    from sim.tabletop.tasks import success_and_reward
    from wmrl.rl.coevolve import replay_in_true_sim
    from world_models.env import WorldModelEnv

    env = sim.make_env("push-red").unwrapped
    starts = [env.reset(seed=s)[0] for s in seeds]
    env.close()
    batch = {k: np.stack([o[k] for o in starts]) for k in starts[0] if k != "task"}
    batch["task"] = [o["task"] for o in starts]
    n = len(seeds)
    venv = WorldModelEnv(model, held, num_envs=n, max_episode_steps=max_steps, decode_images=policy_name != "expert",
                         sampling_steps=1, rules=success_and_reward)
    policy = ScriptedExpert(noise=0.1, seed=0) if policy_name == "expert" else RandomPolicy(venv.single_action_space, seed=0)
    obs, _ = venv.reset(seed=0, options={"observations": batch})
    policy.reset()
    alive, success = np.ones(n, bool), np.zeros(n, bool)
    acts: list[list[np.ndarray]] = [[] for _ in range(n)]
    dis = []
    for _ in range(max_steps):
        a = np.asarray(policy.select_action(obs), np.float32)
        obs, _, term, trunc, info = venv.step(a)
        for i in np.flatnonzero(alive):
            acts[i].append(a[i])
        dis.append(info["disagreement"][alive])
        success |= alive & info["success"]
        alive &= ~(term | trunc)
        if not alive.any():
            break
    check = range(n) if policy_name == "random" else np.flatnonzero(success)
    true = {i: replay_in_true_sim("push-red", seeds[i], np.stack(acts[i])) for i in check}
    hall = [i for i in np.flatnonzero(success) if not true[i]]
    res = {"imagined_success": float(success.mean()), "imagined_successes": int(success.sum()),
           "hallucinated": len(hall), "hallucinated_share": len(hall) / max(int(success.sum()), 1),
           "median_disagreement_cm": float(np.median(np.concatenate(dis)))}
    if policy_name == "random":
        res["true_success"] = float(np.mean([true[i] for i in range(n)]))
    return res


def _gain_plot(path: Path, gains: np.ndarray, motion: np.ndarray, masked: np.ndarray) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    for a, x, title in ((ax[0], gains, "whole frame"), (ax[1], masked, "arm + cubes (masked)")):
        for sel, lab in ((motion, "motion"), (~motion, "static")):
            v = x[sel]
            v = v[np.isfinite(v)]
            a.hist(v, bins=30, alpha=0.6, label=f"{lab} (n={len(v)}, mean {v.mean():+.2f} dB)")
        a.axvline(0, color="k", lw=0.8)
        a.set_title(f"PSNR gain over copy-last at h16: {title}", fontsize=9)
        a.set_xlabel("dB per window")
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _auroc_plot(path: Path, scores: dict[str, np.ndarray], truth: np.ndarray) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, len(scores), figsize=(3.2 * len(scores), 3))
    for a, (name, s) in zip(np.atleast_1d(ax), scores.items()):
        rng = np.random.default_rng(0)
        for lab, c in ((True, "tab:green"), (False, "tab:red")):
            v = s[truth == lab]
            a.scatter(v, rng.uniform(-0.2, 0.2, len(v)) + (1 if lab else 0), s=8, color=c, label="success" if lab else "near-success")
        a.set_title(name, fontsize=9)
        a.set_yticks([])
    np.atleast_1d(ax)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(quick: bool = False, size: str = "small", device: str = "cpu", steps_scale: float = 1.0,
         batch_size: int = 32) -> dict:
    """The defaults are the committed CPU numbers. Anything else (e.g. `--size base --device cuda --steps-scale 5`)
    trains in its own work folder and writes `world-model-SIZE-DEVICE.json`, never the CPU result."""
    import sim
    from sim.tabletop.tasks import success_and_reward
    from wmrl.commands.collect import CollectConfig, collect
    from world_models.video.evaluate import auroc, bootstrap_ci, fixed_windows, matched_max, psnr, rollout, window_inputs
    from world_models.video.model import VideoWorldModel
    from world_models.video.train import TrainWMConfig, load_split, train_world_model

    default = (size, device, steps_scale, batch_size) == ("small", "cpu", 1.0, 32)
    tag = "full" if default else f"{size}-{device.split(':')[0]}"
    work = Path(tempfile.mkdtemp(prefix="wmrl-bench-wm-")) if quick else WORK / tag  # quick: always fresh
    n_eps = 16 if quick else 300
    mix = dict(failures=0.3, noise=0.05, perturbed=0.25)
    base = TrainWMConfig(data=Path("."), out=Path("."))
    steps = dict(ae_steps=20, state_steps=20, dyn_steps=20, unroll_steps=10, size="tiny", batch_size=8) if quick else dict(
        size=size, device=device, batch_size=batch_size,
        **{k: int(getattr(base, k) * steps_scale) for k in ("ae_steps", "state_steps", "dyn_steps", "unroll_steps")})
    data = work / "data"
    if not (data / "meta/info.json").exists():
        collect(CollectConfig(task="push-red", episodes=n_eps, out=data, overwrite=True, post_success_steps=3, **mix),
                progress=not quick)
    run = work / "model"
    resume = (run / "checkpoints/last/train_state.json").exists()
    tcfg = TrainWMConfig(data=data, out=run, videos=3, resume=resume, overwrite=not resume, **steps)
    train_world_model(tcfg, progress=not quick)
    ts = json.loads((run / "checkpoints/last/train_state.json").read_text())
    model = VideoWorldModel.load(run / "checkpoints/last", device="cpu").eval()
    _, _, held = load_split(data, 0.1, keep=("qpos",))
    out: dict = {"dataset_episodes": n_eps, "data_mix": mix, "heldout_episodes": held.num_episodes,
                 "success_source": model.success_source}

    # ---- fidelity on the fixed window set
    wins = fixed_windows(held, 24 if quick else 240, H16, model.cfg.context, seed=0)
    starts = [(w["episode"], w["start"]) for w in wins]
    motion = np.array([w["motion"] for w in wins])
    out["n_windows"], out["n_motion_windows"] = len(wins), int(motion.sum())
    out["windows"] = [[w["episode"], w["start"], int(w["motion"])] for w in wins]
    t = time.perf_counter()
    r = rollout(model, held, starts, H16, seed=0)
    out["rollout_seconds_per_window_h16"] = (time.perf_counter() - t) / len(wins)
    cams = [f"observation.images.{c}" for c in model.cfg.cameras]
    _, _, real = window_inputs(model, held, starts, H16)
    last = {c: np.stack([held.data[c][held.episodes[e][0] + t0] for e, t0 in starts]) for c in cams}
    env = sim.make_env("push-red").unwrapped
    env.reset(seed=0)
    masks = {c: [] for c in cams}
    for e, t0 in starts:
        m = env.moving_mask_at(held.data["qpos"][held.episodes[e][0] + t0 + H16])  # the real frame at h16
        for c in cams:
            masks[c].append(m[c])
    env.close()
    with torch.no_grad():  # the autoencoder's reconstruction of the real frames at h16: the ceiling of a latent model
        rec = model.decode_frames(model.encode_frames({c: real[c][:, H16 - 1] for c in cams}))
    per = {}
    for name, pred in (("model", {c: r["pred"][c][:, H16 - 1] for c in cams}), ("copy", last),
                       ("ceiling", {c: rec[c].numpy() for c in cams})):
        per[name] = np.mean([psnr(pred[c], real[c][:, H16 - 1]) for c in cams], 0)
        per[name + "_masked"] = np.nanmean([psnr(pred[c], real[c][:, H16 - 1], np.stack(masks[c])) for c in cams], 0)
    gain, mgain = per["model"] - per["copy"], per["model_masked"] - per["copy_masked"]
    out["motion_psnr_gain_h16"] = float(gain[motion].mean())
    out["motion_psnr_gain_h16_ci"] = bootstrap_ci(gain[motion])
    out["static_psnr_gain_h16"] = float(gain[~motion].mean())
    out["masked_psnr_gain_h16"] = float(np.nanmean(mgain[motion]))
    out["masked_psnr_gain_h16_ci"] = bootstrap_ci(mgain[motion])
    out["static_psnr_gap_to_ceiling"] = float((per["model"] - per["ceiling"])[~motion].mean())
    for k in ("model", "copy", "ceiling"):
        out[f"psnr_h16_{k}_motion"] = float(per[k][motion].mean())
        out[f"psnr_h16_{k}_static"] = float(per[k][~motion].mean())
        out[f"masked_psnr_h16_{k}_motion"] = float(np.nanmean(per[k + "_masked"][motion]))
    for h in (1, 4, 8, 16):
        pm = np.mean([psnr(r["pred"][c][:, h - 1], real[c][:, h - 1]) for c in cams], 0)
        pc = np.mean([psnr(last[c], real[c][:, h - 1]) for c in cams], 0)
        out[f"motion_psnr_gain_h{h}"] = float((pm - pc)[motion].mean())
    # controllability (Genie's Delta-t PSNR): true vs shuffled actions, motion windows, horizon 8
    mstarts = [s for s, m in zip(starts, motion) if m]
    rt = rollout(model, held, mstarts, 8, seed=1)
    rs = rollout(model, held, mstarts, 8, shuffle_actions=True, seed=1)
    pt = np.mean([psnr(rt["pred"][c][:, 7], rt["real"][c][:, 7]) for c in cams], 0)
    ps = np.mean([psnr(rs["pred"][c][:, 7], rs["real"][c][:, 7]) for c in cams], 0)
    out["delta_t_psnr_h8_motion"] = float((pt - ps).mean())
    out["delta_t_psnr_h8_motion_ci"] = bootstrap_ci(pt - ps)

    # ---- state errors (cm)
    if "ee" in r:
        err = np.linalg.norm(r["ee"] - r["real_state"][..., 5:8], axis=-1) * 100
        out["ee_error_cm_h4"], out["ee_error_cm_h16"] = float(np.median(err[:, 3])), float(np.median(err[:, 15]))
        pose_err = np.linalg.norm(r["pose"][..., :3] - r["real_state"][..., 5:8], axis=-1) * 100
        out["commanded_pose_vs_real_ee_cm_h16"] = float(np.median(pose_err[:, 15]))
        full = [(e, 0) for e, (lo, T) in held.episodes.items()]
        cube_err = []
        for e, _ in full:
            T = held.episodes[e][1]
            re = rollout(model, held, [(e, 0)], T - 1, decode=False, seed=2)
            ci = 3 * ["red", "green", "blue"].index("red")
            cube_err.append(np.linalg.norm(re["pred_env"][0, -1, ci : ci + 3] - re["real_env"][0, -1, ci : ci + 3]) * 100)
        out["cube_error_cm_end"] = float(np.median(cube_err))
        out["cube_error_cm_end_p90"] = float(np.percentile(cube_err, 90))

    # ---- success AUROC on prefix-sharing pairs
    pairs = _pairs(12 if quick else 130)
    truth = np.array([ep["_success"] for ep in pairs])
    lens = np.array([len(ep["action"]) - 1 for ep in pairs])
    matched = np.repeat(np.minimum(lens[0::2], lens[1::2]), 2)  # both of a pair scored on the same steps
    im = _imagine_recorded(model, pairs)
    rng = np.random.default_rng(0)
    rand = [rng.random(n) for n in lens]
    out["n_pairs"] = int(len(pairs) // 2)
    out["random_scorer_auroc_matched"] = auroc(matched_max(rand, matched), truth)
    out["random_scorer_auroc_80step"] = auroc(matched_max(rand, lens), truth)
    scores = {"frames (head on generated latents)": matched_max(im["head"], matched)}
    out["success_auroc_matched_frames"] = auroc(scores["frames (head on generated latents)"], truth)
    out["success_auroc_80step_frames"] = auroc(matched_max(im["head"], lens), truth)
    if "state_reward" in im:
        scores["state (task rules on predicted state)"] = matched_max(im["state_reward"], matched)
        out["success_auroc_matched_state"] = auroc(scores["state (task rules on predicted state)"], truth)
        out["success_auroc_80step"] = auroc(matched_max(im["state_reward"], lens), truth)
        out["imagined_success_accuracy_matched"] = float(np.mean(matched_max(im["state_success"], matched).astype(bool) == truth))
    else:
        out["success_auroc_80step"] = out["success_auroc_80step_frames"]
    real_rew = [success_and_reward(ep["task"][0], ep["observation.state"][1:, 5:8], ep["observation.state"][1:, 4],
                                   ep["observation.environment_state"][1:])[1] for ep in pairs]
    out["success_auroc_real_ceiling"] = auroc(matched_max(real_rew, matched), truth)
    with torch.no_grad():
        real_head = [torch.sigmoid(model.heads(model.encode_frames({c: ep[c][1:] for c in cams}),
                                               model.task([ep["task"][0]] * (len(ep["action"]) - 1)))["success_logit"]).numpy()
                     for ep in pairs]
    out["success_auroc_real_frames_head"] = auroc(matched_max(real_head, matched), truth)

    # ---- hallucinated success (closed loop in imagination, replayed in the true simulator)
    if model.state_channel is not None:
        seeds = list(range(70_000, 70_000 + (6 if quick else 60)))
        ex = _hallucination(model, held, "expert", seeds)
        rd = _hallucination(model, held, "random", seeds)
        out["hallucinated_success_expert"] = ex["hallucinated_share"]
        out["expert_imagined_success"], out["expert_imagined_successes"] = ex["imagined_success"], ex["imagined_successes"]
        out["expert_median_disagreement_cm"], out["random_median_disagreement_cm"] = ex["median_disagreement_cm"], rd["median_disagreement_cm"]
        out["random_policy_imagined_success"], out["random_policy_true_success"] = rd["imagined_success"], rd["true_success"]
        out["random_policy_imagined_minus_true"] = rd["imagined_success"] - rd["true_success"]
        out["hallucination_episodes"] = len(seeds)

    out["train_minutes"] = ts["seconds"] / 60
    out["train_steps"] = ts["step"]
    out["train_steps_per_s"] = ts["step"] / ts["seconds"]
    out["config"] = {"size": model.cfg.size, "context": model.cfg.context, "chunk": model.cfg.chunk,
                     "latent": [model.cfg.frame_channels, model.cfg.latent_size, model.cfg.latent_size],
                     "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "device": device,
                     **{k: getattr(tcfg, k) for k in ("ae_steps", "state_steps", "dyn_steps", "unroll_steps", "batch_size")}}
    if not quick:
        docs = ROOT / "docs"
        _gain_plot(run / "psnr_gain_h16.png", gain, motion, mgain)
        _auroc_plot(run / "auroc_pairs.png", scores, truth)
        if default:
            import shutil

            shutil.copy(run / "psnr_gain_h16.png", docs / "wm_psnr_gain_h16.png")
            shutil.copy(run / "auroc_pairs.png", docs / "wm_auroc_pairs.png")
            shutil.copy(run / "videos" / "real_vs_imagined.gif", docs / "wm_real_vs_imagined.gif")
        out["plots"] = [str((run / p).relative_to(ROOT)) for p in ("psnr_gain_h16.png", "auroc_pairs.png")]
        out["videos"] = str((run / "videos").relative_to(ROOT))
    if default:
        return finish("world-model", out, quick)
    opts = f"size={size} device={device} steps_scale={steps_scale} batch_size={batch_size}"
    return finish(f"world-model-{tag}", out, quick, command=f"wmrl bench world-model --json --options {opts}")
