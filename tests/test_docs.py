"""The documentation cannot drift from the code: every Python block of ``docs/`` and of the
README runs, and the site builds with ``mkdocs build --strict`` (no broken link, no missing
reference, no docstring warning).

The blocks of one page run in order in one fresh interpreter (a page reads like a notebook:
later blocks use what earlier ones defined), as ``__main__``, in a temporary directory, with
CUDA hidden. A block preceded by ``<!-- needs: NAME -->`` runs only where ``import NAME``
works (``cuda``: where CUDA is available); otherwise it is reported as a skip with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts] + [ROOT / "README.md"]
)
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```python[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
MARKER = re.compile(r"<!--\s*needs:\s*(?P<name>[\w.]+)\s*-->")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    code: str
    needs: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's Python blocks, dedented (blocks inside tabs are indented), with their
    ``needs`` marker: the last non-blank line before the fence."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = [ln for ln in text[: m.start()].splitlines() if ln.strip()]
        marker = MARKER.search(before[-1]) if before else None
        out.append(
            Block(
                page=page,
                line=text.count("\n", 0, m.start()) + 1,
                code=textwrap.dedent(m.group("body")),
                needs=marker.group("name") if marker else None,
            )
        )
    return out


def missing(need: str | None) -> str | None:
    """Why a block with this ``needs`` cannot run here (None: it can)."""
    if need is None:
        return None
    if need == "cuda":
        return None if _cuda() else "needs CUDA, which this machine lacks"
    if importlib.util.find_spec(need) is None:
        return f"needs {need} (not installed here: a peer or an extra, not a dependency)"
    return None


def _cuda() -> bool:
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


RUNNER = """
import json, sys
scope = {}
page = None
for b in json.load(open(sys.argv[1])):
    if b["page"] != page:  # a fresh namespace per page
        page, scope = b["page"], {"__name__": "__main__"}
    print(f"--- {b['id']}", flush=True)
    exec(compile(b["code"], b["id"], "exec"), scope)
"""

ALL = [b for page in PAGES for b in blocks(page)]


@pytest.mark.slow
def test_every_runnable_block_runs(tmp_path):
    """Every page's runnable blocks, page after page, in one interpreter (one torch import for
    all of them), each page in a namespace of its own; a failure names the page and the line
    of its block. Blocks that cannot run here are :func:`test_blocks_that_cannot_run_here_say_why`."""
    runnable = [b for b in ALL if missing(b.needs) is None]
    spec = tmp_path / "blocks.json"
    spec.write_text(
        json.dumps([{"page": str(b.page), "id": b.id, "code": b.code} for b in runnable])
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, str(spec)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    ran = out.stdout.count("--- ")
    assert out.returncode == 0, (
        f"a docs block failed (the last '--- page:line' below is the one):\n"
        f"{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    )
    assert ran == len(runnable)


@pytest.mark.parametrize("block", [b for b in ALL if b.needs], ids=lambda b: b.id)
def test_blocks_that_cannot_run_here_say_why(block):
    why = missing(block.needs)
    if why:
        pytest.skip(f"{block.id}: {why}")
    # runnable here: it ran in test_every_runnable_block_runs


def test_a_block_marker_is_read_from_the_line_before_the_fence(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "text\n\n<!-- needs: no_such_module_xyz -->\n\n```python\nimport no_such_module_xyz\n```\n"
        '=== "tab"\n\n    ```python\n    x = 1\n    ```\n'
    )
    found = blocks(page)
    assert [b.needs for b in found] == ["no_such_module_xyz", None]
    assert found[1].code == "x = 1\n"
    assert "no_such_module_xyz" in missing("no_such_module_xyz")


def _docs_extra() -> str | None:
    for name in (
        "mkdocs",
        "material",
        "mkdocstrings",
        "mkdocstrings_handlers.python",
        "matplotlib",
    ):
        try:
            found = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return f"the docs extra is not installed ({name} is missing): pip install -e '.[docs]'"
    return None


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    """The site, built once for this module with ``mkdocs build --strict`` (any warning: a
    broken link, a missing reference, a docstring the API reference cannot parse, fails it)."""
    why = _docs_extra()
    if why:
        pytest.skip(why)
    site = tmp_path_factory.mktemp("docs") / "site"
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{out.stderr[-6000:]}"
    return site


@pytest.mark.slow
def test_the_site_builds_strict(built_site):
    """The generated pages are there: every subcommand's flags, the API reference of
    rlstash.__all__, the benchmark figures."""
    from rlstash.cli.main import COMMANDS

    cli = (built_site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "--buffer-size" in cli
    assert all(f"rlstash {name}" in cli for name in COMMANDS)
    api = "".join(
        p.read_text(encoding="utf-8") for p in (built_site / "reference" / "api").rglob("*.html")
    )
    import rlstash

    assert all(name in api for name in rlstash.__all__)
    assert "update_priorities" in api
    assert list((built_site / "benchmarks" / "img").glob("learn-*.png"))


@pytest.mark.slow
def test_browser_check(built_site, tmp_path):
    """The built site in headless Chromium (docs/check_browser.py): the home page, a guide, an
    API page and the search for ReplayBuffer render without console errors."""
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run does)")
    out = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "check_browser.py"), "--site", str(built_site),
         "--screenshots", str(tmp_path / "shots")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    assert "ok   search 'ReplayBuffer'" in out.stdout
    assert sorted(p.name for p in (tmp_path / "shots").iterdir()) == [
        "api.png", "guide.png", "home.png", "search.png",
    ]  # fmt: skip


def test_sphinx_roles_and_literals_become_markdown_code():
    """The API reference's griffe extension (docs/hooks/griffe_roles.py)."""
    pytest.importorskip("griffe", reason="the docs extra is not installed")
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        from griffe_roles import markdown
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    text = (
        "See :class:`~rlstash.core.Storage`, :func:`plan` and ``x=1``.\n\nUse it::\n\n    a = 1\n"
    )
    assert markdown(text) == "See `Storage`, `plan` and `x=1`.\n\nUse it:\n\n```python\na = 1\n```"


def test_the_cli_reference_lists_every_flag_with_its_default():
    """docs/hooks/generate.py reads the parser: every flag of every command is a row, and a
    default is split from the help wherever the help puts it."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import generate
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    assert generate._split_default("Capacity. [default: 1000000] (formerly --capacity)") == (
        "Capacity. (formerly --capacity)",
        "1000000",
    )
    page = generate.cli_page()
    from rlstash.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    for name, p in sub.choices.items():
        assert f"## `rlstash {name}`" in page
        for action in p._actions:
            if action.help != "==SUPPRESS==" and action.option_strings and action.dest != "help":
                assert f"`{action.option_strings[0]}`" in page, (name, action.option_strings)
