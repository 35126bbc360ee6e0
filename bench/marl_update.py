"""MAPPO/IPPO update speed at BenchMARL's sizes: Adam steps per second of the update loop.

Three ways to run the same update (the same losses, the same Adam) on one BenchMARL batch
(6,000 env steps x 3 agents, minibatch 400: 15 Adam steps per pass, 45 passes = 675 per
iteration; [256, 256] tanh MLPs, actor and critic):

* ``plain``: the loop before this change (a randperm per pass, a gather per minibatch, autograd,
  ``torch.optim.Adam.step``): the same arithmetic as BenchMARL's (TorchRL's) update;
* ``eager``: ``MAPPO.learn`` with ``compile=False`` (permutations up front, one gather per
  pass, fused Adam kernel called directly);
* ``compiled``: ``MAPPO.learn`` with ``compile=True`` (inductor; compiled before timing).

Rounds are interleaved (each round times one pass of each, in rotating order); medians.
One torch thread (as bench/marl.py runs both sides). Run: ``python bench/marl_update.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rlstash.agents.mappo import MAPPO, IPPOConfig, MAPPOConfig

A, OBS, ACT, ROWS, MB = 3, 18, 2, 6000, 400  # VMAS navigation: 3 agents, 18 obs floats
STEPS_PER_ITER = 45 * (ROWS // MB)  # 675
CASES = {  # name: (config class, share_params, discrete)
    "mappo-shared-cont": (MAPPOConfig, True, False),
    "ippo-shared-cont": (IPPOConfig, True, False),
    "mappo-indep-cont": (MAPPOConfig, False, False),
    "mappo-shared-disc": (MAPPOConfig, True, True),
}


def make(case: str, compile_: bool) -> MAPPO:
    cls, share, discrete = CASES[case]
    cfg = cls(n_epochs=1, minibatch_size=MB, share_params=share, agent_id=False, compile=compile_)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    torch.set_num_threads(1)
    steps = ROWS // MB
    print("| case | plain steps/s | eager steps/s | compiled steps/s | eager/plain | "
          "compiled/plain | s/iter plain | s/iter eager | s/iter compiled | compile s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        agents = {"plain": make(case, False), "eager": make(case, False),
                  "compiled": make(case, True)}  # fmt: skip
        data = batch(agents["plain"])
        runs = {"plain": lambda ag=agents, d=data: plain_pass(ag["plain"], d),
                "eager": lambda ag=agents, d=data: ag["eager"].learn(d),
                "compiled": lambda ag=agents, d=data: ag["compiled"].learn(d)}  # fmt: skip
        for run in runs.values():  # warm-up (the compiled one compiles here)
            run()
        rates: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for r in range(args.rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                start = time.perf_counter()
                runs[name]()
                rates[name].append(steps / (time.perf_counter() - start))
        med = {name: statistics.median(v) for name, v in rates.items()}
        print(f"| {case} | {med['plain']:.1f} | {med['eager']:.1f} | {med['compiled']:.1f} | "
              f"{med['eager'] / med['plain']:.2f}x | {med['compiled'] / med['plain']:.2f}x | "
              f"{STEPS_PER_ITER / med['plain']:.1f} | {STEPS_PER_ITER / med['eager']:.1f} | "
              f"{STEPS_PER_ITER / med['compiled']:.1f} | "
              f"{agents['compiled'].compile_seconds:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
