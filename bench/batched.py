#!/usr/bin/env python3
"""Batched torch envs: rlstash/CartPole-v1 against gymnasium's numpy-batched CartPole, and the
Collector's overhead over the env's own step rate.

    .venv/bin/python bench/batched.py [--quick] [--device cpu] [--reps N] [--clock cpu]
                                      [--out bench/results/batched.md]

Runs in the project's ``.venv`` (gymnasium is a dependency; no peers to install).

1. Env steps/s at 256, 4096 and 65536 envs: ``gym.make_vec("rlstash/CartPole-v1", N,
   "vector_entry_point", device=...)`` against ``gym.make_vec("CartPole-v1", N,
   "vector_entry_point")`` (gymnasium's numpy ``CartPoleVectorEnv``), random actions (a bank of
   64 pre-drawn action vectors per env, cycled: the policy's cost is not in this number),
   next-step autoreset on both, timed interleaved (``common.interleaved``), medians.
2. Collector overhead at 4096 envs: steps/s of the collector loop (a random policy that
   picks one of 64 pre-drawn action vectors on the env's device + env step + storing + episode
   statistics, 16 steps per batch) as a fraction of the env's own step rate (section 1's
   loop), interleaved. Storing: ``Collector.collect_into(StreamStorage)`` (each step copied
   once, straight into the stream's slot-major rows; flags read on the host once per batch);
   ``extend`` of each [16, N] batch into a StreamStorage (one block write per field) and,
   flattened to rows, into a ``ReplayBuffer`` over a TensorStorage ring (what a user writes).
   Two bounds without any bookkeeping: the env plus the two copies of a batch path (step
   outputs into the batch, the batch into slot-major rows), and the env plus one copy per step
   into slot-major rows (what ``collect_into`` moves).
3. PPO on rlstash/CartPole-v1 with 1024 envs: env steps and seconds to a mean return of 475
   (only when ``rlstash.agents.ppo`` exists).

Goals (issue 12): rlstash >= 1x gymnasium at 4096 envs on the CPU; collector >= 0.8x the env.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import rlstash  # noqa: E402, F401  (registers the ids)
from rlstash.collect import Collector  # noqa: E402
from rlstash.replay import ReplayBuffer  # noqa: E402
from rlstash.spec import Field  # noqa: E402
from rlstash.storage.ram import TensorStorage  # noqa: E402
from rlstash.storage.stream import StreamStorage  # noqa: E402

SIZES = (256, 4096, 65536)
STREAM_INTO = "collector.collect_into(StreamStorage)"
STREAM_EXTEND = "collector + StreamStorage.extend(batch)"
BANK = 64


def env_runs(n: int, device: str) -> dict[str, common.Run]:
    """run(k): k vectorized steps (k * n env steps) of each env, random actions."""
    rng = np.random.default_rng(0)
    bank_np = rng.integers(0, 2, (BANK, n))
    bank_t = torch.from_numpy(bank_np).to(device)
    ours = gym.make_vec(
        "rlstash/CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point", device=device
    )
    theirs = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    ours.reset(seed=0)
    theirs.reset(seed=0)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def run_ours(k: int) -> None:
        for i in range(k):
            ours.step(bank_t[i % BANK])
        sync()  # the timing ends when the device has done the work

    def run_theirs(k: int) -> None:
        for i in range(k):
            theirs.step(bank_np[i % BANK])

    return {"rlstash": run_ours, "gymnasium": run_theirs}


def collector_runs(n: int, device: str, steps: int = 16) -> dict[str, common.Run]:
    """run(k): k batches of ``steps`` vectorized steps of the bare env, or of the collector
    loop into a storage."""
    bare = env_runs(n, device)["rlstash"]
    runs = {"env alone": lambda k: bare(k * steps)}
    spec = {"obs": Field((4,), torch.float32), "action": Field((), torch.int64)}
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for name in (STREAM_INTO, STREAM_EXTEND, "collector + ReplayBuffer(TensorStorage)"):
        env = gym.make_vec(
            "rlstash/CartPole-v1",
            num_envs=n,
            vectorization_mode="vector_entry_point",
            device=device,
        )
        bank = torch.from_numpy(np.random.default_rng(1).integers(0, 2, (BANK, n))).to(device)
        calls = [0]

        def policy(
            obs: torch.Tensor, bank: torch.Tensor = bank, calls: list = calls
        ) -> torch.Tensor:
            calls[0] += 1
            return bank[calls[0] % BANK]  # a random policy at the cost of one index

        c = Collector(env, policy, frames_per_batch=n * steps, seed=0)
        if name == STREAM_INTO:
            store = StreamStorage(spec, n, capacity=n * 64, device=device)

            def run_into(k: int, c: Collector = c, store: StreamStorage = store) -> None:
                for _ in range(k):
                    c.collect_into(store)
                sync()

            runs[name] = run_into
            continue
        if name == STREAM_EXTEND:
            store = StreamStorage(spec, n, capacity=n * 64, device=device)
            extend = store.extend
        else:
            flat = {
                **spec,
                "reward": Field((), torch.float32),
                "terminated": Field((), torch.bool),
                "truncated": Field((), torch.bool),
            }
            rb = ReplayBuffer(TensorStorage(flat, n * 64, device))

            def extend(batch: dict, rb: ReplayBuffer = rb) -> None:
                rb.extend({k: v.reshape(n * steps, *v.shape[2:]) for k, v in batch.items()})

        def run(k: int, c: Collector = c, extend=extend) -> None:
            for _ in range(k):
                extend(c.collect())
            sync()

        runs[name] = run
    runs["bound: env + the two copies"] = copy_bound(n, device, steps)
    runs["layout bound: env + one copy into slot-major rows"] = slot_major_bound(n, device, steps)
    return runs


def _bound_setup(n: int, device: str) -> tuple[Any, torch.Tensor, torch.Tensor, dict]:
    """The bound rows' shared start: ``rlstash/CartPole-v1`` over ``n`` envs, reset; a bank of
    random actions; the slot fields of a CartPole transition."""
    env = gym.make_vec(
        "rlstash/CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point", device=device
    )
    obs, _ = env.reset(seed=0)
    bank = torch.from_numpy(np.random.default_rng(1).integers(0, 2, (BANK, n))).to(device)
    slots = {"obs": Field((4,), torch.float32), "action": Field((), torch.int64),
             "reward": Field((), torch.float32)}  # fmt: skip
    return env, obs, bank, slots


def copy_bound(n: int, device: str, steps: int) -> common.Run:
    """run(k): the env stepped with the bank's actions, each step's outputs copied into a
    [steps, N] batch and each batch copied into the ring's slot-major rows (one block write per
    field, as StreamStorage writes a lockstep chunk): the bytes a collector that returns a
    batch + a stream storage move (the env may reuse its buffers, the batch is the caller's),
    with no bookkeeping at all."""
    env, obs, bank, slots = _bound_setup(n, device)
    lanes, cursor, state = TensorStorage(slots, n * 64, device), [0], [obs]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def run(k: int) -> None:
        for _ in range(k):
            out = {
                "obs": torch.empty((steps, n, 4), device=device),
                "action": torch.empty((steps, n), dtype=torch.int64, device=device),
                "reward": torch.empty((steps, n), device=device),
                "terminated": torch.empty((steps, n), dtype=torch.bool, device=device),
                "truncated": torch.empty((steps, n), dtype=torch.bool, device=device),
            }
            o, act, rew, te, tr = (v.unbind(0) for v in out.values())  # per-step views
            for t in range(steps):
                a = bank[(cursor[0] + t) % BANK]
                o[t].copy_(state[0])
                act[t].copy_(a)
                state[0], r, term, trunc, _ = env.step(a)
                rew[t].copy_(r)
                te[t].copy_(term)
                tr[t].copy_(trunc)
            flat = {f: out[f].reshape(n * steps, *out[f].shape[2:]) for f in slots}
            at = cursor[0] % 64 * n  # 64 is a multiple of steps: the block never wraps
            lanes.write(slice(at, at + n * steps), flat, validate=False)
            cursor[0] = (cursor[0] + steps) % 64
        sync()

    return run


def slot_major_bound(n: int, device: str, steps: int) -> common.Run:
    """run(k): the env stepped with the bank's actions, each step's outputs copied once,
    straight into rows ``pos * N + e`` of a ring (the N envs' slots of one step contiguous:
    StreamStorage's slot-major layout); flags go to a [steps, N] buffer; no bookkeeping."""
    env, obs, bank, slots = _bound_setup(n, device)
    ring = TensorStorage(slots, n * 64, device)
    rows = {k: t.view(64, n, *t.shape[1:]) for k, t in ring.tensors.items()}  # [pos, N, ...]
    cursor, state = [0], [obs]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def run(k: int) -> None:
        for _ in range(k):
            flags = torch.empty((2, steps, n), dtype=torch.bool, device=device)
            for t in range(steps):
                pos = (cursor[0] + t) % 64
                a = bank[(cursor[0] + t) % BANK]
                rows["obs"][pos].copy_(state[0])
                rows["action"][pos].copy_(a)
                state[0], r, term, trunc, _ = env.step(a)
                rows["reward"][pos].copy_(r)
                flags[0, t].copy_(term)
                flags[1, t].copy_(trunc)
            cursor[0] = (cursor[0] + steps) % 64
        sync()

    return run


def section_envs(device: str, reps: int, target_s: float) -> tuple[list[list[str]], dict]:
    rows, ratios = [], {}
    for n in SIZES:
        res = common.interleaved(env_runs(n, device), reps=reps, target_s=target_s)
        ours, theirs = res["rlstash"].median * n, res["gymnasium"].median * n
        ratios[n] = ours / theirs
        rows.append(
            [
                f"{n:,}",
                common.fmt_rate(ours),
                common.fmt_rate(theirs),
                common.fmt_ratio(ratios[n]),
                f"{res['rlstash'].spread:.2f}/{res['gymnasium'].spread:.2f}",
            ]
        )
        print(f"[batched] envs {n}: {ratios[n]:.2f}x", flush=True)
    return rows, ratios


def section_collector(device: str, reps: int, target_s: float) -> tuple[list[list[str]], float]:
    n = 4096
    res = common.interleaved(collector_runs(n, device), reps=reps, target_s=target_s)
    base = res["env alone"].median
    rows = [
        [
            name,
            common.fmt_rate(t.median * n * 16),
            common.fmt_ratio(t.median / base),
            f"{t.spread:.2f}",
        ]
        for name, t in res.items()
    ]
    return rows, res[STREAM_INTO].median / base


def ppo_to_475(device: str, n: int = 1024, budget_s: float = 600.0) -> dict[str, float]:
    """PPO on rlstash/CartPole-v1 with ``n`` envs until the mean return of the last 100
    training episodes reaches 475; env steps and wall seconds (collection + updates)."""
    from rlstash.agents.ppo import PPO, PPOConfig
    from rlstash.spec import Spec
    from rlstash.storage.rollout import RolloutStorage

    T, max_steps = 16, 20_000_000
    cfg = PPOConfig.for_env(
        "CartPole-v1", num_envs=n, rollout_steps=T, minibatch_size=4096, n_epochs=10,
        total_steps=4_000_000, seed=0,
    )  # fmt: skip
    env = gym.make_vec(
        "rlstash/CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point", device=device
    )
    agent = PPO((4,), 2, config=cfg, device=device)
    c = Collector(env, agent.act, T * n, seed=0)
    spec = Spec({"obs": ((4,), "float32"), "action": ((), "int64")})
    rollout = RolloutStorage(spec, T, n, device=device, same_step=c.same_step)
    steps, start = 0, time.perf_counter()
    while steps < max_steps and time.perf_counter() - start < budget_s:
        rollout.add(c.collect(), c.next_obs)
        agent.update(rollout)
        steps += T * n
        if c.stats.count >= 100 and c.stats.mean_return(100) >= 475:
            break
    return {"steps": steps, "seconds": time.perf_counter() - start,
            "mean_return": c.stats.mean_return(100), "episodes": c.stats.count}  # fmt: skip


def section_ppo(device: str, quick: bool) -> list[str]:
    try:
        import rlstash.agents.ppo  # noqa: F401
    except ImportError:
        return ["PPO: not measured: rlstash.agents.ppo is not in this tree"]
    r = ppo_to_475(device, budget_s=60.0 if quick else 600.0)
    reached = r["mean_return"] >= 475
    head = ["env", "envs", "T", "reached 475", "env steps", "seconds", "mean return (last 100)"]
    row = ["rlstash/CartPole-v1", "1,024", "16", "yes" if reached else "no (budget)",
           f"{int(r['steps']):,}", f"{r['seconds']:.1f}", f"{r['mean_return']:.1f}"]  # fmt: skip
    return [
        common.markdown_table(head, [row]),
        "",
        "PPOConfig.for_env('CartPole-v1') with num_envs=1024, rollout_steps=16, minibatch_size=4096, "
        "n_epochs=10, total_steps=4M (annealing); mean of the last 100 training episodes "
        "(stochastic policy); env, rollout storage and learner on the same device.",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3-second smoke run (5 reps, short)")
    ap.add_argument("--device", default="cpu", help="env, storage and policy device")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-ppo", action="store_true", help="skip the PPO learning run")
    ap.add_argument("--out", default=str(HERE / "results" / "batched.md"))
    ap.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="time repetitions in wall seconds or in CPU seconds of this process (cpu: "
        "steadier when other users load the machine; everything here is single-threaded)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.clock == "cpu":
        common.use_cpu_clock()
    reps, target_s = (5, 0.05) if args.quick else (args.reps, 0.3)
    torch.set_num_threads(1)  # gymnasium's numpy env is single-threaded too
    info = common.machine_info()
    info["device"] = args.device
    info["clock"] = "CPU seconds of this process" if args.clock == "cpu" else "wall seconds"
    common.wait_quiet(5 if args.quick else 60, "batched")
    with common.cpu_meter() as meter:
        env_rows, ratios = common.timed_run(lambda: section_envs(args.device, reps, target_s), info)
        coll_rows, frac = section_collector(args.device, reps, target_s)
    ppo_lines = section_ppo(args.device, args.quick) if not args.no_ppo else ["PPO: skipped"]
    info["concurrent load of other users (busy cores, median)"] = round(meter.others, 2)
    goals = [
        f"{'PASS' if ratios[4096] >= 1 else 'FAIL'}: rlstash/CartPole-v1 vs gymnasium at 4096 envs: "
        f"{ratios[4096]:.2f}x (goal >= 1x on the CPU)",
        f"{'PASS' if frac >= 0.8 else 'FAIL'}: collector.collect_into(StreamStorage) at 4096 envs: "
        f"{frac:.2f}x the env's own step rate (goal >= 0.8)",
    ]
    text = "\n".join(
        [
            "# Batched torch envs: rlstash/CartPole-v1 vs gymnasium's numpy CartPole; collector overhead",
            "",
            f"`.venv/bin/python bench/batched.py --device {args.device}"
            f"{' --quick' if args.quick else ''}{' --clock cpu' if args.clock == 'cpu' else ''}`",
            "",
            *common.header_lines(info),
            "",
            "## Goals (issue 12)",
            "",
            *goals,
            "",
            "## Env steps/s (random actions, next-step autoreset, medians of interleaved reps)",
            "",
            common.markdown_table(
                ["envs", "rlstash/CartPole-v1", "gymnasium CartPoleVectorEnv", "ratio", "spread"],
                env_rows,
            ),
            "",
            "## Collector loop at 4096 envs (random torch policy + env + storing), vs the env alone",
            "",
            common.markdown_table(["loop", "env steps/s", "of env alone", "spread"], coll_rows),
            "",
            "## PPO on rlstash/CartPole-v1, 1024 envs",
            "",
            *ppo_lines,
            "",
        ]
    )
    return common.publish(text, args.out, "batched", [])


if __name__ == "__main__":
    sys.exit(main())
