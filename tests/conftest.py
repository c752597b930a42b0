"""Fixtures shared by the whole suite."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from redis_fixtures import *  # noqa: F403


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


