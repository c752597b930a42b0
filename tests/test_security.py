"""The guarantees docs/security.md makes that a grep or one call can check.

- No deserialisation of code: aiotier's source imports no ``pickle`` (nor ``cPickle``,
  ``_pickle``, ``shelve``, ``marshal``, ``dill``, ``cloudpickle``, ``joblib``), names no such
  module anywhere in its code, and calls no ``eval``, ``exec`` or ``compile``. Stored bytes are
  parsed by the framing codec (a fixed header, then raw bytes) and nothing else.
- Metrics are served on 127.0.0.1 unless a caller asks otherwise.
"""

from __future__ import annotations

import ast
import inspect
import io
import tokenize
from pathlib import Path

import pytest
from redis_fixtures import free_port

import aiotier
from aiotier import telemetry

PACKAGE = Path(aiotier.__file__).resolve().parent
SOURCES = sorted(PACKAGE.rglob("*.py"))
SERIALISERS = {"pickle", "cPickle", "_pickle", "shelve", "marshal", "dill", "cloudpickle", "joblib"}
EVALUATORS = {"eval", "exec", "compile", "__import__"}


def test_the_package_has_sources_to_check() -> None:
    assert len(SOURCES) > 20
    assert PACKAGE / "engine.py" in SOURCES


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_pickle_and_no_eval_in_the_package(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] not in SERIALISERS, f"{path}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            mod = (node.module or "").split(".")[0]
            assert mod not in SERIALISERS, f"{path}: from {node.module} import ..."
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in EVALUATORS, f"{path}:{node.lineno}: {node.func.id}()"
    # and no code token names a serialiser at all (comments and docstrings may say "unpickled")
    names = {
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.NAME
    }
    assert not names & SERIALISERS, f"{path}: names {sorted(names & SERIALISERS)}"
    for line_no, line in enumerate(source.splitlines(), 1):
        code = line.split("#", 1)[0]
        assert "pickle." not in code and "import pickle" not in code, f"{path}:{line_no}"


def test_metrics_are_served_on_loopback_by_default() -> None:
    assert inspect.signature(telemetry.start_prometheus_server).parameters["host"].default == (
        "127.0.0.1"
    )
    provider = telemetry.start_prometheus_server(port=free_port())
    try:
        server = provider._server  # type: ignore[attr-defined]
        assert server.server_address[0] == "127.0.0.1"
    finally:
        provider.shutdown()
