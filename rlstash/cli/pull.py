"""``rlstash pull USER/NAME``: fetch an agent from the Hugging Face Hub into its cache
(:func:`rlstash.hub.pull`; offline once cached) and print where it is;
``rlstash eval hf://USER/NAME`` runs it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rlstash.cli.flags import add_config_flags, config_from_args
from rlstash.cli.main import describe
from rlstash.settings import check_types
from rlstash.settings import setting as s


@dataclass
class PullConfig:
    """Settings of ``rlstash pull``."""

    repo: str = s("", "Hub repository USER/NAME (or hf://USER/NAME).", positional=True)
    revision: str = s("", "Branch, tag or commit (default: main).")

    def __post_init__(self) -> None:
        check_types(self)


def cmd_pull(args: argparse.Namespace) -> int:
    """Fetch (or find in the cache) and check the agent; print its directory and score."""
    import json

    from rlstash.hub import pull
    from rlstash.train import rundir

    cfg = config_from_args(PullConfig, args)
    path = pull(cfg.repo, revision=cfg.revision or None, field="repo")
    rundir.read_checkpoint(path)  # the manifest and the SHA-256 of the weights
    results = path / "results.json"
    score = ""
    if results.exists():
        r = json.loads(results.read_text())
        score = f" ({r['algo']} on {r['env_id']}, mean_reward {r['mean_reward']:.2f} +/- {r['std_reward']:.2f})"
    print(f"{path}{score}")
    print(f"evaluate it: rlstash eval hf://{cfg.repo.removeprefix('hf://')}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``rlstash pull`` to the ``rlstash`` parser."""
    p = sub.add_parser(
        "pull",
        help="fetch an agent from the Hugging Face Hub (cached)",
        **describe(
            "Fetch an agent pushed with `rlstash push` into the Hugging Face cache and print\n"
            "where it is (offline once cached); `rlstash eval hf://USER/NAME` runs it.",
            "rlstash pull USER/ppo-CartPole-v1",
            "guides/tracking/",
        ),
    )
    add_config_flags(p, PullConfig)
    p.set_defaults(func=cmd_pull)
