"""The HTTP server behind :func:`~aiotier.telemetry.start_prometheus_server`: the standard
library's WSGI server, a thread per connection, with the bounds a server on a network needs.

- **A deadline for the request**: a client has ``read_timeout`` seconds to send its whole
  request, headers included, however it trickles them; then its connection is closed. (A
  timeout per ``recv`` alone lets a byte every few seconds hold a thread for hours.)
- **A bound on connections**: at most ``max_connections`` are served at once; one more is
  answered ``503`` with ``Retry-After`` and closed at once, without a thread.
- **A normal listen backlog** (128, where ``socketserver`` uses 5): a burst of connections
  waits in the kernel's queue instead of having its SYNs dropped and retried a second later.

Requests are HTTP/1.0 (one per connection), and request lines and headers are bounded by
``http.server`` (414, 431), as before.
"""

from __future__ import annotations

import io
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

__all__ = ["BACKLOG", "BoundedWSGIServer", "QuietHandler"]

#: Connections the kernel queues before they are accepted.
BACKLOG: Final = 128
_BUSY: Final = (
    b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


class _DeadlineReader(io.RawIOBase):
    """The receiving side of a connection, failing with ``TimeoutError`` once ``deadline``
    (``time.monotonic()``) passed: each ``recv`` waits at most the time left."""

    def __init__(self, sock: socket.socket, deadline: float, write_timeout: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self._write_timeout = write_timeout

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request was not received in time")
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(b)
        finally:
            self._sock.settimeout(self._write_timeout)  # the answer's writes: their own bound


class QuietHandler(WSGIRequestHandler):
    """Reads the request within the server's deadline; logs nothing (probes come every few
    seconds) and drops a client that is too slow or gone without a traceback."""

    server: BoundedWSGIServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.read_timeout)
        deadline = time.monotonic() + self.server.read_timeout
        raw = _DeadlineReader(self.connection, deadline, self.server.read_timeout)
        self.rfile.close()  # the plain reader setup() made: replaced by one with the deadline
        self.rfile = io.BufferedReader(raw)

    def handle(self) -> None:
        try:
            super().handle()
        except (TimeoutError, ConnectionError):
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


class BoundedWSGIServer(ThreadingMixIn, WSGIServer):
    """A threading WSGI server that serves at most ``max_connections`` connections at once,
    each with ``read_timeout`` seconds to send its request (see the module doc)."""

    daemon_threads = True  # a slow client never holds the process up at exit
    request_queue_size = BACKLOG
    read_timeout: float = 10.0
    max_connections: int = 64

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
