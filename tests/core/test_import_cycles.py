"""No import circles among aiotier's modules: each module is built on the ones it imports, never
on one that imports it back (a part takes its collaborators, not the whole that holds it).

The graph has an edge from a module to each aiotier module it imports, at module level or in a
function (runtime imports), and also under ``if TYPE_CHECKING:`` (a type-only back edge is still a
module that knows its owner). A package's ``__init__`` re-exporting its modules is left out:
importing ``aiotier.tiers.base`` runs ``aiotier/tiers/__init__.py`` first, but nothing in
``base`` depends on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import aiotier

ROOT = Path(aiotier.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The aiotier modules ``path`` (module ``name``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` mod
            subs = [f"{module}.{alias.name}" for alias in node.names]
            targets = [s for s in subs if s in known] or [module]
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name and known[target].name != "__init__.py":
                out.add(target)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
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
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_one_that_imports_it_back() -> None:
    known = _modules()
    graph = {name: _imported(name, path, known) for name, path in known.items()}
    assert _cycles(graph) == []


def test_the_walk_sees_a_circle() -> None:
    """The check itself: two modules importing each other are one component."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
