"""``rlstash push RUN --repo-id USER/NAME``: evaluate a run's agent and upload it to the
Hugging Face Hub with a model card, a replay video and its learning curve
(:func:`rlstash.hub.push`; ``pip install 'rlstash[hub]'``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rlstash.cli.flags import add_config_flags, config_from_args
from rlstash.cli.main import describe
from rlstash.settings import SettingError, check_types
from rlstash.settings import setting as s


@dataclass
class PushConfig:
    """Settings of ``rlstash push``."""

    run: str = s("", "Run directory (runs/<name>) holding a checkpoint.", positional=True)
    repo_id: str = s("", "Hub repository USER/NAME (created if missing).", metavar="USER/NAME")
    episodes: int = s(10, "Evaluation episodes behind the card's mean_reward.", at_least=1)
    seed: int = s(12345, "Seed of the first evaluation episode.", at_least=0)
    no_video: bool = s(False, "Upload no replay.mp4 (else it needs rlstash[video]).")
    private: bool = s(False, "Create the repository private (an existing one keeps its own).")
    message: str = s("", "Commit message (default: the algorithm, env and score).")

    def __post_init__(self) -> None:
        check_types(self)
        if not self.repo_id:
            raise SettingError("repo_id", "a Hub repo id USER/NAME", "", "give --repo-id USER/NAME")


def cmd_push(args: argparse.Namespace) -> int:
    """Package, evaluate and upload; print the repository's URL and the score."""
    from rlstash.hub import push
    from rlstash.hub.refs import repo_id

    cfg = config_from_args(PushConfig, args)
    repo_id(cfg.repo_id, "--repo-id")  # a bad name is refused before anything runs
    try:
        out = push(
            cfg.run, cfg.repo_id, episodes=cfg.episodes, seed=cfg.seed, video=not cfg.no_video,
            private=cfg.private, message=cfg.message,
        )  # fmt: skip
    except ValueError as exc:  # the video's refusals name rlstash train's --video
        raise ValueError(str(exc).replace("drop --video", "give --no-video")) from None
    r = out.results
    print(
        f"pushed {cfg.run} to {out.url}: mean_reward {r['mean_reward']:.2f} +/- "
        f"{r['std_reward']:.2f} over {r['n_eval_episodes']} episodes; {len(out.files)} files"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``rlstash push`` to the ``rlstash`` parser."""
    p = sub.add_parser(
        "push",
        help="evaluate a run's agent and upload it to the Hugging Face Hub",
        **describe(
            "Evaluate a run's saved agent, record a replay video, write a model card (the Hub's\n"
            "leaderboard metadata: mean_reward +/- std) and upload the agent, its settings,\n"
            "the card, the video and the learning curve to a Hugging Face Hub model repo.",
            "rlstash push runs/ppo-CartPole-v1 --repo-id USER/ppo-CartPole-v1",
            "guides/tracking/",
        ),
    )
    add_config_flags(p, PushConfig)
    p.set_defaults(func=cmd_push)
