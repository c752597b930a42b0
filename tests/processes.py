"""Child server processes of the test suite: free ports, and stopping a child by its own pid."""

from __future__ import annotations

import os
import socket
import subprocess
from contextlib import ExitStack

__all__ = ["free_ports", "reap"]


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
            os.kill(proc.pid, 9)
            proc.wait(timeout=10)
    else:
        proc.wait()
