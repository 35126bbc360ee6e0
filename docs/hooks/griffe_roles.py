"""A griffe extension: Sphinx roles in rlstash's docstrings (``:class:`~rlstash.core.Storage```,
``:func:`plan```, ``:mod:`rlstash.core```, ``:data:`COMMANDS```) become inline code, and
reStructuredText literals (````x````) become Markdown code, so mkdocstrings renders them as
code instead of as raw role text."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
_LITERAL_BLOCK = re.compile(r"(^|\n)([^\n]*)::\n\n((?:[ \t]+[^\n]*\n|\n)+)", re.M)


def _role(match: re.Match) -> str:
    target = match.group(1)
    shown = target.rsplit(".", 1)[-1] if match.group(0).split("`")[1].startswith("~") else target
    return f"`{shown}`"


def _block(match: re.Match) -> str:
    lead, line, body = match.groups()
    intro = line + (":" if line.strip() else "")
    return f"{lead}{intro}\n\n```python\n{_dedent(body)}```\n"


def _dedent(body: str) -> str:
    import textwrap

    return textwrap.dedent(body).rstrip("\n") + "\n\n"


def markdown(text: str) -> str:
    """A docstring's text with roles, literals and ``::`` literal blocks in Markdown."""
    text = _LITERAL_BLOCK.sub(_block, text + "\n")
    text = _ROLE.sub(_role, text)
    return _LITERAL.sub(lambda m: f"`{m.group(1)}`", text).rstrip("\n")


class SphinxRolesToMarkdown(griffe.Extension):
    """Rewrite every docstring as it is loaded (:func:`markdown`)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
