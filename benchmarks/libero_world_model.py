"""The video world model on LIBERO (issue 19, item 4): LIBERO's 7-D OSC_POSE actions, its official starts, its own
goal check. The first half of the loop on an external benchmark: collect -> world model -> fidelity and success
read from imagination; no policy, RL or ranking yet.

Data: `wmrl collect` with the scripted expert (`sim.libero.experts`; LIBERO ships no scripted policies and this
package no demonstrations), the tabletop benchmark's mix (30% near-success failures: the object set down 14 cm
beside the basket; 25% perturbed like a learning policy; noise 0.1), episodes cut at `horizon` control steps (the
expert finishes object-0 in ~110; its failure mode sets down by ~110 and then holds). LIBERO has 50 official
starts per task, so held-out episodes (the last 10%) can share a start with training episodes: held out by episode,
not by layout.

Model: the CPU default recipe (`TrainWMConfig`) without a state channel, so success comes from the frame head on
generated latents; each frame is conditioned on its commanded pose [target xyz, rotation step, gripper]. Then,
when the task's goal has a rule on body poses (`sim.libero.tasks`; the data then records `object_state: libero`),
the same model with a state channel trained on the objects' poses (`--init-from`, the default channel steps), whose
imagined success is LIBERO's goal rule on the predicted poses, scored on the same pairs.

Measured (`wmrl.eval.world_model`, the same functions as the tabletop's benchmark): PSNR gain over copy-last at
h16 on fixed held-out windows split into motion and static (the masked gain is NaN: LIBERO's env renders no
segmentation masks here), at the model's 3 Euler steps and at 1 (as imagination samples); Delta-t PSNR; success
AUROC on success / near-success pairs from the same official start scored over the same steps, with a random
scorer's AUROC on the same pairs and the ceilings on real frames (the simulator's flag, the frame head on real
frames). Work folder runs/bench-libero-world-model/<task>-<size>/; a trained model is reused.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from wmrl.benchutil import finish

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "runs" / "bench-libero-world-model"
KEYS = ("motion_psnr_gain_h16", "motion_psnr_gain_h16_ci", "static_psnr_gain_h16", "static_psnr_gap_to_ceiling",
        "delta_t_psnr_h8_motion", "motion_psnr_gain_h1", "motion_psnr_gain_h4", "motion_psnr_gain_h8")
MIX = dict(failures=0.3, perturbed=0.25, noise=0.1)  # the tabletop benchmark's data mix


def prepare(task: str = "object-0", episodes: int = 60, horizon: int = 140, size: str = "small",
            steps_scale: float = 1.0, quick: bool = False) -> dict:
    """The data and the trained models, made once per work folder and reused: `data` (the collected episodes),
    `model` (frames and heads, no state channel) and, when the task's goal has a rule on body poses, `channel`
    (the same model plus a state channel; else None). Also `work` and the step budgets (`steps`, `channel_steps`)."""
    import sim.libero
    from wmrl.commands.collect import CollectConfig, collect
    from wmrl.core.control import EEDeltaControl
    from world_models.video.train import TrainWMConfig, train_world_model

    if not sim.libero.available():
        raise ValueError("this benchmark needs LIBERO: pip install 'wmrl[libero]'")
    if quick:
        episodes, horizon, size = 4, 40, "tiny"
    work = Path(tempfile.mkdtemp(prefix="wmrl-bench-libero-wm-")) if quick else WORK / f"{task}-{size}" / (
        f"x{steps_scale:g}" if steps_scale != 1 else "")
    data, run = work / "data", work / "model"
    if not (data / "meta" / "info.json").exists():
        collect(CollectConfig(task=f"libero-{task}", episodes=episodes, out=data, overwrite=True, num_envs=1,
                              max_episode_steps=horizon, post_success_steps=3, **MIX), progress=not quick)
    base = TrainWMConfig(data=data, out=run)
    steps = (dict(ae_steps=4, dyn_steps=4, unroll_steps=2, batch_size=4, change_mask_steps=5, change_mask_windows=2, head_rollout_steps=0) if quick else
             {k: int(getattr(base, k) * steps_scale) for k in ("ae_steps", "dyn_steps", "unroll_steps")})
    state = run / "checkpoints/last/train_state.json"
    budget = sum(steps[k] for k in ("ae_steps", "dyn_steps", "unroll_steps"))
    if not (state.exists() and json.loads(state.read_text())["step"] >= budget):
        resume = state.exists()
        train_world_model(TrainWMConfig(data=data, out=run, size=size, state_channel=False, state_steps=0,
                                        videos=0 if quick else 3, resume=resume, overwrite=not resume, **steps),
                          progress=not quick)
    # the state-channel variant: the same frames and heads (`--init-from`), plus a channel trained on the objects'
    # poses, success by LIBERO's goal rule on the predicted poses (`sim.libero.tasks`)
    chan, csteps = None, 4 if quick else int(base.state_steps * steps_scale)
    if EEDeltaControl.of_dataset(data).object_state == "libero":
        chan = work / "state-channel"
        cstate = chan / "checkpoints/last/train_state.json"
        if not (cstate.exists() and json.loads(cstate.read_text())["step"] >= csteps):
            train_world_model(TrainWMConfig(data=data, out=chan, init_from=run, size=size, ae_steps=0, dyn_steps=0,
                                            unroll_steps=0, state_steps=csteps, videos=0, overwrite=True,
                                            **({"batch_size": 4, "change_mask_steps": 5, "change_mask_windows": 2}
                                               if quick else {})), progress=not quick)
    return {"work": work, "data": data, "model": run, "channel": chan, "steps": steps, "channel_steps": csteps,
            "episodes": episodes, "horizon": horizon}


def main(quick: bool = False, task: str = "object-0", episodes: int = 60, horizon: int = 140, size: str = "small",
         steps_scale: float = 1.0, windows: int = 240, pairs: int = 16) -> dict:
    from sim.libero.env import instruction
    from wmrl.eval.world_model import auroc_plot, gain_plot, pair_auroc, success_pairs, window_fidelity
    from world_models.video.evaluate import write_side_by_side
    from world_models.video.model import VideoWorldModel
    from world_models.video.train import load_split

    made = prepare(task, episodes, horizon, size, steps_scale, quick)
    work, data, run, steps = made["work"], made["data"], made["model"], made["steps"]
    episodes, horizon = made["episodes"], made["horizon"]
    if quick:
        windows, pairs = 6, 1
    state = run / "checkpoints/last/train_state.json"
    ts = json.loads(state.read_text())
    model = VideoWorldModel.load(run / "checkpoints/last").eval()
    _, train, held = load_split(data, 0.1)
    out: dict = {"task": task, "instruction": instruction(task),
                 "episodes": episodes, "horizon": horizon, "data_mix": MIX, "train_episodes": train.num_episodes,
                 "heldout_episodes": held.num_episodes, "success_source": model.success_source,
                 "pose_dim": model.cfg.pose_dim, "action_dim": model.cfg.action_dim}
    env_task = f"libero-{task}"
    fid = window_fidelity(model, held, env_task, windows, 16, seed=0)
    pw = fid.pop("per_window")
    out.update({k: fid[k] for k in (*KEYS, "n_windows", "n_motion_windows", "windows") if k in fid})
    for cam in model.cfg.cameras:
        for name in ("model", "copy"):
            for kind in ("motion", "static"):
                k = f"psnr_h16_{name}_{kind}_{cam}"
                out[k] = fid.get(k)
    ifid = window_fidelity(model, held, env_task, windows, 16, seed=0, steps=1)
    for k in KEYS:
        if k in ifid:
            out[f"imagination_{k}"] = ifid[k]
    prs = success_pairs(env_task, pairs, max_episode_steps=horizon)
    pa = pair_auroc(model, prs)
    scores, truth = pa.pop("scores"), pa.pop("truth")
    out.update(pa)
    # the state-channel variant (made by `prepare`), scored on the same pairs
    if made["channel"] is not None:
        chan = made["channel"]
        cm = VideoWorldModel.load(chan / "checkpoints/last").eval()
        cp = pair_auroc(cm, prs)
        cp.pop("scores"), cp.pop("truth")
        out["state_channel"] = {k: cp[k] for k in ("success_auroc_matched_state", "success_auroc_80step",
                                                   "imagined_success_accuracy_matched", "success_auroc_matched_frames")}
        out["state_channel"]["train_steps"] = made["channel_steps"]
    out["train_minutes"], out["train_steps"] = ts["seconds"] / 60, ts["step"]
    out["train_steps_per_s"] = ts["step"] / max(ts["seconds"], 1e-9)
    out["config"] = {"size": model.cfg.size, "params_m": sum(p.numel() for p in model.parameters()) / 1e6, **steps}
    if not quick:
        gain_plot(run / "psnr_gain_h16.png", pw["gain"], pw["motion"], pw["masked_gain"])
        auroc_plot(run / "auroc_pairs.png", scores, truth)
        if not (run / "videos" / "real_vs_imagined.gif").exists():
            write_side_by_side(model, held, run / "videos", n=3)
        import imageio.v3 as iio

        gif = iio.imread(run / "videos" / "real_vs_imagined.gif", index=None)
        # half size, every second frame (LIBERO's episodes are 110-140 steps): a README-sized file
        iio.imwrite(ROOT / "docs" / f"libero_{task}_real_vs_imagined.gif", gif[::2, ::2, ::2], duration=200, loop=0)
        out["videos"] = str((run / "videos").relative_to(ROOT))
    import inspect

    params = inspect.signature(main).parameters
    given = {k: v for k, v in dict(task=task, episodes=episodes, horizon=horizon, size=size, steps_scale=steps_scale,
                                   windows=windows, pairs=pairs).items() if v != params[k].default}
    command = "wmrl bench libero-world-model --json" + (" --options " + " ".join(f"{k}={v}" for k, v in given.items())
                                                        if given else "")
    return finish("libero-world-model", out, quick, command=None if quick else command)
