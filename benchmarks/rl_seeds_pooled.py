"""RL recipes compared over their RL seeds, layout by layout: which world model makes RL in imagination gain most?

`wmrl bench rl-seeds-pooled --json --options recipes=NAME:A+B,NAME2:C+D name=TAG` where A, B, ... are the suffixes of
`benchmarks/results/imagination-estimated-state-<suffix>.json` (one file per RL seed of a recipe, e.g.
`ppo-lr0.0001-it60-wm-hand-ep1200-s0-g128x8-gate-hard`). Every file must hold the same start actor's outcomes on the
same layouts (`outcomes_start`; refused otherwise), so each layout's outcome after RL can be averaged over a
recipe's RL seeds and paired with the start and with every other recipe:

- per recipe: true success per RL seed, the pooled gain over the start (mean over layouts of the seeds' mean outcome
  minus the start's) with a 95% bootstrap interval over layouts;
- per pair of recipes: the difference of their pooled outcomes, same interval;
- the check of the measure, per recipe with two or more seeds: its first RL seed minus its second (what the RL seed
  alone moves; a recipe difference inside this spread is not a result).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from wmrl.benchutil import finish

RESULTS = Path(__file__).resolve().parent / "results"


def boot(d: np.ndarray, n_boot: int = 4000, seed: int = 0) -> dict:
    """Mean of d (points: 100 x a success share) and a 95% bootstrap interval over its entries (layouts)."""
    rng = np.random.default_rng(seed)
    b = d[rng.integers(0, len(d), (n_boot, len(d)))].mean(1)
    return {"mean": float(100 * d.mean()), "ci": [float(100 * np.quantile(b, q)) for q in (0.025, 0.975)]}


def pool(recipes: dict[str, list[dict]]) -> dict:
    """`recipes`: name -> the RL seeds' results, each with `outcomes_start` and `outcomes_rl` ("0"/"1" per layout)."""
    def bits(s: str) -> np.ndarray:
        return np.array([c == "1" for c in s], float)

    starts = {r["outcomes_start"] for runs in recipes.values() for r in runs}
    if len(starts) != 1:
        raise ValueError("the results do not share one start actor on the same layouts (their outcomes_start differ); "
                         "only runs from the same start and evaluation layouts can be pooled")
    start = bits(starts.pop())
    after = {k: np.stack([bits(r["outcomes_rl"]) for r in runs]) for k, runs in recipes.items()}
    if any(a.shape[1] != len(start) for a in after.values()):
        raise ValueError("outcomes_rl and outcomes_start cover different numbers of layouts")
    out = {"layouts": len(start), "success_start": float(100 * start.mean()), "recipes": {}, "differences": {}}
    for k, a in after.items():
        out["recipes"][k] = {"rl_seeds": len(a), "success_per_rl_seed": (100 * a.mean(1)).tolist(),
                             "pooled_gain": boot(a.mean(0) - start),
                             **({"rl_seed_difference": boot(a[0] - a[1])} if len(a) > 1 else {})}
    names = list(after)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            out["differences"][f"{y} minus {x}"] = boot(after[y].mean(0) - after[x].mean(0))
    return out


def main(quick: bool = False, recipes: str = "", name: str = "") -> dict:
    if quick:  # a hand-made pair of recipes on 6 layouts (the test checks the numbers)
        runs = {"a": [{"outcomes_start": "001100", "outcomes_rl": "101100"}, {"outcomes_start": "001100", "outcomes_rl": "111000"}],
                "b": [{"outcomes_start": "001100", "outcomes_rl": "111111"}]}
    else:
        if not recipes:
            raise ValueError("recipes=NAME:SUFFIX+SUFFIX,... is required (suffixes of imagination-estimated-state-*.json)")
        runs = {}
        for part in recipes.split(","):
            k, _, files = part.partition(":")
            if not files:
                raise ValueError(f"recipes: {part!r} is not NAME:SUFFIX+SUFFIX")
            runs[k] = []
            for s in files.split("+"):
                path = RESULTS / f"imagination-estimated-state-{s}.json"
                if not path.exists():
                    raise FileNotFoundError(f"recipes: {path.name} is not in benchmarks/results")
                runs[k].append(json.loads(path.read_text()))
    out = {**pool(runs), "recipes_files": recipes or None}
    tag = "rl-seeds-pooled" + (f"-{name}" if name else "")
    return finish(tag, out, quick, command=None if quick else
                  f"wmrl bench rl-seeds-pooled --json --options recipes={recipes}" + (f" name={name}" if name else ""))
