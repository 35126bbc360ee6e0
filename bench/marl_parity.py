#!/usr/bin/env python3
"""Is rlstash's MAPPO BenchMARL's, step for step? (``bench/results/marl_parity.md``; runs in
``.venv-marl``, ``bench/setup_marl.py``.)

    python3 bench/marl_parity.py [--task balance] [--seed 0]

From BenchMARL's own set-up of MAPPO on a VMAS task (its defaults, seed ``--seed``):

1. **One batch, the same weights.** BenchMARL collects one 6,000-frame batch; rlstash's
   :class:`~rlstash.agents.mappo.MAPPO` (``agent_id=False``, ``bootstrap_truncated=False``, the
   settings ``bench/marl.py`` runs) gets BenchMARL's initial actor and critic weights (first
   compared with the ones rlstash draws itself from the same seed). Compared:
   the tanh-normal's loc and scale on the batch, the critic's values, GAE's advantages and
   value targets (rlstash's :func:`~rlstash.agents.gae.gae` against BenchMARL's
   ``process_batch``), then one pass of 15 minibatch steps (400 env steps each, one order):
   BenchMARL's ``ClipPPOLoss``, its two Adam optimizers and its gradient clipping against
   rlstash's steps (``backward`` 'autograd' and 'written'), each from the same weights: the
   weight change of every layer and every step's gradient norms.
2. **The env wrappers, the same policy.** One rlstash policy acts for 3,000 steps of 10 envs in
   TorchRL's ``VmasEnv`` (BenchMARL's env, ``step_and_maybe_reset`` as its collector) and in
   rlstash's ``VmasVectorEnv``: episode ends, terminations and the mean reward per step (the
   two differ only by the envs' random draws).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from setup_marl import ensure_marl_venv  # noqa: E402

OUT = HERE / "results" / "marl_parity.md"
ACTOR = "actor_network_params.module.0.module.0.mlp.params."
CRITIC = "critic_network_params.module.0.mlp.params."


def _experiment(task: str, seed: int):  # noqa: ANN202
    from benchmarl.algorithms import MappoConfig
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    cfg = ExperimentConfig.get_from_yaml()
    cfg.max_n_frames, cfg.loggers, cfg.render = 6000, ["csv"], False
    cfg.create_json, cfg.checkpoint_at_end, cfg.evaluation = False, False, False
    cfg.save_folder = tempfile.mkdtemp()
    return Experiment(task=getattr(VmasTask, task.upper()).get_from_yaml(),
                      algorithm_config=MappoConfig.get_from_yaml(),
                      model_config=MlpConfig.get_from_yaml(),
                      critic_model_config=MlpConfig.get_from_yaml(), seed=seed, config=cfg)  # fmt: skip


def _layers(loss, agent):  # noqa: ANN001, ANN202
    """(name, BenchMARL parameter, rlstash parameter, transposed?) for every layer."""
    bp = dict(loss.named_parameters())
    out = []
    for prefix, net, tag in ((ACTOR, agent.actor, "actor"), (CRITIC, agent.critic, "critic")):
        lins = [m for m in net.net if hasattr(m, "weight")]
        for k, lin in zip((0, 2, 4), lins):
            out.append(
                (f"{tag} layer {k // 2} weight", bp[f"{prefix}{k}.weight"], lin.weight, True)
            )
            out.append((f"{tag} layer {k // 2} bias", bp[f"{prefix}{k}.bias"], lin.bias, False))
    return out


def _as_rlstash(p, transposed: bool):  # noqa: ANN001, ANN202
    return p.detach().T if transposed else p.detach()


def rows_of(td):  # noqa: ANN001, ANN202
    """BenchMARL's processed rows [N] as MAPPO.learn's fields (without ``logp``): the pre-tanh
    sample recovered from the action as its TanhNormal does (atanh of it clamped to 1 - 1e-6)."""
    import torch

    u = torch.atanh(td["agents", "action"].clamp(-1 + 1e-6, 1 - 1e-6))
    return {"obs": td["agents", "observation"], "action": u,
            "advantages": td["agents", "advantage"].squeeze(-1),
            "returns": td["agents", "value_target"].squeeze(-1),
            "mask": torch.ones(u.shape[:2], dtype=torch.bool)}  # fmt: skip


def one_batch(task: str, seed: int) -> list[str]:
    import torch

    from rlstash.agents.gae import gae
    from rlstash.agents.mappo import MAPPO, MAPPOConfig

    exp = _experiment(task, seed)
    loss, opts = exp.losses["agents"], exp.optimizers["agents"]
    batch = next(iter(exp.collector))  # [E, T] of BenchMARL's own collector
    E, T, A, D = batch["agents", "observation"].shape
    act_dim = batch["agents", "action"].shape[-1]
    lines = [f"### 1. One batch of vmas/{task}, seed {seed}: {E} envs x {T} steps x {A} agents",
             "", "| quantity | max abs difference | scale |", "|---|---|---|"]  # fmt: skip

    def agent_for(backward: str) -> MAPPO:
        cfg = MAPPOConfig(agent_id=False, bootstrap_truncated=False, compile=False,
                          backward=backward, seed=seed)  # fmt: skip
        bounds = (-torch.ones(act_dim), torch.ones(act_dim))
        agent = MAPPO(A, D, bounds=bounds, config=cfg)
        with torch.no_grad():
            for _, b, r, tr in _layers(loss, agent):
                r[0].copy_(_as_rlstash(b, tr))
        return agent

    own = MAPPO(A, D, bounds=(-torch.ones(act_dim), torch.ones(act_dim)),
                config=MAPPOConfig(agent_id=False, compile=False, seed=seed))  # fmt: skip
    init = max(float((r.detach()[0] - _as_rlstash(b, tr)).abs().max())
               for _, b, r, tr in _layers(loss, own))  # fmt: skip
    lines.append(f"| initial weights, rlstash's own for seed {seed} (no copy) | {init:.2e} | - |")
    agent = agent_for("autograd")
    obs = batch["agents", "observation"]
    with torch.no_grad():
        loc, scale = agent.dist_params(obs)
    row = lambda name, a, b: lines.append(  # noqa: E731
        f"| {name} | {float((a - b).abs().max()):.2e} | {float(b.abs().mean()):.3g} |"
    )
    row("tanh-normal loc", loc, batch["agents", "loc"])
    row("tanh-normal scale", scale, batch["agents", "scale"])
    done = exp.algorithm.process_batch("agents", batch.clone())
    with torch.no_grad():
        v = agent.values(obs)
        nv = agent.values(batch["next", "agents", "observation"])
    row("critic value", v, done["agents", "state_value"].squeeze(-1))
    ended = batch["next", "done"].squeeze(-1)[..., None].expand(E, T, A)  # terminal at the horizon
    flat = lambda x: x.transpose(0, 1).reshape(T, E * A)  # noqa: E731
    back = lambda x: x.reshape(T, E, A).transpose(0, 1)  # noqa: E731
    reward = batch["next", "agents", "reward"].squeeze(-1)
    adv, ret = gae(flat(reward), flat(v), flat(nv), flat(ended), flat(~ended), 0.99, 0.9)
    row("GAE advantage", back(adv), done["agents", "advantage"].squeeze(-1))
    row("GAE value target", back(ret), done["agents", "value_target"].squeeze(-1))

    rows = done.reshape(-1)
    perm = torch.randperm(E * T, generator=torch.Generator().manual_seed(seed))
    mbs = [rows[perm[i : i + 400]].clone() for i in range(0, E * T, 400)]  # one pass
    before = {name: _as_rlstash(b, tr).clone() for name, b, _, tr in _layers(loss, agent)}
    bm_norms = []
    for mb in mbs:  # BenchMARL's _optimizer_loop, one pass of minibatches
        vals = exp.algorithm.process_loss_vals("agents", loss(mb))
        for name, value in vals.items():
            if name in opts:
                value.backward()
                bm_norms.append(exp._grad_clip(opts[name]))  # objective, then critic
                opts[name].step()
                opts[name].zero_grad()
    lines += ["", f"One pass of {len(mbs)} minibatch steps (400 env steps each, the same "
              "order on both sides) from the same weights: the change of each layer, "
              "BenchMARL's against rlstash's (Adam's first steps move every weight by about "
              "the learning rate whatever the gradient's size, so the later steps are what "
              "tells):", "",
              "| layer | BenchMARL change (norm) | rlstash autograd: difference | rlstash "
              "written: difference |", "|---|---|---|---|"]  # fmt: skip
    diffs: dict[str, list[float]] = {}
    norms: dict[str, list[float]] = {}
    for backward in ("autograd", "written"):
        agent = agent_for(backward)
        with torch.no_grad():
            for name, _, r, _ in _layers(loss, agent):
                r[0].copy_(before[name])
        mine_mbs = []
        for mb in mbs:  # the old policy's log-probs: from the weights before the pass
            mine = rows_of(mb)
            with torch.no_grad():
                mine["logp"] = agent.log_prob(mine["obs"], mine["action"])[0]
            mine_mbs.append(mine)
        for mine in mine_mbs:
            metrics = agent._minibatch(mine)  # ... actor_grad_norm, critic_grad_norm
            norms.setdefault(backward, []).extend([float(metrics[4]), float(metrics[5])])
        for name, b, r, tr in _layers(loss, agent):
            d_b = _as_rlstash(b, tr) - before[name]
            diffs.setdefault(name, [float(d_b.norm())]).append(
                float((r.detach()[0] - before[name] - d_b).norm())
            )
    for name, (norm, d_auto, d_written) in diffs.items():
        lines.append(f"| {name} | {norm:.3e} | {d_auto:.1e} | {d_written:.1e} |")
    rel = {k: max(abs(a - b) / b for a, b in zip(v, bm_norms)) for k, v in norms.items()}
    lines += ["", f"Gradient norms before clipping, all {len(bm_norms)} (actor and critic per "
              f"step): BenchMARL {min(bm_norms):.3g}-{max(bm_norms):.3g}; largest relative "
              f"difference rlstash autograd {rel['autograd']:.1e}, written {rel['written']:.1e}."]  # fmt: skip
    return lines


def iterations(task: str, seed: int, k: int = 2, epochs: int = 5) -> list[str]:
    """``k`` whole ``MAPPO.learn`` calls (``epochs`` passes each, Adam's state carried from one
    to the next) against BenchMARL's ``_optimizer_loop`` over the same permutations."""
    import torch

    from rlstash.agents.mappo import MAPPO, MAPPOConfig

    exp = _experiment(task, seed)
    loss, opts = exp.losses["agents"], exp.optimizers["agents"]
    rows = exp.algorithm.process_batch("agents", next(iter(exp.collector))).reshape(-1)
    data = rows_of(rows)
    n, A, u = rows.shape[0], data["mask"].shape[1], data["action"]
    agents = {}
    for backward in ("autograd", "written"):
        cfg = MAPPOConfig(agent_id=False, bootstrap_truncated=False, compile=False,
                          backward=backward, seed=seed, n_epochs=epochs)  # fmt: skip
        agent = MAPPO(A, data["obs"].shape[-1], bounds=(-torch.ones(u.shape[-1]),
                      torch.ones(u.shape[-1])), config=cfg)  # fmt: skip
        with torch.no_grad():
            for _, b, r, tr in _layers(loss, agent):
                r[0].copy_(_as_rlstash(b, tr))
        agents[backward] = agent
    with torch.no_grad():
        data["logp"] = agents["autograd"].log_prob(data["obs"], u)[0]
    gen = torch.Generator().manual_seed(seed)  # MAPPO.gen's draws: the same permutations
    lines = ["", f"{k} whole `MAPPO.learn` calls of {epochs} passes each ({k * epochs * n // 400} "
             "minibatch steps, Adam's state carried over) against BenchMARL's loop over the "
             "same permutations: the largest weight difference of any layer, relative to "
             "that layer's total change:", "",
             "| after call | rlstash autograd | rlstash written |", "|---|---|---|"]  # fmt: skip
    start = {
        name: _as_rlstash(b, tr).clone() for name, b, _, tr in _layers(loss, agents["autograd"])
    }
    for call in range(k):
        for _ in range(epochs):
            perm = torch.randperm(n, generator=gen)
            for i in range(0, n, 400):
                vals = exp.algorithm.process_loss_vals("agents", loss(rows[perm[i : i + 400]]))
                for name, value in vals.items():
                    if name in opts:
                        value.backward()
                        exp._grad_clip(opts[name])
                        opts[name].step()
                        opts[name].zero_grad()
        cells = []
        for agent in agents.values():
            agent.learn(data)
            worst = 0.0
            for name, b, r, tr in _layers(loss, agent):
                theirs = _as_rlstash(b, tr)
                change = float((theirs - start[name]).norm())
                worst = max(worst, float((r.detach()[0] - theirs).norm()) / change)
            cells.append(f"{worst:.1e}")
        lines.append(f"| {call + 1} | " + " | ".join(cells) + " |")
    return lines


def env_stats(task: str, steps: int = 3000) -> list[str]:
    import torch
    from torchrl.envs.libs.vmas import VmasEnv

    from rlstash.agents.mappo import MAPPO, MAPPOConfig
    from rlstash.train.config import TrainConfig
    from rlstash.train.marl import env_kwargs, make_env

    cfg = TrainConfig(algo="mappo", env=f"vmas/{task}", device="cpu", seed=0)
    kw = env_kwargs(cfg)
    renv = make_env(cfg, 10, torch.device("cpu"), 0)
    space = renv.action_spaces["agents"]
    n_agents = len(renv.groups["agents"])
    obs_dim = renv.observation_spaces["agents"].shape[0]
    agent = MAPPO(n_agents, obs_dim, bounds=(space.low, space.high),
                  config=MAPPOConfig(agent_id=False, compile=False, seed=3))  # fmt: skip
    tenv = VmasEnv(task, num_envs=10, continuous_actions=True, seed=0, device="cpu",
                   categorical_actions=True, clamp_actions=True, **kw)  # fmt: skip
    td = tenv.reset()
    t_ends = t_term = 0
    t_rew = 0.0
    for _ in range(steps):
        td["agents", "action"] = agent.act(td["agents", "observation"])[1]
        td, nxt = tenv.step_and_maybe_reset(td)
        t_ends += int(td["next", "done"].sum())
        t_term += int(td["next", "terminated"].sum())
        t_rew += float(td["next", "agents", "reward"].mean())
        td = nxt
    step = renv.reset(seed=0)
    r_ends = r_term = 0
    r_rew = 0.0
    for _ in range(steps):
        step = renv.step({"agents": agent.act(step.obs["agents"])[1]})
        r_ends += int(step.env_done.sum())
        r_term += int(step.terminated["agents"][:, 0].sum())
        r_rew += float(step.reward["agents"].mean())
    renv.close()
    return [f"### 2. The env wrappers, one policy, {steps:,} steps x 10 envs of vmas/{task}", "",
            "| env | episode ends | terminated (TorchRL: every end, the horizon too) | mean "
            "reward per agent-step |", "|---|---|---|---|",
            f"| TorchRL VmasEnv (BenchMARL's) | {t_ends} | {t_term} | {t_rew / steps:.4f} |",
            f"| rlstash VmasVectorEnv | {r_ends} | {r_term} (the horizon is truncation) | "
            f"{r_rew / steps:.4f} |"]  # fmt: skip


def main() -> None:
    ensure_marl_venv(__file__)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="balance", choices=("balance", "navigation"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    lines = ["# MAPPO: rlstash against BenchMARL step for step (bench/marl_parity.py)", "",
             f"`python3 bench/marl_parity.py --task {args.task} --seed {args.seed}`, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; BenchMARL 1.5.2, TorchRL "
             "0.11.1, VMAS 1.5.2, torch 2.13.0 CPU. What each part does: the script's "
             "docstring.", ""]  # fmt: skip
    lines += one_batch(args.task, args.seed) + iterations(args.task, args.seed)
    lines += [""] + env_stats(args.task)
    lines += ["", f"({time.perf_counter() - t0:.0f} s)"]
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
