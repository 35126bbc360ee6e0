"""Names of Hugging Face Hub model repositories: ``USER/NAME``, and ``hf://USER/NAME`` where a
run directory is expected (``rlstash eval hf://USER/NAME``).

Checked here, before ``huggingface_hub`` is imported, by the Hub's own rules for a repo id
(``huggingface_hub.utils.validate_repo_id``): a namespace and a name of letters, digits,
``-``, ``_`` and ``.``, no ``--`` or ``..``, not starting or ending with ``-`` or ``.``, at
most 96 characters.
"""

from __future__ import annotations

import re

SCHEME = "hf://"
"""The prefix that marks a Hub repository where a run directory is expected."""

_PART = re.compile(r"^[A-Za-z0-9_.\-]+$")


def is_hub_ref(text: str) -> bool:
    """Whether ``text`` names a Hub repository (``hf://USER/NAME``) rather than a directory."""
    return text.startswith(SCHEME)


def repo_id(text: str, field: str = "repo_id") -> str:
    """``USER/NAME`` from ``USER/NAME`` or ``hf://USER/NAME``; a ValueError naming ``field``,
    what a repo id is and what came otherwise."""
    rid = text[len(SCHEME) :] if is_hub_ref(text) else text
    why = _problem(rid)
    if why:
        raise ValueError(
            f"{field}: expected a Hub repo id USER/NAME (letters, digits, '-', '_', '.'), got "
            f"{text!r} ({why}); e.g. alice/dqn-CartPole-v1"
        )
    return rid


def _problem(rid: str) -> str:
    parts = rid.split("/")
    if len(parts) != 2 or not all(parts):
        return "not two parts joined by one '/'"
    if len(rid) > 96:
        return f"{len(rid)} characters, at most 96"
    for part in parts:
        if not _PART.match(part):
            return f"{part!r} holds other characters"
        if "--" in part or ".." in part:
            return f"{part!r} holds '--' or '..'"
        if part[0] in "-." or part[-1] in "-.":
            return f"{part!r} starts or ends with '-' or '.'"
    return ""
