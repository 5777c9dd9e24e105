"""RL in imagination, evaluation without physical rollouts and co-evolution, measured against the true simulator.

Runs `wmrl demo` at its default size (work folder runs/bench-imagination/demo, reused with --resume), then:
- true-simulator success of the BC policy and of the same policy after GRPO in imagination, over several evaluation
  seeds (independent batches of episodes), with a 95% Wilson interval over all episodes;
- the true-simulator steps taken during RL (counted, expected 0);
- the ranking agreement of the policy population (world model vs true simulator) and the hallucinated-success
  rate before and after the co-evolution round (from the demo);
- Ctrl-World's fine-tuning on imagined successes, applied to the BC policy: its true-simulator success after;
- the wall-clock time of every stage.

`task`: another task for the same loop, e.g. `metaworld-push` (Meta-World's push, with the world model's state
channel on its 39-entry state): work folder runs/bench-imagination/<task>, result `imagination-<task>.json`.
`episodes`: true-simulator episodes per evaluation seed (3 seeds).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path


from wmrl.benchutil import finish

WORK = Path(__file__).resolve().parent.parent / "runs" / "bench-imagination"


def _success(policy, task: str, episodes: int, seeds: list[int]) -> dict:
    import sim
    from wmrl.eval import evaluate
    from wmrl.eval.loop import wilson_interval

    per_seed, n_succ = [], 0
    for s in seeds:
        env = sim.make_vector_env(task, 2)
        try:
            r = evaluate(policy, env, episodes, seed=s, progress=False)
        finally:
            env.close()
        per_seed.append(r.pc_success / 100)
        n_succ += sum(e["success"] for e in r.per_episode)
    lo, hi = wilson_interval(n_succ, episodes * len(seeds))
    return {"mean": n_succ / (episodes * len(seeds)), "ci95": [lo, hi], "per_seed": per_seed}


def main(quick: bool = False, work: str = "", task: str = "push-red", episodes: int = 100) -> dict:
    """`work`: the folder holding (or to hold) the demo run `work/demo`; an existing one is resumed."""
    from policies.vla import VLAPolicy
    from wmrl.commands.demo import DemoConfig, run_demo
    from wmrl.core.checkpoint import resolve_checkpoint
    from wmrl.rl.coevolve import imagined_success_sft
    from world_models.video.model import VideoWorldModel

    given = bool(work)
    work = Path(work) if work else Path(tempfile.mkdtemp(prefix="wmrl-bench-imag-")) if quick else WORK
    default = task == "push-red"
    run = work / ("demo" if default else task)
    resume = (run / "config.yaml").exists()
    s = run_demo(DemoConfig(task=task, out=run, quick=quick, resume=resume, overwrite=False), progress=not quick)
    episodes = 2 if quick else int(episodes)
    seeds = [500_000, 600_000, 700_000]
    bc = VLAPolicy.load(resolve_checkpoint(run / "policy_bc")).eval()
    rl = VLAPolicy.load(resolve_checkpoint(run / "policy_rl")).eval()
    out: dict = {"task": task, "episodes_per_seed": episodes, "eval_seeds": len(seeds), "training_seeds": 1}
    for name, pol in (("bc", bc), ("rl", rl)):
        r = _success(pol, task, episodes, seeds)
        out[f"success_{name}"], out[f"success_{name}_ci95"], out[f"success_{name}_per_seed"] = r["mean"], r["ci95"], r["per_seed"]
    out["success_gain_points"] = 100 * (out["success_rl"] - out["success_bc"])
    out["true_env_steps_during_rl"] = s["true_env_steps_during_rl"]
    for k in ("rank_spearman", "rank_kendall", "success_abs_error", "n_policies", "hallucinated_success_before",
              "hallucinated_success_after", "hallucination_imagined_successes"):
        out[k] = s[k]
    for k in ("rank_spearman_ci", "rank_spearman_with_anchors", "rank_mmrv", "rank_mmrv_noise_ceiling", "rank_noise_ceiling",
              "episodes_per_policy"):
        if k in s:  # the paired protocol's statistics (with >= 2 learned policies in the population)
            out[k] = s[k]
    # Ctrl-World: fine-tune BC on the world model's imagined successes (the co-evolved world model)
    wm = VideoWorldModel.load(resolve_checkpoint(run / "coevolution" / "world_model"))
    sft = imagined_success_sft(bc, wm, task, n=8 if quick else 64, steps=20 if quick else 300, progress=not quick)
    out["imagined_sft"] = {k: v for k, v in sft.items() if isinstance(v, (int, float))}
    r = _success(bc.eval(), task, episodes, seeds) if sft["steps"] else {"mean": out["success_bc"]}
    out["success_after_imagined_sft"] = r["mean"]
    out["demo_minutes"] = sum(s["stage_minutes"].values())  # cached stages keep their original times
    out["stage_minutes"] = s["stage_minutes"]
    out["population"] = json.loads((run / "ranking" / "ranking.json").read_text())["policies"]
    out["report"] = str((run / "report.html").resolve()) if not quick else ""  # `finish` makes it repository-relative
    out["dataset_frames"] = s["dataset_frames"]
    for k in ("wm_motion_psnr_gain_h16", "wm_masked_psnr_gain_h16", "wm_success_auroc_matched_state",
              "wm_success_auroc_matched_frames"):
        out[k] = s.get(k)
    if default:  # a demo run elsewhere (`work`, e.g. a copy of one made with today's code) is named in the command
        return finish("imagination", out, quick, command="wmrl bench imagination --json" + (f" --options work={work}" if given else ""))
    return finish(f"imagination-{task}", out, quick,
                  command=f"wmrl bench imagination --json --options task={task} episodes={episodes}" + (f" work={work}" if given else ""))
