"""Which part of the state channel loses a policy's success in imagination: closed loops in mixed worlds.

A ranking on the predicted objects runs a policy closed-loop on the world model's state channel alone
(`rank.paired_worlds` with `:objects`), and on push-red the strongest pixel policies succeed there at a third of
their true rate (`imagination_divergence.py`). This runs the same policy, from the same layouts, with the same draws
of the observation noise, in worlds that take each part of the next state from the state channel or from the true
simulator put in the current state (`TabletopEnv.place`: the hand by inverse kinematics, the cubes' centres at rest)
and stepped once:

- `sim`: the simulator (the true episodes);
- `placed`: the simulator put in the scene it reached before every step: the oracle the mixed worlds use; its
  distance from `sim` is what placing (no velocities, the cubes' orientation kept) costs;
- `channel`: the state channel alone, its members each following their own prediction (what a ranking runs);
- `arm-sim`: hand, gripper and joints from the placed simulator's step, the cubes from the channel's;
- `cube-sim`: the hand, gripper and joints from the channel, the cubes from the placed simulator;
- `flat`: the channel with every cube put back at its starting height after each step (on push tasks nothing is
  lifted: the channel without its errors in height);
- `flat-seen`: the channel as it is, the policy reading every cube at its starting height.

Every variant but `sim` and `channel` sets the channel's members to the state it is in before each step. Per
variant: success (Wilson 95% interval) and, paired by layout, its difference from `channel` and from `sim`
(bootstrap 95% interval), and the task cube's height above its start after 10 steps (median and p90, cm).

    wmrl bench imagination-hybrid --json --options world_model=RUN policy=SPEC [episodes=100 settle=on|off tag=T]

`policy`: a ranking spec that reads state (an `:objects` pixel policy or a scripted anchor); the world model needs a
state channel; the task's simulator must be placeable (the tabletop suite's).
"""

from __future__ import annotations

import time

import numpy as np

from wmrl.benchutil import finish, on_off, on_off_word

VARIANTS = ("sim", "placed", "channel", "arm-sim", "cube-sim", "flat", "flat-seen")
TASK = "push-red"


def run_variant(variant: str, pcfg, true_env, wm_env, objects: bool, seed: int, horizon: int) -> dict:
    """One variant's closed loop from layouts seed..seed+B-1 (`wm_env`'s batch); per episode success and the task
    cube's height above its start after 10 steps."""
    import torch

    import sim
    from sim import success_and_reward
    from wmrl.core.features import OBS_ENV_STATE, OBS_STATE
    from wmrl.eval.rank import imagined_policy

    model = wm_env.model
    cfg = model.cfg
    B = wm_env.num_envs
    obs0, _ = true_env.reset(seed=seed)
    sims = [sim.make_env(TASK, cameras=()).unwrapped for _ in range(B)]
    for i, s in enumerate(sims):
        s.reset(seed=seed + i)
    state = model.encode(obs0)
    gen = torch.Generator().manual_seed(seed)  # the channel's contacts: the same draws in every variant
    noise = np.zeros(0) if wm_env.object_noise is None else np.asarray(wm_env.object_noise, np.float32)
    rng = np.random.default_rng(seed)  # the observation noise: the same draws in every variant
    policy = imagined_policy(pcfg, true_env, wm_env, seed, objects)
    policy.reset()
    proprio = np.asarray(obs0[OBS_STATE], np.float32).copy()
    env = np.asarray(obs0[OBS_ENV_STATE], np.float32).copy()
    start_z = env[:, [o + 2 for o in cfg.object_xyz]].copy()
    tasks = list(obs0["task"])
    red = cfg.object_xyz[0]  # push-red's task cube is the first object
    alive, success, height10 = np.ones(B, bool), np.zeros(B, bool), np.full(B, np.nan)
    try:
        for t in range(horizon):
            seen = env.copy()
            if variant == "flat-seen":
                seen[:, [o + 2 for o in cfg.object_xyz]] = start_z
            if len(noise):
                seen = seen + (rng.standard_normal(seen.shape) * noise).astype(np.float32)
            a = np.asarray(policy.select_action({OBS_STATE: proprio.copy(), OBS_ENV_STATE: seen, "task": tuple(tasks)}),
                           np.float32)
            if variant in ("sim", "placed"):
                nxt_p, nxt_e = proprio.copy(), env.copy()
            else:
                if variant != "channel":  # every member starts this step from the mixed world's state
                    state = model.reanchor_state(state, proprio, env)
                state, preds = model.step(state, torch.from_numpy(a[:, None]), frames=False, generator=gen)
                nxt_p = preds[OBS_STATE][:, 0].numpy().astype(np.float32)
                nxt_e = preds[OBS_ENV_STATE][:, 0].numpy().astype(np.float32)
            if variant != "channel":
                for i in np.flatnonzero(alive):
                    if variant in ("placed", "arm-sim", "cube-sim"):
                        sims[i].place(proprio[i], env[i])
                    if variant in ("sim", "placed", "arm-sim", "cube-sim"):
                        ob, *_ = sims[i].step(a[i])
                        if variant in ("sim", "placed", "arm-sim"):
                            nxt_p[i] = ob[OBS_STATE]
                        if variant in ("sim", "placed", "cube-sim"):
                            nxt_e[i] = ob[OBS_ENV_STATE]
            if variant == "flat":
                nxt_e[:, [o + 2 for o in cfg.object_xyz]] = start_z
            ok = success_and_reward(tasks, nxt_p[:, list(cfg.ee_index)], nxt_p[:, cfg.gripper_index], nxt_e)[0]
            success |= alive & ok
            alive &= ~ok
            proprio = np.where(alive[:, None], nxt_p, proprio).astype(np.float32)
            env = np.where(alive[:, None], nxt_e, env).astype(np.float32)
            if t == 9:
                height10 = (env[:, red + 2] - start_z[:, 0]) * 100
            if not alive.any():
                break
    finally:
        for s in sims:
            s.close()
    return {"success": success, "height10_cm": height10}


def main(quick: bool = False, world_model: str = "", policy: str = "", data: str = "", episodes: int = 100,
         seed: int | None = None, num_envs: int = 25, variants: str = ",".join(VARIANTS), settle: str = "",
         tag: str = "") -> dict:
    """`world_model`: a trained run with a state channel; `policy`: a ranking spec that reads state; `episodes`:
    rounded up to whole batches of `num_envs`; `seed`: the first layout (default: the ranking's fresh ones);
    `variants`: comma-separated (module docstring); `settle`: on | off, cubes the hand does not hold resting in the channel
    (default: the model's own); `tag`: appended to the result's name."""
    import sim
    from world_models.video.state_dagger import check_placeable
    from world_models.video.train import world_model_data
    from wmrl.eval.rank import FRESH_LAYOUTS, acts_on_objects, is_anchor, paired_worlds, policy_label
    from wmrl.eval import wilson_interval

    if not world_model or not policy:
        raise ValueError("options world_model=RUN and policy=SPEC are required")
    chosen = [v for v in str(variants).split(",") if v]
    if bad := [v for v in chosen if v not in VARIANTS]:
        raise ValueError(f"variants: expected some of {VARIANTS}, got {bad}")
    if int(episodes) < 1 or int(num_envs) < 1:
        raise ValueError(f"episodes and num_envs must be >= 1, got {episodes}, {num_envs}")
    if not (is_anchor(policy) or policy.startswith("estimated-state:") and acts_on_objects(policy)):
        raise ValueError(f"policy {policy!r}: this measure runs the state channel without frames; give a policy that "
                         "reads state (an estimated-state policy with ':objects', or a random or scripted anchor)")
    check_placeable(TASK)
    seed = FRESH_LAYOUTS if seed is None else int(seed)
    state_settle = on_off(settle, "settle")
    settle = on_off_word(state_settle)
    B = min(int(num_envs), int(episodes))
    n_batches = 1 if quick else -(-int(episodes) // B)
    t0 = time.time()
    pcfg, true_env, wm_env, objects = paired_worlds(policy, world_model, data or str(world_model_data(world_model)), TASK, B,
                                                    max_steps=8 if quick else None, state_settle=state_settle)
    horizon = 8 if quick else sim.episode_horizon(TASK)
    per: dict[str, dict] = {v: {"success": [], "height10_cm": []} for v in chosen}
    try:
        for k in range(n_batches):
            for v in chosen:
                r = run_variant(v, pcfg, true_env, wm_env, objects, seed + k * B, horizon)
                per[v]["success"] += r["success"].astype(int).tolist()
                per[v]["height10_cm"] += r["height10_cm"].tolist()
    finally:
        true_env.close()
    rng = np.random.default_rng(0)
    n = len(per[chosen[0]]["success"])
    boot = rng.integers(0, n, size=(2000, n))

    def paired(a: str, b: str) -> dict:
        d = np.asarray(per[a]["success"], float) - np.asarray(per[b]["success"], float)
        means = d[boot].mean(1)
        return {"mean": float(d.mean()), "ci95": [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]}

    rows = {}
    for v in chosen:
        s = np.asarray(per[v]["success"])
        h = np.asarray(per[v]["height10_cm"], float)
        h = h[np.isfinite(h)]
        rows[v] = {"success": float(s.mean()), "success_ci95": list(wilson_interval(int(s.sum()), len(s))),
                   "cube_height_above_start_10_cm_median": float(np.median(h)) if len(h) else None,
                   "cube_height_above_start_10_cm_p90": float(np.quantile(h, 0.9)) if len(h) else None,
                   **({"minus_channel": paired(v, "channel")} if "channel" in chosen and v != "channel" else {}),
                   **({"minus_sim": paired(v, "sim")} if "sim" in chosen and v != "sim" else {})}
    out = {"task": TASK, "world_model": world_model, "policy": policy, "state_settle": wm_env.model.cfg.state_settle,
           "state_height_loss": wm_env.model.cfg.state_height_loss, "first_layout_seed": seed, "episodes": n,
           "variants": rows, "per_episode": {v: per[v]["success"] for v in chosen}, "minutes": (time.time() - t0) / 60}
    name = "imagination-hybrid-" + (tag or policy_label(policy).replace(":", "-").replace("=", ""))
    opts = f"world_model={world_model} policy={policy}" + (f" data={data}" * bool(data)) + \
        (f" episodes={episodes}" if int(episodes) != 100 else "") + (f" seed={seed}" if seed != FRESH_LAYOUTS else "") + \
        (f" variants={variants}" if variants != ",".join(VARIANTS) else "") + \
        (f" settle={settle}" if settle else "") + (f" tag={tag}" if tag else "")
    return finish(name, out, quick, command=f"wmrl bench imagination-hybrid --json --options {opts}")
