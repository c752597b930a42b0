"""The SSD tier's work on its threads: system calls over file descriptors and caller buffers.

Nothing here touches the event loop or the tier's index; every function runs on one of the
tier's threads, inside a hop (:mod:`.hops`) or while a tier opens or closes. A disk error
surfaces as ``OSError``, for the op's ``finish`` to translate on the loop.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable
from typing import Final

__all__ = [
    "O_CLOEXEC",
    "O_NOFOLLOW",
    "NowaitProbe",
    "fsync_dir",
    "open_regular",
    "pwrite_all",
    "read_exact_into",
    "replace_file",
    "skip_views",
    "unlink_quiet",
    "yield_cpu",
]

O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
#: The tier's files are never followed through a symlink planted at their path.
O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)


def open_regular(path: str, flags: int) -> int:
    """``os.open`` of a file the tier reads, refusing anything but a regular file: never
    through a symlink, and a FIFO or device planted at the path is refused instead of blocking
    the open. Raises ``OSError`` naming what was found."""
    fd = os.open(path, flags | os.O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file (mode {stat.filemode(mode)})", path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


#: Let a runnable thread waiting for this CPU run (the event loop, most often); returns at once
#: when there is none. A no-op where the platform has no ``sched_yield``.
yield_cpu: Callable[[], None] = getattr(os, "sched_yield", lambda: None)


class NowaitProbe:
    """Reads what the page cache holds without waiting for the disk (``RWF_NOWAIT``).

    A file system that refuses the flag (or a platform without it) is remembered, so the flag
    is tried once rather than on every read; from then on every read simply blocks. One probe
    per tier: tiers on different file systems learn separately.

    After a probe found part of a block on disk, the probe rests for :attr:`rest` seconds, and
    on while reads keep going to the disk path (:meth:`rest_on`), up to :attr:`rest_max`: the
    tier then reads each batch as one stream in file order, unprobed, the kernel reading ahead
    (or advised together when scattered). A cold stream gains nothing from probing, a probe of
    pages the kernel is still reading in can wait behind the readahead's own requests as long as
    a blocking read would, and any read out of the stream's order (a probe ahead of it, a second
    thread) resets the kernel's readahead for the file (figures in ``docs/ssd.md``).
    """

    rest = 0.1
    rest_max = 1.0

    def __init__(self, flag: int = getattr(os, "RWF_NOWAIT", 0)) -> None:
        #: The ``preadv`` flag in use; 0 once refused (every read then waits for the disk).
        self.flag = flag
        #: ``time.monotonic()`` until which :meth:`preadv` reads nothing (it found the disk).
        self.resting_until = 0.0
        #: When a probe last found the disk.
        self.found_at = 0.0

    @property
    def resting(self) -> bool:
        """Whether a read found the disk less than :attr:`rest` seconds ago."""
        return bool(self.resting_until) and time.monotonic() < self.resting_until

    def rest_on(self) -> None:
        """A read while resting went to the disk path: rest :attr:`rest` more, but probe again
        at the latest :attr:`rest_max` after a probe last found the disk (the data may have
        become warm meanwhile; probing on every read would disturb a cold stream)."""
        self.resting_until = min(time.monotonic() + self.rest, self.found_at + self.rest_max)

    def preadv(self, fd: int, views: list[memoryview], offset: int) -> int:
        """Bytes read from the page cache at ``offset``; 0 when the read would wait for the
        disk (the rest is then read with :func:`read_exact_into`)."""
        flag = self.flag
        if not flag or (self.resting_until and time.monotonic() < self.resting_until):
            return 0
        try:
            got = os.preadv(fd, views, offset, flag)
        except BlockingIOError:
            got = 0
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self.flag = 0
            return 0
        want = 0
        for v in views:  # no generator: this runs per block, holding the GIL
            want += v.nbytes
        if got < want:
            self.found_at = time.monotonic()
            self.resting_until = self.found_at + self.rest
        return got


def skip_views(views: list[memoryview], skip: int) -> list[memoryview]:
    """``views`` without their first ``skip`` bytes."""
    rest: list[memoryview] = []
    for v in views:
        if skip >= v.nbytes:
            skip -= v.nbytes
            continue
        rest.append(v[skip:])
        skip = 0
    return rest


def read_exact_into(fd: int, views: list[memoryview], offset: int) -> int:
    """``preadv`` until the views are full or EOF; return the bytes read."""
    want = sum(v.nbytes for v in views)
    got = 0
    while got < want:  # a regular file returns short only at EOF
        n = os.preadv(fd, skip_views(views, got) if got else views, offset + got)
        if n <= 0:
            break
        got += n
    return got


def pwrite_all(fd: int, chunks: list[memoryview], offset: int) -> None:
    """``pwritev`` until every byte is written at ``offset`` (a disk error raises ``OSError``)."""
    pending = [c for c in chunks if c.nbytes]
    while pending:
        n = os.pwritev(fd, pending, offset)
        if n <= 0:
            raise OSError(errno.EIO, f"pwritev wrote {n} bytes")
        offset += n
        while n:
            head = pending[0]
            if n >= head.nbytes:
                n -= head.nbytes
                pending.pop(0)
            else:
                pending[0] = head[n:]
                n = 0


def fsync_dir(path: str) -> None:
    """Make a rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | O_CLOEXEC | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(directory: str, name: str, data: bytes, *, tmp_prefix: str, sync: bool) -> None:
    """Write ``directory/name`` whole (mode 0600) through a temporary renamed over it; with
    ``sync``, durably (the file, then the directory)."""
    tmp = os.path.join(directory, tmp_prefix + name)
    unlink_quiet(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        unlink_quiet(tmp)
        raise
    if sync:
        fsync_dir(directory)


def unlink_quiet(path: str) -> None:
    """Unlink ``path``; a file already gone is no error."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
