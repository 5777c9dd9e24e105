"""Evaluating a video world model as a simulator for policies (the benchmark and `wmrl demo` share it):

- `window_fidelity`: a fixed set of held-out windows (stored by the caller), split into motion and static; per-window
  PSNR gain over copy-last-frame at h16 with bootstrap CIs, the same on the pixels of the arm and cubes only (MuJoCo
  segmentation renders of the real frames), the autoencoder ceiling, per-horizon gains, Genie's Delta-t PSNR on
  motion windows, and end-effector errors in cm from the state channel;
- `success_pairs` + `pair_auroc`: success / near-success episodes sharing a start (same seed), each imagined under its
  recorded actions and scored on the *same* number of steps per pair (a random scorer gives 0.5; its value is
  reported in the same run), plus the whole-episode ("80-step") AUROC RL sees and the ceilings on real data;
- `hallucination`: closed-loop imagined episodes of a policy from true-simulator starts, every imagined success's
  actions replayed open-loop in the true simulator from the same start;
- `replay_states`: the state channel alone replaying recorded episodes, with the ensemble mean or one member
  (the open-loop checks per readout, in seconds instead of minutes);
- `gain_plot`, `auroc_plot` for reports.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import sim
from policies.random_policy import RandomPolicy
from sim import replay_in_true_sim, replay_open_loop, success_and_reward
from sim.experts import ScriptedExpert
from sim.tabletop.twin import CUBE_COLOURS
from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE, SUCCESS, TASK, image_key
from wmrl.eval.loop import evaluate
from world_models.env import WorldModelEnv
from world_models.video.change_mask import paste_objects
from world_models.video.evaluate import (auroc, bootstrap_ci, first_frame_inputs, fixed_windows, matched_max, pair_auroc_ci, psnr,
                                        recorded_points, rollout, window_inputs)


H16 = 16


def _mean(x: np.ndarray) -> float:
    """Mean over the finite entries; NaN (without a warning) when there are none, e.g. no static window."""
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


def window_fidelity(model, held, task: str, n_windows: int = 240, horizon: int = H16, seed: int = 0,
                    steps: int | None = None, controllability: bool = True, sample_seed: int | None = None) -> dict:
    """Fidelity on `fixed_windows(held, n_windows, horizon, seed=seed)`. The masked (arm + objects) PSNR needs a
    suite whose env renders segmentation masks (`moving_mask_at`, the tabletop's) and `held` keeping `qpos`; without
    them its keys are NaN.
    `steps`: Euler steps per chunk (None: the model's `sampling_steps`; imagination samples with 1). Returns summary
    numbers, the model's and copy-last's PSNR per camera, and under `per_window` the arrays the plots use.
    `controllability=False` skips Delta-t PSNR (two more rollouts), e.g. on training windows. `sample_seed`: the
    sampling noise's seed when it should differ from the windows' (default `seed`)."""
    wins = fixed_windows(held, n_windows, horizon, model.cfg.context, seed=seed, ee_index=model.cfg.ee_index,
                         object_xyz=model.cfg.object_xyz)
    starts = [(w["episode"], w["start"]) for w in wins]
    motion = np.array([w["motion"] for w in wins])
    episode = np.array([w["episode"] for w in wins])  # windows of one episode are not independent: CIs over episodes too
    out: dict = {"n_windows": len(wins), "n_motion_windows": int(motion.sum()),
                 "n_motion_episodes": len(set(episode[motion].tolist())),
                 "windows": [[w["episode"], w["start"], int(w["motion"])] for w in wins]}
    r = rollout(model, held, starts, horizon, steps=steps, seed=seed if sample_seed is None else sample_seed)
    cams = [image_key(c) for c in model.cfg.cameras]
    start, _, real = window_inputs(model, held, starts, horizon)
    last = {c: np.stack([held.data[c][held.episodes[e][0] + t0] for e, t0 in starts]) for c in cams}
    masks, swept = {c: [] for c in cams}, {c: [] for c in cams}
    parts = {"arm": {c: [] for c in cams}, "objects": {c: [] for c in cams}}  # the masks split, where the env can
    env = sim.make_env(task).unwrapped
    has_masks = hasattr(env, "moving_mask_at") and "qpos" in held.data
    has_parts = has_masks and hasattr(env, "part_masks_at")
    if has_masks:
        env.reset(seed=0)
        for e, t0 in starts:
            qpos_h = held.data["qpos"][held.episodes[e][0] + t0 + horizon]  # the real frame at the horizon
            if has_parts:
                split = env.part_masks_at(qpos_h)
                m = {c: split["arm"][c] | split["objects"][c] for c in cams}
                for part in parts:
                    for c in cams:
                        parts[part][c].append(split[part][c])
            else:
                m = env.moving_mask_at(qpos_h)
            m0 = env.moving_mask_at(held.data["qpos"][held.episodes[e][0] + t0])  # and where things were at the start
            for c in cams:
                masks[c].append(m[c])
                swept[c].append(m[c] | m0[c])
    else:  # no masks: every masked PSNR is NaN
        for c in cams:
            masks[c] = [np.zeros(real[c].shape[2:4], bool)] * len(starts)
    env.close()
    with torch.no_grad():  # the autoencoder's reconstruction of the real frames: the ceiling of a latent model
        z_real = model.encode_frames({c: real[c][:, horizon - 1] for c in cams})
        rec = model.decode_frames(z_real)
        # the same real latents through the identity path the model decodes with (frame0 + dec(z) - dec(z0)): the
        # ceiling of this model's frames, higher where little changes
        z0 = model.encode_frames(last)
        ident = model.decode_frames(z_real, (z0, last), mask=False)
        # where a loss is made: the model's latent error and copy-last's (z0), rms over the latent, at h1 and h
        z_at = {1: model.encode_frames({c: real[c][:, 0] for c in cams}), horizon: z_real}
    for hh, zr in z_at.items():
        for name, zp in (("model", r["latents"][:, hh - 1]), ("copy", z0)):
            rms = (zp - zr).pow(2).mean((1, 2, 3)).sqrt().numpy()
            out[f"latent_error_h{hh}_{name}_motion"], out[f"latent_error_h{hh}_{name}_static"] = _mean(rms[motion]), _mean(rms[~motion])
    per = {}
    for name, pred in (("model", {c: r["pred"][c][:, horizon - 1] for c in cams}), ("copy", last),
                       ("ceiling", {c: rec[c].numpy() for c in cams}), ("identity_ceiling", {c: ident[c].numpy() for c in cams})):
        per[name] = np.mean([psnr(pred[c], real[c][:, horizon - 1]) for c in cams], 0)
        per[name + "_masked"] = masked_psnr(pred, {c: real[c][:, horizon - 1] for c in cams}, masks)
    gain, mgain = per["model"] - per["copy"], per["model_masked"] - per["copy_masked"]
    h = horizon
    part_gains = {}
    if has_parts:  # the masked gain on the arm's pixels and on the cubes' (the same per-window PSNR, the mask split)
        preds = {"model": {c: r["pred"][c][:, h - 1] for c in cams}, "copy": last}
        if "points" in r and getattr(model.cfg, "change_objects", False):
            # the same latents decoded with the recorded [hand, object] points: how much of the cubes' error the
            # state channel's predicted points make (the ceiling of a channel that were exact)
            real_pts = recorded_points(model, real)[:, h - 1 : h]
            dec = model.decode(r["latents"][:, h - 1 : h], model.encode(start["obs"], anchor=start["anchor"]),
                               r["pose"][:, h - 1 : h], real_pts)
            preds["recorded_points"] = {c: dec[c][:, 0] for c in cams}
            # a rigid object layer over the model's frames (`change_mask.paste_objects`): each cube's start-frame
            # patch pasted where the state channel puts it, and where it really is
            preds["rigid_objects"] = paste_objects(model, preds["model"], last, r["points0"], r["points"][:, h - 1])
            preds["rigid_objects_recorded_points"] = paste_objects(model, preds["model"], last, r["points0"], real_pts[:, 0])
        real_h = {c: real[c][:, h - 1] for c in cams}
        for part, pm in parts.items():
            pp = {name: masked_psnr(pred, real_h, pm) for name, pred in preds.items()}
            part_gains[part] = pp["model"] - pp["copy"]
            out[f"masked_psnr_gain_h{h}_{part}"] = _mean((pp["model"] - pp["copy"])[motion])
            out[f"masked_psnr_gain_h{h}_{part}_ci"] = bootstrap_ci((pp["model"] - pp["copy"])[motion])
            others = [n for n in pp if n not in ("model", "copy")]
            for n in others:
                out[f"masked_psnr_gain_h{h}_{part}_{n}"] = _mean((pp[n] - pp["copy"])[motion])
            for c, cam in zip(cams, model.cfg.cameras):  # per camera (the wrist sees the cubes large and moving)
                pc = {name: masked_psnr({c: pred[c]}, {c: real_h[c]}, {c: pm[c]}) for name, pred in preds.items()}
                out[f"masked_psnr_gain_h{h}_{part}_{cam}"] = _mean((pc["model"] - pc["copy"])[motion])
                for n in others:
                    out[f"masked_psnr_gain_h{h}_{part}_{cam}_{n}"] = _mean((pc[n] - pc["copy"])[motion])
    out[f"motion_psnr_gain_h{h}"] = _mean(gain[motion])
    out[f"motion_psnr_gain_h{h}_ci"] = bootstrap_ci(gain[motion])
    out[f"motion_psnr_gain_h{h}_ci_episodes"] = bootstrap_ci(gain[motion], groups=episode[motion])
    out[f"static_psnr_gain_h{h}"] = _mean(gain[~motion])
    out[f"masked_psnr_gain_h{h}"] = _mean(mgain[motion])
    out[f"masked_psnr_gain_h{h}_ci"] = bootstrap_ci(mgain[motion])
    out[f"masked_psnr_gain_h{h}_ci_episodes"] = bootstrap_ci(mgain[motion], groups=episode[motion])
    out["static_psnr_gap_to_ceiling"] = _mean((per["model"] - per["ceiling"])[~motion])
    out["static_psnr_gap_to_identity_ceiling"] = _mean((per["model"] - per["identity_ceiling"])[~motion])
    for k in ("model", "copy", "ceiling", "identity_ceiling"):
        out[f"psnr_h{h}_{k}_motion"] = _mean(per[k][motion])
        out[f"psnr_h{h}_{k}_static"] = _mean(per[k][~motion])
        out[f"masked_psnr_h{h}_{k}_motion"] = _mean(per[k + "_masked"][motion])
    for c, cam in zip(cams, model.cfg.cameras):  # per camera: a moving (wrist) view fails differently from a fixed one
        for name, pred in (("model", r["pred"][c][:, h - 1]), ("copy", last[c])):
            p = psnr(pred, real[c][:, h - 1])
            out[f"psnr_h{h}_{name}_motion_{cam}"], out[f"psnr_h{h}_{name}_static_{cam}"] = _mean(p[motion]), _mean(p[~motion])
    for hh in sorted(x for x in {1, 4, 8, h} if x <= h):
        pm = np.mean([psnr(r["pred"][c][:, hh - 1], real[c][:, hh - 1]) for c in cams], 0)
        pc = np.mean([psnr(last[c], real[c][:, hh - 1]) for c in cams], 0)
        out[f"motion_psnr_gain_h{hh}"] = _mean((pm - pc)[motion])
    if has_masks:  # where the error is made: on the arm and cubes (at the start or at h) or on the background
        out[f"error_split_h{h}"] = error_split({c: r["pred"][c][:, h - 1] for c in cams}, last,
                                              {c: real[c][:, h - 1] for c in cams}, swept, motion, model.cfg.cameras)
    if controllability:  # Genie's Delta-t PSNR: true vs shuffled actions, motion windows, horizon 8
        mstarts = [s for s, m in zip(starts, motion) if m]
        rt = rollout(model, held, mstarts, 8, steps=steps, seed=seed + 1)
        rs = rollout(model, held, mstarts, 8, steps=steps, shuffle_actions=True, seed=seed + 1)
        pt = np.mean([psnr(rt["pred"][c][:, 7], rt["real"][c][:, 7]) for c in cams], 0)
        ps = np.mean([psnr(rs["pred"][c][:, 7], rs["real"][c][:, 7]) for c in cams], 0)
        out["delta_t_psnr_h8_motion"] = _mean(pt - ps)
        out["delta_t_psnr_h8_motion_ci"] = bootstrap_ci(pt - ps)
    if "ee" in r:
        err = np.linalg.norm(r["ee"] - r["real_state"][..., list(model.cfg.ee_index)], axis=-1) * 100
        out["ee_error_cm_h4"], out[f"ee_error_cm_h{h}"] = float(np.median(err[:, 3])), float(np.median(err[:, h - 1]))
    if "points" in r:  # the channel's hand and objects against the recorded ones at h on motion windows (what the
        # blobs and object sources are drawn from)
        dist = np.linalg.norm(r["points"][:, h - 1] - recorded_points(model, real)[:, h - 1].numpy(), axis=-1) * 100
        out[f"hand_error_cm_h{h}_motion"] = float(np.median(dist[motion, 0]))
        out[f"object_error_cm_h{h}_motion"] = [float(v) for v in np.median(dist[motion, 1:], 0)]
    rest = model.cfg.rest_index  # joint angles: from the state channel when it predicts them, else frame heads
    if rest:
        jerr = np.abs(r["pred_state"][..., rest] - r["real_state"][..., rest]).max(-1)
        out[f"joint_error_rad_h{h}"] = float(np.median(jerr[:, h - 1]))
        out["joint_source"] = "state channel" if model.state_channel is not None and model.cfg.state_rest else "frame heads"
    out["per_window"] = {"gain": gain, "masked_gain": mgain, "motion": motion, "episode": episode,
                         **{f"masked_gain_{part}": g for part, g in part_gains.items()}}
    return out


def masked_psnr(pred: dict, real: dict, masks: dict) -> np.ndarray:
    """Per window: the PSNR of `pred` against `real` (per camera (N, H, W, 3)) on `masks` (per camera, N bool (H, W)
    masks), averaged over the cameras that show any masked pixel in that window (NaN where none does)."""
    with np.errstate(all="ignore"):  # a camera may show no arm or cube in a window: NaN there, skipped
        m = np.stack([psnr(pred[c], real[c], np.stack(masks[c])) for c in pred])
    fin = np.isfinite(m)
    return np.where(fin.any(0), np.where(fin, m, 0).sum(0) / np.maximum(fin.sum(0), 1), np.nan)


def error_split(pred: dict, last: dict, real: dict, regions: dict, motion: np.ndarray, names) -> dict:
    """Squared error per frame (pixel values 0-255, summed over the frame's pixels and channels, averaged over
    windows) of the model (`pred`) and of copy-last (`last`) against `real`, inside `regions` (per camera, per window,
    a bool (H, W) mask: the arm and cubes) and outside them (the background), per camera `names` and on motion and
    static windows; `inside_share` is the masks' share of the frame. A model that beats copy-last inside but loses
    outside spills its changes onto the background (the change mask's diagnosis)."""
    out = {}
    for c, cam in zip(pred, names):
        m = np.stack(regions[c])[..., None]
        se = {"model": (pred[c].astype(np.float64) - real[c]) ** 2, "copy": (last[c].astype(np.float64) - real[c]) ** 2}
        out[cam] = {}
        for split, sel in (("motion", motion), ("static", ~motion)):
            n = max(int(sel.sum()), 1)
            mm = np.broadcast_to(m[sel], se["model"][sel].shape)
            row = {"inside_share": float(m[sel].mean()) if sel.any() else float("nan")}
            for name, e in se.items():
                row[f"{name}_inside"], row[f"{name}_outside"] = float(e[sel][mm].sum() / n), float(e[sel][~mm].sum() / n)
            out[cam][split] = row
    return out


def cube_error_at_episode_end(model, held, cube: str = "red") -> np.ndarray:
    """Per held-out episode: the distance (cm) between the imagined and the real cube at the episode's last frame,
    rolling out from its first frame under the recorded actions (state channel)."""
    i = 3 * CUBE_COLOURS.index(cube)
    errs = []
    for e, (lo, T) in held.episodes.items():
        r = rollout(model, held, [(e, 0)], T - 1, decode=False, seed=2)
        errs.append(np.linalg.norm(r["pred_env"][0, -1, i : i + 3] - r["real_env"][0, -1, i : i + 3]) * 100)
    return np.array(errs)


def cube_error_in_true_sim(held, task: str, cube_shift: float, cube: str = "red", seed: int = 0) -> np.ndarray:
    """The same measurement as `cube_error_at_episode_end` for the true simulator started `cube_shift` (m) off: each
    held-out episode's recorded actions replayed from its recorded start with every cube moved that far in a random
    horizontal direction. With 0 it reproduces the recording (a check of the measurement); with 1 mm it is the
    ceiling of any model that is exact up to a 1 mm state error (pushing is chaotic)."""
    i = 3 * CUBE_COLOURS.index(cube)
    errs = []
    for k, (e, (lo, T)) in enumerate(held.episodes.items()):
        acts = held.data[ACTION][lo : lo + T - 1]
        _, env = replay_open_loop(task, acts, start_qpos=held.data["qpos"][lo], cube_shift=cube_shift,
                                  shift_seed=seed + k, until_done=False)
        errs.append(np.linalg.norm(env[i : i + 3] - held.data[OBS_ENV_STATE][lo + T - 1, i : i + 3]) * 100)
    return np.array(errs)


def success_pairs(task: str, n_seeds: int, seed0: int = 50_000, max_episode_steps: int | None = None) -> list[dict]:
    """Success / near-success episode pairs from the same start (same seed): they share a prefix and diverge when
    the expert's failure mode kicks in (the push stops just outside the zone). Pairs where the nominal expert
    failed or the failure-mode expert succeeded are dropped (they are not contrastive). `max_episode_steps`: cut
    episodes there (None: the task's horizon)."""
    out = []
    horizon = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    env = sim.make_env(task, post_success_steps=3, **horizon).unwrapped
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
def imagine_recorded(model, eps: list[dict], seed: int = 0, steps: int | None = None, keep_latents: bool = False,
                     keep_frames: bool = False, exact_points: bool = False) -> dict:
    """Every recorded episode rolled out in the model from its first frame under its recorded actions (batched,
    padded to the longest). Per episode and step: the success head's probability on the generated latents and,
    with a state channel, the task rules' success and shaped reward on the predicted state. `steps`: Euler steps per
    chunk (None: the model's `sampling_steps`; imagination samples with 1). `keep_latents`: also the generated
    latents (`latents`, per episode (T, C, S, S)), to score other heads on the same rollouts. `keep_frames`: also the
    frames decoded as policies see them (`frames`, per episode {camera key: uint8 (T, H, W, 3)}), for scorers of pixels.
    `exact_points` (with `keep_frames` and a mask with object sources): also the same latents decoded with each
    object's patch placed where the simulator put it (`frames_recorded_points`), the state channel's points made exact
    at the decode only. With a state channel `keep_frames` also returns the points the frames were decoded with
    (`points`, per episode (T, 1 + n_objects, 3), and the start frame's `points0`)."""
    Hc = model.cfg.chunk
    T, acts, obs = first_frame_inputs(model, eps)
    Tm = max(T)
    state = model.encode(obs)
    g = torch.Generator().manual_seed(seed)
    head, ee, op, env, lat, frames, exact, pts = [], [], [], [], [], [], [], []
    if exact_points:
        if not (keep_frames and model.cfg.change_objects):
            raise ValueError("exact_points decodes the object patches at the recorded points: it needs keep_frames "
                             "and a world model whose change mask has object sources (change_objects)")
        q = [recorded_points(model, {k: ep[k][1 : t + 1] for k in (OBS_STATE, OBS_ENV_STATE)}) for ep, t in zip(eps, T)]
        n = -(-Tm // Hc) * Hc  # padded with each episode's last point to whole chunks
        q = torch.stack([torch.cat([x, x[-1:].expand(n - len(x), *x.shape[1:])]) for x in q])
    for i in range(0, Tm, Hc):
        state, p = model.step(state, torch.as_tensor(acts[:, i : i + Hc]), steps=steps, generator=g)
        head.append(p["success"].numpy())
        if keep_latents:
            lat.append(p["latents"])
        if keep_frames:
            frames.append(model.decode(p["latents"], state, p["pose"], p["points"] if "points" in p else None))
            if "points" in p:
                pts.append(torch.as_tensor(p["points"]))
            if exact_points:
                exact.append(model.decode(p["latents"], state, p["pose"], q[:, i : i + p["latents"].shape[1]]))
        if "ee" in p:
            ee.append(p["ee"].numpy())
            op.append(p["gripper_opening"].numpy())
            env.append(p[OBS_ENV_STATE].numpy())
    head = np.concatenate(head, 1)
    out = {"head": [head[i, :t] for i, t in enumerate(T)]}
    if keep_latents:
        lat = torch.cat(lat, 1)
        out["latents"] = [lat[i, :t] for i, t in enumerate(T)]
    if keep_frames:
        frames = {k: np.concatenate([f[k] for f in frames], 1) for k in frames[0]}
        out["frames"] = [{k: v[i, :t] for k, v in frames.items()} for i, t in enumerate(T)]
    if pts:
        pts = torch.cat(pts, 1)
        out["points0"], out["points"] = list(state["points0"]), [pts[i, :t] for i, t in enumerate(T)]
    if exact:
        exact = {k: np.concatenate([f[k] for f in exact], 1) for k in exact[0]}
        out["frames_recorded_points"] = [{k: v[i, :t] for k, v in exact.items()} for i, t in enumerate(T)]
    if ee:
        ee, op, env = np.concatenate(ee, 1), np.concatenate(op, 1), np.concatenate(env, 1)
        rs = [success_and_reward(obs[TASK][i], ee[i, :t], op[i, :t], env[i, :t]) for i, t in enumerate(T)]
        out["state_success"], out["state_reward"] = [r[0] for r in rs], [r[1] for r in rs]
    return out


def held_episodes(held, cams: list[str]) -> list[dict]:
    """The held-out replay's episodes as the dicts `replay_states` reads (first frame per camera is enough)."""
    eps = []
    for lo, T in held.episodes.values():
        sl = slice(lo, lo + T)
        eps.append({ACTION: np.asarray(held.data[ACTION][sl]), OBS_STATE: np.asarray(held.data[OBS_STATE][sl]),
                    OBS_ENV_STATE: np.asarray(held.data[OBS_ENV_STATE][sl]),
                    TASK: [held.vocab[TASK][int(held.data[TASK][lo])]] * T,
                    **{c: np.asarray(held.data[c][lo : lo + 1]) for c in cams}})
    return eps


@torch.no_grad()
def replay_states(model, eps: list[dict], member: int | None = None, seed: int = 0, consensus: bool = False) -> dict:
    """The state channel alone (no frames generated) replaying recorded episodes from their first frame under their
    recorded actions, batched and padded to the longest: per episode (its T - 1 steps) the predicted `ee`,
    `opening` and `env` (observation.environment_state) as the channel reports them, with the ensemble mean
    (`member` None), one member `member` for every episode, or the members stepped from their mean (`consensus`,
    `state_channel.READOUTS`), and the task rules' `success` and `reward`. The model's own contact gate; `seed` draws
    sampled contacts. Needs a state channel that predicts all of observation.state."""
    if not model.frames_optional:
        raise ValueError("replay_states needs a state channel that predicts all of observation.state (state_rest)")
    M = model.cfg.state_members
    if member is not None and not 0 <= member < M:
        raise ValueError(f"member: expected 0..{M - 1} or None, got {member}")
    if member is not None and consensus:
        raise ValueError("replay_states: one member or the consensus of all, not both")
    T, acts, obs = first_frame_inputs(model, eps)
    Tm = max(T)
    state = model.encode(obs)
    if member is not None:
        state["member"] = torch.full((len(eps),), member, dtype=torch.long, device=model.device)
    if consensus:
        state["consensus"] = torch.ones(len(eps), dtype=torch.bool, device=model.device)
    g = torch.Generator(device=model.device).manual_seed(seed)
    ee, op, env = [], [], []
    for i in range(0, Tm, model.cfg.chunk):
        state, p = model.step(state, torch.as_tensor(acts[:, i : i + model.cfg.chunk]), frames=False, state_generator=g)
        ee.append(p["ee"].cpu().numpy())
        op.append(p["gripper_opening"].cpu().numpy())
        env.append(p[OBS_ENV_STATE].cpu().numpy())
    ee, op, env = np.concatenate(ee, 1), np.concatenate(op, 1), np.concatenate(env, 1)
    rs = [success_and_reward(obs[TASK][i], ee[i, :t], op[i, :t], env[i, :t]) for i, t in enumerate(T)]
    return {"ee": [ee[i, :t] for i, t in enumerate(T)], "opening": [op[i, :t] for i, t in enumerate(T)],
            "env": [env[i, :t] for i, t in enumerate(T)], "success": [r[0] for r in rs], "reward": [r[1] for r in rs]}


def pair_lengths(pairs: list[dict], seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Success / near-success pairs (`success_pairs`) -> the labels, each episode's steps, the steps both of its
    pair are scored on (the shorter's), and the AUROCs a random scorer gets on them (`n_pairs`,
    `random_scorer_auroc_matched`, `random_scorer_auroc_80step`): the check any score is read against."""
    if not pairs:
        raise ValueError("no contrastive success / near-success pair: raise the number of seeds")
    truth = np.array([ep["_success"] for ep in pairs])
    lens = np.array([len(ep[ACTION]) - 1 for ep in pairs])
    matched = np.repeat(np.minimum(lens[0::2], lens[1::2]), 2)  # both of a pair scored on the same steps
    rng = np.random.default_rng(seed)
    rand = [rng.random(n) for n in lens]
    return truth, lens, matched, {"n_pairs": int(len(pairs) // 2),
                                  "random_scorer_auroc_matched": auroc(matched_max(rand, matched), truth),
                                  "random_scorer_auroc_80step": auroc(matched_max(rand, lens), truth)}


def pair_auroc(model, pairs: list[dict], seed: int = 0, steps: int | None = None) -> dict:
    """AUROCs of imagined success on success / near-success pairs (see the module docstring). Scores: the max over
    the first n steps of the task rules' shaped reward on predicted state (state path), or of the success head's
    probability on generated latents (frames path), with n the shorter episode of the pair (`matched`) or each
    episode's own length (`80step`); matched ones with a bootstrap 95% interval over pairs (`_ci`). `scores` keeps
    the matched scores for plots. `steps`: Euler steps per chunk of the rollouts (None: the model's default;
    imagination, ranking and RL sample with 1, and the frames path depends on it)."""
    truth, lens, matched, out = pair_lengths(pairs, seed)
    im = imagine_recorded(model, pairs, seed, steps=steps)
    scores = {"frames: success head on generated latents": matched_max(im["head"], matched)}
    out["success_auroc_matched_frames"] = auroc(scores["frames: success head on generated latents"], truth)
    out["success_auroc_matched_frames_ci"] = pair_auroc_ci(scores["frames: success head on generated latents"], truth)
    out["success_auroc_80step_frames"] = auroc(matched_max(im["head"], lens), truth)
    out["success_auroc_80step"] = out["success_auroc_80step_frames"]
    if "state_reward" in im:
        scores["state: task rules on predicted state"] = matched_max(im["state_reward"], matched)
        out["success_auroc_matched_state"] = auroc(scores["state: task rules on predicted state"], truth)
        out["success_auroc_matched_state_ci"] = pair_auroc_ci(scores["state: task rules on predicted state"], truth)
        out["success_auroc_80step"] = auroc(matched_max(im["state_reward"], lens), truth)
        out["imagined_success_accuracy_matched"] = float(np.mean(matched_max(im["state_success"], matched).astype(bool) == truth))
    ee, g = list(model.cfg.ee_index), model.cfg.gripper_index
    if sim.has_task_rules(pairs[0][TASK][0]):  # the rules' shaped reward on the recorded state
        real = [success_and_reward(ep[TASK][0], ep[OBS_STATE][1:, ee], ep[OBS_STATE][1:, g], ep[OBS_ENV_STATE][1:])[1]
                for ep in pairs]
    else:  # the simulator's own success flags (LIBERO's goal check)
        real = [np.asarray(ep[SUCCESS][: len(ep[ACTION]) - 1], np.float64) for ep in pairs]
    out["success_auroc_real_ceiling"] = auroc(matched_max(real, matched), truth)
    cams = [image_key(c) for c in model.cfg.cameras]
    with torch.no_grad():
        real_head = [torch.sigmoid(model.heads(model.encode_frames({c: ep[c][1:] for c in cams}),
                                               model.task([ep[TASK][0]] * (len(ep[ACTION]) - 1)))["success_logit"]).numpy()
                     for ep in pairs]
    out["success_auroc_real_frames_head"] = auroc(matched_max(real_head, matched), truth)
    out["scores"], out["truth"] = scores, truth
    return out


def hallucination(model, held, task: str, policy_name: str, seeds: list[int], max_steps: int = 80,
                  flag_cm: float = 2.0, state_readout: str = "mean", noise: float = 0.1,
                  true_run: dict | None = None) -> dict:
    """Closed-loop imagined episodes of a policy (`expert`: the scripted expert with `noise`; `random`) from
    true-simulator starts, success from the task's rules on predicted state. Every imagined success's actions are
    replayed in the true simulator from the same start; for the random policy every episode is replayed (its actions
    do not depend on what it sees), which gives its true success rate on the very same action sequences.
    `*_flagged`: the same, counting only successes reached while the ensemble's disagreement stayed <= `flag_cm`
    (the hallucination flag a caller can stop or discount uncertain imagined episodes with). `state_readout`: the
    state channel's readout (`state_channel.READOUTS`: mean, one member per episode, consensus; `WorldModelEnv`).
    `true_run`: the expert's `true_closed_loop` on the same seeds, noise and steps when the caller already has it
    (it depends on neither the model nor the readout)."""
    env = sim.make_env(task).unwrapped
    starts = [env.reset(seed=s)[0] for s in seeds]
    env.close()
    batch = {k: np.stack([o[k] for o in starts]) for k in starts[0] if k != TASK}
    batch[TASK] = [o[TASK] for o in starts]
    n = len(seeds)
    venv = WorldModelEnv(model, held, num_envs=n, max_episode_steps=max_steps, decode_images=policy_name != "expert",
                         sampling_steps=1, rules=success_and_reward, state_readout=state_readout)
    policy = ScriptedExpert(noise=noise, seed=0) if policy_name == "expert" else RandomPolicy(venv.single_action_space, seed=0)
    obs, _ = venv.reset(seed=0, options={"observations": batch})
    policy.reset()
    alive, success, trusted = np.ones(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    max_dis = np.zeros(n)
    acts: list[list[np.ndarray]] = [[] for _ in range(n)]
    dis = []
    for _ in range(max_steps):
        a = np.asarray(policy.select_action(obs), np.float32)
        obs, _, term, trunc, info = venv.step(a)
        for i in np.flatnonzero(alive):
            acts[i].append(a[i])
        dis.append(info["disagreement"][alive])
        max_dis = np.where(alive, np.maximum(max_dis, info["disagreement"]), max_dis)
        trusted |= alive & info["success"] & (max_dis <= flag_cm)
        success |= alive & info["success"]
        alive &= ~(term | trunc)
        if not alive.any():
            break
    check = range(n) if policy_name == "random" else np.flatnonzero(success)
    true = {i: replay_in_true_sim(task, seeds[i], np.stack(acts[i])) for i in check}
    hall = [i for i in np.flatnonzero(success) if not true[i]]
    hall_f = [i for i in np.flatnonzero(trusted) if not true[i]]
    res = {"imagined_success": float(success.mean()), "imagined_successes": int(success.sum()),
           "imagined_per_start": success.tolist(),
           "hallucinated": len(hall), "hallucinated_share": len(hall) / max(int(success.sum()), 1),
           "imagined_success_flagged": float(trusted.mean()), "hallucinated_share_flagged": len(hall_f) / max(int(trusted.sum()), 1),
           "true_success_of_imagined": float(np.mean([true[i] for i in np.flatnonzero(success)])) if success.any() else float("nan"),
           "median_disagreement_cm": float(np.median(np.concatenate(dis))), "flag_cm": flag_cm}
    if policy_name == "random":
        res["true_success"] = float(np.mean([true[i] for i in range(n)]))
    else:  # the policy itself in the true simulator from the same starts, and the chaos ceiling of the replay check
        res.update(true_run if true_run is not None else true_closed_loop(task, seeds, max_steps, noise=noise))
    return res


def true_closed_loop(task: str, seeds: list[int], max_steps: int = 80, cube_shift: float = 1e-3,
                     noise_seed0: int = 0, noise: float = 0.1) -> dict:
    """The noisy scripted expert (`noise`) run closed-loop in the true simulator from the same starts (its true
    success rate: what imagined success should match), and the ceiling of the open-loop replay check: the share of
    its *true* successes whose actions fail when replayed from a start with every cube moved `cube_shift` (1 mm).
    A model exact up to 1 mm cannot score a lower hallucinated share than this. `true_per_start`: each start's
    outcome; the expert's noise for start k is seeded `noise_seed0 + k` (another value: a second true run, whose
    per-start agreement with the first is what a perfect model could reach)."""
    env = sim.make_env(task, cameras=(), max_episode_steps=max_steps).unwrapped
    ok, fail_shifted = [], []
    for k, s in enumerate(seeds):
        r = evaluate(ScriptedExpert(noise=noise, seed=noise_seed0 + k), env, 1, seed=s, record=True, progress=False)
        ok.append(bool(r.per_episode[0]["success"]))
        if ok[-1]:
            fail_shifted.append(not replay_in_true_sim(task, s, r.episodes[0][ACTION], cube_shift=cube_shift, shift_seed=k))
    env.close()
    return {"true_success": float(np.mean(ok)), "true_per_start": ok,
            "replay_fails_after_shift": float(np.mean(fail_shifted)) if fail_shifted else float("nan"),
            "shift_m": cube_shift}


def gain_plot(path: Path, gains: np.ndarray, motion: np.ndarray, masked: np.ndarray, horizon: int = H16) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    for a, x, title in ((ax[0], gains, "whole frame"), (ax[1], masked, "arm + cubes (masked)")):
        for sel, lab in ((motion, "motion"), (~motion, "static")):
            v = x[sel]
            v = v[np.isfinite(v)]
            if len(v):
                a.hist(v, bins=30, alpha=0.6, label=f"{lab} (n={len(v)}, mean {v.mean():+.2f} dB)")
        a.axvline(0, color="k", lw=0.8)
        a.set_title(f"PSNR gain over copy-last at h{horizon}: {title}", fontsize=9)
        a.set_xlabel("dB per window")
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def auroc_plot(path: Path, scores: dict[str, np.ndarray], truth: np.ndarray) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, len(scores), figsize=(3.6 * len(scores), 3), squeeze=False)
    for a, (name, s) in zip(ax[0], scores.items()):
        rng = np.random.default_rng(0)
        for lab, c in ((True, "tab:green"), (False, "tab:red")):
            v = s[truth == lab]
            a.scatter(v, rng.uniform(-0.2, 0.2, len(v)) + (1 if lab else 0), s=8, color=c,
                      label="success" if lab else "near-success")
        a.set_title(f"{name}\nAUROC {auroc(s, truth):.2f}", fontsize=8)
        a.set_yticks([])
        a.set_xlabel("score over matched steps")
    ax[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
