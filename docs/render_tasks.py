"""Renders docs/tasks.png: the front and wrist cameras (64x64, as policies see them) of every task family, at the
start and at the end of a scripted-expert episode.  Run: python docs/render_tasks.py
`python docs/render_tasks.py metaworld` renders docs/metaworld_tasks.png the same way for six Meta-World tasks,
`python docs/render_tasks.py so101` docs/so101_tasks.png for the SO-101 cell's reach tasks,
`python docs/render_tasks.py libero` docs/libero_tasks.png for four LIBERO basket tasks (official initial state 0)."""

from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import numpy as np

from sim.tabletop.env import TabletopEnv
from sim.experts import ScriptedExpert
from sim.tabletop.tasks import FAMILIES
from wmrl.eval import evaluate


METAWORLD = ("reach", "push", "pick-place", "drawer-open", "button-press-topdown", "door-open")


def main(suite: str = "tabletop") -> None:
    import sim

    names = {"tabletop": [f"{f}-{['red', 'green', 'blue', 'red'][i]}" for i, f in enumerate(FAMILIES)],
             "metaworld": [f"metaworld-{t}" for t in METAWORLD],
             "so101": [f"so101-reach-{c}" for c in ("red", "green", "blue")],
             "libero": ["libero-object-0", "libero-object-3", "libero-object-7", "libero-10-0"]}[suite]
    rows = []
    for i, name in enumerate(names):
        env = TabletopEnv(name) if suite == "tabletop" else sim.make_env(name).unwrapped
        seed = 0 if suite == "libero" else 3 + i  # LIBERO: a seed is an official initial state
        ep = evaluate(ScriptedExpert(), env, 1, seed=seed, record=True, progress=False).episodes[0]
        env.close()
        tiles = [ep[k][t] for t in (0, -1) for k in ("observation.images.front", "observation.images.wrist")]
        row = np.concatenate([np.pad(t, ((2, 2), (2, 2), (0, 0)), constant_values=255) for t in tiles], axis=1)
        rows.append(row)
        print(f"{name}: {ep['task'][0]!r}, success {bool(np.any(ep['next.success']))}")
    img = np.concatenate(rows, axis=0).repeat(3, 0).repeat(3, 1)
    out = Path(__file__).resolve().parent / ("tasks.png" if suite == "tabletop" else f"{suite}_tasks.png")
    iio.imwrite(out, img)
    print(out)


if __name__ == "__main__":
    import sys

    main(*sys.argv[1:2])
