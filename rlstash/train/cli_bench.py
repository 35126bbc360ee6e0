"""``rlstash bench``: a short measurement of this machine (:mod:`rlstash.diag.bench`).

::

    rlstash bench                                     # CartPole-v1, 8 envs, workers 0 and 2, dqn
    rlstash bench --env Pendulum-v1 --algo sac --envs 16 --workers 0,4,auto --batch-size 512
    rlstash bench --field obs=4x84x84:uint8 --field action=:int64 --capacity 100000
"""

from __future__ import annotations

import argparse
import sys

from rlstash.train.flags import compute_device, int_at_least, ints_at_least, positive_float


def cmd_bench(args: argparse.Namespace) -> int:
    from rlstash.diag.bench import BenchOptions, format_table, measure
    from rlstash.spec import Spec
    from rlstash.train.algos import ALGOS
    from rlstash.train.cli import parse_field

    if args.algo not in ALGOS:
        raise ValueError(f"--algo: expected one of {', '.join(ALGOS)}, got {args.algo!r}; pick one")
    spec = Spec(dict(parse_field(f) for f in args.field)) if args.field else None
    opts = BenchOptions(
        env=args.env, envs=args.envs, workers=args.workers, batch_size=args.batch_size,
        algo=args.algo, capacity=args.capacity, chunk=args.chunk, storage=args.storage,
        device=args.device, seconds=args.seconds, spec=spec,
    )  # fmt: skip
    rows = measure(opts, progress=lambda text: print(text, file=sys.stderr, flush=True))
    print(format_table(rows))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench",
        help="measure this machine: replay rates, env steps/s per worker count, agent updates/s",
        description=__doc__.split("::")[0].strip() if __doc__ else None,
    )
    b.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default CartPole-v1)")
    count = int_at_least(1)
    b.add_argument("--envs", type=count, default=8, help="envs in the pool (default 8)")
    b.add_argument(
        "--workers", type=ints_at_least(0, ("auto",)), default=(0, 2),
        help="worker counts to time, comma-separated, e.g. 0,2,auto (default 0,2)",
    )  # fmt: skip
    b.add_argument(
        "--batch-size", type=count, default=256, help="rows per sample and per update (256)"
    )
    b.add_argument("--algo", default="dqn", help="agent whose updates are timed (dqn, sac, ...)")
    b.add_argument(
        "--capacity", type=count, default=100_000, help="replay capacity in rows (100000)"
    )
    b.add_argument("--chunk", type=count, default=256, help="rows per replay extend (256)")
    b.add_argument("--storage", default="ram", choices=["ram", "disk"], help="replay storage")
    b.add_argument(
        "--device", type=compute_device, default="cpu",
        help="device of sampled batches and the learner (cpu, cuda[:N], auto)",
    )  # fmt: skip
    b.add_argument(
        "--seconds", type=positive_float, default=1.0, help="timing per measurement (1.0)"
    )
    b.add_argument(
        "--field", action="append", default=[],
        help="replay field NAME=SHAPE:DTYPE instead of the env's transitions (repeat)",
    )  # fmt: skip
    b.set_defaults(func=cmd_bench)
