"""MAPPO/IPPO update speed at BenchMARL's sizes: Adam steps per second of the update loop.

Ways to run the same update (the same losses, the same Adam) on one BenchMARL batch (6,000 env
steps x 3 agents, minibatch 400: 15 Adam steps per pass, 45 passes = 675 per iteration;
[256, 256] tanh MLPs, actor and critic), chosen with ``--variants`` (ratios are to the first):

* ``plain``: the loop before the fast update (a randperm per pass, a gather per minibatch,
  autograd, ``torch.optim.Adam.step``): the same arithmetic as BenchMARL's (TorchRL's) update;
* ``eager``: ``MAPPO.learn`` with ``compile=False, backward='autograd'`` (permutations up front,
  one gather per pass, fused Adam kernel called directly);
* ``compiled``: ``MAPPO.learn`` with ``compile=True`` (inductor; compiled before timing);
* ``written``: ``MAPPO.learn`` with the gradient written out (``backward='written'``,
  :mod:`rlstash.agents.marl_grad`); ``written-torch-tanh``: the same with torch's tanh instead
  of 2 sigmoid(2z) - 1.

Rounds are interleaved (each round times one pass of each, in rotating order); medians.
One torch thread (as bench/marl.py runs both sides). Run: ``python bench/marl_update.py``
(from the repository root with ``PYTHONPATH=.``, so the worktree's rlstash is the one timed).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from rlstash.agents import ppo_grad
from rlstash.agents.mappo import MAPPO, IPPOConfig, MAPPOConfig

A, OBS, ACT, ROWS, MB = 3, 18, 2, 6000, 400  # VMAS navigation: 3 agents, 18 obs floats
STEPS_PER_ITER = 45 * (ROWS // MB)  # 675
CASES = {  # name: (config class, share_params, discrete)
    "mappo-shared-cont": (MAPPOConfig, True, False),
    "ippo-shared-cont": (IPPOConfig, True, False),
    "mappo-indep-cont": (MAPPOConfig, False, False),
    "mappo-shared-disc": (MAPPOConfig, True, True),
}


def make(case: str, compile_: bool, backward: str = "autograd") -> MAPPO:
    cls, share, discrete = CASES[case]
    cfg = cls(n_epochs=1, minibatch_size=MB, share_params=share, agent_id=False, compile=compile_,
              backward=backward)  # fmt: skip
    if discrete:
        return MAPPO(A, OBS, n_actions=5, config=cfg)
    return MAPPO(A, OBS, bounds=(-torch.ones(ACT), torch.ones(ACT)), config=cfg)


def batch(agent: MAPPO) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    data = {
        "obs": torch.randn(ROWS, A, OBS, generator=g),
        "logp": torch.randn(ROWS, A, generator=g) - 2.0,
        "advantages": torch.randn(ROWS, A, generator=g),
        "returns": torch.randn(ROWS, A, generator=g),
        "mask": torch.ones(ROWS, A, dtype=torch.bool),
    }
    if agent.n_actions is None:
        data["action"] = torch.randn(ROWS, A, ACT, generator=g)
    else:
        data["action"] = torch.randint(0, 5, (ROWS, A), generator=g)
    return data


def plain_pass(agent: MAPPO, data: dict[str, torch.Tensor]) -> None:
    """One pass of the loop before this change (the same arithmetic as MAPPO.learn)."""
    cfg = agent.config
    perm = torch.randperm(ROWS, generator=agent.gen)
    for idx in perm.split(cfg.minibatch_size):
        out = agent.losses({k: v[idx] for k, v in data.items()})
        agent.actor_opt.flat.zero_grad()
        agent.critic_opt.flat.zero_grad()
        (out["policy_loss"] + out["value_loss"]).backward()
        agent.actor_opt.flat.clip_grad_norm_(cfg.max_grad_norm)
        agent.critic_opt.flat.clip_grad_norm_(cfg.max_grad_norm)
        agent.actor_opt.opt.step()
        agent.critic_opt.opt.step()


@contextlib.contextmanager
def torch_tanh():
    """The written gradient with torch's tanh instead of 2 sigmoid(2z) - 1."""
    saved = ppo_grad.SIGMOID_TANH
    ppo_grad.SIGMOID_TANH = ()
    try:
        yield
    finally:
        ppo_grad.SIGMOID_TANH = saved


VARIANTS = {  # name: (compile, backward, context of each pass)
    "plain": None,
    "eager": (False, "autograd", contextlib.nullcontext),
    "compiled": (True, "autograd", contextlib.nullcontext),
    "written": (False, "written", contextlib.nullcontext),
    "written-torch-tanh": (False, "written", torch_tanh),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument(
        "--variants",
        default="plain,compiled,written",
        help=f"comma-separated, of {','.join(VARIANTS)}; ratios are to the first",
    )
    args = ap.parse_args()  # fmt: skip
    torch.set_num_threads(1)
    steps = ROWS // MB
    names = args.variants.split(",")
    base = names[0]
    head = " | ".join(f"{n} steps/s" for n in names)
    ratios = " | ".join(f"{n}/{base}" for n in names[1:])
    iters = " | ".join(f"s/iter {n}" for n in names)
    print(f"| case | {head} | {ratios} | {iters} | compile s |")
    print("|---" * (1 + 3 * len(names)) + "|")
    for case in args.cases.split(","):
        agents, runs = {}, {}
        for name in names:
            spec = VARIANTS[name]
            if spec is None:
                agents[name] = make(case, False)
            else:
                agents[name] = make(case, spec[0], spec[1])
        data = batch(agents[names[0]])
        for name in names:
            spec, agent = VARIANTS[name], agents[name]
            if spec is None:
                runs[name] = lambda ag=agent, d=data: plain_pass(ag, d)
            else:

                def run(ag=agent, d=data, ctx=spec[2]):
                    with ctx():
                        ag.learn(d)

                runs[name] = run
        for run in runs.values():  # warm-up (the compiled one compiles here)
            run()
        rates: dict[str, list[float]] = {name: [] for name in runs}
        k = len(names)
        for r in range(args.rounds):
            for name in names[r % k :] + names[: r % k]:
                start = time.perf_counter()
                runs[name]()
                rates[name].append(steps / (time.perf_counter() - start))
        med = {name: statistics.median(v) for name, v in rates.items()}
        comp = max(a.compile_seconds for a in agents.values())
        print(f"| {case} | " + " | ".join(f"{med[n]:.1f}" for n in names) + " | "
              + " | ".join(f"{med[n] / med[base]:.2f}x" for n in names[1:]) + " | "
              + " | ".join(f"{STEPS_PER_ITER / med[n]:.1f}" for n in names)
              + f" | {comp:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
