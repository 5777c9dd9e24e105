"""Self-consistent checkpoints: a kill at every stage of a save leaves a checkpoint that resumes at one step, never
a mix; incomplete, changed or unverifiable checkpoints are refused with one line naming the file."""

import json
import os
import signal
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load_file

from wmrl.core.checkpoint import (commit_checkpoint, load_state, read_config, resume_checkpoint, save_pretrained,
                                  save_train_state, verify_checkpoint)

@dataclass
class Cfg:
    width: int = 3


def _write(home, step: int) -> None:
    net = torch.nn.Linear(3, 3)
    with torch.no_grad():
        net.weight.fill_(step)
        net.bias.fill_(step)
    opt = torch.optim.AdamW(net.parameters())
    commit_checkpoint(home, step, lambda d: (save_pretrained(net, Cfg(), d), save_train_state(d, step, {"net": opt})))


def _save(home, step: int, kill_at: int = 0) -> tuple[int, int]:
    """Save in a forked child that SIGKILLs itself at its `kill_at`-th file rename (each file of a save lands by
    one, and so do the checkpoint folder and the `last` switch): (exit signal or code, renames done)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no cleanup, no finally when killed, like a power cut
        os.close(r)
        calls = [0]

        def counted(fn):
            def wrapper(*a, **k):
                calls[0] += 1
                if calls[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                return fn(*a, **k)
            return wrapper

        os.replace, os.rename = counted(os.replace), counted(os.rename)
        try:
            _write(home, step)
            os.write(w, str(calls[0]).encode())
        finally:
            os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    out = os.read(r, 64)
    os.close(r)
    return (-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)), int(out or 0)


def test_a_kill_at_every_stage_of_a_save_never_mixes_steps(tmp_path):
    _write(tmp_path / "warm", 1)  # torch's lazy imports happen once, here, not in every child
    code, n_calls = _save(tmp_path / "probe", 1)
    assert code == 0
    assert n_calls >= 5  # each file of the save, the folder rename and the switch of `last`
    outcomes = set()
    for k in range(1, n_calls + 1):
        home = tmp_path / f"k{k}"
        assert _save(home, 1)[0] == 0
        assert _save(home, 2, kill_at=k)[0] == -signal.SIGKILL
        try:
            last, step = resume_checkpoint(home)
        except ValueError as e:
            assert "\n" not in str(e)
            outcomes.add("refused")
            continue
        weights = load_file(str(last / "model.safetensors"))
        assert torch.all(weights["weight"] == step) and torch.all(weights["bias"] == step)
        assert json.loads((last / "train_state.json").read_text())["step"] == step
        outcomes.add(step)
    assert outcomes <= {1, 2, "refused"} and 1 in outcomes  # a kill before the switch keeps the old step
    assert _save(tmp_path / "k1", 3)[0] == 0 and resume_checkpoint(tmp_path / "k1")[1] == 3  # and saving goes on


def test_incomplete_changed_or_unverifiable_checkpoints_are_refused(tmp_path):
    _write(tmp_path / "h", 1)
    _write(tmp_path / "h", 2)
    last, step = resume_checkpoint(tmp_path / "h")
    assert step == 2 and len(list((tmp_path / "h").glob("ckpt-*"))) == 2  # the newest two are kept
    (last / "train_state.json").unlink()
    with pytest.raises(ValueError, match=r"train_state.json: missing from the step-2 checkpoint"):
        resume_checkpoint(tmp_path / "h")
    _write(tmp_path / "h", 3)
    last, _ = resume_checkpoint(tmp_path / "h")
    # weights copied without the training state (e.g. back from a lent GPU) still load; resuming from them does not
    (last / "train_state.json").rename(tmp_path / "aside.json")
    assert verify_checkpoint(last, only=("model.safetensors",))["step"] == 3
    with pytest.raises(ValueError, match=r"train_state.json: missing from the step-3 checkpoint"):
        verify_checkpoint(last)
    (tmp_path / "aside.json").rename(last / "train_state.json")
    data = (last / "model.safetensors").read_bytes()
    (last / "model.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(ValueError, match="model.safetensors: changed since the step-3 checkpoint"):
        resume_checkpoint(tmp_path / "h")
    # a `last` folder without a manifest (an older layout, or written by hand) cannot be checked: refused
    legacy = tmp_path / "legacy"
    (legacy / "last").mkdir(parents=True)
    (legacy / "last" / "train_state.json").write_text('{"step": 4}')
    with pytest.raises(ValueError, match="no manifest.json"):
        resume_checkpoint(legacy)
    assert resume_checkpoint(tmp_path / "empty") == (None, 0)  # nothing committed yet: start from 0


def test_saving_the_same_step_again_never_leaves_last_without_a_checkpoint(tmp_path):
    _write(tmp_path / "h", 3)
    _write(tmp_path / "h", 3)  # e.g. a resumed run that was already at its last step saves once more
    last, step = resume_checkpoint(tmp_path / "h")
    assert step == 3 and last.resolve().name == "ckpt-000000003.1"
    _write(tmp_path / "h", 4)
    assert sorted(p.name for p in (tmp_path / "h").glob("ckpt-*")) == ["ckpt-000000003.1", "ckpt-000000004"]


def test_corrupt_model_files_give_one_line_naming_the_file(tmp_path):
    net = torch.nn.Linear(3, 3)
    save_pretrained(net, Cfg(), tmp_path / "m")
    data = (tmp_path / "m/model.safetensors").read_bytes()
    (tmp_path / "m/model.safetensors").write_bytes(data[:40])
    with pytest.raises(ValueError, match=r"m/model.safetensors: not a readable safetensors file") as e:
        load_state(net, tmp_path / "m")
    assert "\n" not in str(e.value)
    (tmp_path / "m/config.json").write_text("{broken")
    with pytest.raises(ValueError, match=r"m/config.json: not valid JSON"):
        read_config(tmp_path / "m", Cfg)
    (tmp_path / "m/config.json").write_text('{"width": 3, "depth": 2}')
    with pytest.raises(ValueError, match="config.json has fields \\['depth'\\]"):
        read_config(tmp_path / "m", Cfg)


def test_atomic_writes_get_ordinary_permissions(tmp_path):
    import stat

    from wmrl.core.io import write_json

    old = os.umask(0o022)
    try:
        write_json(tmp_path / "report.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "report.json").st_mode) == 0o644  # readable by others, like open() makes
