"""Push a run to the Hugging Face Hub and pull one back (``pip install 'rlstash[hub]'``).

::

    push("runs/dqn-CartPole-v1-s0", "alice/dqn-CartPole-v1")  # evaluate, package, upload
    path = pull("alice/dqn-CartPole-v1")                      # a run directory in the HF cache
    evaluate_run(path)                                        # what rlstash eval hf://... runs

:func:`push` packages the run (:func:`rlstash.hub.package.package`) in a scratch directory
and uploads it with ``HfApi.create_repo`` (``exist_ok``) and ``HfApi.upload_folder``, one
commit. :func:`pull` is ``snapshot_download``: the files land in the Hugging Face cache
(``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``) and a second pull of the same revision
downloads nothing; with ``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached, the cached
snapshot is used. The pulled directory is a run directory whose checkpoint is checked like any
other (its manifest's SHA-256 of ``state.pt``, :func:`rlstash.train.rundir.read_checkpoint`).

``HF_ENDPOINT``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` are read when each call is made.
Errors are one line: a bad repo id, a run directory without a checkpoint, the missing extra, a
repository not found (or not cached while offline) are ValueErrors; a Hub that answers with
an error or cannot be reached is an OSError.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlstash.hub import refs
from rlstash.hub.extra import import_hub
from rlstash.hub.package import check_run, package
from rlstash.train import checkpoint


@dataclass
class Pushed:
    """What :func:`push` uploaded: the repository's URL, the commit, the evaluation and the
    files (paths in the repository)."""

    url: str
    commit: str
    results: dict[str, Any]
    files: list[str]


def push(
    run_dir: str | Path,
    repo_id: str,
    episodes: int = 10,
    seed: int = 12345,
    video: bool = True,
    private: bool = False,
    message: str = "",
    token: str | None = None,
    endpoint: str | None = None,
) -> Pushed:
    """Evaluate the run's saved agent for ``episodes`` episodes, record a replay video (unless
    ``video`` is False; needs ``rlstash[video]``), write the model card and upload the agent
    (``checkpoint/``), ``config.json``, ``results.json``, ``README.md``, ``replay.mp4``,
    ``learning_curve.png`` and the run's CSVs to ``repo_id`` (created if missing)."""
    rid = refs.repo_id(repo_id)
    run = check_run(Path(run_dir))
    hub = import_hub()
    with tempfile.TemporaryDirectory(prefix="rlstash-push-") as tmp:
        results = package(run, Path(tmp), rid, episodes=episodes, seed=seed, video=video)
        files = sorted(str(p.relative_to(tmp)) for p in Path(tmp).rglob("*") if p.is_file())
        api = hub.HfApi(endpoint=_endpoint(endpoint), token=token)
        summary = message or (
            f"rlstash push: {results['algo']} on {results['env_id']}, mean_reward "
            f"{results['mean_reward']:.2f} +/- {results['std_reward']:.2f}"
        )
        with hub_errors("push", rid, hub):
            url = api.create_repo(rid, exist_ok=True, private=private)
            info = api.upload_folder(repo_id=rid, folder_path=tmp, commit_message=summary)
    return Pushed(str(url), str(getattr(info, "oid", "")), results, files)


def pull(
    repo_id: str,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    field: str = "repo_id",
) -> Path:
    """The snapshot of ``repo_id`` (``USER/NAME`` or ``hf://USER/NAME``) in the Hugging Face
    cache, downloaded if not cached (module docstring); a run directory with a checkpoint."""
    rid = refs.repo_id(repo_id, field)
    hub = import_hub()
    cache = cache_dir or os.environ.get("HF_HUB_CACHE") or None
    with hub_errors("pull", rid, hub):
        path = Path(
            hub.snapshot_download(
                rid,
                revision=revision,
                cache_dir=str(cache) if cache else None,
                token=token,
                endpoint=_endpoint(endpoint),
                local_files_only=offline(hub),
            )
        )
    if checkpoint.latest(path) is None:
        raise ValueError(
            f"{field}: {rid} holds no rlstash agent (no checkpoint/COMPLETE in {path}); is it a "
            "repository made by rlstash push?"
        )
    return path


def offline(hub: Any) -> bool:
    """Whether the Hub is switched off (``HF_HUB_OFFLINE`` now, or when it was imported)."""
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return value.strip().lower() in ("1", "on", "yes", "true") or bool(hub.constants.HF_HUB_OFFLINE)


def _endpoint(endpoint: str | None) -> str | None:
    return endpoint or os.environ.get("HF_ENDPOINT") or None


@contextlib.contextmanager
def hub_errors(doing: str, rid: str, hub: Any) -> Iterator[None]:
    """The Hub's exceptions as one line: ValueError for a repository not found (or not cached
    while offline), OSError for an error answer or no connection."""
    errors = hub.errors
    try:
        yield
    except errors.OfflineModeIsEnabled:
        raise ValueError(
            f"{doing}: HF_HUB_OFFLINE is set, so {rid} cannot be uploaded; unset it to push"
        ) from None
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError) as exc:
        raise ValueError(
            f"{doing}: {rid} is not on the Hub or not readable with your token "
            f"({_first_line(exc)}); check the name, or log in (hf auth login)"
        ) from None
    except errors.LocalEntryNotFoundError:
        raise ValueError(
            f"{doing}: {rid} is not in the Hugging Face cache and the Hub cannot be reached "
            "(HF_HUB_OFFLINE, or no connection); pull it once while online"
        ) from None
    except errors.HfHubHTTPError as exc:
        raise OSError(f"{doing}: the Hub refused it for {rid}: {_first_line(exc)}") from None
    except Exception as exc:
        if type(exc).__module__.split(".")[0].startswith("httpx"):  # no connection, a timeout
            raise OSError(
                f"{doing}: cannot reach the Hub for {rid} ({type(exc).__name__}: "
                f"{_first_line(exc)}); check the connection or HF_ENDPOINT"
            ) from None
        raise


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(exc).__name__


push_to_hub = push
"""The root export of :func:`push` (``from rlstash import push_to_hub``)."""
pull_from_hub = pull
"""The root export of :func:`pull` (``from rlstash import pull_from_hub``)."""
