"""MkDocs hook: the pages and figures made from the code and the results files at build time.

- ``reference/cli.md``: every flag of every ``rlstash`` subcommand, read from the parser that
  :mod:`rlstash.cli.main` builds (each command's flags are derived from its settings dataclass,
  so a new command, flag, help text or default appears here without a page edit).
- ``reference/api/*.md``: one mkdocstrings entry per name of ``rlstash.__all__``, grouped by
  the layer of the module that defines it.
- ``benchmarks/*.md``: each ``bench/results/*.md`` file, with matplotlib figures drawn from its
  tables (ratio columns as bars, per-seed evaluation returns as learning curves).

Nothing is written into ``docs/``: the pages and PNGs are MkDocs "generated" files.
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "docs" / "hooks"))

from figures import curve_sections, learning_curves, ratio_bars, tables  # noqa: E402

API_SECTIONS = (  # (page, title, module prefixes), first match wins; the rest goes to "other"
    ("data", "Data: specs, storages, samplers, replay", ("rlstash.spec", "rlstash.memory",
        "rlstash.indices", "rlstash.storage", "rlstash.sampler", "rlstash.writer",
        "rlstash.replay", "rlstash.device", "rlstash.ratelimit", "rlstash.prefetch")),
    ("envs", "Environments and collection", ("rlstash.envs", "rlstash.collect")),
    ("agents", "Agents", ("rlstash.agents",)),
    ("train", "Training runs", ("rlstash.train",)),
)  # fmt: skip


# ---------------------------------------------------------------- CLI reference
def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _split_default(help_text: str) -> tuple[str, str]:
    m = re.search(r"\s*\[default: ([^\]]*)\]", help_text or "")
    if not m:
        return help_text or "", ""
    return help_text[: m.start()] + help_text[m.end() :], m.group(1)


def _action_row(action: argparse.Action) -> str | None:
    if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
        return None
    if action.option_strings:
        names = ", ".join(f"`{o}`" for o in action.option_strings)
        if isinstance(action, argparse.BooleanOptionalAction):
            names = f"`{action.option_strings[0]}` / `{action.option_strings[1]}`"
        elif action.nargs != 0:
            meta = action.metavar or action.dest.upper()
            names += f" `{meta}`"
    else:
        names = f"`{action.metavar or action.dest}` (positional)"
    help_text, default = _split_default(action.help or "")
    if action.choices and not action.option_strings:
        help_text += f" (one of {', '.join(map(str, action.choices))})"
    return f"| {names} | {_cell(help_text)} | {_cell(default) if default else ''} |"


def cli_page() -> str:
    from rlstash.cli.main import COMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    out = [
        "# Command line reference",
        "",
        "Generated at build time from the parser `rlstash.cli.main.build_parser()` builds: each "
        "command's flags are the fields of its settings dataclass (`rlstash/cli/`, "
        "`rlstash.train.TrainConfig` and the agents' configs for `train`), with the field's "
        "help text and default. `rlstash <command> --help` prints the same.",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    for name in COMMANDS:
        p = sub.choices[name]
        out += [f"## `rlstash {name}`", "", _cell(helps.get(name) or ""), ""]
        if p.description:
            out += ["```text", p.description.strip(), "```", ""]
        out += ["```text", p.format_usage().strip(), "```", ""]
        for group in p._action_groups:
            rows = [r for r in map(_action_row, group._group_actions) if r]
            if not rows:
                continue
            title = group.title or "arguments"
            out += [f"### {title[0].upper() + title[1:]}", ""]
            if group.description:
                out += [_cell(group.description), ""]
            out += ["| flag | what it sets | default |", "| --- | --- | --- |", *rows, ""]
    return "\n".join(out)


# ---------------------------------------------------------------- API reference
def api_entries() -> dict[str, list[tuple[str, str]]]:
    """Section page -> [(public name, dotted path of the object mkdocstrings documents)]."""
    import rlstash

    pages: dict[str, list[tuple[str, str]]] = {p: [] for p, _, _ in API_SECTIONS}
    pages["other"] = []
    for name in sorted(rlstash.__all__, key=str.lower):
        with warnings.catch_warnings():  # a deprecated alias warns when read
            warnings.simplefilter("ignore")
            obj = getattr(rlstash, name)
        module = getattr(obj, "__module__", None) or rlstash._EXPORTS.get(name, "rlstash")
        qual = getattr(obj, "__qualname__", name)
        path = f"{module}.{qual}"
        page = next((p for p, _, pre in API_SECTIONS if module.startswith(pre)), "other")
        pages[page].append((name, path))
    return {p: entries for p, entries in pages.items() if entries}


def _titles() -> dict[str, str]:
    return {**{p: t for p, t, _ in API_SECTIONS}, "other": "Other public names"}


def api_pages() -> dict[str, str]:
    entries = api_entries()
    titles = _titles()
    index = [
        "# API reference",
        "",
        "Everything `from rlstash import ...` offers (`rlstash.__all__`), generated at build "
        "time from the docstrings. The package imports lazily: `import rlstash` pulls in no "
        "torch until a name is used, so env worker processes stay torch-free.",
        "",
    ]
    pages = {}
    for page, items in entries.items():
        index += [f"## [{titles[page]}]({page}.md)", ""]
        index += [f"- [`{n}`]({page}.md#{p})" for n, p in items]
        index.append("")
        body = [f"# {titles[page]}", ""]
        seen: set[str] = set()
        for name, path in items:
            if path.rsplit(".", 1)[-1] != name:  # an alias (an old name)
                body += [f"## `{name}`", "", f"`rlstash.{name}` is `{path}` (an older name).", ""]
            if path in seen:
                continue
            seen.add(path)
            body += [f"::: {path}", ""]
        pages[f"reference/api/{page}.md"] = "\n".join(body)
    pages["reference/api/index.md"] = "\n".join(index)
    return pages


# ---------------------------------------------------------------- benchmarks
def bench_pages() -> tuple[dict[str, str], dict[str, bytes]]:
    """One page per results file (its text, then its figures) and the PNGs they show."""
    pages: dict[str, str] = {}
    images: dict[str, bytes] = {}
    for path in sorted(RESULTS.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        stem = path.stem
        figs: list[str] = []
        for i, (title, png) in enumerate(ratio_bars(tables(text), stem)):
            uri = f"benchmarks/img/{stem}-ratios-{i}.png"
            images[uri] = png
            figs.append(f"![{title}](img/{stem}-ratios-{i}.png)")
        for slug, title, png in learning_curves(text):
            uri = f"benchmarks/img/{stem}-{slug}.png"
            images[uri] = png
            figs.append(f"![{title}](img/{stem}-{slug}.png)")
        body = _demote(text)
        head = f"_Source: `bench/results/{path.name}`, rendered at build time._\n"
        figures = "\n\n".join(figs)
        if figs:
            body = body.replace("\n", f"\n{head}\n## Figures\n\n{figures}\n\n", 1)
        else:
            body = body.replace("\n", f"\n{head}\n", 1)
        pages[f"benchmarks/{stem}.md"] = body
    return pages, images


def _demote(text: str) -> str:
    """The first line becomes the page title; fenced text is left alone."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        lines.insert(0, "# Results")
    return "\n".join(lines) + "\n"


def bench_files() -> list[tuple[str, str]]:
    """(stem, title) of every results file, the title its first heading."""
    out = []
    for path in sorted(RESULTS.glob("*.md")):
        first = path.read_text(encoding="utf-8").splitlines()[:1]
        title = first[0].lstrip("# ").strip() if first and first[0].startswith("#") else path.stem
        out.append((path.stem, title))
    return out


def bench_nav() -> list[dict[str, str]]:
    return [{stem: f"benchmarks/{stem}.md"} for stem, _ in bench_files()]


# ---------------------------------------------------------------- MkDocs events
_CACHE: dict[str, Any] = {}


def on_config(config: Any) -> Any:
    """Put the generated pages into the nav (API sections, every results file)."""
    titles = _titles()
    api = [{"Overview": "reference/api/index.md"}]
    api += [{titles[p]: f"reference/api/{p}.md"} for p in api_entries()]
    for item in config["nav"]:
        if isinstance(item, dict) and "Reference" in item:
            item["Reference"] = [
                (dict(API=api) if isinstance(e, dict) and "API" in e else e)
                for e in item["Reference"]
            ]
        if isinstance(item, dict) and "Benchmarks" in item:
            item["Benchmarks"] = [{"Overview": "benchmarks.md"}, *bench_nav()]
    return config


def on_files(files: Files, config: Any) -> Files:
    generated: dict[str, str | bytes] = {"reference/cli.md": cli_page(), **api_pages()}
    pages, images = bench_pages()
    generated.update(pages)
    generated.update(images)
    for uri, content in generated.items():
        files.append(File.generated(config, uri, content=content))
    return files


# ---------------------------------------------------------------- markers in hand-written pages
_SETTINGS = re.compile(r"<!-- settings: (\S+) (\S+) -->")
_BENCH = re.compile(r"<!-- bench: (\S+) (.+?) -->")


def settings_block(algo_name: str, kind: str) -> str:
    """The algorithm's learner settings (name, default, help), loop defaults and presets, read
    from :mod:`rlstash.train.algos` (``<!-- settings: sac continuous -->`` in a page)."""
    import dataclasses

    from rlstash.settings import help_of
    from rlstash.train.algos import agent_fields
    from rlstash.train.config import ALGOS

    algo = ALGOS[algo_name]
    config = algo.learners[kind].config
    rows = []
    for f in dataclasses.fields(config):
        if f.name not in agent_fields(config):  # the run's --seed seeds the agent
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append(f"| `--{f.name.replace('_', '-')}` | `{default!r}` | {_cell(help_of(f))} |")
    out = [
        f"Learner settings (`{config.__module__}.{config.__name__}`; flags of `rlstash train "
        f"--algo {algo_name}`, also `--set NAME=VALUE` and `[agent]` in a `--config` file):",
        "",
        "| flag | default | meaning |",
        "| --- | --- | --- |",
        *rows,
        "",
    ]
    loop = {k: v for k, v in algo.loop.items() if v is not None}
    if loop:
        out += [f"Loop defaults of `--algo {algo_name}`: "
                + ", ".join(f"`{k}={v!r}`" for k, v in loop.items()) + ".", ""]  # fmt: skip
    fields = {f.name for f in dataclasses.fields(config)}
    presets = {
        env: p for env, p in algo.presets.items()
        if _preset_kind(env, p, fields, algo, kind)
    }  # fmt: skip
    if presets:
        out += ["Per-env presets (applied over the defaults; your flags win):", "",
                "| env | settings |", "| --- | --- |"]  # fmt: skip
        out += [f"| `{env}` | " + ", ".join(f"`{k}={v!r}`" for k, v in p.items()) + " |"
                for env, p in presets.items()]  # fmt: skip
        out.append("")
    return "\n".join(out)


def _preset_kind(env: str, preset: dict, fields: set, algo: Any, kind: str) -> bool:
    if len(algo.learners) == 1:
        return True
    others = set().union(*(
        {f.name for f in __import__("dataclasses").fields(lr.config)}
        for k, lr in algo.learners.items() if k != kind
    ))  # fmt: skip
    own = set(preset) & (fields - others)
    foreign = set(preset) & (others - fields)
    return bool(own) or not foreign


def bench_block(stem: str, prefix: str) -> str:
    """The first table of the section of ``bench/results/<stem>.md`` whose heading starts with
    ``prefix``, with its learning curve when it has one (``<!-- bench: learn DQN CartPole -->``)."""
    text = (RESULTS / f"{stem}.md").read_text(encoding="utf-8")
    found = [t for t in tables(text) if t[0].startswith(prefix)]
    if not found:
        raise ValueError(
            f"bench marker: no section of bench/results/{stem}.md starts with {prefix!r}"
        )
    heading, header, rows = found[0]
    out = [f"**{heading}** (from [`bench/results/{stem}.md`](../benchmarks/{stem}.md)):", ""]
    out += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    out.append("")
    for slug, title, _runs in curve_sections(text):
        if title == heading:
            out += [f"![{title}](../benchmarks/img/{stem}-{slug}.png)", ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "<!-- bench-index -->" in markdown:
        index = [f"- [`{stem}`](benchmarks/{stem}.md): {title}" for stem, title in bench_files()]
        markdown = markdown.replace("<!-- bench-index -->", "\n".join(index))
    markdown = _SETTINGS.sub(lambda m: settings_block(m.group(1), m.group(2)), markdown)
    return _BENCH.sub(lambda m: bench_block(m.group(1), m.group(2)), markdown)


__all__ = ["api_pages", "bench_pages", "cli_page", "on_config", "on_files", "on_page_markdown"]
