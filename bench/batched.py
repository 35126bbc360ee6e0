#!/usr/bin/env python3
"""Batched torch envs: rlstash/CartPole-v1 and rlstash/Pendulum-v1 against gymnasium, the
Collector's overhead over the env's own step rate, and PPO to 475 on CartPole.

    .venv/bin/python bench/batched.py [--quick] [--device cpu|cuda] [--reps N] [--clock cpu]
        [--ppo-envs N] [--ppo-budget S] [--collector-envs 4096,65536] [--out PATH]
        [--sections cartpole,pendulum,collector,ppo] [--max-seconds S] [--wait-quiet S]

Runs in the project's ``.venv`` (gymnasium is a dependency; no peers to install). With
``--device cuda`` the batched envs, the policy, the storages and PPO run on the GPU; the
gymnasium references stay numpy on the CPU (one thread), as their users run them. Every
timed repetition on CUDA ends with ``torch.cuda.synchronize``, so a rate counts work the
device has done, not work queued. The report is rewritten after every section (a run cut
short keeps what it measured); a section that fails is reported as failed, the rest go on.

1. Env steps/s: ``gym.make_vec("rlstash/CartPole-v1", N, "vector_entry_point",
   device=...)`` at 256, 4096 and 65536 envs against gymnasium's numpy ``CartPoleVectorEnv``
   (``gym.make_vec("CartPole-v1", N, "vector_entry_point")``); ``rlstash/Pendulum-v1`` at
   4096 and 65536 envs against ``gym.make_vec("Pendulum-v1", 4096, "sync")`` (gymnasium has
   no numpy-batched Pendulum: a SyncVectorEnv of 4096 single envs is what it offers; only at
   4096 envs, few steps). Random actions (a bank of 64 pre-drawn action vectors per env,
   cycled: the policy's cost is not in this number), next-step autoreset on both, timed
   interleaved (``common.interleaved``), medians.
2. Collector overhead at 4096 envs (and 65536 on CUDA: ``--collector-envs``): steps/s of the
   collector loop (a random policy that picks one of 64 pre-drawn action vectors on the env's
   device + env step + storing + episode statistics, 16 steps per batch, the statistics read
   every 4 batches as a training loop logs them) as a fraction of the env's own step rate
   (section 1's loop), interleaved. Storing: ``Collector.collect_into(StreamStorage)`` (on the
   CPU each step copied once, straight into the stream's slot-major rows; on a GPU it is
   ``extend(collect())``); ``extend`` of each [16, N] batch into a StreamStorage and,
   flattened to rows, into a ``ReplayBuffer`` over a TensorStorage ring. Two bounds without
   any bookkeeping: the env plus the two copies of a batch path (step outputs into the batch,
   the batch into slot-major rows), and the env plus one copy per step into slot-major rows.
3. PPO on rlstash/CartPole-v1 with ``--ppo-envs`` envs (1024 on the CPU, 4096 on CUDA): env
   steps and seconds to a mean return of 475 (at most ``--ppo-budget`` seconds).

Goals (issue 12): rlstash >= 1x gymnasium at 4096 envs on the CPU; collector >= 0.8x the env.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
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
PENDULUM_SIZES = (4096, 65536)
PENDULUM_SYNC_MAX = 4096  # gymnasium's Pendulum reference (a SyncVectorEnv) up to this many envs
STREAM_INTO = "collector.collect_into(StreamStorage)"
STREAM_EXTEND = "collector + StreamStorage.extend(batch)"
BANK = 64
SECTIONS = ("cartpole", "pendulum", "collector", "ppo")
STATS_EVERY = 4  # collector loops read the episode statistics every this many batches
# env key -> (rlstash id, gymnasium id, gymnasium's vectorization, observation width)
ENVS = {
    "cartpole": ("rlstash/CartPole-v1", "CartPole-v1", "vector_entry_point", 4),
    "pendulum": ("rlstash/Pendulum-v1", "Pendulum-v1", "sync", 3),
}


def syncer(device: str) -> Callable[[], None]:
    """What ends a timed repetition: ``torch.cuda.synchronize`` on CUDA (the rate then counts
    work done, not work queued), nothing elsewhere (CPU work is done when the call returns)."""
    if torch.device(device).type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def action_bank(env: str, n: int, seed: int = 0) -> np.ndarray:
    """``BANK`` pre-drawn random action vectors of ``n`` envs: CartPole ints in {0, 1}
    ``[BANK, n]``; Pendulum float32 torques in [-2, 2] ``[BANK, n, 1]``."""
    rng = np.random.default_rng(seed)
    if env == "cartpole":
        return rng.integers(0, 2, (BANK, n))
    return rng.uniform(-2.0, 2.0, (BANK, n, 1)).astype(np.float32)


def make_ours(env: str, n: int, device: str) -> Any:
    return gym.make_vec(
        ENVS[env][0], num_envs=n, vectorization_mode="vector_entry_point", device=device
    )


def env_runs(n: int, device: str, env: str = "cartpole") -> dict[str, common.Run]:
    """run(k): k vectorized steps (k * n env steps) of each env, random actions. gymnasium's
    Pendulum (a SyncVectorEnv of single envs) only up to ``PENDULUM_SYNC_MAX`` envs."""
    bank_np = action_bank(env, n)
    bank_t = torch.from_numpy(bank_np).to(device)
    ours = make_ours(env, n, device)
    ours.reset(seed=0)
    sync = syncer(device)

    def run_ours(k: int) -> None:
        for i in range(k):
            ours.step(bank_t[i % BANK])
        sync()  # the timing ends when the device has done the work

    runs: dict[str, common.Run] = {"rlstash": run_ours}
    _, ref_id, mode, _ = ENVS[env]
    if mode == "sync" and n > PENDULUM_SYNC_MAX:
        return runs
    theirs = gym.make_vec(ref_id, num_envs=n, vectorization_mode=mode)
    theirs.reset(seed=0)

    def run_theirs(k: int) -> None:
        for i in range(k):
            theirs.step(bank_np[i % BANK])

    runs["gymnasium"] = run_theirs
    return runs


def _with_stats(c: Collector, each: Callable[[], object], sync: Callable[[], None]) -> common.Run:
    """run(k): ``each()`` k times (one batch each), the collector's episode statistics read
    every ``STATS_EVERY`` batches (on CUDA that waits for their copy to the host) and, after
    ``sync``, at the end: on CUDA unread statistics would hold a pinned [16, N] copy per
    batch."""

    def run(k: int) -> None:
        for i in range(k):
            each()
            if i % STATS_EVERY == STATS_EVERY - 1:
                c.stats  # noqa: B018  (reading drains the pending episode statistics)
        sync()
        c.stats  # noqa: B018

    return run


def collector_runs(n: int, device: str, steps: int = 16) -> dict[str, common.Run]:
    """run(k): k batches of ``steps`` vectorized steps of the bare env, or of the collector
    loop into a storage."""
    bare = env_runs(n, device)["rlstash"]
    runs = {"env alone": lambda k: bare(k * steps)}
    spec = {"obs": Field((4,), torch.float32), "action": Field((), torch.int64)}
    sync = syncer(device)
    for name in (STREAM_INTO, STREAM_EXTEND, "collector + ReplayBuffer(TensorStorage)"):
        env = make_ours("cartpole", n, device)
        bank = torch.from_numpy(action_bank("cartpole", n, seed=1)).to(device)
        calls = [0]

        def policy(
            obs: torch.Tensor, bank: torch.Tensor = bank, calls: list = calls
        ) -> torch.Tensor:
            calls[0] += 1
            return bank[calls[0] % BANK]  # a random policy at the cost of one index

        c = Collector(env, policy, frames_per_batch=n * steps, seed=0)
        if name == STREAM_INTO:
            store = StreamStorage(spec, n, capacity=n * 64, device=device)
            runs[name] = _with_stats(c, lambda c=c, store=store: c.collect_into(store), sync)
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

        runs[name] = _with_stats(c, lambda c=c, extend=extend: extend(c.collect()), sync)
    runs["bound: env + the two copies"] = copy_bound(n, device, steps)
    runs["layout bound: env + one copy into slot-major rows"] = slot_major_bound(n, device, steps)
    return runs


def _bound_setup(n: int, device: str) -> tuple[Any, torch.Tensor, torch.Tensor, dict]:
    """The bound rows' shared start: ``rlstash/CartPole-v1`` over ``n`` envs, reset; a bank of
    random actions; the slot fields of a CartPole transition."""
    env = make_ours("cartpole", n, device)
    obs, _ = env.reset(seed=0)
    bank = torch.from_numpy(action_bank("cartpole", n, seed=1)).to(device)
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
    sync = syncer(device)

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
    sync = syncer(device)

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


def section_envs(
    device: str, reps: int, target_s: float, env: str, sizes: tuple[int, ...]
) -> tuple[list[list[str]], dict]:
    rows, ratios = [], {}
    for n in sizes:
        res = common.interleaved(env_runs(n, device, env), reps=reps, target_s=target_s)
        ours = res["rlstash"].median * n
        theirs = res["gymnasium"].median * n if "gymnasium" in res else None
        ratios[n] = ours / theirs if theirs else None
        spread = "/".join(f"{t.spread:.2f}" for t in res.values())
        rows.append([f"{n:,}", common.fmt_rate(ours), common.fmt_rate(theirs),
                     common.fmt_ratio(ratios[n]), spread])  # fmt: skip
        print(f"[batched] {env} {n} envs: {common.fmt_rate(ours)} steps/s, "
              f"{common.fmt_ratio(ratios[n])} gymnasium", flush=True)  # fmt: skip
    return rows, ratios


def section_collector(device: str, reps: int, target_s: float, n: int) -> tuple[list, float]:
    res = common.interleaved(collector_runs(n, device), reps=reps, target_s=target_s)
    base = res["env alone"].median
    rows = [
        [
            name,
            common.fmt_rate(t.median * n * 16),
            common.fmt_ratio(t.median / base),
            f"{t.spread:.2f}",
        ]  # fmt: skip
        for name, t in res.items()
    ]
    frac = res[STREAM_INTO].median / base
    print(f"[batched] collector {n} envs: collect_into {frac:.2f}x the env", flush=True)
    return rows, frac


def ppo_settings(n: int) -> dict[str, Any]:
    """PPO's settings at ``n`` envs, scaled from the tuned 1024-env run (rollout 16 steps,
    minibatches of 4096 rows, 10 epochs, annealing over 4M steps): the minibatch grows with
    the envs (4 minibatches per rollout, so as many gradient steps per rollout) and so does
    the annealing horizon (the same number of rollouts, 244); the rest is
    ``PPOConfig.for_env('CartPole-v1')``'s preset (lr 1e-3 and clip range annealed, gamma
    0.98, lambda 0.8)."""
    T = 16
    return dict(num_envs=n, rollout_steps=T, minibatch_size=4 * n, n_epochs=10,
                total_steps=4_000_000 * n // 1024, seed=0)  # fmt: skip


def ppo_to_475(device: str, n: int, budget_s: float, compile_: Any) -> dict[str, float]:
    """PPO on rlstash/CartPole-v1 with ``n`` envs until the mean return of the last 100
    training episodes reaches 475 (or ``budget_s`` passed); env steps and wall seconds
    (collection + updates; on CUDA up to a synchronize)."""
    from rlstash.agents.ppo import PPO, PPOConfig
    from rlstash.spec import Spec
    from rlstash.storage.rollout import RolloutStorage

    settings = ppo_settings(n)
    T, max_steps = settings["rollout_steps"], 20_000_000 * max(1, n // 1024)
    cfg = PPOConfig.for_env("CartPole-v1", **settings, compile=compile_)
    env = make_ours("cartpole", n, device)
    agent = PPO((4,), 2, config=cfg, device=device)
    c = Collector(env, agent.act, T * n, seed=0)
    spec = Spec({"obs": ((4,), "float32"), "action": ((), "int64")})
    rollout = RolloutStorage(spec, T, n, device=device, same_step=c.same_step)
    sync = syncer(device)
    sync()
    steps, start, last = 0, time.perf_counter(), time.perf_counter()
    while steps < max_steps and time.perf_counter() - start < budget_s:
        rollout.add(c.collect(), c.next_obs)
        agent.update(rollout)
        steps += T * n
        mean = c.stats.mean_return(100)  # waits for the batch's statistics (host copy)
        if time.perf_counter() - last > 5:
            last = time.perf_counter()
            print(f"[batched] ppo {steps:,} steps, {last - start:.0f} s, mean return "
                  f"{mean:.1f}", flush=True)  # fmt: skip
        if c.stats.count >= 100 and mean >= 475:
            break
    sync()
    return {"steps": steps, "seconds": time.perf_counter() - start,
            "mean_return": c.stats.mean_return(100), "episodes": c.stats.count}  # fmt: skip


def section_ppo(device: str, n: int, budget_s: float, compile_: Any) -> list[str]:
    try:
        import rlstash.agents.ppo  # noqa: F401
    except ImportError:
        return ["PPO: not measured: rlstash.agents.ppo is not in this tree"]
    r = ppo_to_475(device, n, budget_s, compile_)
    reached = r["mean_return"] >= 475
    s = ppo_settings(n)
    head = ["env", "envs", "T", "reached 475", "env steps", "seconds", "env steps/s",
            "mean return (last 100)"]  # fmt: skip
    row = ["rlstash/CartPole-v1", f"{n:,}", str(s["rollout_steps"]),
           "yes" if reached else f"no (budget {budget_s:.0f} s)", f"{int(r['steps']):,}",
           f"{r['seconds']:.1f}", common.fmt_rate(r["steps"] / max(r["seconds"], 1e-9)),
           f"{r['mean_return']:.1f}"]  # fmt: skip
    print(f"[batched] ppo: {row}", flush=True)
    return [
        common.markdown_table(head, [row]),
        "",
        f"PPOConfig.for_env('CartPole-v1') with num_envs={n}, rollout_steps={s['rollout_steps']}, "
        f"minibatch_size={s['minibatch_size']}, n_epochs={s['n_epochs']}, "
        f"total_steps={s['total_steps']:,} (annealing), compile={compile_!r}; mean of the last "
        "100 training episodes (stochastic policy); env, rollout storage and learner on "
        f"{device}.",
    ]


def gpu_info(device: str) -> dict[str, object]:
    """The GPU's name, its driver (``nvidia-smi``, 10 s at most) and torch's CUDA version."""
    info: dict[str, object] = {"gpu": torch.cuda.get_device_name(device),
                               "torch_cuda": torch.version.cuda}  # fmt: skip
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        info["nvidia-smi"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else "—"
    except (OSError, subprocess.TimeoutExpired) as e:
        info["nvidia-smi"] = f"not read: {e}"
    return info


def resolve(args: argparse.Namespace) -> None:
    """The device as torch places tensors (``cuda`` -> ``cuda:<current>``; refused at once
    without CUDA) and the defaults that depend on it: on CUDA 65536 collector envs too, PPO
    on 4096 envs for 90 s at most, eager updates (a compilation could outlast the budget:
    compiled updates are bench/updates.py's), no waiting for a quiet machine."""
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch.cuda.is_available() is False here")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        args.device = f"cuda:{index}"
        if args.clock == "cpu":
            raise SystemExit("--clock cpu: the CPU clock misses GPU time; use --clock wall")
    if args.collector_envs is None:
        args.collector_envs = "4096,65536" if cuda else "4096"
    args.sections = tuple(x for x in str(args.sections).split(",") if x)
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"--sections: unknown {unknown}; expected some of {list(SECTIONS)}")
    if args.no_ppo:
        args.sections = tuple(x for x in args.sections if x != "ppo")
    args.collector_sizes = tuple(int(x) for x in str(args.collector_envs).split(",") if x)
    if args.ppo_envs is None:
        args.ppo_envs = 4096 if cuda else 1024
    if args.ppo_budget is None:
        args.ppo_budget = 60.0 if args.quick else 90.0 if cuda else 600.0
    if args.ppo_compile is None:
        args.ppo_compile = "false" if cuda else "auto"
    args.ppo_compile = {"true": True, "false": False}.get(args.ppo_compile, args.ppo_compile)
    if args.wait_quiet is None:
        args.wait_quiet = 0.0 if cuda else 5.0 if args.quick else 60.0
    if args.max_seconds is None:
        args.max_seconds = 300.0 if cuda else 0.0


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short smoke run (5 reps, short)")
    ap.add_argument("--device", default="cpu", help="env, storage and policy device")
    ap.add_argument("--reps", type=int, default=7, help="interleaved repetitions (>= 5)")
    ap.add_argument("--no-ppo", action="store_true", help="skip the PPO learning run")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated sections to run (default all: {','.join(SECTIONS)}; "
                    "e.g. to rerun only a failed one)")  # fmt: skip
    ap.add_argument("--ppo-envs", type=int, default=None, help="PPO's envs (1024; cuda: 4096)")
    ap.add_argument("--ppo-budget", type=float, default=None,
                    help="PPO's seconds at most (600; cuda: 90; --quick: 60)")  # fmt: skip
    ap.add_argument("--ppo-compile", choices=("auto", "true", "false"), default=None,
                    help="PPOConfig.compile (auto; cuda: false)")  # fmt: skip
    ap.add_argument("--collector-envs", default=None,
                    help="comma-separated env counts of the collector section (4096; cuda: "
                    "4096,65536)")  # fmt: skip
    ap.add_argument("--wait-quiet", type=float, default=None,
                    help="seconds at most to wait for a quiet machine first (60; --quick: 5; "
                    "cuda: 0)")  # fmt: skip
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="watchdog: dump the stacks and exit after this many seconds (0: "
                    "off; cuda: 300); the report keeps the sections done")  # fmt: skip
    ap.add_argument("--out", default=str(HERE / "results" / "batched.md"))
    ap.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="time repetitions in wall seconds or in CPU seconds of this process (cpu: "
        "steadier when other users load the machine; everything here is single-threaded)",
    )  # fmt: skip
    args = ap.parse_args()
    resolve(args)
    return args


class Report:
    """The markdown report, rewritten to ``--out`` after every section; a failed section is
    reported with its error and the others go on."""

    def __init__(self, args: argparse.Namespace, info: dict) -> None:
        self.args, self.info = args, info
        self.goals: list[str] = []
        self.sections: list[tuple[str, list[str]]] = []
        self.failed: list[str] = []

    def run(self, title: str, body: Callable[[], list[str]]) -> None:
        print(f"[batched] {title} ...", flush=True)
        start = time.perf_counter()
        try:
            lines = body()
        except Exception as e:  # noqa: BLE001  (reported; the other sections still run)
            traceback.print_exc()
            self.failed.append(title)
            lines = [f"FAILED: {type(e).__name__}: {e}"]
        took = time.perf_counter() - start
        print(f"[batched] {title}: {took:.1f} s", flush=True)
        self.sections.append((title, [*lines, "", f"({took:.0f} s)"]))
        self.write()

    def text(self) -> str:
        a = self.args
        flags = f" --device {a.device}" + (" --quick" if a.quick else "")
        flags += " --clock cpu" if a.clock == "cpu" else ""
        flags += "" if a.quick else f" --reps {a.reps}"
        flags += "" if a.sections == SECTIONS else f" --sections {','.join(a.sections)}"
        lines = [
            "# Batched torch envs: rlstash/CartPole-v1 and rlstash/Pendulum-v1 vs gymnasium; "
            "collector overhead; PPO to 475",
            "",
            f"`python bench/batched.py{flags}`",
            "",
            *common.header_lines(self.info),
            "",
        ]
        if self.goals:
            lines += ["## Goals (issue 12)", "", *self.goals, ""]
        for title, body in self.sections:
            lines += [f"## {title}", "", *body, ""]
        return "\n".join(lines)

    def write(self) -> None:
        path = Path(self.args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text())


def main() -> int:
    args = parse_args()
    if args.max_seconds > 0:  # never hang: stacks on stderr, then exit (the report is on disk)
        faulthandler.dump_traceback_later(args.max_seconds, exit=True)
    if args.clock == "cpu":
        common.use_cpu_clock()
    reps, target_s = (5, 0.05) if args.quick else (args.reps, 0.3)
    torch.set_num_threads(1)  # gymnasium's numpy env is single-threaded too
    info = common.machine_info()
    info["device"] = args.device
    if args.device.startswith("cuda"):
        info.update(gpu_info(args.device))
    info["clock"] = "CPU seconds of this process" if args.clock == "cpu" else "wall seconds"
    if args.wait_quiet > 0:
        common.wait_quiet(args.wait_quiet, "batched")
    rep = Report(args, info)
    ratios: dict[int, Any] = {}
    fracs: dict[int, float] = {}
    dev = args.device
    run_start = time.time()

    def envs(env: str, sizes: tuple[int, ...], ref: str) -> list[str]:
        rows, r = section_envs(dev, reps, target_s, env, sizes)
        if env == "cartpole":
            ratios.update(r)
        head = ["envs", ENVS[env][0], ref, "ratio", "spread"]
        return [common.markdown_table(head, rows)]

    def collector(n: int) -> list[str]:
        rows, fracs[n] = section_collector(dev, reps, target_s, n)
        table = common.markdown_table(["loop", "env steps/s", "of env alone", "spread"], rows)
        if not dev.startswith("cuda"):
            return [table]
        return [table, "", "On CUDA `collect_into` is `extend(collect())` (steps are copied in "
                "place only into CPU rows); StreamStorage.extend reads the batch's flags on the "
                "host once per batch (one blocking copy)."]  # fmt: skip

    where = f"{dev}; gymnasium: numpy on the CPU, one thread"
    want = args.sections
    with common.cpu_meter() as meter:
        if "cartpole" in want:
            rep.run(
                f"CartPole env steps/s ({where}; random actions, next-step autoreset, medians)",
                lambda: envs("cartpole", SIZES, "gymnasium CartPoleVectorEnv"),
            )
        if "pendulum" in want:
            rep.run(
                f"Pendulum env steps/s ({where})",
                lambda: [
                    *envs("pendulum", PENDULUM_SIZES, "gymnasium SyncVectorEnv of Pendulum-v1"),
                    "",
                    "gymnasium has no numpy-batched Pendulum: its reference is a SyncVectorEnv of 4096 "
                    "single Pendulum-v1 envs (a Python loop), measured at 4096 envs only (—: not run).",
                ],
            )
        for n in args.collector_sizes if "collector" in want else ():
            rep.run(f"Collector loop at {n} envs on {dev} (random torch policy + env + storing),"
                    " vs the env alone", lambda n=n: collector(n))  # fmt: skip
    info["concurrent load of other users (busy cores, median)"] = round(meter.others, 2)
    if "ppo" in want:
        rep.run(f"PPO on rlstash/CartPole-v1, {args.ppo_envs} envs on {dev}",
                lambda: section_ppo(dev, args.ppo_envs, args.ppo_budget, args.ppo_compile))  # fmt: skip
    info["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    info["wall_time_s"] = round(time.time() - run_start)
    if 4096 in ratios and ratios[4096] is not None:
        ok = "PASS" if ratios[4096] >= 1 else "FAIL"
        rep.goals.append(f"{ok}: rlstash/CartPole-v1 ({dev}) vs gymnasium (numpy, CPU) at 4096 "
                         f"envs: {ratios[4096]:.2f}x (goal >= 1x, set for the CPU)")  # fmt: skip
    for n, frac in fracs.items():
        rep.goals.append(f"{'PASS' if frac >= 0.8 else 'FAIL'}: {STREAM_INTO} at {n} envs on "
                         f"{dev}: {frac:.2f}x the env's own step rate (goal >= 0.8)")  # fmt: skip
    faulthandler.cancel_dump_traceback_later()
    return common.publish(rep.text(), args.out, "batched", rep.failed)


if __name__ == "__main__":
    sys.exit(main())
