"""The core stays sans-IO: no module of ``aiotier._core`` imports an event loop, a tier, the
telemetry or the engine (directly or through a module it imports)."""

from __future__ import annotations

import ast
from pathlib import Path

import aiotier._core

CORE = Path(aiotier._core.__file__).parent
FORBIDDEN = (
    "asyncio",
    "anyio",
    "aiofiles",
    "threading",
    "concurrent",
    "socket",
    "opentelemetry",
    "redis",
    "aiotier.tiers",
    "aiotier.telemetry",
    "aiotier.engine",
    "aiotier._engine",
)


def _imports(path: Path) -> list[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    package = "aiotier._core"
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
                out.append(module)
                out.extend(f"{module}.{alias.name}" for alias in node.names)
            else:
                out.append(node.module or "")
    return out


def _reachable() -> dict[str, list[str]]:
    """For each core module, everything it imports, following aiotier modules it reaches."""
    root = CORE.parent
    seen: dict[str, list[str]] = {}
    for path in sorted(CORE.glob("*.py")):
        names: list[str] = []
        todo = [path]
        done: set[Path] = set()
        while todo:
            p = todo.pop()
            if p in done:
                continue
            done.add(p)
            for name in _imports(p):
                names.append(name)
                if name.startswith("aiotier."):
                    rel = Path(*name.split(".")[1:])
                    for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
                        if candidate.exists():
                            todo.append(candidate)
        seen[path.name] = names
    return seen


def test_core_imports_no_io_no_tier_no_telemetry_no_engine() -> None:
    offenders = {
        module: sorted({n for n in names for f in FORBIDDEN if n == f or n.startswith(f + ".")})
        for module, names in _reachable().items()
    }
    offenders = {m: names for m, names in offenders.items() if names}
    assert not offenders, f"_core modules reach I/O or outer layers: {offenders}"


def test_the_walk_sees_imports() -> None:
    """The check above would pass vacuously if the walk found nothing: it finds the core's own
    modules and the public types."""
    names = _reachable()["engine_core.py"]
    assert "aiotier._core.table" in names and "aiotier._types" in names
