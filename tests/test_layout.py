"""The package's shape (issue 23, docs/architecture.md): imports point down the stack and do not
go round in circles.

Imports are read from the source with ``ast`` -- every ``import`` and ``from ... import``, at
module level, inside functions and under ``TYPE_CHECKING`` alike (a function-level import is
still an edge: it only hides it from the interpreter). Package ``__init__`` modules are left
out: they re-export, they do not use.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "rlstash"

# The stack, bottom to top (DESIGN.md's layout): a module may import its own layer and below.
TOP_LEVEL = {
    # foundation: contracts, specs, devices, memory planning, files, checks
    "core": 0, "spec": 0, "device": 0, "atomic": 0, "indices": 0, "settings": 0,
    "registration": 0, "memory": 0, "cgroup": 0, "presets": 0, "autoreset": 0, "finite": 0, "moved": 0, "manifest": 0,
    # the parts a buffer is made of
    "writer": 1, "prefetch": 1, "ratelimit": 1,
    "replay": 2,
    "__main__": 7,
}  # fmt: skip
PACKAGES = {
    "storage": 1, "sampler": 1, "datasets": 2, "envs": 3, "collect": 4, "agents": 5,
    "diag": 6, "train": 6, "hub": 6, "cli": 7,
}  # fmt: skip
LAYER_NAMES = {0: "foundation", 1: "storage/sampler", 2: "replay", 3: "envs", 4: "collect",
               5: "agents", 6: "train/diag", 7: "cli"}  # fmt: skip

# Cycles not yet taken apart, each with the issue point that removes it. This set may only
# shrink: a new cycle fails the test, and so does one listed here that no longer exists.
KNOWN_CYCLES: set[frozenset[str]] = set()  # none left (issue 23 point 4 took the stream's apart)


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


MODULES = _modules()
INITS = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def _targets(module: str, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".")
        if MODULES[module].name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        if module in INITS:
            continue
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges.update(t for t in _targets(module, node) if t in MODULES and t not in INITS)
        edges.discard(module)
        graph[module] = edges
    return graph


def layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 2:
        return TOP_LEVEL[parts[1]]
    return PACKAGES[parts[1]]


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


GRAPH = _graph()


def test_every_module_has_a_layer():
    unplaced = []
    for module in GRAPH:
        try:
            layer(module)
        except KeyError:
            unplaced.append(module)
    assert unplaced == [], f"add these to TOP_LEVEL or PACKAGES in {__file__}: {unplaced}"


def test_imports_point_down_the_stack():
    upward = [
        f"{m} ({LAYER_NAMES[layer(m)]}) imports {t} ({LAYER_NAMES[layer(t)]})"
        for m, targets in sorted(GRAPH.items())
        for t in sorted(targets)
        if layer(t) > layer(m)
    ]
    assert upward == [], "imports that point up the stack:\n" + "\n".join(upward)


def test_no_import_cycles():
    cycles = set(_cycles(GRAPH))
    new = [sorted(c) for c in cycles - KNOWN_CYCLES]
    gone = [sorted(c) for c in KNOWN_CYCLES - cycles]
    assert new == [], f"import cycles: {new}"
    assert gone == [], f"cycles taken apart: remove them from KNOWN_CYCLES: {gone}"


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": set()}, [frozenset({"a", "b"})]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [frozenset({"a", "b", "c"})]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_cycle_finder_finds_cycles(graph, expected):
    assert _cycles(graph) == expected
