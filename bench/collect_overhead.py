#!/usr/bin/env python3
"""rlstash's own share of the time of an EnvPool collection loop into a StreamStorage.

    .venv/bin/python bench/collect_overhead.py          # sync and async (batch N/2)
    .venv/bin/python bench/collect_overhead.py sync     # sync only

Under the other helpers' load, rates of two loops timed one after the other differ by 2x
(bench/results/collect_backends.md: spread 79-123%), so "EnvPool through rlstash / EnvPool
alone" cannot be resolved there. This measures, within one loop, the time spent inside
EnvPool's ``send``/``recv`` (stepping, waiting for its threads) against the whole loop
(``Collector.collect_into`` or ``AsyncBatchCollector.collect_into`` into a StreamStorage,
bench/collect_backends.py's peers): ``1 - share`` is the ratio to EnvPool alone if EnvPool's
own time per step is the same in both loops. Medians of 5 repetitions.

Under load that wall-clock share is noisy (a descheduled moment counts as rlstash's), so the
loop's own CPU time is measured too: ``time.thread_time`` of the collecting thread outside
EnvPool's calls, per env step (``rlstash us/step``), beside EnvPool's wall time inside its
calls per env step; ``CPU-implied ratio`` = inside / (inside + rlstash's CPU), what the loop
would reach if nothing else ran. ``CASES=CartPole-v1,...`` picks the cases.

``collect_overhead.py pure``: rlstash's loop alone over an env that costs nothing (recv/step
return the same arrays), CPU microseconds per env step of ``Collector.collect_into`` and
``AsyncBatchCollector.collect_into`` into the StreamStorage, medians of 9: the number the
per-step work is cut by, free of EnvPool and of the load's noise in its threads.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CASES = tuple(
    c
    for c in (("CartPole-v1", 32, 400), ("HalfCheetah-v5", 32, 200), ("ALE/Pong-v5", 8, 120))
    if c[0] in os.environ.get("CASES", c[0])
)


class _Free:
    """An env that costs nothing: CartPole's spaces, fixed arrays, ready envs in turn."""

    def __init__(self, n: int, batch: int | None) -> None:
        import gymnasium as gym
        import numpy as np
        from gymnasium.vector.utils import batch_space

        self.num_envs, self.batch = n, batch or n
        self.single_observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        b = self.batch
        self.obs = np.zeros((n, 4), np.float32)
        self.rew, self.flags = np.ones(n), np.zeros(n, bool)
        self.rew_b, self.flags_b, self.obs_b = np.ones(b), np.zeros(b, bool), self.obs[:b]
        self.groups = [np.arange(i, i + b) for i in range(0, n, b)]
        self.turn = 0

    def reset(self, seed=None, options=None):
        return self.obs.copy(), {}

    def step(self, actions):
        return self.obs.copy(), self.rew, self.flags, self.flags, {}

    def async_reset(self) -> None:
        self.turn = 0

    def recv(self):
        ids = self.groups[self.turn % len(self.groups)]
        self.turn += 1
        return self.obs_b, self.rew_b, self.flags_b, self.flags_b, {"env_id": ids}

    def send(self, actions, env_ids) -> None:
        pass


def pure(n: int = 32, steps: int = 400) -> None:
    import numpy as np
    import torch
    from collect_backends import T, _stream

    from rlstash.collect.async_batches import AsyncBatchCollector
    from rlstash.collect.sync import Collector

    torch.set_num_threads(1)
    acts = np.zeros(n, np.int64)
    print("| loop | rlstash CPU us per env step, median of 9 (min-max) |")
    print("| --- | ---: |")
    for mode in ("sync", "async"):
        env = _Free(n, n // 2 if mode == "async" else None)
        store = _stream(env, n)
        if mode == "sync":
            c = Collector(env, lambda obs: torch.as_tensor(acts), n * T, device="cpu")

            def run(k, c=c, store=store):
                for _ in range(k // T):
                    c.collect_into(store)
        else:
            a = AsyncBatchCollector(env, lambda obs, ids: acts[: len(ids)])

            def run(k, a=a, store=store):
                a.collect_into(store, steps=k * n)

        run(16)
        cpu = []
        for _ in range(9):
            t = time.thread_time()
            run(steps)
            cpu.append((time.thread_time() - t) / (steps * n) * 1e6)
        cpu.sort()
        print(f"| {mode} | {cpu[4]:.2f} ({cpu[0]:.2f}-{cpu[-1]:.2f}) |", flush=True)


def main() -> int:
    import collect_backends as cb
    import torch

    from rlstash.envs import envpool_env

    torch.set_num_threads(1)
    inside = [0.0, 0.0]  # wall, thread CPU inside EnvPool's send/recv
    make = envpool_env.EnvPoolVectorEnv._make

    def timed_make(self, seed):  # EnvPool's send/recv (its step calls them) timed
        pool = make(self, seed)
        for name in ("send", "recv"):
            f = getattr(pool, name)

            def timed(*a, _f=f, **k):
                t, c = time.perf_counter(), time.thread_time()
                try:
                    return _f(*a, **k)
                finally:
                    inside[0] += time.perf_counter() - t
                    inside[1] += time.thread_time() - c

            setattr(pool, name, timed)
        return pool

    if sys.argv[1:] == ["pure"]:
        pure()
        return 0
    envpool_env.EnvPoolVectorEnv._make = timed_make
    modes = ("sync",) if sys.argv[1:] == ["sync"] else ("sync", "async")
    print(
        "| env | N | loop | rlstash's share, median (min-max) | implied ratio to EnvPool alone "
        "| rlstash us/step (CPU) | EnvPool us/step (wall) | CPU-implied ratio |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for env, n, steps in CASES:
        for mode in modes:
            run, close = cb._envpool_stream(env, n, 2, n // 2 if mode == "async" else None)
            run(8)
            shares, own, envpool = [], [], []
            for _ in range(5):
                inside[:] = [0.0, 0.0]
                t, c = time.perf_counter(), time.thread_time()
                run(steps)
                shares.append(1 - inside[0] / (time.perf_counter() - t))
                own.append((time.thread_time() - c - inside[1]) / (steps * n) * 1e6)
                envpool.append(inside[0] / (steps * n) * 1e6)
            close()
            shares.sort()
            mine, theirs = sorted(own)[2], sorted(envpool)[2]
            print(
                f"| {env} | {n} | {mode} | {shares[2]:.1%} ({shares[0]:.1%}-{shares[-1]:.1%}) "
                f"| {1 - shares[2]:.2f}x | {mine:.2f} | {theirs:.2f} "
                f"| {theirs / (theirs + mine):.2f}x |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
