"""``rlstash eval``: run a saved policy and print its return statistics."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from rlstash.cli.flags import add_config_flags, config_from_args
from rlstash.cli.main import describe
from rlstash.settings import check_types
from rlstash.settings import setting as s


@dataclass
class EvalConfig:
    """Settings of ``rlstash eval``."""

    run: str = s(
        "",
        "Run directory (runs/<name>), or hf://USER/NAME: an agent on the Hugging Face Hub "
        "(fetched into its cache; needs rlstash[hub]).",
        positional=True,
    )
    episodes: int = s(10, "Episodes to run.", at_least=1)
    seed: int = s(12345, "Seed of the first episode.", at_least=0)
    video: bool = s(
        False,
        "Record the episodes of evaluation env 0 to RUN/videos/*.mp4 (hf://USER/NAME: "
        "./videos/USER--NAME/*.mp4; needs rlstash[video]).",
    )

    def __post_init__(self) -> None:
        check_types(self)


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate the run's saved policy and print one line of statistics."""
    from rlstash.train.evaluate import evaluate_run

    args = config_from_args(EvalConfig, args)
    run, video_dir = Path(args.run), None
    if args.run.startswith("hf://"):
        from rlstash.hub import pull

        run = pull(args.run, field="run")
        video_dir = Path("videos") / args.run.removeprefix("hf://").replace("/", "--")
    out = evaluate_run(
        run, episodes=args.episodes, seed=args.seed, video=args.video, video_dir=video_dir
    )
    r = out["returns"]
    print(
        f"{args.run}: {len(r)} episodes, return mean {r.mean():.2f} +- {r.std():.2f} (min {r.min():.1f}, max {r.max():.1f}), length mean {out['lengths'].mean():.1f}"
    )
    for path in out.get("videos", ()):
        print(f"video: {path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``rlstash eval`` to the ``rlstash`` parser."""
    p = sub.add_parser(
        "eval",
        help="run a saved policy and print return statistics",
        **describe(
            "Load a run's checkpoint (verified first), play its policy for some episodes and\n"
            "print the return statistics; --video records the episodes to MP4.",
            "rlstash eval runs/dqn-CartPole-v1-s0",
            "getting-started/#evaluating-and-resuming",
        ),
    )
    add_config_flags(p, EvalConfig)
    p.set_defaults(func=cmd_eval)
