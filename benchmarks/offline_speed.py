"""How fast can an offline-RL update be on this machine? Updates/s of the SAC family against the arithmetic ceiling.

Issue "Offline RL at real budgets" asks for >= 10x today's RAVL updates/s at the same network size. Before
optimising, this measures what that would take: for RAVL (N=10 critics with EDAC's gradient-diversity term), MBPO's
SAC (N=2) and SAC-N (N=10, no diversity term), at the benchmark's network size (3 x 256 units, batch 256,
HalfCheetah's 17-d state and 6-d action):

- `updates_per_s`: one `agent.update` on a fixed batch (the replay is not timed), median over repeats;
- `gflop_per_update`: the matrix-product work of one update (2mnk per product, backward and double backward
  included; elementwise work is not counted, so this is a lower bound);
- `peak_gflops`: this machine's rate on matrix products shaped like the critics' layers (a batched (N, 256, 256)
  product per member) and on one large square product;
- `ceiling_updates_per_s` = peak / work: no implementation of the same update at the same size can beat it here.

The metric's check: the counter gives exactly 2*m*n*k for a single (m, k) @ (k, n) product, verified in the same run.

The peer in the same run: torchrl's own `IQLLoss` and `TD3BCLoss` (with `SoftUpdate` and Adam), at our IQL's and
TD3+BC's network shapes (2 hidden layers of `hidden` units, 2 critics), one gradient step each on the very same
batch tensors (asserted: the TensorDict holds our tensors, not copies). TD3+BC's actor and targets move every second
step in both.

`ravl_previous` is the same RAVL update as this project ran it before 2026-11-27, timed in the same run as the
reference for `ravl_speedup_vs_previous`: a second critic forward for EDAC's action gradients (now one forward serves
the TD loss and the gradients), the critics' weight gradients computed in the actor's step and thrown away, and
Adam's per-parameter loop instead of its fused kernel. Both give the same losses (tests/rl/test_offline.py).
"""

from __future__ import annotations

import torch

from wmrl.benchutil import finish, median_time

AGENTS = {"ravl": dict(num_critics=10, eta=1.0), "ravl_previous": dict(num_critics=10, eta=1.0),
          "sac-n": dict(num_critics=10, eta=0.0), "mbpo_sac": dict(num_critics=2, eta=0.0)}


def flops_of(fn) -> int:
    """Matrix-product FLOPs (2mnk per product) of everything `fn` runs, backward and double backward included. A
    dispatch mode of our own: torch's FlopCounterMode tracks modules with hooks that autograd.grad(create_graph=True),
    which EDAC's term uses, does not support."""
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    mm = {aten.mm.default: lambda a, b: a.shape[0] * a.shape[1] * b.shape[1],
          aten.addmm.default: lambda c, a, b: a.shape[0] * a.shape[1] * b.shape[1],
          aten.bmm.default: lambda a, b: a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2],
          aten.baddbmm.default: lambda c, a, b: a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]}

    class Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in mm:
                Count.total += 2 * mm[func](*args[:3 if func in (aten.addmm.default, aten.baddbmm.default) else 2])
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.total


def matmul_gflops(batch: int, m: int, k: int, n: int, repeats: int) -> float:
    """GFLOP/s of `batch` products (m, k) @ (k, n) (one bmm; batch 0: a plain matrix product), median of repeats."""
    a, b = torch.randn(*(batch,) * bool(batch), m, k), torch.randn(*(batch,) * bool(batch), k, n)
    f = (lambda: torch.bmm(a, b)) if batch else (lambda: a @ b)
    return 2 * max(batch, 1) * m * k * n / median_time(f, repeats) / 1e9


def torchrl_peers(batch: dict, obs_dim: int, act_dim: int, hidden: int, repeats: int) -> dict:
    """Updates/s of our IQL and TD3+BC against torchrl's losses on the same batch, same sizes."""
    try:
        import torchrl
        from tensordict import TensorDict
        from tensordict.nn import (NormalParamExtractor, ProbabilisticTensorDictModule,
                                   ProbabilisticTensorDictSequential, TensorDictModule)
        from torchrl.modules import MLP, TanhNormal, ValueOperator
        from torchrl.objectives import IQLLoss, SoftUpdate, TD3BCLoss
    except ImportError:
        return {"torchrl": "not installed (pip install 'wmrl[bench]')"}
    from torch import nn

    from wmrl.rl.iql import IQL, IQLConfig
    from wmrl.rl.td3bc import TD3BC, TD3BCConfig

    B = len(batch["obs"])
    td = TensorDict({"observation": batch["obs"], "action": batch["act"],
                     "next": {"observation": batch["next_obs"], "reward": batch["rew"][:, None],
                              "done": batch["term"][:, None].bool(), "terminated": batch["term"][:, None].bool()}},
                    batch_size=[B])
    assert td["observation"].data_ptr() == batch["obs"].data_ptr() and td["action"].data_ptr() == batch["act"].data_ptr()
    box = dict(obs_dim=obs_dim, act_dim=act_dim, action_low=(-1.0,) * act_dim, action_high=(1.0,) * act_dim, hidden=hidden)
    mlp = lambda i, o: MLP(in_features=i, out_features=o, num_cells=[hidden, hidden], activation_class=nn.ReLU)
    q = lambda: ValueOperator(mlp(obs_dim + act_dim, 1), in_keys=["observation", "action"])
    torch.manual_seed(0)

    # IQL: TanhNormal actor, 2 Q nets, a value net; one optimiser step on the summed losses
    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(nn.Sequential(mlp(obs_dim, 2 * act_dim), NormalParamExtractor()), in_keys=["observation"],
                         out_keys=["loc", "scale"]),
        ProbabilisticTensorDictModule(in_keys=["loc", "scale"], out_keys=["action"], distribution_class=TanhNormal,
                                      distribution_kwargs={"low": -1.0, "high": 1.0}))
    iql = IQLLoss(actor, q(), ValueOperator(mlp(obs_dim, 1), in_keys=["observation"]), num_qvalue_nets=2,
                  loss_function="l2", temperature=3.0, expectile=0.7)
    iql.make_value_estimator(gamma=0.99)
    iql_target, iql_opt = SoftUpdate(iql, tau=5e-3), torch.optim.Adam(iql.parameters(), 3e-4)

    def iql_step():
        o = iql(td)
        loss = o["loss_actor"] + o["loss_qvalue"] + o["loss_value"]
        iql_opt.zero_grad(set_to_none=True)
        loss.backward()
        iql_opt.step()
        iql_target.step()

    # TD3+BC: tanh actor, 2 Q nets; the actor and the targets every second step
    td3 = TD3BCLoss(TensorDictModule(nn.Sequential(mlp(obs_dim, act_dim), nn.Tanh()), in_keys=["observation"],
                                     out_keys=["action"]), q(), bounds=(-1.0, 1.0), num_qvalue_nets=2, alpha=2.5,
                    loss_function="l2")
    td3.make_value_estimator(gamma=0.99)
    td3_target, td3_opt = SoftUpdate(td3, tau=5e-3), torch.optim.Adam(td3.parameters(), 3e-4)
    count = [0]

    def td3_step():
        o = td3(td)
        count[0] += 1
        loss = o["loss_qvalue"] + (o["loss_actor"] if count[0] % 2 == 0 else 0.0)
        td3_opt.zero_grad(set_to_none=True)
        loss.backward()
        td3_opt.step()
        if count[0] % 2 == 0:
            td3_target.step()

    ours = {"iql": IQL(IQLConfig(**box)), "td3bc": TD3BC(TD3BCConfig(**box))}
    out: dict = {"torchrl": torchrl.__version__, "peer_hidden": hidden}
    for name, peer in (("iql", iql_step), ("td3bc", td3_step)):
        agent = ours[name]
        # an even number of steps per timing, so both TD3+BC sides do the same share of actor updates
        ours_s = median_time(lambda: (agent.update(batch), agent.update(batch)), repeats) / 2
        peer_s = median_time(lambda: (peer(), peer()), repeats) / 2
        out[f"{name}_updates_per_s"], out[f"torchrl_{name}_updates_per_s"] = 1 / ours_s, 1 / peer_s
        out[f"speedup_vs_torchrl_{name}"] = peer_s / ours_s
    return out


def as_before(agent) -> None:
    """Puts `agent` (a `SAC`) back on the update this project ran before 2026-11-27 (see the module's docstring)."""
    critic = agent.critic

    def two_forwards(obs, act):
        N = critic.n
        a = act.unsqueeze(0).expand(N, -1, -1).clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(critic(obs.unsqueeze(0).expand(N, -1, -1), a).sum(), a, create_graph=True)
        return critic(obs, act), grad

    critic.q_and_action_grad = two_forwards
    critic.requires_grad_ = lambda flag=True: critic  # the actor's step then computes the critics' weight gradients
    for name in ("opt_actor", "opt_critic"):
        old = getattr(agent, name)
        setattr(agent, name, torch.optim.Adam(old.param_groups[0]["params"], lr=old.param_groups[0]["lr"]))


def main(quick: bool = False, batch_size: int = 256, hidden: int = 256, layers: int = 3) -> dict:
    from wmrl.rl.sac import SAC, SACConfig

    obs_dim, act_dim = 17, 6
    if quick:
        batch_size, hidden = 32, 32
    repeats = 3 if quick else 30
    # the counter's own check: one product of known size
    a, b = torch.randn(64, 48), torch.randn(48, 32)
    check = flops_of(lambda: a @ b)
    out: dict = {"threads": torch.get_num_threads(), "batch_size": batch_size, "hidden": hidden, "layers": layers,
                 "flop_counter_check": {"counted": check, "expected": 2 * 64 * 48 * 32}, "agents": {}}
    n = 10
    out["peak_gflops_critic_layer"] = matmul_gflops(n, batch_size, hidden, hidden, repeats)  # (N, B, h) @ (N, h, h)
    sq = 256 if quick else 2048
    out["peak_gflops_square_2048"] = matmul_gflops(0, sq, sq, sq, max(3, repeats // 3))
    peak = max(out["peak_gflops_critic_layer"], out["peak_gflops_square_2048"])
    g = torch.Generator().manual_seed(0)
    batch = {"obs": torch.randn(batch_size, obs_dim, generator=g), "act": torch.rand(batch_size, act_dim, generator=g) * 2 - 1,
             "rew": torch.randn(batch_size, generator=g), "next_obs": torch.randn(batch_size, obs_dim, generator=g),
             "term": torch.zeros(batch_size)}
    for name, fields in AGENTS.items():
        torch.manual_seed(0)
        agent = SAC(SACConfig(obs_dim=obs_dim, act_dim=act_dim, action_low=(-1.0,) * act_dim, action_high=(1.0,) * act_dim,
                              hidden=hidden, layers=layers, batch_size=batch_size, **fields))
        if name == "ravl_previous":
            as_before(agent)
        flops = flops_of(lambda: agent.update(batch))
        sec = median_time(lambda: agent.update(batch), repeats)
        out["agents"][name] = {"updates_per_s": 1 / sec, "gflop_per_update": flops / 1e9, "achieved_gflops": flops / sec / 1e9,
                               "share_of_peak": flops / sec / 1e9 / peak, "ceiling_updates_per_s": peak / (flops / 1e9)}
    out.update(torchrl_peers(batch, obs_dim, act_dim, hidden, repeats))
    r = out["agents"]["ravl"]
    out["ravl_updates_per_s"] = r["updates_per_s"]
    out["ravl_ceiling_updates_per_s"] = r["ceiling_updates_per_s"]
    out["ravl_ceiling_over_measured"] = r["ceiling_updates_per_s"] / r["updates_per_s"]
    out["ravl_speedup_vs_previous"] = r["updates_per_s"] / out["agents"]["ravl_previous"]["updates_per_s"]
    name = "offline-speed" + ("" if (hidden, layers, batch_size) == (256, 3, 256) else f"-h{hidden}x{layers}-b{batch_size}")
    return finish(name, out, quick, command=f"wmrl bench offline-speed --json --options hidden={hidden} layers={layers} "
                                            f"batch_size={batch_size}")
