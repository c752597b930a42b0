"""Every example runs as written (quickstart is covered in test_cli.py)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        check=False,
    )  # fmt: skip


def test_scheduler_loop() -> None:
    out = run("examples/scheduler_loop.py")
    assert out.returncode == 0, out.stderr
    assert "r4 admitted: 4 blocks reused" in out.stdout
    assert "r5 now reuses 5 blocks" in out.stdout


def test_custom_tier() -> None:
    out = run("examples/custom_tier.py")
    assert out.returncode == 0, out.stderr
    assert "promoted back: b'block 0'" in out.stdout
    assert "corrupted block reads as: None" in out.stdout
    assert "counted read errors: 1" in out.stdout


def test_vllm_offloading_spec() -> None:
    """Runs without vLLM: the manager driven the way vLLM's scheduler-side connector does."""
    out = run("examples/vllm_offloading_spec.py")
    assert out.returncode == 0, out.stderr
    assert "r2 admitted: 4 blocks reused, 4 stored (3 evicted to the memory tier)" in out.stdout
    assert "r3 deferred: its blocks are on their way up" in out.stdout
    assert "9 blocks reused, 1 stored" in out.stdout
    assert "stored in memory" in out.stdout  # evictions were written back below
    assert "every loaded block verified; pinned blocks at the end: 0" in out.stdout


def test_shared_arena_workers() -> None:
    """Worker processes store and load through the shared arena; the segment is gone after,
    and no resource tracker complains (a worker's attach must not touch the parent's)."""
    shm = Path("/dev/shm")
    before = set(shm.iterdir()) if shm.is_dir() else set()
    out = run("examples/shared_arena_workers.py")
    assert out.returncode == 0, out.stderr
    assert "worker 1 stored 3 blocks" in out.stdout
    assert "worker 2 loaded 3 blocks: ok, ok, ok" in out.stdout
    assert "pinned blocks at the end: 0" in out.stdout
    assert "workers exited with [0, 0]" in out.stdout
    assert "Traceback" not in out.stderr and "leaked" not in out.stderr, out.stderr
    if shm.is_dir():
        assert set(shm.iterdir()) <= before


def test_otlp_export_reaches_a_collector(otlp_sink: tuple[str, list[bytes]]) -> None:
    url, received = otlp_sink
    out = run("examples/otlp_export.py", url)
    assert out.returncode == 0, out.stderr
    assert received  # at least the final export at shutdown


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()


def test_web_service_over_real_http(tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "examples/web_service.py", "--port", str(port),
             "--cache-dir", str(tmp_path / "cache")],
            cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(f"{base}/ops/healthz")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        status, headers, first = _get(f"{base}/blob/hello")
        assert status == 200 and headers["x-cache"] == "miss" and len(first) == 32 * 1024
        status, headers, again = _get(f"{base}/blob/hello")
        assert headers["x-cache"] == "hit" and again == first
        deadline = time.monotonic() + 10
        status, headers, doc = _get(f"{base}/report/hello")
        assert status == 200 and headers["content-type"] == "application/json"
        assert b'"name":"hello"' in doc
        status, _, ready = _get(f"{base}/ops/readyz")
        assert status == 200 and b'"ready": true' in ready
        while True:  # an engine no scheduler steps exports its counts every second
            _, _, metrics = _get(f"{base}/ops/metrics")
            if b'aiotier_lookups_total{' in metrics or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert b"aiotier_lookups_total{" in metrics
        assert b"aiotier_tier_usage_bytes{" in metrics
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, -signal.SIGINT), log.read_text()
    # the SSD tier kept what the engine wrote down at shutdown
    assert any(p.is_file() for p in (tmp_path / "cache").rglob("*"))


async def test_web_service_in_process_through_an_asgi_client(tmp_path: Path) -> None:
    """The example's app through httpx's in-process ASGI transport: single flight on a stampede,
    the cached JSON route, and the mounted probes."""
    import asyncio
    import importlib.util

    import httpx

    # the example imports the Prometheus client, whose import reads /proc once: as a service
    # does, at start-up; here the module is loaded inside the test's loop, so import it first
    await asyncio.to_thread(importlib.import_module, "aiotier.web")
    spec = importlib.util.spec_from_file_location("web_service", ROOT / "examples/web_service.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = module.create_app(str(tmp_path / "cache"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            replies = await asyncio.gather(*(client.get("/blob/stampede") for _ in range(20)))
            assert {r.status_code for r in replies} == {200}
            assert [r.headers["x-cache"] for r in replies].count("miss") == 1
            assert len({r.content for r in replies}) == 1
            first = await client.get("/report/x")
            again = await client.get("/report/x")
            assert first.json() == again.json() and first.json()["name"] == "x"
            assert (await client.get("/ops/healthz")).json() == {"status": "ok"}
            ready = await client.get("/ops/readyz")
            assert ready.status_code == 200 and ready.json()["ready"] is True
            assert (await client.post("/ops/metrics")).status_code == 405
            assert (await client.get("/ops/nothing")).status_code == 404
