"""Offline RL, one loop: model-based RAVL, MOPO, MBPO on the MBPO pipeline; model-free SAC-N, TD3+BC and IQL.

Sims, Lu, Foerster, Teh 2024, "The Edge-of-Reach Problem in Offline Model-Based RL" (RAVL); Yu et al. 2020 (MOPO);
Janner et al. 2019 (MBPO); An et al. 2021 (SAC-N/EDAC).

Every epoch: k-step rollouts of the current policy from `rollout_batch` dataset states, in the learned ensemble or
in the true dynamics, go into a FIFO model buffer (the common replay, tagged `source=world_model`); then
`updates_per_epoch` SAC updates on batches with a share `real_ratio` of dataset transitions.

| algo  | critics        | reward                       | what keeps it from exploiting edge-of-reach states |
|-------|----------------|------------------------------|----------------------------------------------------|
| mbpo  | 2              | r                            | nothing                                             |
| mopo  | 2              | r - lambda max_i |sigma_i|   | the uncertainty penalty (zero under true dynamics) |
| ravl  | N=10, eta=1    | r                            | min over a diversified Q-ensemble                  |
| sac-n | N=10, eta=0    | (no model data)              | min over N critics, dataset only                   |
| edac  | N=10, eta=1    | (no model data)              | RAVL's critics on the dataset alone (An et al.)     |
| td3bc, iql | their own | (no model data)              | behaviour regularisation / in-sample learning      |

`wmrl offline --algo ravl --data DIR --out RUN [--dynamics learned|true]`. Runs write `metrics.jsonl` (return,
mean Q on dataset transitions), checkpoints every evaluation and resume with `--resume`, also with a larger
`--epochs`: the checkpoint holds the agent, its optimisers, the model buffer of past rollouts and every RNG, so a
resumed run continues exactly as one never stopped (tested), and paper-scale runs can span several sittings.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from sim.locomotion import termination_fn
from wmrl.core.checkpoint import (commit_checkpoint, load_state, load_train_state, read_config, resume_checkpoint,
                                  save_pretrained, save_train_state)
from wmrl.core.features import ACTION, IS_LAST, OBS_STATE, REWARD, SOURCE, TERMINATED, TRUNCATED
from wmrl.core.io import write_json
from wmrl.core.run import Tracker, read_metrics, start_run
from wmrl.replay import EpisodeReplay, MixedReplay
from wmrl.replay.weighting import apply_weighting
from wmrl.rl.agents import load_agent, make_agent, save_agent
from wmrl.rl.sac import batch_tensors
from world_models.dynamics import EnsembleConfig, GaussianEnsemble, TrueDynamics, fit_ensemble


@dataclass(frozen=True)
class Preset:
    """What sets one member of the family apart (the table above); `OfflineConfig` fields override the numbers."""

    num_critics: int
    eta: float  # EDAC's ensemble-diversity weight
    penalty: float  # MOPO's lambda on the ensemble's uncertainty
    model_data: bool  # train on rollouts in a dynamics model besides the dataset
    agent: str = "sac"  # the registered agent (`wmrl.rl.agents`)


MBPO = Preset(num_critics=2, eta=0.0, penalty=0.0, model_data=True)
MOPO = Preset(num_critics=2, eta=0.0, penalty=0.5, model_data=True)
RAVL = Preset(num_critics=10, eta=1.0, penalty=0.0, model_data=True)
SAC_N = Preset(num_critics=10, eta=0.0, penalty=0.0, model_data=False)
EDAC = Preset(num_critics=10, eta=1.0, penalty=0.0, model_data=False)  # RAVL without the model: what rollouts add
TD3BC = Preset(num_critics=2, eta=0.0, penalty=0.0, model_data=False, agent="td3bc")
IQL = Preset(num_critics=2, eta=0.0, penalty=0.0, model_data=False, agent="iql")
PRESETS = {"mbpo": MBPO, "mopo": MOPO, "ravl": RAVL, "sac-n": SAC_N, "edac": EDAC, "td3bc": TD3BC, "iql": IQL}


@dataclass
class OfflineConfig:
    data: Path = Path("data/halfcheetah-medium")
    out: Path = Path("runs/offline")
    algo: str = "ravl"
    """mbpo | mopo | ravl | sac-n | edac | td3bc | iql (presets above; the fields below override them)"""
    env: str = ""
    """the environment to evaluate in; default: the dataset's `wmrl.env` entry"""
    dynamics: str = "learned"
    """learned (bootstrapped Gaussian ensemble) | true (restore qpos/qvel and step MuJoCo)"""
    epochs: int = 100
    updates_per_epoch: int = 1000
    rollout_batch: int = 5000  # start states per epoch (paper: 50,000; CPU budget)
    rollout_length: int = 5  # k
    real_ratio: float = 0.05  # r
    retain_epochs: int = 5  # model buffer holds this many epochs of rollouts (FIFO)
    num_critics: int | None = None
    eta: float | None = None
    penalty: float | None = None  # MOPO's lambda
    hidden: int = 256
    layers: int = 3
    batch_size: int = 256
    ensemble_members: int = 7
    ensemble_elites: int = 5
    ensemble_hidden: int = 200
    ensemble_max_epochs: int = 200
    dynamics_dir: Path | None = None
    """where the learned ensemble is saved and, when present, reused (default: RUN/dynamics); share it between runs
    on the same data and seed"""
    weighting: str = "none"
    """trajectory weighting of the dataset: none | return | advantage (Hong et al. 2023)"""
    weighting_alpha: float = 0.1
    eval_every: int = 5  # epochs
    eval_episodes: int = 5
    seed: int = 0
    resume: bool = False
    overwrite: bool = False
    progress: bool = True


def resolve_algo(cfg: OfflineConfig) -> Preset:
    """The algorithm's preset with the config's overrides applied (bad names and ranges refused)."""
    if cfg.algo not in PRESETS:
        raise ValueError(f"algo: expected one of {', '.join(PRESETS)}, got {cfg.algo!r}")
    if cfg.dynamics not in ("learned", "true"):
        raise ValueError(f"dynamics: expected learned or true, got {cfg.dynamics!r}")
    if not 0.0 <= cfg.real_ratio <= 1.0:
        raise ValueError(f"real_ratio must be in [0, 1], got {cfg.real_ratio}")
    p = PRESETS[cfg.algo]
    return dataclasses.replace(p, num_critics=cfg.num_critics if cfg.num_critics is not None else p.num_critics,
                               eta=cfg.eta if cfg.eta is not None else p.eta,
                               penalty=cfg.penalty if cfg.penalty is not None else p.penalty)


def dataset_env(data: Path) -> str:
    meta = Path(data) / "meta" / "wmrl.json"
    return json.loads(meta.read_text()).get("env", "") if meta.exists() else ""


def load_offline_data(data: Path, seed: int = 0):
    """The dataset as the common replay (`replay.transitions()` gives its D4RL-style arrays)."""
    replay = EpisodeReplay.from_lerobot(data, seed=seed)
    if OBS_STATE not in replay.data or ACTION not in replay.data:
        raise ValueError(f"{data}: needs {OBS_STATE} and {ACTION}; has {sorted(replay.data)}")
    return replay


def make_dynamics(cfg: OfflineConfig, env_id: str, real, run: Path):
    """The learned ensemble (trained once per run folder, then reused) or the true-dynamics oracle."""
    if cfg.dynamics == "true":
        if "qpos" not in real.data or "qvel" not in real.data:
            raise ValueError(f"{cfg.data}: --dynamics true needs the simulator state (qpos, qvel) at every step, and this "
                             f"dataset has none (its features: {sorted(real.data)}); make it with `wmrl datasets make`")
        return TrueDynamics(env_id), {}
    tr = real.transitions([OBS_STATE, ACTION, REWARD])
    ecfg = EnsembleConfig(obs_dim=tr[OBS_STATE].shape[1], act_dim=tr[ACTION].shape[1], members=cfg.ensemble_members,
                          elites=cfg.ensemble_elites, hidden=cfg.ensemble_hidden, max_epochs=cfg.ensemble_max_epochs)
    model = GaussianEnsemble(ecfg)
    ck = Path(cfg.dynamics_dir) if cfg.dynamics_dir else run / "dynamics"
    if (ck / "fit.json").exists():
        read_config(ck, EnsembleConfig, expect=ecfg, what="dynamics ensemble")
        return load_state(model, ck), json.loads((ck / "fit.json").read_text())
    info = fit_ensemble(model, tr[OBS_STATE], tr[ACTION], tr[f"next.{OBS_STATE}"], tr[REWARD].reshape(-1),
                        seed=cfg.seed, progress=cfg.progress)

    save_pretrained(model, ecfg, ck)
    write_json(ck / "fit.json", info)
    return model, info


@torch.no_grad()
def rollout(agent, dynamics, real, n: int, k: int, penalty: float, termination, rng: np.random.Generator) -> dict:
    """k-step branched rollouts from n dataset states; returns (n, k+1, ...) arrays and per-rollout lengths."""
    keys = [OBS_STATE] + [k_ for k_ in ("qpos", "qvel") if k_ in real.data]
    start = real.sample(n, keys=keys)
    s = np.array(start[OBS_STATE], np.float32)
    state = {"qpos": np.array(start["qpos"], np.float64), "qvel": np.array(start["qvel"], np.float64)} if "qpos" in start else None
    obs = np.zeros((n, k + 1, s.shape[1]), np.float32)
    act = np.zeros((n, k + 1, agent.cfg.act_dim), np.float32)
    sample = agent.actor.sample if hasattr(agent.actor, "sample") else agent.actor.mu
    rew = np.zeros((n, k + 1), np.float32)
    term = np.zeros((n, k + 1), bool)
    length = np.full(n, k)
    alive = np.ones(n, bool)
    obs[:, 0] = s
    unc_sum = 0.0
    for t in range(k):
        a = sample(torch.as_tensor(s))
        a = (a[0] if isinstance(a, tuple) else a).numpy()
        s2, r, te, state, info = dynamics.step(s, a, state, rng=rng, termination=termination)
        unc_sum += float(info["uncertainty"][alive].mean()) if alive.any() else 0.0
        r = r - penalty * info["uncertainty"]
        act[:, t], rew[:, t], term[:, t], obs[:, t + 1] = a, r, te, s2
        newly_done = alive & te
        length[newly_done] = t + 1
        alive &= ~te
        s = s2.astype(np.float32)
        if not np.isfinite(s).all():  # a diverging model: stop those rollouts here
            bad = ~np.isfinite(s).all(-1)
            length[alive & bad] = t
            alive &= ~bad
            s = np.nan_to_num(s)
    return {"obs": obs, "act": act, "rew": rew, "term": term, "length": length, "uncertainty": unc_sum / k}


def add_rollouts(buffer, ro: dict) -> int:
    """Each rollout becomes an episode of `length` steps in the model buffer; its last frame is only a target."""
    added = 0
    for i in range(len(ro["length"])):
        T = int(ro["length"][i])
        if T == 0:
            continue
        a = ro["act"][i, : T + 1].copy()
        a[T] = a[T - 1]  # the final frame repeats the last action (wmrl.core.episode)
        ep = {OBS_STATE: ro["obs"][i, : T + 1], ACTION: a, REWARD: np.append(ro["rew"][i, :T], 0.0).astype(np.float32),
              TERMINATED: np.append(ro["term"][i, :T], ro["term"][i, T - 1]), TRUNCATED: np.append(np.zeros(T, bool), not ro["term"][i, T - 1]),
              IS_LAST: np.arange(T + 1) == T, SOURCE: ["world_model"] * (T + 1)}
        buffer.add_episode(ep)
        added += T
    return added


class ModelDataSource(Protocol):
    """Where a model-based agent's synthetic transitions come from: k-step rollouts in a dynamics model
    (`DynamicsRollouts`, MBPO/MOPO/RAVL) or PGD's trajectory diffusion (`wmrl.rl.pgd`). `capacity`: frames the model
    buffer holds; `refresh` writes the epoch's data into it and returns metrics."""

    capacity: int

    def refresh(self, agent, buffer, epoch: int) -> dict: ...


class DynamicsRollouts:
    """MBPO's branched rollouts (Janner et al. 2019): `rollout_batch` dataset states, `rollout_length` steps of the
    current policy in the dynamics, `retain_epochs` epochs kept (FIFO). `edge`: the states the last rollouts ended
    in, where edge-of-reach values show (Sims et al. 2024)."""

    def __init__(self, cfg: OfflineConfig, dynamics, real, penalty: float, termination, rng: np.random.Generator):
        self.cfg, self.dynamics, self.real, self.penalty, self.termination, self.rng = cfg, dynamics, real, penalty, termination, rng
        self.capacity = cfg.rollout_batch * (cfg.rollout_length + 1) * cfg.retain_epochs
        self.edge: np.ndarray | None = None

    def refresh(self, agent, buffer, epoch: int) -> dict:
        ro = rollout(agent, self.dynamics, self.real, self.cfg.rollout_batch, self.cfg.rollout_length, self.penalty,
                     self.termination, self.rng)
        out = {"model_transitions": add_rollouts(buffer, ro), "rollout_uncertainty": ro["uncertainty"]}
        self.edge = ro["obs"][np.arange(len(ro["length"])), ro["length"]]  # last states: Bellman targets only
        return out


def train_offline(cfg: OfflineConfig, source: ModelDataSource | None = None) -> dict:
    """The offline loop for every algorithm of the family. `source` replaces the preset's model data (PGD passes its
    trajectory diffusion); by default a model-based preset rolls out in the learned or true dynamics."""
    from wmrl.rl.sac import evaluate_return

    preset = resolve_algo(cfg)
    env_id = cfg.env or dataset_env(cfg.data)
    if not env_id:
        raise ValueError(f"{cfg.data}: the dataset does not name its environment; pass --env")
    run = start_run(cfg)
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)
    real = load_offline_data(cfg.data, cfg.seed)

    apply_weighting(real, cfg.weighting, cfg.weighting_alpha)
    from wmrl.rl.sac import spaces_of

    spaces = spaces_of(env_id)
    if real.data[OBS_STATE].shape[1] != spaces["obs_dim"] or real.data[ACTION].shape[1] != spaces["act_dim"]:
        raise ValueError(f"{cfg.data}: observation/action dims {real.data[OBS_STATE].shape[1]}/{real.data[ACTION].shape[1]} "
                         f"do not match {env_id}'s {spaces['obs_dim']}/{spaces['act_dim']}")
    dyn_info: dict = {}
    if source is None and preset.model_data:
        dynamics, dyn_info = make_dynamics(cfg, env_id, real, run)
        source = DynamicsRollouts(cfg, dynamics, real, preset.penalty, termination_fn(env_id), rng)
    torch.manual_seed(cfg.seed)  # the same agent whether the ensemble was fitted here or loaded from `dynamics_dir`
    if preset.agent != "sac":
        agent = make_agent(preset.agent, spaces, hidden=cfg.hidden, batch_size=cfg.batch_size)
        if preset.agent == "td3bc":
            agent.set_obs_stats(real.transitions([OBS_STATE])[OBS_STATE])
    else:
        agent = make_agent("sac", spaces, num_critics=preset.num_critics, eta=preset.eta, hidden=cfg.hidden,
                           layers=cfg.layers, batch_size=cfg.batch_size)
    use_model = source is not None
    rollouts = isinstance(source, DynamicsRollouts)
    model_buf = EpisodeReplay(max(source.capacity if use_model else 1, 1), seed=cfg.seed)
    ck, epoch0 = resume_checkpoint(run / "checkpoints") if cfg.resume else (None, 0)
    curve: list[dict] = []
    if ck is not None:  # everything the next update depends on, so a resumed run continues as if never stopped
        saved = load_agent(ck)
        if dataclasses.asdict(saved.cfg) != dataclasses.asdict(agent.cfg):
            raise ValueError(f"{ck}: the checkpointed agent's config differs from this run's; use a new --out")
        agent = saved
        state = load_train_state(ck, agent.optimizers())
        epoch0 = state["step"]
        rng.bit_generator.state, real.rng.bit_generator.state = state["rng"], state["real_rng"]
        if use_model:
            model_buf = EpisodeReplay.load(ck / "model_buffer")
        # rows logged after the checkpoint by the stopped run come again now: keep each epoch's last row
        rows = {r["epoch"]: r for r in read_metrics(run) if r.get("epoch", 0) <= epoch0}
        curve = [rows[e] for e in sorted(rows)]
    mix = MixedReplay(real, model_buf, online_ratio=1.0 - cfg.real_ratio) if use_model else None
    keys = [OBS_STATE, ACTION, REWARD, TERMINATED]
    logger = Tracker(run)
    t0 = time.time() - 60 * (curve[-1].get("minutes", 0.0) if curve else 0.0)
    bar = tqdm(range(epoch0, cfg.epochs), desc=f"{cfg.algo} ({cfg.dynamics})", disable=not cfg.progress)
    for epoch in bar:
        row: dict = {"epoch": epoch + 1}
        if use_model:
            row.update(source.refresh(agent, model_buf, epoch))
        for _ in range(cfg.updates_per_epoch):
            b = mix.sample(cfg.batch_size, keys=keys) if use_model else real.sample(cfg.batch_size, keys=keys)
            try:
                info = agent.update(batch_tensors(b))
            except FloatingPointError as e:
                raise FloatingPointError(f"{cfg.algo} diverged at epoch {epoch + 1}: {e}; "
                                         f"the last good checkpoint is in {run / 'checkpoints' / 'last'}") from None
        with torch.no_grad():  # Q on dataset transitions: the quantity that diverges at edge-of-reach states
            rb = batch_tensors(real.sample(1024, keys=keys))
            row["q_dataset"] = agent.q_values(rb["obs"], rb["act"]).mean().item()
            if rollouts:
                row["q_dataset_pi"] = agent.q_values(rb["obs"], agent.actor.sample(rb["obs"])[0]).mean().item()
                # Q at the states rollouts end in (edge-of-reach candidates), under the current policy
                e = torch.as_tensor(source.edge[:1024], dtype=torch.float32)
                row["q_rollout_end"] = agent.q_values(e, agent.actor.sample(e)[0]).mean().item()
        row.update({k: info[k] for k in ("q_mean", "critic_loss", "alpha", "entropy") if k in info})
        if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
            row["return"] = evaluate_return(agent.actor, env_id, cfg.eval_episodes)
            row["minutes"] = (time.time() - t0) / 60
        logger.log(row, step=epoch + 1)  # before the checkpoint: a resumed run finds every row up to it
        curve.append(row)
        if "return" in row:
            def write(d: Path) -> None:
                save_agent(agent, d)
                if use_model:
                    model_buf.save(d / "model_buffer")
                save_train_state(d, epoch + 1, agent.optimizers(), rng=rng.bit_generator.state,
                                 real_rng=real.rng.bit_generator.state)

            commit_checkpoint(run / "checkpoints", epoch + 1, write)
            bar.set_postfix(ret=f"{row['return']:.0f}", q=f"{row['q_dataset']:.1f}")
    logger.close()
    evals = [r["return"] for r in curve if "return" in r]
    return {"run_dir": str(run), "algo": cfg.algo, "dynamics": cfg.dynamics, "env": env_id,
            "final_return": evals[-1] if evals else float("nan"), "curve": curve, "dynamics_fit": dyn_info,
            "minutes": (time.time() - t0) / 60}


__all__ = ["OfflineConfig", "Preset", "PRESETS", "ModelDataSource", "DynamicsRollouts", "train_offline", "rollout",
           "add_rollouts", "resolve_algo"]
