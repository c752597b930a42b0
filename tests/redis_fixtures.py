"""Real ``redis-server`` processes for the Redis tests, started and stopped by the tests themselves.

Every server binds 127.0.0.1 only, keeps nothing on disk (``--save "" --appendonly no``) and is
stopped by its own pid. Where ``redis-server`` is missing the tests skip on a laptop (with the
command that installs it) but fail in CI (``CI`` set), so Redis coverage is never lost silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiotier_bench.servers import free_ports, reap

__all__ = [
    "RedisServer",
    "RedisServerFactory",
    "free_port",
    "redis_server",
    "redis_server_factory",
    "redis_url",
    "require_redis_server",
]

_START_DEADLINE = 15.0


def require_redis_server() -> str:
    """Path of ``redis-server``; fail in CI, skip elsewhere, when it is not installed."""
    exe = shutil.which("redis-server")
    if exe is None:
        msg = (
            "redis-server is not installed: the Redis tier tests need a real server. "
            "Install it with `sudo apt-get install redis-server` (Debian/Ubuntu) or "
            "`brew install redis` (macOS)."
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI run without redis-server: {msg}", pytrace=False)
        pytest.skip(msg)
    return exe


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


def _ping(port: int, timeout: float = 0.5) -> bool:
    """One RESP ``PING`` over a raw socket (no client library state to leak between polls)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = s.recv(64)
            # +PONG, or -NOAUTH from a server that wants a password: either way it answers.
            return reply.startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` child process on a fixed port; can be killed and restarted there."""

    def __init__(self, exe: str, port: int, workdir: Path, extra_args: tuple[str, ...] = ()):
        self.exe = exe
        self.port = port
        self.workdir = workdir
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"redis-{port}.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> RedisServer:
        """Start the process and return once it answers PING (or fail with its log)."""
        if self.running:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            self.exe,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self.workdir),
            "--loglevel", "warning",
            *self.extra_args,
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + _START_DEADLINE
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if _ping(self.port):
                return self
            time.sleep(0.02)
        self.stop()
        log_text = self.log_path.read_text(errors="replace")[-2000:]
        pytest.fail(f"redis-server on port {self.port} did not answer PING:\n{log_text}")

    def kill(self) -> None:
        """SIGKILL the server (a crash: no goodbye to its clients) and reap it."""
        self._signal_and_reap(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM the server and reap it (SIGKILL if it lingers)."""
        self._signal_and_reap(signal.SIGTERM)

    def restart(self) -> RedisServer:
        """Kill, then start again on the same port (an empty server: nothing is persisted)."""
        self.kill()
        return self.start()

    def _signal_and_reap(self, sig: int) -> None:
        proc, self.proc = self.proc, None
        reap(proc, sig)


class HoldingRelay:
    """A TCP relay in front of a server that can lose a request's answer: once armed, the next
    chunk a client sends that holds ``match`` is kept back and the client's connection reset
    (its library sees a lost connection and may send the request again); :meth:`release`
    delivers the kept bytes on a connection of its own, late."""

    def __init__(self, upstream_port: int, match: bytes) -> None:
        self.upstream_port = upstream_port
        self.match = match
        self.armed = False
        self.held: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> HoldingRelay:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in self._relays:
            task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)
        for _ in range(3):  # the transports' closing callbacks
            await asyncio.sleep(0)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        task.add_done_callback(self._relays.discard)
        writers = [writer]
        pump: asyncio.Task[None] | None = None
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            writers.append(up_writer)

            async def answers() -> None:
                with contextlib.suppress(OSError):
                    while data := await up_reader.read(1 << 16):
                        writer.write(data)
                        await writer.drain()

            pump = asyncio.create_task(answers())
            while data := await reader.read(1 << 16):
                if self.armed and self.match in data:
                    self.armed = False
                    self.held.append(data)
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()  # a reset, no answer
                    break
                up_writer.write(data)
                await up_writer.drain()
        except OSError:
            pass
        finally:
            for w in writers:
                w.close()
            if pump is not None:
                pump.cancel()
            # each socket is closed a loop turn after its transport: wait for that here, or a
            # loop that stops first leaves it to the garbage collector (a ResourceWarning)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(
                    asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True),
                    5,
                )

    async def release(self) -> None:
        """Deliver what was kept back, each on a new connection, and wait for the answers."""
        for data in self.held:
            r, w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            w.write(data)
            await w.drain()
            await asyncio.wait_for(r.read(1 << 16), 10)
            w.close()
            await w.wait_closed()
        self.held.clear()


class RedisServerFactory:
    """Starts servers for one test and stops every one of them at its end."""

    def __init__(self, exe: str, workdir: Path) -> None:
        self.exe = exe
        self.workdir = workdir
        self.servers: list[RedisServer] = []

    def __call__(self, port: int | None = None, *extra_args: str) -> RedisServer:
        server = RedisServer(self.exe, port or free_port(), self.workdir, extra_args)
        self.servers.append(server)
        return server.start()

    def close(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One server shared by the session (tests get a flushed database via ``redis_url``)."""
    exe = require_redis_server()
    server = RedisServer(exe, free_port(), tmp_path_factory.mktemp("redis-session"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session server, emptied (FLUSHALL) before the test."""
    if not redis_server.running:  # a test may have crashed it; bring it back
        redis_server.start()
    with socket.create_connection(("127.0.0.1", redis_server.port), timeout=5) as s:
        s.sendall(b"*1\r\n$8\r\nFLUSHALL\r\n")
        assert s.recv(64).startswith(b"+OK")
    return redis_server.url


@pytest.fixture
def redis_server_factory(tmp_path: Path) -> Iterator[RedisServerFactory]:
    """Start private servers (to kill and restart) that are all stopped when the test ends."""
    factory = RedisServerFactory(require_redis_server(), tmp_path / "redis")
    try:
        yield factory
    finally:
        factory.close()
