"""The package's import graph has no cycle, and every module imports.

The graph is read from the source (an AST walk), so an import inside a function
counts as much as one at the top of a file: an import cycle hidden in a function
body is still a cycle, it only fails later and in fewer places.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "specdec"
ROOT = Path(importlib.util.find_spec(PACKAGE).origin).parent  # src/specdec, without importing it


@dataclass(frozen=True)
class Edge:
    """Where ``source`` imports ``target``."""

    path: str  # file, relative to the package's parent folder
    line: int
    in_function: bool


Graph = dict[str, dict[str, Edge]]  # module -> imported module -> where


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under ``root`` (a package folder)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int, bool]]:
    """(dotted name, line, inside a function) for every name imported in ``tree``, relative
    imports resolved against ``module``: ``from specdec.config import SpecConfig`` gives
    specdec.config.SpecConfig, ``import specdec.verify as v`` gives specdec.verify."""
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno, in_function) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.extend((f"{base}.{alias.name}", node.lineno, in_function) for alias in node.names)
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def import_graph(root: Path = ROOT) -> Graph:
    """Module -> the package modules it imports, at module level or inside functions.

    ``from specdec.bench import harness`` is an edge to ``specdec.bench.harness``; a name
    that is not a module (``from specdec.config import SpecConfig``) is an edge to the
    module that defines it. Parent packages a dotted import runs first are not edges.
    """
    files = module_files(root)
    graph: Graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        edges: dict[str, Edge] = {}
        for name, line, in_function in imported_names(tree, module, path.name == "__init__.py"):
            target = name if name in files else name.rpartition(".")[0]
            if target in files and target != module and name.split(".")[0] == PACKAGE:
                edges.setdefault(target, Edge(str(path.relative_to(root.parent)), line, in_function))
        graph[module] = edges
    return graph


def find_cycles(graph: dict[str, dict]) -> list[list[str]]:
    """One cycle [a, b, ..., a] per strongly connected component with more than one module
    (or a module that imports itself); [] for an acyclic graph. Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_cycle_in(graph, set(c), c[0]) for c in sorted(components)]


def _cycle_in(graph: dict[str, dict], component: set[str], start: str) -> list[str]:
    """The shortest path start -> ... -> start inside ``component`` (breadth-first)."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w not in component:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is on no cycle in {sorted(component)}")


def describe(graph: Graph, cycle: list[str]) -> str:
    """'a -> b -> a' and where each import is, e.g. 'specdec/a.py:12 (in a function)'."""
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:], strict=False):
        edge = graph[a][b]
        where = " (in a function)" if edge.in_function else ""
        lines.append(f"    {edge.path}:{edge.line} imports {b}{where}")
    return "\n".join(lines)


# -- the cycle finder on hand-made graphs ------------------------------------------------------


def test_find_cycles_on_small_graphs():
    assert find_cycles({}) == []
    assert find_cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) == []
    assert find_cycles({"a": {"b": 1, "c": 1}, "b": {"d": 1}, "c": {"d": 1}, "d": {}}) == []  # a diamond
    assert find_cycles({"a": {"b": 1}, "b": {"a": 1}}) == [["a", "b", "a"]]
    assert find_cycles({"a": {"a": 1}}) == [["a", "a"]]
    # two separate cycles, one of three modules; the tail x -> a is not part of one
    graph = {"x": {"a": 1}, "a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "p": {"q": 1}, "q": {"p": 1}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["p", "q", "p"]]


def test_function_level_import_cycle_is_found(tmp_path):
    """Today-style code: a cycle hidden in a function body, and one through a relative import."""
    pkg = tmp_path / PACKAGE
    (pkg / "server").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "server" / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("from specdec.server.app import serve\n")
    (pkg / "server" / "app.py").write_text("def serve():\n    from specdec.cli import UsageError\n")
    (pkg / "server" / "protocol.py").write_text("from . import metrics\n")
    (pkg / "server" / "metrics.py").write_text("from .protocol import Body\n")
    (pkg / "config.py").write_text("from specdec import cli  # not a cycle: cli does not import config\n")
    graph = import_graph(pkg)
    assert graph["specdec.config"] == {"specdec.cli": Edge("specdec/config.py", 1, False)}
    assert graph["specdec.server.app"]["specdec.cli"].in_function
    assert find_cycles(graph) == [
        ["specdec.cli", "specdec.server.app", "specdec.cli"],
        ["specdec.server.metrics", "specdec.server.protocol", "specdec.server.metrics"],
    ]
    assert "specdec/server/app.py:2 imports specdec.cli (in a function)" in describe(graph, find_cycles(graph)[0])


# -- the package ---------------------------------------------------------------------------------


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 20 and "specdec.bench.harness" in graph["specdec.bench.cli"]  # the walk sees the package
    cycles = find_cycles(graph)
    assert not cycles, "import cycles in specdec:\n" + "\n".join(describe(graph, c) for c in cycles)


OPTIONAL = {  # module -> the optional extra it needs (skipped when absent)
    "specdec.server.ray.deployment": "ray.serve", "specdec.server.ray.router": "ray.serve",
    "specdec.server.ray.app": "ray.serve",
}


@pytest.mark.parametrize("module", sorted(module_files()))
def test_every_module_imports(module):
    if module in OPTIONAL:
        pytest.importorskip(OPTIONAL[module], reason=f"{module} needs pip install 'specdec[ray]'")
    importlib.import_module(module)
