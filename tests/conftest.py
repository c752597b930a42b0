"""Fixtures shared by the whole suite, and the event loop it runs on.

``--loop uvloop`` (or ``AIOTIER_TEST_LOOP=uvloop``) runs every async test, and every loop a sync
test starts with ``asyncio.run``, on uvloop; the default is asyncio's own loop. CI runs the
suite both ways (``scripts/ci_matrix.sh``).
"""

from __future__ import annotations

import asyncio
import http.server
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from blockbuster import blockbuster_ctx
from redis_fixtures import *  # noqa: F403
from seaweedfs_fixtures import *  # noqa: F403

LOOPS = ("asyncio", "uvloop")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--loop", choices=LOOPS, default=os.environ.get("AIOTIER_TEST_LOOP") or "asyncio",
        help="the event loop the tests run on (default: $AIOTIER_TEST_LOOP or asyncio)",
    )  # fmt: skip
    parser.addoption(
        "--run-slow", action="store_true", help="also run the tests marked slow (long variants)"
    )


class _UvloopFactories:
    """pytest-asyncio's hook: every async test gets a uvloop loop."""

    def pytest_asyncio_loop_factories(self, config: pytest.Config, item: pytest.Item) -> Any:
        import uvloop

        return {"uvloop": uvloop.new_event_loop}


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--loop") != "uvloop":
        return
    try:
        import uvloop
    except ImportError:
        raise pytest.UsageError(
            "--loop uvloop: uvloop is not installed (pip install 'aiotier[uvloop]')"
        ) from None
    config.pluginmanager.register(_UvloopFactories(), "aiotier-uvloop-factories")
    # sync tests that start a loop of their own (asyncio.run, asyncio.Runner) get uvloop too
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def pytest_report_header(config: pytest.Config) -> str:
    return f"event loop: {config.getoption('--loop')}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="a long variant: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_blocking_calls_in_the_event_loop() -> Iterator[None]:
    """Fail any test in which aiotier's own code blocks the event loop (file I/O, sleep, sockets).

    Only calls made from ``aiotier`` frames count (test code may use plain files and clients).
    The benchmark suite (``aiotier_bench``) counts as aiotier's code, except
    ``aiotier_bench.servers``: test harness (starting and killing servers, synchronous by
    design), so it counts as test code.
    Thread locks are left out: the OpenTelemetry SDK takes short, uncontended locks when it
    records, which is CPU work, not I/O.
    """
    with blockbuster_ctx(
        ["aiotier", "aiotier_bench"], excluded_modules=["aiotier_bench.servers"]
    ) as bb:
        for name in ("threading.Lock.acquire", "threading.Lock.acquire_lock"):
            bb.functions[name].deactivate()
        yield


class _Sink(http.server.BaseHTTPRequestHandler):
    received: list[bytes]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def otlp_sink() -> Iterator[tuple[str, list[bytes]]]:
    received: list[bytes] = []
    handler = type("Sink", (_Sink,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/metrics", received
    server.shutdown()
    server.server_close()


