"""``docs/architecture.md`` matches the code: every module under ``aiotier/`` is placed in "The
layers", every line there names a module that exists, and every ``Class.member`` and source path
the page names resolves. Failures say what to add or change on the page."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "aiotier"
PAGE = ROOT / "docs" / "architecture.md"
TEXT = PAGE.read_text()

#: A line of the layers tree: its indent, then one or more names ("table.py / arena.py").
_ENTRY = re.compile(r"^( *)((?:aiotier/)?[\w.]+(?:\.py|/)(?: / [\w.]+(?:\.py|/))*)(?= {2,}|$)")


def _layers_block() -> list[str]:
    section = TEXT.split("## The layers", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1].splitlines()[1:]


def _placed() -> dict[str, int]:
    """Each path the tree places (relative to ``aiotier/``, directories ending in ``/``) and
    its depth."""
    placed: dict[str, int] = {}
    parents: list[str] = []
    for line in _layers_block():
        m = _ENTRY.match(line)
        if not m:
            continue  # a description carried over to the next line
        depth = len(m.group(1)) // 2
        del parents[depth:]
        for name in m.group(2).removeprefix("aiotier/").split(" / "):
            placed["".join(parents) + name] = depth
        if m.group(2).endswith("/"):
            parents.append(m.group(2))
    return placed


def _modules() -> list[str]:
    """Every module under ``aiotier/``: a package as its directory, the rest as files."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and path.parent != PACKAGE:
            rel = rel.removesuffix("__init__.py")
        out.append(rel)
    return out


def _where_to_add(module: str, placed: dict[str, int]) -> str:
    parent, _, name = module.rstrip("/").rpartition("/")
    name += "/" if module.endswith("/") else ""
    if not parent:
        return f"a line `{name:<27}<what it holds>` at the top level of the tree"
    depth = placed.get(parent + "/")
    if depth is None:
        return f"first its directory `{parent}/`, then `{name}` under it"
    line = "  " * (depth + 1) + name
    return f"under `{parent}/`, a line `{line:<27}<what it holds>`"


def test_every_module_is_placed_in_the_layers() -> None:
    placed = _placed()
    missing = [m for m in _modules() if m not in placed]
    hints = "\n".join(f"- aiotier/{m}: add {_where_to_add(m, placed)}" for m in missing)
    assert not missing, f"docs/architecture.md, 'The layers', does not place:\n{hints}"


def test_every_module_the_layers_name_exists() -> None:
    modules = set(_modules())
    stale = [p for p in _placed() if p not in modules]
    assert not stale, (
        "docs/architecture.md, 'The layers', names modules that do not exist (renamed or "
        "moved? change or remove their lines): " + ", ".join(f"aiotier/{p}" for p in stale)
    )


def _members() -> dict[str, set[str]]:
    """Class name -> every member its definitions (any module of that name) give: methods,
    class attributes, ``self.x`` assigned in its methods, and what its bases in the package
    define."""
    members: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            got = members.setdefault(node.name, set())
            bases.setdefault(node.name, set()).update(
                b.id for b in node.bases if isinstance(b, ast.Name)
            )
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    got.add(item.name)
                elif isinstance(item, ast.Assign | ast.AnnAssign):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    for t in targets:
                        if isinstance(t, ast.Name):
                            got.add(t.id)
                        elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                            got.add(t.attr)  # self.x = ...
    for name in list(members):
        todo, seen = list(bases[name]), set()
        while todo:
            base = todo.pop()
            if base in seen or base not in members:
                continue
            seen.add(base)
            members[name] |= members[base]
            todo.extend(bases[base])
    return members


def test_every_class_member_the_page_names_exists() -> None:
    members = _members()
    named = set(re.findall(r"`([A-Z]\w*)\.([a-z_]\w*|[A-Z][A-Z_]+)\b", TEXT))
    wrong = sorted(
        f"`{cls}.{attr}`" + ("" if cls in members else f" (no class {cls} in aiotier/)")
        for cls, attr in named
        if attr not in members.get(cls, ())
    )
    assert not wrong, f"docs/architecture.md names what the code does not have: {wrong}"


def test_every_source_path_the_page_names_exists() -> None:
    paths = set(re.findall(r"`((?:tests/|benchmarks/|aiotier/)?[\w/]+\.py)\b", TEXT))
    wrong = sorted(
        p for p in paths
        if not any((base / p).exists() for base in (ROOT, PACKAGE))
        and p not in _placed_names()
    )  # fmt: skip
    assert not wrong, f"docs/architecture.md names files that do not exist: {wrong}"


def _placed_names() -> set[str]:
    """Bare file names the tree itself places (``options.py`` in its own line)."""
    return {p.rsplit("/", 1)[-1] for p in _placed()}
