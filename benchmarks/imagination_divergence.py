"""Where a policy's imagined episodes leave its true ones: paired closed-loop episodes and a lockstep replay.

A ranking compares a policy's success in imagination with its success in the simulator from the same layouts
(`wmrl.eval.rank`). Where the two disagree (on push-red the world models read the strongest pixel policies 30-40
points low), this says where an imagined episode departs from its true twin, on the ranking's own worlds
(`rank.paired_worlds`: the same world model, imagination env and acting mode):

- **closed loop**: `episodes` paired layouts from `seed`, the policy acting in each world as a ranking makes it act
  (generated frames, or the predicted objects with `:objects`), one action per step. Per world, the medians of the
  step the hand first came down to the cube's height (`descent_step`: the end-effector within 1 cm above the task
  cube's top; push, lift and place all start so), the step that cube first moved by more than 5 mm
  (`first_move_step`), its largest displacement and its distance to the zone at the end, and success; per pair,
  imagined minus true for both steps (mean, bootstrap 95% interval) over pairs where both worlds reached it.
- **lockstep**: the true episode's actions replayed in the imagination from the same start (open loop, the policy
  reading the true observations): the median absolute error of each `observation.state` dimension and of the task
  cube's position after 1, 5, 10 and 20 steps, over episodes running in both worlds. The closed loop minus this is
  what the policy's own reactions to imagined observations add.

    wmrl bench imagination-divergence --json --options world_model=RUN policy=SPEC [data=DIR episodes=20 seed=S]

The measure's check: two runs of the same deterministic policy in the true simulator from the same layouts give
paired differences of exactly 0 (tests), so what a world model shows is its own. A policy that executes chunks is
stepped here one action at a time (a ranking steps the world model by its chunks).
"""

from __future__ import annotations

import runpy
import time
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish, on_off, on_off_word

SIBLING = runpy.run_path(str(Path(__file__).with_name("state_channel_visited_error.py")), run_name="wmrl_bench_sibling")
LOCKSTEP_STEPS = (1, 5, 10, 20)
MOVED_M = 0.005  # the task cube "moved" once this far (m) from where it started
DESCENT_M = 0.01  # the hand "came down" once within this height (m) above the cube's top


def noise_free(env, obs: dict) -> dict:
    """`obs` with the predicted objects as the world model predicts them, where the imagination adds an estimator's
    noise to what the policy reads (`:objects`): the scene is measured, not perceived."""
    from wmrl.core.features import OBS_ENV_STATE

    if getattr(env, "object_noise", None) is None:
        return obs
    return {**obs, OBS_ENV_STATE: env.predicted_environment_state}


def scene(obs: dict, i: int, ee_index, gripper_index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(task cube xyz, its zone's xy, end-effector xyz) of env `i`, from observation-level state."""
    from sim.tabletop.tasks import scene_from_state
    from wmrl.core.features import OBS_ENV_STATE, OBS_STATE

    state = np.asarray(obs[OBS_STATE][i], np.float64)
    _, s = scene_from_state(obs["task"][i], state[list(ee_index)], float(state[gripper_index]),
                            np.asarray(obs[OBS_ENV_STATE][i]))
    return s.cube.copy(), np.asarray(s.zone_xy, float).copy(), s.ee.copy()


def closed_loop(policy, env, obs: dict, steps: int, ee_index, gripper_index) -> list[dict]:
    """Run `policy` from `obs` (the env just reset) until every env has ended once; per env its observations' states
    and scenes, the actions taken and success. An env that ended is stepped on (it autoresets) but not recorded."""
    from wmrl.core.features import OBS_STATE

    B = len(obs[OBS_STATE])
    eps = [{"state": [], "scene": [], "actions": [], "success": False} for _ in range(B)]
    alive = np.ones(B, bool)
    policy.reset()
    for _ in range(steps):
        seen = noise_free(env, obs)
        for i in np.nonzero(alive)[0]:
            eps[i]["state"].append(np.asarray(obs[OBS_STATE][i], np.float64))
            eps[i]["scene"].append(scene(seen, i, ee_index, gripper_index))
        a = np.asarray(policy.select_action(obs), np.float32)
        obs, _, term, trunc, info = env.step(a)
        for i in np.nonzero(alive)[0]:
            eps[i]["actions"].append(a[i].copy())
            eps[i]["success"] |= bool(np.asarray(info.get("success", np.zeros(B, bool)))[i])
        alive &= ~(np.asarray(term) | np.asarray(trunc))
        if not alive.any():
            break
    return eps


def episode_summary(ep: dict, half_size: float = 0.02) -> dict:
    """One episode's departures (module docstring); a step that never came is -1."""
    cube = np.array([c for c, _, _ in ep["scene"]])
    zone = ep["scene"][0][1]
    ee = np.array([e for _, _, e in ep["scene"]])
    moved = np.nonzero(np.linalg.norm(cube[:, :2] - cube[0, :2], axis=1) > MOVED_M)[0]
    down = np.nonzero(ee[:, 2] < cube[:, 2] + half_size + DESCENT_M)[0]
    return {"success": bool(ep["success"]), "steps": len(ep["actions"]),
            "descent_step": int(down[0]) if len(down) else -1, "first_move_step": int(moved[0]) if len(moved) else -1,
            "cube_travel_cm": float(np.linalg.norm(cube[:, :2] - cube[0, :2], axis=1).max() * 100),
            "zone_gap_start_cm": float(np.linalg.norm(cube[0, :2] - zone) * 100),
            "zone_gap_end_cm": float(np.linalg.norm(cube[-1, :2] - zone) * 100)}


def paired_steps(true: list[dict], imagined: list[dict], key: str) -> dict:
    """Imagined minus true for `key` (a step) over the pairs where both worlds reached it, and how often each did."""
    both = [(t[key], i[key]) for t, i in zip(true, imagined) if t[key] >= 0 and i[key] >= 0]
    d = np.array([i - t for t, i in both], float)
    return {"imagined_minus_true_mean": float(d.mean()) if len(d) else None,
            "imagined_minus_true_ci": SIBLING["bootstrap_ci"](d) if len(d) else None, "pairs": len(d),
            "reached_true": float(np.mean([t[key] >= 0 for t in true])),
            "reached_imagined": float(np.mean([i[key] >= 0 for i in imagined]))}


def lockstep(wm_env, true_eps: list[dict], obs0: dict, seed: int, ee_index, gripper_index) -> dict[int, list]:
    """The true episodes' actions replayed in `wm_env` from `obs0` (the same starts, the sampler seeded by `seed`):
    for each step in LOCKSTEP_STEPS, per env running in both worlds, the absolute error of each state dimension and
    the task cube's error (cm)."""
    from wmrl.core.features import OBS_STATE

    B = len(true_eps)
    obs, _ = wm_env.reset(seed=seed, options={"observations": obs0})
    alive = np.ones(B, bool)
    errs: dict[int, list] = {t: [] for t in LOCKSTEP_STEPS}
    for t in range(1, max(LOCKSTEP_STEPS) + 1):
        a = np.stack([ep["actions"][min(t - 1, len(ep["actions"]) - 1)] for ep in true_eps]).astype(np.float32)
        obs, _, term, trunc, _ = wm_env.step(a)
        alive &= np.array([len(ep["actions"]) > t for ep in true_eps])  # the true episode still ran at step t
        if t in errs:
            for i in np.nonzero(alive)[0]:
                state_err = np.abs(np.asarray(obs[OBS_STATE][i], np.float64) - true_eps[i]["state"][t])
                cube_err = np.linalg.norm(scene(noise_free(wm_env, obs), i, ee_index, gripper_index)[0]
                                          - true_eps[i]["scene"][t][0]) * 100
                errs[t].append((state_err, cube_err))
        alive &= ~(np.asarray(term) | np.asarray(trunc))
    return errs


def main(quick: bool = False, world_model: str = "", policy: str = "", data: str = "", episodes: int = 20,
         seed: int | None = None, num_envs: int = 10, settle: str = "", tag: str = "") -> dict:
    """`world_model`: a trained run with a state channel; `policy`: a ranking policy spec (`wmrl rank`'s);
    `data`: the imagined starts' dataset (default: the model's own); `episodes`: rounded up to whole batches of
    `num_envs`; `seed`: the first layout (default: the ranking's fresh ones); `settle`: on | off, cubes the hand
    does not hold resting in imagination (default: the model's own); `tag`: appended to the result's name."""
    from world_models.video.train import world_model_data
    from wmrl.eval.rank import FRESH_LAYOUTS, imagined_policy, paired_worlds, policy_label

    if not world_model or not policy:
        raise ValueError("options world_model=RUN and policy=SPEC are required")
    if int(episodes) < 1 or int(num_envs) < 1:
        raise ValueError(f"episodes and num_envs must be >= 1, got {episodes}, {num_envs}")
    seed = FRESH_LAYOUTS if seed is None else int(seed)
    state_settle = on_off(settle, "settle")
    settle = on_off_word(state_settle)
    B = min(int(num_envs), int(episodes))
    n_batches = 1 if quick else -(-int(episodes) // B)
    t0 = time.time()
    pcfg, true_env, wm_env, objects = paired_worlds(policy, world_model, data or str(world_model_data(world_model)), "push-red", B,
                                                    max_steps=8 if quick else None,
                                                    state_settle=state_settle)
    cfg = wm_env.model.cfg
    steps = wm_env.max_episode_steps
    true_eps, imagined_eps = [], []
    lock: dict[int, list] = {t: [] for t in LOCKSTEP_STEPS}
    try:
        for k in range(n_batches):
            s = seed + k * B
            obs0, _ = true_env.reset(seed=s)
            t_eps = closed_loop(pcfg.build(true_env, seed=s), true_env, obs0, steps, cfg.ee_index, cfg.gripper_index)
            obs, _ = wm_env.reset(seed=s, options={"observations": obs0})
            i_eps = closed_loop(imagined_policy(pcfg, true_env, wm_env, s, objects), wm_env, obs, steps,
                                cfg.ee_index, cfg.gripper_index)
            for t, e in lockstep(wm_env, t_eps, obs0, s, cfg.ee_index, cfg.gripper_index).items():
                lock[t] += e
            true_eps += [episode_summary(e) for e in t_eps]
            imagined_eps += [episode_summary(e) for e in i_eps]
    finally:
        true_env.close()
    keys = ("success", "steps", "descent_step", "first_move_step", "cube_travel_cm", "zone_gap_start_cm", "zone_gap_end_cm")

    def medians(eps: list[dict]) -> dict:
        out = {k: float(np.median([e[k] for e in eps if e[k] >= 0] or [np.nan])) for k in keys if k != "success"}
        return {"success": float(np.mean([e["success"] for e in eps])), **out}

    merged = {f"step{t}": ({"n": len(e), "state_abs_error_median": np.median([x for x, _ in e], 0).tolist(),
                            "cube_cm_median": float(np.median([c for _, c in e]))} if e else {"n": 0})
              for t, e in lock.items()}
    out = {"task": "push-red", "world_model": world_model, "policy": policy, "state_settle": cfg.state_settle, "acting": "objects" if objects else "frames",
           "first_layout_seed": seed, "episodes": len(true_eps),
           "true": medians(true_eps), "imagined": medians(imagined_eps),
           "paired": {k: paired_steps(true_eps, imagined_eps, k) for k in ("descent_step", "first_move_step")},
           "lockstep": merged, "per_episode": {"true": true_eps, "imagined": imagined_eps},
           "minutes": (time.time() - t0) / 60}
    name = "imagination-divergence-" + (tag or policy_label(policy).replace(":", "-").replace("=", ""))
    opts = f"world_model={world_model} policy={policy}" + (f" data={data}" * bool(data)) + \
        (f" episodes={episodes}" if int(episodes) != 20 else "") + (f" seed={seed}" if seed != FRESH_LAYOUTS else "") + \
        (f" settle={settle}" if settle else "") + (f" tag={tag}" if tag else "")
    return finish(name, out, quick, command=f"wmrl bench imagination-divergence --json --options {opts}")
