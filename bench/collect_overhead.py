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
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CASES = (("CartPole-v1", 32, 400), ("HalfCheetah-v5", 32, 200), ("ALE/Pong-v5", 8, 120))


def main() -> int:
    import collect_backends as cb
    import torch

    from rlstash.envs import envpool_env

    torch.set_num_threads(1)
    inside = [0.0]
    make = envpool_env.EnvPoolVectorEnv._make

    def timed_make(self, seed):  # EnvPool's send/recv (its step calls them) timed
        pool = make(self, seed)
        for name in ("send", "recv"):
            f = getattr(pool, name)

            def timed(*a, _f=f, **k):
                t = time.perf_counter()
                try:
                    return _f(*a, **k)
                finally:
                    inside[0] += time.perf_counter() - t

            setattr(pool, name, timed)
        return pool

    envpool_env.EnvPoolVectorEnv._make = timed_make
    modes = ("sync",) if sys.argv[1:] == ["sync"] else ("sync", "async")
    print("| env | N | loop | rlstash's share, median (min-max) | implied ratio to EnvPool alone |")
    print("| --- | ---: | --- | ---: | ---: |")
    for env, n, steps in CASES:
        for mode in modes:
            run, close = cb._envpool_stream(env, n, 2, n // 2 if mode == "async" else None)
            run(8)
            shares = []
            for _ in range(5):
                inside[0] = 0.0
                t = time.perf_counter()
                run(steps)
                shares.append(1 - inside[0] / (time.perf_counter() - t))
            close()
            shares.sort()
            print(
                f"| {env} | {n} | {mode} | {shares[2]:.1%} ({shares[0]:.1%}-{shares[-1]:.1%}) "
                f"| {1 - shares[2]:.2f}x |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
