"""World models by registered kind (`--world-model-kind video`), loaded from a run or checkpoint folder."""

from __future__ import annotations

from wmrl.core.checkpoint import resolve_checkpoint
from wmrl.core.registry import WORLD_MODELS
from world_models.video.model import VideoWorldModel


@WORLD_MODELS.register("video")
def _video_world_model(path: str, device: str = "cpu", state_gate: str | None = None,
                       state_settle: bool | None = None, object_layer: str | None = None, **_):
    """A trained video world model from a `wmrl train-wm` run folder or checkpoint folder; `state_gate`,
    `state_settle` and `object_layer` override how its state channel's rollouts apply the contact gate
    (`state_channel.GATES`), whether objects the hand does not hold rest at their starting height
    (`state_channel.settle`) and how its fixed cameras' frames show the objects (`model.OBJECT_LAYERS`)."""
    return VideoWorldModel.load(resolve_checkpoint(path), device=device, state_gate=state_gate, state_settle=state_settle,
                                object_layer=object_layer)


def make_world_model(kind: str, path: str, **kwargs):
    return WORLD_MODELS.get(kind)(path, **kwargs)
