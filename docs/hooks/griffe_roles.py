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


def _inline(text: str) -> str:
    return _LITERAL.sub(lambda m: f"`{m.group(1)}`", _ROLE.sub(_role, text))


def markdown(text: str) -> str:
    """A docstring's text with roles and literals as Markdown code and ``::`` literal blocks
    as fenced Python blocks (their contents left as written)."""
    import textwrap

    text += "\n"
    out, end = [], 0
    for m in _LITERAL_BLOCK.finditer(text):
        lead, line, body = m.groups()
        intro = line + (":" if line.strip() else "")
        code = textwrap.dedent(body).strip("\n")
        out += [
            _inline(text[end : m.start()]),
            f"{lead}{_inline(intro)}\n\n```python\n{code}\n```\n",
        ]
        end = m.end()
    out.append(_inline(text[end:]))
    return "".join(out).rstrip("\n")


class SphinxRolesToMarkdown(griffe.Extension):
    """Rewrite every docstring as it is loaded (:func:`markdown`)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
