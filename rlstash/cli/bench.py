"""``rlstash bench``: a short measurement of this machine (:mod:`rlstash.diag.bench`).

::

    rlstash bench                                     # CartPole-v1, 8 envs, workers 0 and 2, dqn
    rlstash bench --env Pendulum-v1 --algo sac --envs 16 --workers 0,4,auto --batch-size 512
    rlstash bench --field obs=4x84x84:uint8 --field action=:int64 --capacity 100000
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from rlstash.cli.flags import (
    add_config_flags,
    compute_device,
    config_from_args,
    ints_at_least,
    positive_float,
)
from rlstash.cli.main import describe
from rlstash.settings import check_types
from rlstash.settings import setting as s


@dataclass
class BenchConfig:
    """Settings of ``rlstash bench``."""

    env: str = s("CartPole-v1", "Gymnasium env id.")
    envs: int = s(8, "Envs in the pool.", at_least=1)
    workers: tuple[int | str, ...] = s(
        (0, 2),
        "Worker counts to time, comma-separated, e.g. 0,2,auto.",
        parse=ints_at_least(0, ("auto",)),
        metavar="N,N",
    )
    batch_size: int = s(256, "Rows per sample and per update.", at_least=1)
    algo: str = s("dqn", "Agent whose updates are timed (dqn, sac, ...).")
    capacity: int = s(100_000, "Replay capacity in rows.", at_least=1)
    chunk: int = s(256, "Rows per replay extend.", at_least=1)
    storage: str = s("ram", "Replay storage.", choices=("ram", "disk"))
    device: str = s(
        "cpu",
        "Device of sampled batches and the learner (cpu, cuda[:N], auto).",
        parse=compute_device,
    )
    seconds: float = s(1.0, "Timing per measurement.", parse=positive_float)
    field: tuple[str, ...] = s(
        (),
        "Replay field NAME=SHAPE:DTYPE instead of the env's transitions (repeat).",
        repeat=True,
        metavar="SPEC",
    )

    def __post_init__(self) -> None:
        check_types(self)


def cmd_bench(args: argparse.Namespace) -> int:
    from rlstash.cli.fields import parse_field
    from rlstash.diag.bench import BenchOptions, format_table, measure
    from rlstash.spec import Spec
    from rlstash.train.algos import ALGOS

    args = config_from_args(BenchConfig, args)
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
    """Add ``rlstash bench`` to the ``rlstash`` parser."""
    p = sub.add_parser(
        "bench",
        help="measure this machine: replay rates, env steps/s per worker count, agent updates/s",
        **describe(
            "Measure this machine in about 20 s: replay extend and sample rates, env steps/s\n"
            "for each worker count asked for and the agent's updates/s, then say whether\n"
            "collection or the learner bounds a run (use it to pick --workers and --batch-size).",
            "rlstash bench --env Pendulum-v1 --algo sac --envs 16 --workers 0,4,auto",
            "benchmarks/",
        ),
    )
    add_config_flags(p, BenchConfig)
    p.set_defaults(func=cmd_bench)
