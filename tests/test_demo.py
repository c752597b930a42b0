"""``aiotier demo`` as a user runs it: sizes, the 80-column summary, timed and open-ended runs
(served, probed over HTTP, stopped with Ctrl-C), and the uvloop option."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from aiotier.cli import print_summary
from aiotier.demo import DemoConfig, DemoResult

ROOT = Path(__file__).resolve().parent.parent
HEADERS = ("tier", "lookups", "hit", "rate", "promoted", "evicted", "read", "written", "MiB",
           "errors", "dropped")  # fmt: skip


def run(*args: str, columns: int = 120, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "aiotier", "demo", *args], capture_output=True, text=True,
        timeout=timeout, cwd=ROOT, env=env, check=False,
    )  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read().decode()


def test_the_default_sizes_leave_room_for_what_a_step_pins() -> None:
    """The default run is sized to shed nothing: the primary holds every block the running
    requests can pin at once, with room for promotions, and write-back's backlog bound (the
    engine's default, 64 MiB) holds many steps of stores."""
    cfg = DemoConfig()
    primary_blocks = (cfg.primary_mib << 20) // cfg.block_size
    pinned_at_most = cfg.max_running * cfg.blocks_per_prompt
    assert primary_blocks >= 1.5 * pinned_at_most
    stores_per_step = cfg.requests / cfg.steps * cfg.blocks_per_prompt * cfg.block_size
    assert 10 * stores_per_step <= (64 << 20)
    assert cfg.memory_mib > cfg.primary_mib  # a demotion target that keeps up


def test_the_default_run_counts_no_errors_and_explains_any_shed_demotion(tmp_path: Path) -> None:
    report = tmp_path / "demo.json"
    out = run("--json", str(report), columns=80)
    assert out.returncode == 0, out.stderr
    data = json.loads(report.read_text())
    assert all(t["errors"] == 0 for t in data["tiers"].values())
    dropped = sum(t["dropped"] for t in data["tiers"].values())
    # none on a machine with a working disk; if the disk stalled, the summary says why
    assert dropped == 0 or "write-back backlog" in out.stdout


def _assert_whole_in_80_columns(text: str) -> None:
    assert "…" not in text
    for line in text.splitlines():
        assert len(line) <= 80, line
    for word in HEADERS:
        assert word in text, word


def test_the_summary_reads_whole_in_80_columns() -> None:
    out = run("--steps", "30", "--requests", "120", columns=80)
    assert out.returncode == 0, out.stderr
    _assert_whole_in_80_columns(out.stdout)


def test_the_summary_of_a_long_run_still_fits_80_columns() -> None:
    huge = {"lookups": 123_456_789, "hit_rate": 0.999, "promotions": 98_765_432,
            "evictions": 87_654_321, "read_mib": 1_234_567.0, "written_mib": 7_654_321.0,
            "errors": 1_234_567, "dropped": 7_654_321}  # fmt: skip
    result = DemoResult(
        steps=99_999_999, seconds=86_400.0, requests_done=123_456_789, ended="stopped",
        summary={
            "tiers": {"primary": huge, "memory": huge, "ssd": huge, "redis": huge,
                      "object": huge},
            "delays_ms": {"sync": {"p50": 1.5, "p90": 12.5, "p99": 99_999.9, "count": 12_345_678},
                          "async": {"p50": None, "p90": None, "p99": None, "count": 0}},
            "blocks_per_second": 1e6, "allocation_failures": 5,
        },
    )  # fmt: skip
    console = Console(width=80, record=True, file=io.StringIO())
    print_summary(console, result)
    text = console.export_text()
    _assert_whole_in_80_columns(text)
    for cell in ("123.5M", "99.9%", "98.8M", "87.7M", "1.2T", "7.3T", "1.2M", "7.7M"):
        assert cell in text
    assert "stopped by Ctrl-C" in text
    assert "write-back backlog" in text  # dropped demotions are explained


def test_duration_runs_a_steady_load_for_that_long(tmp_path: Path) -> None:
    report = tmp_path / "demo.json"
    out = run("--duration", "1.5", "--rate", "40", "--json", str(report))
    assert out.returncode == 0, out.stderr
    data = json.loads(report.read_text())
    assert data["ended"] == "duration"
    assert data["seconds"] >= 1.5
    assert data["tiers"]["primary"]["lookups"] > 0


def test_with_a_metrics_port_it_runs_until_ctrl_c_serving_metrics_and_probes(
    tmp_path: Path,
) -> None:
    port = free_port()
    report = tmp_path / "demo.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiotier", "demo", "--metrics-port", str(port), "--rate", "50",
         "--ssd-dir", str(tmp_path / "ssd"), "--json", str(report)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # ready once the engine has opened its tiers
            assert proc.poll() is None, proc.communicate()
            try:
                status, body = http_get(f"{base}/readyz")
            except urllib.error.URLError:
                status = 0
            if status == 200:
                break
            assert time.monotonic() < deadline, "/readyz never answered 200"
            time.sleep(0.05)
        doc = json.loads(body)
        assert list(doc["engines"][0]["tiers"]) == ["primary", "memory", "ssd"]
        assert http_get(f"{base}/healthz") == (200, '{\n "status": "ok"\n}')

        def lookups() -> float:
            text = http_get(f"{base}/metrics")[1]
            return sum(
                float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("aiotier_lookups_total{")
            )  # fmt: skip

        first = lookups()
        deadline = time.monotonic() + 30
        while lookups() <= first:  # a steady load: the counters keep moving
            assert time.monotonic() < deadline, "the steady load stopped"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "until Ctrl-C" in stdout
    assert "stopped by Ctrl-C" in stdout
    assert "Traceback" not in stderr
    data = json.loads(report.read_text())
    assert data["ended"] == "stopped"
    assert data["tiers"]["primary"]["lookups"] > 0
    with pytest.raises(urllib.error.URLError):  # the server went with the demo
        http_get(f"{base}/healthz")


def test_the_demo_runs_on_uvloop(tmp_path: Path) -> None:
    pytest.importorskip("uvloop", reason="uvloop is not installed (pip install 'aiotier[uvloop]')")
    report = tmp_path / "demo.json"
    out = run("--steps", "20", "--requests", "60", "--loop", "uvloop", "--json", str(report))
    assert out.returncode == 0, out.stderr
    assert json.loads(report.read_text())["tiers"]["primary"]["lookups"] > 0
