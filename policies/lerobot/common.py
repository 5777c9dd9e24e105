"""What LeRobot's ACT and Diffusion Policy checkpoints share, read without installing lerobot: the checkpoint's
files, its normalisation statistics, torchvision's ResNet under torchvision's parameter names, and the Policy
protocol around a network that works in LeRobot's normalised space.

A LeRobot checkpoint folder (`pretrained_model/`, or one downloaded from the Hub) holds

    config.json                     the policy config (draccus): "type", "input_features", "output_features",
                                    "normalization_mapping" and the architecture's fields
    model.safetensors               the weights, named as LeRobot's modules name them
    policy_preprocessor.json        (lerobot >= 0.4) the processor pipelines; the normaliser's and unnormaliser's
    policy_postprocessor.json       statistics lie in `<pipeline>_step_<i>_<registry name>.safetensors` files as
                                    "<feature>.<stat>" tensors
Older checkpoints keep the statistics inside the weights as buffers (`normalize_inputs.buffer_observation_state.mean`,
`unnormalize_outputs.buffer_action.std`, ...); both layouts are read. Statistics are never unpickled: JSON and
safetensors only.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from wmrl.core.features import ACTION, OBS_ENV_STATE, OBS_STATE, check_spaces, is_image_key

NORM_MODES = ("IDENTITY", "MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10")
_MODE_STATS = {"MEAN_STD": ("mean", "std"), "MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"),
               "QUANTILE10": ("q10", "q90")}
LEGACY_PREFIXES = ("normalize_inputs.", "normalize_targets.", "unnormalize_outputs.")
EPS = 1e-8  # LeRobot's NormalizerProcessorStep default


# ----------------------------------------------------------------------------------------------- checkpoint files
def read_lerobot_checkpoint(path: str | Path, policy_type: str) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """(config, weights without normalisation buffers, stats {feature: {stat: tensor}}) of a LeRobot checkpoint
    folder. Refuses a folder that is not one, or whose config names another policy type, with the reason."""
    from safetensors.torch import load_file

    p = Path(path)
    missing = [f for f in ("config.json", "model.safetensors") if not (p / f).is_file()]
    if missing:
        raise ValueError(f"{p}: not a LeRobot checkpoint folder (missing {', '.join(missing)}); pass the folder that "
                         "holds config.json and model.safetensors (a training run's checkpoints/<step>/pretrained_model)")
    try:
        config = json.loads((p / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p / 'config.json'}: not valid JSON ({e})") from None
    if config.get("type") not in (None, policy_type):
        raise ValueError(f"{p}: config.json describes a {config.get('type')!r} policy, not {policy_type!r}; "
                         f"use --policy.type {config.get('type')}")
    for key in ("input_features", "output_features"):
        if not isinstance(config.get(key), dict) or not config[key]:
            raise ValueError(f"{p / 'config.json'}: {key!r} is missing or empty")
    try:
        weights = load_file(str(p / "model.safetensors"))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for corrupt files
        raise ValueError(f"{p / 'model.safetensors'}: not a readable safetensors file ({e})") from None
    stats = _legacy_stats(weights, feature_keys(config))
    weights = {k: v for k, v in weights.items() if not k.startswith(LEGACY_PREFIXES)}
    for pipeline in ("policy_preprocessor", "policy_postprocessor"):
        for feature, s in _processor_stats(p, pipeline).items():
            stats.setdefault(feature, {}).update(s)
    return config, weights, stats


def lerobot_policy_type(path: str | Path) -> str | None:
    """The policy type a LeRobot checkpoint folder names in its config.json ("act", "diffusion", ...), or None
    when `path` is not one (e.g. one of our own run folders)."""
    f = Path(path) / "config.json"
    if not (f.is_file() and (Path(path) / "model.safetensors").is_file()):
        return None
    try:
        cfg = json.loads(f.read_text())
    except json.JSONDecodeError:
        return None
    return cfg.get("type") if isinstance(cfg, dict) and "input_features" in cfg else None


def feature_keys(config: dict) -> list[str]:
    return [*config["input_features"], *config["output_features"]]


def _legacy_stats(weights: dict[str, torch.Tensor], features: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """Statistics kept as buffers in older checkpoints. The buffer name replaces the feature's dots with
    underscores (`buffer_observation_images_front`), so it is matched against the config's feature names."""
    by_flat = {f.replace(".", "_"): f for f in features}
    out: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in weights.items():
        if not k.startswith(LEGACY_PREFIXES):
            continue
        rest = k.split(".", 1)[1].removeprefix("buffer_")
        flat, stat = rest.rsplit(".", 1)
        if flat in by_flat:
            out.setdefault(by_flat[flat], {})[stat] = v.float()
    return out


def _processor_stats(p: Path, pipeline: str) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    cfg_file = p / f"{pipeline}.json"
    if not cfg_file.is_file():
        return {}
    out: dict[str, dict[str, torch.Tensor]] = {}
    for step in json.loads(cfg_file.read_text()).get("steps", []):
        name = step.get("state_file")
        if step.get("registry_name") not in ("normalizer_processor", "unnormalizer_processor") or not name:
            continue
        f = (p / name).resolve()
        if f.parent != p.resolve():  # a state file may not point outside the checkpoint folder
            raise ValueError(f"{cfg_file}: state_file {name!r} leaves the checkpoint folder")
        for k, v in load_file(str(f)).items():
            feature, stat = k.rsplit(".", 1)
            out.setdefault(feature, {})[stat] = v.float()
    return out


def write_lerobot_checkpoint(path: str | Path, config: dict, weights: dict[str, torch.Tensor], stats: dict,
                             legacy: bool = False) -> Path:
    """Write a checkpoint in LeRobot's file layout: the statistics as processor files (lerobot >= 0.4) or, with
    `legacy`, as normalisation buffers inside the weights (older releases). Used to export and in the tests."""
    from safetensors.torch import save_file

    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
    flat = {f"{f}.{s}": torch.as_tensor(t, dtype=torch.float32).clone() for f, st in stats.items() for s, t in st.items()}
    norm_map = config.get("normalization_mapping", {})
    if legacy:
        inputs = {k for k in config["input_features"]}
        for k, v in flat.items():
            feature, stat = k.rsplit(".", 1)
            prefixes = ("normalize_inputs.",) if feature in inputs else ("normalize_targets.", "unnormalize_outputs.")
            for pre in prefixes:
                weights[f"{pre}buffer_{feature.replace('.', '_')}.{stat}"] = v.clone()
    else:
        features = {**config["input_features"], **config["output_features"]}
        step_cfg = {"eps": EPS, "features": features, "norm_map": norm_map}
        for pipeline, registry, index in (("policy_preprocessor", "normalizer_processor", 3),
                                          ("policy_postprocessor", "unnormalizer_processor", 0)):
            state_file = f"{pipeline}_step_{index}_{registry}.safetensors"
            steps = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
                     {"registry_name": "to_batch_processor", "config": {}},
                     {"registry_name": "device_processor", "config": {"device": "cpu"}}] if index == 3 else []
            steps.append({"registry_name": registry, "config": step_cfg, "state_file": state_file})
            if index == 0:
                steps.append({"registry_name": "device_processor", "config": {"device": "cpu"}})
            (p / f"{pipeline}.json").write_text(json.dumps({"name": pipeline, "steps": steps}, indent=2))
            save_file(flat, str(p / state_file))
    save_file(weights, str(p / "model.safetensors"))
    (p / "config.json").write_text(json.dumps(config, indent=2))
    return p


# ------------------------------------------------------------------------------------------------- normalisation
class Normalizer(nn.Module):
    """LeRobot's normaliser and unnormaliser for a set of features: the mode per feature type from
    `normalization_mapping`, the statistics per feature. Features without statistics pass unchanged (as in
    LeRobot); a mode whose statistics are missing is refused at load time, not silently skipped."""

    def __init__(self, features: dict, norm_map: dict, stats: dict):
        super().__init__()
        self.modes: dict[str, str] = {}
        for key, ft in features.items():
            mode = norm_map.get(ft["type"], "IDENTITY")
            if mode not in NORM_MODES:
                raise ValueError(f"normalization_mapping: unknown mode {mode!r} for {ft['type']} (one of {NORM_MODES})")
            if mode == "IDENTITY" or key not in stats:
                continue
            need = _MODE_STATS[mode]
            if any(s not in stats[key] for s in need):
                raise ValueError(f"{key}: {mode} normalisation needs the statistics {need}; the checkpoint has "
                                 f"{sorted(stats[key])}")
            self.modes[key] = mode
            lo, hi = (stats[key][s].float() for s in need)
            shape = tuple(ft["shape"])
            if len(shape) == 3:  # images (C, H, W): per-channel statistics
                lo, hi = lo.reshape(-1, 1, 1), hi.reshape(-1, 1, 1)
            self.register_buffer(f"{key.replace('.', '_')}_a", lo)
            self.register_buffer(f"{key.replace('.', '_')}_b", hi)

    def _ab(self, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        return getattr(self, f"{key.replace('.', '_')}_a"), getattr(self, f"{key.replace('.', '_')}_b")

    def normalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        mode = self.modes.get(key)
        if mode is None:
            return x
        a, b = self._ab(key)
        if mode == "MEAN_STD":
            return (x - a) / (b + EPS)
        span = torch.where(b - a == 0, torch.full_like(b, EPS), b - a)
        return 2 * (x - a) / span - 1

    def unnormalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        mode = self.modes.get(key)
        if mode is None:
            return x
        a, b = self._ab(key)
        if mode == "MEAN_STD":
            return x * b + a
        span = torch.where(b - a == 0, torch.full_like(b, EPS), b - a)
        return (x + 1) / 2 * span + a


# -------------------------------------------------------------------------------------------------------- ResNet
class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = norm(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = norm(width)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False), norm(width))
                           if stride != 1 or cin != width else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int, norm):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), norm(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), norm(width)  # stride here (v1.5)
        self.conv3, self.bn3 = nn.Conv2d(width, width * 4, 1, bias=False), norm(width * 4)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, width * 4, 1, stride, bias=False), norm(width * 4))
                           if stride != 1 or cin != width * 4 else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


RESNETS = {"resnet18": (_BasicBlock, (2, 2, 2, 2)), "resnet34": (_BasicBlock, (3, 4, 6, 3)),
           "resnet50": (_Bottleneck, (3, 4, 6, 3))}


class FrozenBatchNorm2d(nn.Module):
    """torchvision.ops.FrozenBatchNorm2d (ACT's backbone norm): fixed affine statistics, no num_batches_tracked."""

    def __init__(self, n: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        for name, init in (("weight", torch.ones), ("bias", torch.zeros), ("running_mean", torch.zeros), ("running_var", torch.ones)):
            self.register_buffer(name, init(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        return x * scale.reshape(1, -1, 1, 1) + (self.bias - self.running_mean * scale).reshape(1, -1, 1, 1)


class ResNetTrunk(nn.Module):
    """torchvision's ResNet up to layer4 (no pooling, no fc), with torchvision's parameter names
    (conv1, bn1, layer1.0.conv1, ..., layer4.1.downsample.0). `norm(n)` builds each normalisation layer."""

    def __init__(self, name: str, norm=nn.BatchNorm2d):
        super().__init__()
        if name not in RESNETS:
            raise ValueError(f"vision_backbone {name!r} is not supported here (one of {sorted(RESNETS)})")
        block, depths = RESNETS[name]
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = norm(64)
        cin = 64
        for i, (width, n) in enumerate(zip((64, 128, 256, 512), depths)):
            blocks = []
            for j in range(n):
                blocks.append(block(cin, width, (1 if i == 0 else 2) if j == 0 else 1, norm))
                cin = width * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.out_channels = cin

    def children_in_order(self) -> list[nn.Module]:
        """conv1, bn1, relu, maxpool, layer1..layer4: `list(resnet.children())[:-2]`, as an nn.Sequential sees it."""
        return [self.conv1, self.bn1, nn.ReLU(), nn.MaxPool2d(3, 2, 1), self.layer1, self.layer2, self.layer3, self.layer4]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))


# --------------------------------------------------------------------------------------------- the policy shell
class LeRobotPolicy(nn.Module):
    """The Policy protocol (`wmrl.core.protocols.Policy`) around a LeRobot network: observations from our envs
    (uint8 (B, H, W, 3) images, float states, LeRobot feature names) become LeRobot's normalised batch (float
    (B, 3, H, W) in [0, 1], then the checkpoint's normaliser); the network's normalised action chunk is
    unnormalised; `select_action` pops a queue of `n_action_steps` actions refilled from `predict_action_chunk`,
    as LeRobot's policies do. Subclasses build `self.net`-style modules under LeRobot's attribute names and
    implement `_chunk(batch) -> (B, H, A)` and `_loss(batch) -> (loss, info)` in normalised space."""

    policy_type = ""

    def __init__(self, config: dict, stats: dict):
        super().__init__()
        self.config = config
        self.image_keys = [k for k, f in config["input_features"].items() if f["type"] == "VISUAL"]
        self.state_key = OBS_STATE if OBS_STATE in config["input_features"] else None
        self.env_key = OBS_ENV_STATE if OBS_ENV_STATE in config["input_features"] else None
        if ACTION not in config["output_features"]:
            raise ValueError(f"config.json: output_features has no {ACTION!r}")
        self.action_dim = int(config["output_features"][ACTION]["shape"][0])
        norm_map = config.get("normalization_mapping", {})
        self.normalizer = Normalizer({**config["input_features"], **config["output_features"]}, norm_map, stats)
        self._queue: deque = deque()
        self.generator: torch.Generator | None = None  # sampling noise (stochastic policies)

    # ---- the protocol
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def reset(self) -> None:
        self._queue.clear()

    @torch.no_grad()
    def predict_action_chunk(self, obs: dict) -> torch.Tensor:
        self.eval()
        return self.normalizer.unnormalize(ACTION, self._chunk(self.batch(obs)))

    @torch.no_grad()
    def select_action(self, obs: dict) -> torch.Tensor:
        if not self._queue:
            self._queue.extend(self.predict_action_chunk(obs)[:, : self.cfg.n_action_steps].transpose(0, 1))
        return self._queue.popleft()

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """LeRobot's training loss on a batch: observations at t, `action` (B, H, A) and optionally `action_mask`
        (B, H) of real (not padded) steps (LeRobot's `action_is_pad` inverted)."""
        b = self.batch(batch)
        a = torch.as_tensor(np.asarray(batch[ACTION]), dtype=torch.float32, device=self.device)
        if a.ndim != 3 or a.shape[-1] != self.action_dim:
            raise ValueError(f"{ACTION}: expected (B, H, {self.action_dim}), got {tuple(a.shape)}")
        b[ACTION] = self.normalizer.normalize(ACTION, a)
        mask = batch.get("action_mask")
        b["action_is_pad"] = (torch.zeros(a.shape[:2], dtype=torch.bool, device=self.device) if mask is None
                              else ~torch.as_tensor(np.asarray(mask), dtype=torch.bool, device=self.device))
        return self._loss(b)

    # ---- observations in, LeRobot's batch out
    def check_spaces(self, observation_space, action_space) -> None:
        """Refuse, at start, an environment whose spaces this checkpoint cannot drive; both specs are printed."""
        want = {}
        for k in self.image_keys:
            c, h, w = self.config["input_features"][k]["shape"]
            want[k] = (h, w, c)
        for k in (self.state_key, self.env_key):
            if k is not None:
                want[k] = tuple(self.config["input_features"][k]["shape"])
        check_spaces(want, self.action_dim, observation_space, action_space, f"LeRobot {self.policy_type} checkpoint",
                     "checkpoint")

    def batch(self, obs: dict) -> dict[str, torch.Tensor]:
        """One step's observations (B, ...) -> LeRobot's normalised batch."""
        out = {}
        for k in self.image_keys:
            if k not in obs:
                raise ValueError(f"the checkpoint needs {k!r}; the observation has {sorted(x for x in obs if is_image_key(x))}")
            x = torch.as_tensor(np.asarray(obs[k]), device=self.device)
            c, h, w = self.config["input_features"][k]["shape"]
            if x.ndim != 4 or tuple(x.shape[1:]) != (h, w, c):
                raise ValueError(f"{k}: expected (B, {h}, {w}, {c}) images, got {tuple(x.shape)}")
            # LeRobot's networks see float images in [0, 1]; our envs give uint8
            x = x.permute(0, 3, 1, 2).float() / (255.0 if x.dtype == torch.uint8 else 1.0)
            out[k] = self.normalizer.normalize(k, x)
        for k in (self.state_key, self.env_key):
            if k is None:
                continue
            if k not in obs:
                raise ValueError(f"the checkpoint needs {k!r} in the observation")
            x = torch.as_tensor(np.asarray(obs[k]), dtype=torch.float32, device=self.device)
            d = tuple(self.config["input_features"][k]["shape"])
            if x.ndim != 2 or tuple(x.shape[1:]) != d:
                raise ValueError(f"{k}: expected (B, {d[0]}), got {tuple(x.shape)}")
            if not torch.isfinite(x).all():
                raise ValueError(f"{k}: contains NaN or inf")
            out[k] = self.normalizer.normalize(k, x)
        return out

    def _chunk(self, batch: dict) -> torch.Tensor:
        raise NotImplementedError

    def _loss(self, batch: dict) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    # ---- loading
    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", seed: int | None = None):
        """The policy from a LeRobot checkpoint folder; `seed` fixes the sampling noise of stochastic policies
        (Diffusion) so that two instances act the same."""
        config, weights, stats = read_lerobot_checkpoint(path, cls.policy_type)
        policy = cls(config, stats)
        policy.load_lerobot_weights(weights, Path(path))
        policy = policy.to(device).eval()
        if seed is not None:
            policy.generator = torch.Generator(device=device).manual_seed(seed)
        return policy

    def load_lerobot_weights(self, weights: dict[str, torch.Tensor], path: Path) -> None:
        """Strict load: every tensor the checkpoint has must find its module, and every module its tensor; the
        differing names are listed (a checkpoint from another architecture or lerobot version)."""
        own = {k for k in self.state_dict() if not k.startswith("normalizer.")}
        missing, unexpected = sorted(own - set(weights)), sorted(set(weights) - own)
        if missing or unexpected:
            raise ValueError(f"{path}: the weights do not fit the {self.policy_type} network that config.json "
                             f"describes.\n  missing: {missing[:8]}{' ...' if len(missing) > 8 else ''}\n  "
                             f"unexpected: {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
        shapes = {k: v.shape for k, v in self.state_dict().items()}
        wrong = [f"{k}: {tuple(v.shape)} vs {tuple(shapes[k])}" for k, v in weights.items() if v.shape != shapes[k]]
        if wrong:
            raise ValueError(f"{path}: tensor shapes differ from the config's network: {wrong[:5]}")
        self.load_state_dict(weights, strict=False)
