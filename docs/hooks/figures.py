"""Figures drawn from the markdown tables of ``bench/results/*.md`` (matplotlib, Agg, PNG).

- :func:`ratio_bars`: a table with ``ratio`` columns (values such as ``0.69x``) as bars, one
  group per row, with a line at 1.0 (parity with the peer).
- :func:`learning_curves`: a section whose per-run table has ``library`` and ``eval returns``
  columns as return curves: the median over seeds per library, each seed faint.
"""

from __future__ import annotations

import io
import re
import statistics
from collections.abc import Iterator

Table = tuple[str, list[str], list[list[str]]]  # (section heading, header, rows)


def tables(text: str) -> list[Table]:
    """Every pipe table of ``text`` with the ``##`` heading it sits under."""
    out: list[Table] = []
    heading, block = "", []
    for line in [*text.splitlines(), ""]:
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|"):
            block.append(line)
            continue
        if len(block) >= 3 and set(block[1].replace("|", "").strip()) <= set("-: "):
            cells = [_cells(row) for row in block]
            out.append((heading, cells[0], cells[2:]))
        block = []
    return out


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


_RATIO = re.compile(r"^\**([0-9]*\.?[0-9]+)x\**$")


def _ratio(cell: str) -> float | None:
    m = _RATIO.match(cell.replace(" ", ""))
    return float(m.group(1)) if m else None


def _png(fig) -> bytes:  # noqa: ANN001 - a matplotlib Figure
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _short(text: str, n: int = 38) -> str:
    text = re.sub(r"[`*]", "", text)
    return text if len(text) <= n else text[: n - 1] + "…"


def ratio_bars(found: list[Table], stem: str) -> Iterator[tuple[str, bytes]]:
    """(title, PNG) for each table with at least one column of ``0.69x``-style ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for heading, header, rows in found:
        cols = [
            j
            for j, name in enumerate(header)
            if "ratio" in name.lower() and sum(_ratio(r[j]) is not None for r in rows if j < len(r))
        ]
        rows = [r for r in rows if len(r) == len(header)]
        if not cols or not rows or len(rows) > 40:
            continue
        labels = [_label(r[: cols[0]]) for r in rows]
        names = [_col_name(header, j) for j in cols]
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) * max(1, len(cols) / 2) + 1.4))
        height = 0.8 / len(cols)
        for k, j in enumerate(cols):
            values = [_ratio(r[j]) or 0.0 for r in rows]
            ys = [i + k * height for i in range(len(rows))]
            ax.barh(ys, values, height=height, label=names[k])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks([i + height * (len(cols) - 1) / 2 for i in range(len(rows))], labels)
        ax.invert_yaxis()
        ax.set_xlabel("ratio (1.0 = parity with the peer; see the table for which way is better)")
        ax.set_title(_short(heading or stem, 90), fontsize=10)
        if len(cols) > 1:
            ax.legend(fontsize=8)
        yield f"{heading or stem}: ratios", _png(fig)


def _label(cells: list[str]) -> str:
    """A row's label: its cells with words in them (not numbers), before the first ratio."""
    words = [c for c in cells if re.search(r"[A-Za-z]", c) and c not in ("—", "-")]
    return _short(" · ".join(words[:3]) or " ".join(cells[:1]), 60)


def _col_name(header: list[str], j: int) -> str:
    if header[j].strip().lower() == "ratio" and j >= 2:
        left = header[j - 2].split()
        return f"ratio of {left[-1] if left else header[j - 2]}"
    return header[j]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.split(":")[0].lower()).strip("-")


def curve_sections(text: str) -> list[tuple[str, str, dict[str, list[list[float]]]]]:
    """(slug, heading, library -> per-seed returns) of each section with per-seed
    ``eval returns`` (no drawing: what :func:`learning_curves` draws)."""
    out = []
    for heading, header, rows in tables(text):
        if "eval returns" not in header or "library" not in header:
            continue
        li, ri = header.index("library"), header.index("eval returns")
        runs: dict[str, list[list[float]]] = {}
        for r in rows:
            if len(r) <= ri:
                continue
            values = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", r[ri])]
            if len(values) >= 2:
                runs.setdefault(r[li], []).append(values)
        if runs:
            out.append((_slug(heading), heading, runs))
    return out


def learning_curves(text: str) -> Iterator[tuple[str, str, bytes]]:
    """(slug, title, PNG) per section with per-seed ``eval returns``: the return curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for slug, heading, runs in curve_sections(text):
        m = re.search(r"budget ([\d,]+) env steps", heading)
        budget = int(m.group(1).replace(",", "")) if m else None
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for k, (lib, curves) in enumerate(sorted(runs.items())):
            color = f"C{k}"
            n = min(len(c) for c in curves)
            xs = [(i + 1) * budget / n for i in range(n)] if budget else list(range(1, n + 1))
            for c in curves:
                ax.plot(xs, c[:n], color=color, alpha=0.15, linewidth=0.8)
            median = [statistics.median(c[i] for c in curves) for i in range(n)]
            ax.plot(xs, median, color=color, linewidth=2, label=f"{lib} (median of {len(curves)})")
        m = re.search(r"threshold (-?[\d,]+)", heading)
        if m:
            ax.axhline(float(m.group(1).replace(",", "")), color="gray", linestyle="--",
                       linewidth=0.8, label="threshold")  # fmt: skip
        ax.set_xlabel("env steps (evaluations spread evenly over the budget)" if budget
                      else "evaluation")  # fmt: skip
        ax.set_ylabel("evaluation return")
        ax.set_title(_short(heading, 90), fontsize=10)
        ax.legend(fontsize=8)
        yield slug, heading, _png(fig)
