"""``rlstash export RUN --minari NAME``: a run's replay buffer as a local Minari dataset.

The newest complete checkpoint's buffer (checked against its manifest) is written episode by
episode (:func:`rlstash.datasets.minari.to_minari`) as the dataset ``NAME`` under
``MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``), naming the run's env, so that
``minari.load_dataset(NAME)`` reads it back and ``rlstash train --dataset NAME`` trains on it.
The buffer's ``info/...`` fields become the episodes' ``infos``. A frame-stacked run (Atari,
``--history K``) writes the single frames its buffer stores, with the env's frame as the
observation space and ``frame_stack: K`` in the dataset's metadata (``from_minari`` stacks by
it again). Needs ``pip install 'rlstash[minari]'``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlstash.cli.flags import add_config_flags, config_from_args
from rlstash.cli.main import describe
from rlstash.settings import check_types
from rlstash.settings import setting as s


@dataclass
class ExportConfig:
    """Settings of ``rlstash export``."""

    run: str = s("", "Run directory (runs/<name>).", positional=True)
    minari: str = s(
        "", "Id of the local Minari dataset to write, e.g. rlstash/pendulum/sac-v0 (required)."
    )

    def __post_init__(self) -> None:
        check_types(self)
        if not self.minari:
            raise ValueError(
                "--minari: expected a dataset id to write, got none; e.g. --minari mine/sac-v0"
            )


def export_run(run_dir: Path, dataset_id: str) -> Any:
    """Write the replay buffer of ``run_dir``'s newest checkpoint as the local Minari dataset
    ``dataset_id``; returns the ``MinariDataset``. ValueError lines for a run without a
    checkpoint or without a replay buffer (on-policy and offline runs keep none)."""
    from rlstash.datasets.minari import import_minari, to_minari
    from rlstash.envs.make import probe_env
    from rlstash.replay import ReplayBuffer
    from rlstash.train import checkpoint, rundir
    from rlstash.train.config import TrainConfig

    import_minari()  # the install hint before anything is read
    if checkpoint.latest(run_dir) is None:
        raise ValueError(
            f"run: no complete checkpoint in {run_dir}; train first (rlstash train --name ...)"
        )
    ckpt, state, _ = rundir.read_checkpoint(run_dir)
    cfg = TrainConfig(**state["config"])
    path = ckpt / checkpoint.BUFFER
    if not path.exists():
        raise ValueError(
            f"run: {ckpt} holds no replay buffer ({cfg.algo} keeps none); export a run of "
            f"an off-policy algorithm (sac, td3, dqn)"
        )
    with checkpoint.reading(path):
        rb = ReplayBuffer.load(path, device="cpu")
    try:
        info = probe_env(cfg.env, cfg.history)
        return to_minari(
            rb.storage, dataset_id, env=cfg.env, algorithm_name=f"rlstash {cfg.algo}",
            observation_space=info.obs_space, action_space=info.act_space,
        )  # fmt: skip
    finally:
        rb.close()


def cmd_export(args: argparse.Namespace) -> int:
    """Export the run's replay buffer and print one line."""
    args = config_from_args(ExportConfig, args)
    ds = export_run(Path(args.run), args.minari)
    print(
        f"{args.run}: wrote Minari dataset {args.minari}: {ds.total_episodes} episodes, "
        f"{ds.total_steps} steps"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``rlstash export`` to the ``rlstash`` parser."""
    p = sub.add_parser(
        "export",
        help="write a run's replay buffer as a Minari dataset",
        **describe(
            "Write a run's replay buffer as a Minari dataset (episodes oldest first, termination\n"
            "and truncation kept) that minari.load_dataset reads back; a frame-stacked run\n"
            "writes single frames and records frame_stack in the dataset's metadata.",
            "rlstash export runs/sac-Pendulum-v1 --minari pendulum/sac-v0",
            "guides/offline/",
        ),
    )
    add_config_flags(p, ExportConfig)
    p.set_defaults(func=cmd_export)
