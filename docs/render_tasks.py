"""Renders docs/tasks.png: the front and wrist cameras (64x64, as policies see them) of every task family, at the
start and at the end of a scripted-expert episode.  Run: python docs/render_tasks.py"""

from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import numpy as np

from sim.tabletop.env import TabletopEnv
from sim.experts import ScriptedExpert
from sim.tabletop.tasks import FAMILIES
from wmrl.eval import evaluate


def main() -> None:
    rows = []
    for i, family in enumerate(FAMILIES):
        env = TabletopEnv(f"{family}-{['red', 'green', 'blue', 'red'][i]}")
        ep = evaluate(ScriptedExpert(), env, 1, seed=3 + i, record=True, progress=False).episodes[0]
        tiles = [ep[k][t] for t in (0, -1) for k in ("observation.images.front", "observation.images.wrist")]
        row = np.concatenate([np.pad(t, ((2, 2), (2, 2), (0, 0)), constant_values=255) for t in tiles], axis=1)
        rows.append(row)
        print(f"{family}: {ep['task'][0]!r}")
    img = np.concatenate(rows, axis=0).repeat(3, 0).repeat(3, 1)
    out = Path(__file__).resolve().parent / "tasks.png"
    iio.imwrite(out, img)
    print(out)


if __name__ == "__main__":
    main()
