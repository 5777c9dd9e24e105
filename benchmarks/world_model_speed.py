"""Training throughput of the video world model, per phase, eager vs torch.compile (issue "World model v2", part 7).

`wmrl train-wm` has four phases with different costs: the autoencoder (frames sampled on the host), the state
channel (an ensemble unrolled `state_unroll` control steps: hundreds of tiny kernels), the denoiser on real context,
and the unrolled phase (a generated chunk, then the loss on it). At small batches a GPU is bound by kernel launches,
not arithmetic, so the same run is timed eager, with `--compile default` (fused kernels) and with
`--compile reduce-overhead` (CUDA graphs), plus eager at a 4x batch (samples/s, to show the launch bound).

Rates are steady-state: the median of steps/s over the run's logging intervals within each phase, the first interval
of a phase left out (compilation, the latents encoded at the autoencoder's end). Each run writes its `metrics.jsonl`
(wall time per logged step); `logs=DIR` summarises such logs again without training (e.g. logs brought back from a
lent device).

Work folder: runs/bench-world-model-speed/<device>/ (the dataset is reused).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from wmrl.benchutil import device_name, finish

WORK = Path(__file__).resolve().parent.parent / "runs" / "bench-world-model-speed"
PHASES = ("ae_loss", "state_loss", "dyn_loss", "unroll_loss")  # the loss each phase logs
STEPS = dict(ae_steps=300, state_steps=400, dyn_steps=500, unroll_steps=250)


def phase_rates(rows: list[dict], skip_first: int = 1) -> dict[str, float]:
    """Median steps/s per phase from a run's logged rows ({"time", "step", "<phase>_loss", ...}): each interval
    between two consecutive logs of the same phase is one sample; a phase's first `skip_first` intervals (warm-up,
    compilation) are left out."""
    rows = [r for r in rows if "step" in r and any(p in r for p in PHASES)]
    per: dict[str, list[float]] = {}
    for a, b in zip(rows, rows[1:]):
        pa, pb = (next(p for p in PHASES if p in r) for r in (a, b))
        if pa == pb and b["time"] > a["time"]:
            per.setdefault(pb, []).append((b["step"] - a["step"]) / (b["time"] - a["time"]))
    return {p.removesuffix("_loss"): float(np.median(v[skip_first:] or v)) for p, v in per.items()}


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def main(quick: bool = False, device: str = "cpu", size: str = "base", batch_size: int = 64,
         modes: str = "eager,default,reduce-overhead", big_batch: int = 256, logs: str | None = None) -> dict:
    """`modes`: comma-separated, each eager or a `--compile` mode. `big_batch`: one more eager run at this batch
    (0: none). `logs`: a folder of `<run>.jsonl` logs to summarise instead of training."""
    runs = [(m, batch_size) for m in modes.split(",") if m] + ([("eager", big_batch)] if big_batch else [])
    name = lambda mode, b: mode + ("" if b == batch_size else f"_b{b}")
    if logs is not None:
        log_dir = Path(logs)
    else:
        from wmrl.commands.collect import CollectConfig, collect
        from world_models.video.train import TrainWMConfig, train_world_model

        work = Path(tempfile.mkdtemp(prefix="wmrl-bench-wm-speed-")) if quick else WORK / device.split(":")[0]
        data, log_dir = work / "data", work / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        if not (data / "meta/info.json").exists():
            collect(CollectConfig(task="push-red", episodes=12 if quick else 300, out=data, overwrite=True,
                                  post_success_steps=3, failures=0.3, noise=0.05, perturbed=0.25,
                                  num_envs=max(2, min(14, (os.cpu_count() or 2) - 2))), progress=not quick)
        steps = {k: 3 for k in STEPS} if quick else STEPS
        for mode, b in runs:
            out = work / "runs" / name(mode, b)
            train_world_model(TrainWMConfig(data=data, out=out, size="tiny" if quick else size, device=device,
                                            batch_size=4 if quick else b, compile=None if mode == "eager" else mode,
                                            log_every=1 if quick else 25, ckpt_every=10**9, videos=0, overwrite=True,
                                            change_mask_steps=0, head_rollout_steps=0,  # not training phases: not timed
                                            **steps), progress=not quick)
            shutil.copy(out / "metrics.jsonl", log_dir / f"{name(mode, b)}.jsonl")
        import torch

        (log_dir / "device.json").write_text(json.dumps({"train_device": device_name(device),
                                                         "torch": torch.__version__}) + "\n")
    out: dict = {"device": device, "size": size, "batch_size": batch_size, "steps_per_phase": STEPS, "runs": {}}
    if (log_dir / "device.json").exists():  # where the logs were made (the summary may run elsewhere)
        out.update(json.loads((log_dir / "device.json").read_text()))
    for mode, b in runs:
        rates = phase_rates(read_rows(log_dir / f"{name(mode, b)}.jsonl"))
        out["runs"][name(mode, b)] = {"batch_size": b, "steps_per_s": rates,
                                      # the state phase draws a fixed 128 sequences per member, whatever the batch
                                      "samples_per_s": {p: r * b for p, r in rates.items() if p != "state"}}
    eager = out["runs"].get("eager", {}).get("steps_per_s", {})
    for key, r in out["runs"].items():
        if key != "eager" and eager and r["batch_size"] == batch_size:
            r["speedup_vs_eager"] = {p: v / eager[p] for p, v in r["steps_per_s"].items() if p in eager}
    # the bench's whole default budget (world_model.py: 1200 / 3000 / 2000 / 600 steps) at each run's phase rates
    from world_models.video.train import TrainWMConfig

    base = TrainWMConfig()
    budget = {"ae": base.ae_steps, "state": base.state_steps, "dyn": base.dyn_steps, "unroll": base.unroll_steps}
    for r in out["runs"].values():
        if set(budget) <= set(r["steps_per_s"]):
            secs = sum(n / r["steps_per_s"][p] for p, n in budget.items())
            r["default_budget_steps_per_s"] = sum(budget.values()) / secs
    tag = device.split(":")[0]
    return finish(f"world-model-speed-{tag}", out, quick,
                  command=f"wmrl bench world-model-speed --json --options device={device} size={size} batch_size={batch_size}"
                  + (f" logs={logs}" if logs else ""))
