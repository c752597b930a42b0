"""Real ``redis-server`` processes for the Redis tests, started and stopped by the tests themselves.

Every server binds 127.0.0.1 only, keeps nothing on disk (``--save "" --appendonly no``) and is
stopped by its own pid. Where ``redis-server`` is missing the tests skip on a laptop (with the
command that installs it) but fail in CI (``CI`` set), so Redis coverage is never lost silently.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiotier.bench.servers import free_ports, reap

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
