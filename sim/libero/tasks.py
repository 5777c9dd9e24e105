"""LIBERO's goal check on observation-level state, for imagination: a world model's state channel predicts object
poses, and success is LIBERO's own rule applied to them (as `sim.tabletop.tasks` does for the tabletop and
`sim.metaworld.tasks` for Meta-World).

LIBERO's `In(object, region)` (`libero.libero.envs.predicates.In`), with a region that is a site on a body (a
basket's `contain_region`), holds when the object's body position lies inside the site's box: centred on the site,
half-extents |R_site @ size|, the lower bound 1 cm lower (`SiteObject.in_box`); for a site the contact test is
always true. The site is rigidly attached to its body, so its pose follows from that body's position and wxyz
quaternion in `observation.environment_state` (7 entries per body, `sim.libero.env`) and the site's fixed offset in
the body's frame, read once from the task's model. Other goals (On, which needs physical contact; Open, Turnon;
regions of the table) have no rule here: `has_rule` says which tasks do.
"""

from __future__ import annotations

import numpy as np

from sim.libero.env import task_of


def quat_wxyz_to_mat(q: np.ndarray) -> np.ndarray:
    """Rotation matrices (..., 3, 3) of wxyz quaternions (..., 4) (normalised first)."""
    q = np.asarray(q, np.float64)
    w, x, y, z = np.moveaxis(q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-12), -1, 0)
    return np.stack([np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
                     np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
                     np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1)], -2)


_LAYOUTS: dict[str, tuple | None] = {}  # task -> goal_layout, filled by every LiberoEnv built in this process


def goal_layout(env) -> tuple | None:
    """`_layout` of a built `LiberoEnv`, kept for its task (so success on predicted state needs no second env)."""
    _LAYOUTS[env.task] = _layout(env)
    return _LAYOUTS[env.task]


def _layout(env) -> tuple | None:
    """Per goal predicate of a built `LiberoEnv`'s task: (object index, region body index, site offset and rotation
    in the body's frame, site size), indices into the bodies of `observation.environment_state`; None when any goal
    has no rule. Reads model constants only (no reset needed)."""
    import mujoco

    from libero.libero.envs.bddl_utils import robosuite_parse_problem
    from sim.libero.env import bddl_file

    goal = robosuite_parse_problem(str(bddl_file(env.task)))["goal_state"]
    robo, m, names = env.lib.env, env.lib.sim.model._model, env.object_names()
    out = []
    for pred in goal:
        if pred[0] != "in" or pred[2] not in robo.object_sites_dict or pred[1] not in names:
            return None
        sid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, pred[2])
        body = int(m.site_bodyid[sid])
        if body not in env._bodies:
            return None
        out.append((names.index(pred[1]), env._bodies.index(body), m.site_pos[sid].copy(),
                    quat_wxyz_to_mat(m.site_quat[sid]), np.asarray(robo.object_sites_dict[pred[2]].size, np.float64)))
    return tuple(out)


def _goals(task: str) -> tuple | None:
    """The task's goal layout: the one a LiberoEnv of it already computed, else from an env built for it (seconds)."""
    if task not in _LAYOUTS:
        from sim.libero.env import LiberoEnv

        LiberoEnv(task, cameras=()).close()
    return _LAYOUTS[task]


def has_rule(task: str) -> bool:
    """Whether every goal of a LIBERO task ('object-0') is an `In` a region site on a body (LIBERO-Object's ten)."""
    return _goals(task) is not None


def success_and_reward(tasks, ee: np.ndarray, opening: np.ndarray, env_state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Batched success (every goal's `In` holds) and a dense reward in [0, 1] (1 at success, else 0.9 (1 -
    tanh(10 d)) with d the mean distance of the goals' objects to their regions' centres) on observation-level
    state (B rows). `tasks`: LIBERO instructions (one, or one per row). The hand plays no part in these goals."""
    env = np.asarray(env_state, np.float64).reshape(len(env_state), -1, 7)
    texts = [tasks] * len(env) if isinstance(tasks, str) else list(tasks)
    ok, rew = np.zeros(len(env), bool), np.zeros(len(env))
    for text in set(texts):
        rows = np.array([i for i, t in enumerate(texts) if t == text])
        goals = _goals(task_of(text))
        if goals is None:
            raise ValueError(f"LIBERO task {task_of(text)!r} has no rule on observation-level state; train its world "
                             "model with --no-state-channel")
        inside, dist = [], []
        for obj, body, off, rot, size in goals:
            e = env[rows]
            R = quat_wxyz_to_mat(e[:, body, 3:])
            centre = e[:, body, :3] + R @ off
            half = np.abs((R @ rot) @ size)
            lo, hi = centre - half, centre + half
            lo[:, 2] -= 0.01
            p = e[:, obj, :3]
            inside.append(np.all((p > lo) & (p < hi), axis=1))
            dist.append(np.linalg.norm(p - centre, axis=1))
        ok[rows] = np.all(inside, axis=0)
        rew[rows] = np.where(ok[rows], 1.0, 0.9 * (1.0 - np.tanh(10.0 * np.mean(dist, axis=0))))
    return ok, rew
