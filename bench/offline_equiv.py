"""Update-for-update check of rlstash's TD3+BC against TorchRL's ``TD3BCLoss`` as
``bench/offline.py`` ``torchrl_update`` runs it (sota-implementations td3_bc): both start from
the same weights, take the same batches, and after every update their losses and every
parameter (networks, targets) are compared. The target-smoothing noise is set to 0 on both
sides (each draws it from its own generator; everything else is the algorithm).

    python3 bench/offline_equiv.py          # needs the bench extra (TorchRL); prints a table

Differences of float32 rounding order only are expected (relative ~1e-6, growing slowly with
Adam); a formula difference shows at the first update that uses it.
"""

from __future__ import annotations

import sys

import torch

HIDDEN = (256, 256)


def main(updates: int = 8, obs_dim: int = 11, act_dim: int = 3, batch: int = 256) -> int:
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.data import Bounded
    from torchrl.modules import MLP, TanhModule, ValueOperator
    from torchrl.objectives import SoftUpdate, TD3BCLoss

    from rlstash.agents.td3_bc import TD3BC, TD3BCConfig

    torch.manual_seed(0)
    eps = 1e-4  # td3_bc/config.yaml's Adam eps, as bench/offline_learn.py sets on both sides
    agent = TD3BC((obs_dim,), act_dim, -1.0, 1.0,
                  TD3BCConfig(seed=0, compile=False, target_policy_noise=0.0))  # fmt: skip
    for group in agent.groups.values():
        group.eps = eps
        for pg in group.opt.param_groups:
            pg["eps"] = eps

    spec = Bounded(-torch.ones(act_dim), torch.ones(act_dim), (act_dim,))
    relu = torch.nn.ReLU
    qvalue = ValueOperator(in_keys=["observation", "action"],
                           module=MLP(num_cells=list(HIDDEN), out_features=1,
                                      activation_class=relu))  # fmt: skip
    actor = TensorDictSequential(
        TensorDictModule(MLP(num_cells=list(HIDDEN), out_features=act_dim, activation_class=relu),
                         in_keys=["observation"], out_keys=["param"]),
        TanhModule(in_keys=["param"], out_keys=["action"], spec=spec),
    )  # fmt: skip

    def make_batch(i: int) -> tuple[dict, TensorDict]:
        g = torch.Generator().manual_seed(100 + i)
        obs = torch.randn(batch, obs_dim, generator=g)
        nxt = torch.randn(batch, obs_dim, generator=g)
        act = torch.rand(batch, act_dim, generator=g) * 2 - 1
        rew = torch.randn(batch, generator=g)
        term = torch.rand(batch, generator=g) < 0.1
        ours = {"obs": obs, "next_obs": nxt, "action": act, "reward": rew, "terminated": term}
        theirs = TensorDict({
            "observation": obs, "action": act,
            "next": {"observation": nxt, "reward": rew[:, None], "terminated": term[:, None],
                     "done": term[:, None]},
        }, [batch])  # fmt: skip
        return ours, theirs

    with torch.no_grad():
        actor(make_batch(0)[1].clone()), qvalue(make_batch(0)[1].clone())
    # TorchRL's networks get rlstash's initial weights
    lin = [m for m in actor.modules() if isinstance(m, torch.nn.Linear)]
    a = agent.nets["actor"]
    with torch.no_grad():
        for m, (w, b) in zip(lin, [(a.encoder.mlp[0].weight, a.encoder.mlp[0].bias),
                                   (a.encoder.mlp[2].weight, a.encoder.mlp[2].bias),
                                   (a.head.weight, a.head.bias)]):  # fmt: skip
            m.weight.copy_(w), m.bias.copy_(b)
    loss = TD3BCLoss(actor_network=actor, qvalue_network=qvalue, action_spec=spec,
                     num_qvalue_nets=2, loss_function="l2", policy_noise=0.0, noise_clip=0.5,
                     alpha=2.5)  # fmt: skip
    loss.make_value_estimator(gamma=0.99)
    crit = agent.nets["critic"].mlp
    qp = loss.qvalue_network_params
    qlin = sorted(k for k in qp.keys(True, True) if k[-1] in ("weight", "bias"))
    with torch.no_grad():
        for layer in range(3):
            w = crit.weights[layer]  # [2, in, out]
            b = crit.biases[layer]  # [2, 1, out]
            key_w = [k for k in qlin if k[-1] == "weight"][layer]
            key_b = [k for k in qlin if k[-1] == "bias"][layer]
            qp.get(key_w).data.copy_(w.transpose(1, 2))
            qp.get(key_b).data.copy_(b[:, 0])
        for src, dst in (
            (loss.qvalue_network_params, loss.target_qvalue_network_params),
            (loss.actor_network_params, loss.target_actor_network_params),
        ):
            for k in src.keys(True, True):
                dst.get(k).data.copy_(src.get(k).data)
    updater = SoftUpdate(loss, tau=0.005)
    actor_opt = torch.optim.Adam(
        list(loss.actor_network_params.values(True, True)), lr=3e-4, eps=eps
    )
    critic_opt = torch.optim.Adam(
        list(loss.qvalue_network_params.values(True, True)), lr=3e-4, eps=eps
    )

    def theirs_critic() -> list[torch.Tensor]:
        return [qp.get(k).data for k in qlin]

    def ours_critic() -> list[torch.Tensor]:
        out = []
        for layer in range(3):
            out += [crit.weights[layer].transpose(1, 2), crit.biases[layer][:, 0]]
        return (
            [out[i] for i in (1, 0, 3, 2, 5, 4)] if [k[-1] for k in qlin][:1] == ["bias"] else out
        )

    @torch.no_grad()
    def rel(x: list[torch.Tensor], y: list[torch.Tensor]) -> float:
        return max(float((u - v).abs().max() / (v.abs().max() + 1e-12)) for u, v in zip(x, y))

    rows = [
        "| update | critic loss rlstash / TorchRL | actor loss rlstash / TorchRL | "
        "max rel. diff critic | max rel. diff actor |",
        "|---:|---:|---:|---:|---:|",
    ]
    worst = 0.0
    for i in range(1, updates + 1):
        ours, td = make_batch(i)
        out = agent.update(ours)
        q_loss, _ = loss.qvalue_loss(td)
        critic_opt.zero_grad()
        q_loss.backward()
        critic_opt.step()
        a_loss = None
        if i % 2 == 0:
            a_loss, _ = loss.actor_loss(td)
            actor_opt.zero_grad()
            a_loss.backward()
            actor_opt.step()
            updater.step()
        d_c = rel(ours_critic(), theirs_critic())
        d_a = rel([p.data for p in a.parameters()], [m.data for m in lin_params(lin)])
        worst = max(worst, d_c, d_a)
        ours_a = f"{float(out['actor_loss']):.6f}" if a_loss is not None else "-"
        theirs_a = f"{float(a_loss.detach()):.6f}" if a_loss is not None else "-"
        rows.append(f"| {i} | {float(out['critic_loss']):.6f} / {float(q_loss.detach()):.6f} | "
                    f"{ours_a} / {theirs_a} | {d_c:.1e} | {d_a:.1e} |")  # fmt: skip
    print("\n".join(rows))
    print(f"\nlargest relative parameter difference: {worst:.1e}")
    return 0 if worst < 1e-3 else 1


def lin_params(lin: list[torch.nn.Linear]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for m in lin:
        out += [m.weight, m.bias]
    return out


if __name__ == "__main__":
    sys.exit(main())
