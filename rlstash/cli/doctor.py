"""``rlstash doctor``: what matters for RL runs on this machine (:mod:`rlstash.diag.doctor`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rlstash.cli.flags import add_config_flags, config_from_args
from rlstash.cli.main import describe
from rlstash.settings import check_types
from rlstash.settings import setting as s


@dataclass
class DoctorConfig:
    """Settings of ``rlstash doctor``."""

    run_dir: str = s("runs", "Where runs and disk buffers go.")

    def __post_init__(self) -> None:
        check_types(self)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Print the machine's report."""
    from rlstash.diag.doctor import diagnose

    cfg = config_from_args(DoctorConfig, args)
    report = diagnose(cfg.run_dir)
    print(report.format())
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``rlstash doctor`` to the ``rlstash`` parser."""
    p = sub.add_parser(
        "doctor",
        help="what matters for RL runs on this machine",
        **describe(
            "Check this machine for what RL runs depend on: CUDA, free RAM and disk, /dev/shm,\n"
            "the open-file limit and the process start methods, each with a fix where it falls\n"
            "short.",
            "rlstash doctor",
        ),
    )
    add_config_flags(p, DoctorConfig)
    p.set_defaults(func=cmd_doctor)
