"""The metrics and probe server under hostile clients: half-sent requests, trickled bytes,
connection floods and bursts. Real sockets on 127.0.0.1."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider

from aiotier import ConfigError
from aiotier.telemetry import start_prometheus_server

HALF_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"  # no blank line: never finished


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
        return int(r.status)


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` (EOF, after any answer) within ``within`` s."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


@pytest.fixture
def serve() -> Iterator[tuple[int, MeterProvider]]:
    port = free_port()
    provider = start_prometheus_server(port=port, read_timeout=0.5, max_connections=4)
    yield port, provider
    provider.shutdown()


def test_a_half_sent_request_is_dropped_after_the_read_timeout(
    serve: tuple[int, MeterProvider],
) -> None:
    port, _ = serve
    with socket.create_connection(("127.0.0.1", port)) as idle:
        idle.sendall(HALF_REQUEST)
        assert closed_by_server(idle, within=10.0)
    assert healthz(port) == 200


def test_a_request_trickled_byte_by_byte_is_cut_at_the_deadline(
    serve: tuple[int, MeterProvider],
) -> None:
    """A timeout per read alone would let a byte every 0.1 s hold a thread for ever."""
    port, _ = serve
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.settimeout(0.05)
        while time.monotonic() - start < 20:
            try:
                slow.send(b"X-Slow: 1\r\n"[:1])
                if slow.recv(1) == b"":
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        else:
            pytest.fail("the server kept a trickling client for 20 s")


def test_connections_past_the_bound_get_503_at_once_and_slots_come_back(
    serve: tuple[int, MeterProvider],
) -> None:
    port, _ = serve
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    try:
        for s in idle:
            s.sendall(HALF_REQUEST)
        with socket.create_connection(("127.0.0.1", port)) as extra:
            extra.settimeout(10.0)
            extra.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert extra.recv(4096).startswith(b"HTTP/1.0 503 ")
        assert all(closed_by_server(s, within=10.0) for s in idle)  # their deadline passed
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while True:  # the slots are given back as the handler threads end
        try:
            assert healthz(port) == 200
            break
        except (urllib.error.HTTPError, ConnectionError):
            assert time.monotonic() < deadline, "the connection slots never came back"
            time.sleep(0.01)


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_the_listen_backlog_holds_a_burst(serve: tuple[int, MeterProvider]) -> None:
    port, _ = serve
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(out[2]) == 128  # Send-Q of a listening socket: its backlog


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"read_timeout": 0}, "read_timeout"), ({"max_connections": 0}, "max_connections")],
)
def test_bad_bounds_are_refused(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        start_prometheus_server(port=free_port(), **kwargs)  # type: ignore[arg-type]
