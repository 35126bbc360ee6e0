"""What ``rlstash push`` uploads, made in a local directory (no network): the agent, its
evaluation, a replay video, the model card, the settings and the learning curve.

Layout of the package (and of the Hub repository)::

    README.md             the model card (rlstash.hub.card): YAML metadata + text
    checkpoint/           the agent as a checkpoint without its replay buffer: state.pt
                          (weights, optimizers, counters, settings), MANIFEST.json (its
                          SHA-256, config, spaces), COMPLETE: a run directory that
                          rlstash eval reads and checks like any other
    config.json           the run's resolved settings (TrainConfig, agent settings included)
    results.json          mean_reward, std_reward, n_eval_episodes, seed, eval_datetime
    replay.mp4            the first evaluation episode (rlstash[video]; not with video=False)
    learning_curve.png    the run's, drawn from eval.csv if missing (rlstash[plots])
    eval.csv, progress.csv  the run's logs

The evaluation runs on the packaged checkpoint, not the run's: what is uploaded is what was
scored.
"""

from __future__ import annotations

import datetime
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rlstash.hub import card
from rlstash.train import checkpoint, rundir
from rlstash.train.evaluate import evaluate_run
from rlstash.train.runlog import plot_learning_curve

AGENT_STATE = ("step", "train_seconds", "config", "agent", "evals", "settings")
"""What of a run's checkpoint state a package keeps (not the replay buffer, not the limiter)."""


def check_run(run_dir: Path) -> Path:
    """``run_dir`` if it holds a complete checkpoint, else a ValueError naming it and the fix."""
    if not run_dir.is_dir():
        raise ValueError(
            f"run: {run_dir} is not a directory; give a run directory (runs/<name>) made by "
            "rlstash train"
        )
    if checkpoint.latest(run_dir) is None:
        raise ValueError(
            f"run: no complete checkpoint in {run_dir}; train first (rlstash train --name ...) "
            "or give the run's directory"
        )
    return run_dir


def package(
    run_dir: Path,
    out: Path,
    repo_id: str,
    episodes: int = 10,
    seed: int = 12345,
    video: bool = True,
) -> dict[str, Any]:
    """Write the package of ``run_dir`` into the directory ``out`` (module docstring); the
    evaluation results (``results.json``'s contents, with ``algo`` and ``env_id``)."""
    if video:
        from rlstash.train.video import check_available

        check_available()  # before anything is evaluated: the fix is the video extra
    check_run(run_dir)
    _, state, _ = rundir.read_checkpoint(run_dir)
    checkpoint.save(out, {k: state[k] for k in AGENT_STATE if k in state})
    config = state["config"]
    with tempfile.TemporaryDirectory(prefix="rlstash-videos-") as scratch:
        out_eval = evaluate_run(
            out, episodes=episodes, seed=seed, video=video, video_dir=Path(scratch)
        )
        recorded = list(out_eval.get("videos", ()))
        if recorded:
            shutil.copyfile(recorded[0], out / "replay.mp4")
    returns = out_eval["returns"]
    results = {
        "algo": config["algo"],
        "env_id": config["env"],
        "mean_reward": float(returns.mean()),
        "std_reward": float(returns.std()),
        "n_eval_episodes": int(len(returns)),
        "length_mean": float(out_eval["lengths"].mean()),
        "is_deterministic": True,
        "seed": seed,
        "train_steps": int(state.get("step", 0)),
        "eval_datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps(config, indent=1, default=str) + "\n")
    for name in ("eval.csv", "progress.csv"):
        if (run_dir / name).exists():
            shutil.copyfile(run_dir / name, out / name)
    curve = run_dir / "learning_curve.png"  # written when the run ended; else drawn now
    if not curve.exists():
        curve = plot_learning_curve(run_dir)  # from eval.csv; None without matplotlib
    if curve is not None and curve.exists():
        shutil.copyfile(curve, out / "learning_curve.png")
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    meta = card.metadata(
        config["algo"], config["env"], results["mean_reward"], results["std_reward"]
    )
    card.write(out / "README.md", meta, card.text(repo_id, config, results, ["README.md", *files]))
    return results
