"""scripts/ci_matrix.sh: a Python of the matrix that is missing is reported, never passed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def matrix(**env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "CI"}
    return subprocess.run(
        ["bash", "scripts/ci_matrix.sh"], cwd=ROOT, capture_output=True, text=True,
        timeout=60, env={**environ, "CI_MATRIX_PYTHONS": "3.99", **env}, check=False,
    )  # fmt: skip


def test_a_missing_python_fails_ci() -> None:
    out = matrix(CI="true")
    assert out.returncode == 1
    assert "Python 3.99 was not found" in out.stderr
    assert "CI fails" in out.stderr
    assert "3.99/asyncio   MISSING" in out.stdout and "3.99/uvloop    MISSING" in out.stdout


def test_a_missing_python_is_a_loud_warning_outside_ci() -> None:
    out = matrix()
    assert out.returncode == 0
    assert "WARNING: ci_matrix: Python 3.99 was not found" in out.stderr
    assert "NOT run" in out.stderr
    assert "MISSING" in out.stdout
