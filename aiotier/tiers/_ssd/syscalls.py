"""The SSD tier's work on its threads: system calls over file descriptors and caller buffers.

Nothing here touches the event loop or the tier's index; every function runs on one of the
tier's threads, inside a hop (:mod:`.hops`). A disk error surfaces as ``OSError`` and a damaged
block as ``BlockCorruptedError``, for the op's ``finish`` to translate on the loop.
"""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Final

from ..._types import MAX_KEY_BYTES
from ...errors import BlockCorruptedError
from ..framing import HEADER, check_header, check_payload, parse_header

__all__ = [
    "O_CLOEXEC",
    "TMP_FLAGS",
    "NowaitProbe",
    "drop_file",
    "fsync_dir",
    "open_for_read",
    "read_block_key",
    "read_exact_into",
    "read_whole_block",
    "skip_views",
    "unlink_quiet",
    "verify_block",
    "write_all",
]

O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
#: Block files are never followed through a symlink planted at their path.
_READ_FLAGS: Final = os.O_RDONLY | O_CLOEXEC | _O_NOFOLLOW
TMP_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC | _O_NOFOLLOW


class NowaitProbe:
    """Reads what the page cache holds without waiting for the disk (``RWF_NOWAIT``).

    A file system that refuses the flag (or a platform without it) is remembered, so the flag
    is tried once rather than on every read; from then on every read simply blocks. One probe
    per tier: tiers on different file systems learn separately.
    """

    def __init__(self, flag: int = getattr(os, "RWF_NOWAIT", 0)) -> None:
        #: The ``preadv`` flag in use; 0 once refused (every read then waits for the disk).
        self.flag = flag

    def preadv(self, fd: int, views: list[memoryview], offset: int) -> int:
        """Bytes read from the page cache at ``offset``; 0 when the read would wait for the
        disk (the rest is then read with :func:`read_exact_into`)."""
        flag = self.flag
        if not flag:
            return 0
        try:
            return os.preadv(fd, views, offset, flag)
        except BlockingIOError:
            return 0
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self.flag = 0
            return 0


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


def write_all(fd: int, chunks: list[memoryview]) -> None:
    """``writev`` until every byte is written (a disk error raises ``OSError``)."""
    pending = [c for c in chunks if c.nbytes]
    while pending:
        n = os.writev(fd, pending)
        while n:
            head = pending[0]
            if n >= head.nbytes:
                n -= head.nbytes
                pending.pop(0)
            else:
                pending[0] = head[n:]
                n = 0


def drop_file(fd: int, path: str) -> None:
    """Unlink ``path`` if it is still the inode open as ``fd`` (a newer write may have landed)."""
    try:
        cur = os.stat(path, follow_symlinks=False)
        mine = os.fstat(fd)
        if cur.st_ino == mine.st_ino and cur.st_dev == mine.st_dev:
            os.unlink(path)
    except OSError:
        pass


def open_for_read(path: str) -> int | None:
    """A read-only descriptor of ``path``, or None if there is no such file."""
    try:
        return os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None


def verify_block(
    fd: int, path: str, key: bytes, hdr: bytearray, buf: memoryview, got: int, tier_name: str
) -> int:
    """Check a block read as ``hdr`` + ``buf`` (``got`` bytes); drop the file if it is damaged.

    ``buf`` is as long as the payload the file's name promises; a file that holds a complete
    frame of another length is damaged too.
    """
    try:
        _key_len, payload_len, digest = check_header(hdr, key, got)
        if payload_len != buf.nbytes:
            raise BlockCorruptedError(
                f"key {key[:64]!r}: file holds {payload_len} payload bytes, its name says "
                f"{buf.nbytes}"
            )
        check_payload(buf, key, digest)
    except BlockCorruptedError as exc:
        drop_file(fd, path)
        raise BlockCorruptedError(f"ssd tier {tier_name!r} file {path}: {exc}") from None
    return payload_len


def read_whole_block(path: str) -> tuple[bytes, bytes] | None:
    """(key, payload) of a verified block file, or None if it is gone or does not verify."""
    try:
        with open(path, "rb", buffering=0) as f:
            blob = f.read()
        key_len, _payload_len, digest = check_header(blob, None, len(blob))
        key = blob[HEADER.size : HEADER.size + key_len]
        payload = blob[HEADER.size + key_len :]
        check_payload(payload, key, digest)
        return key, payload
    except (OSError, BlockCorruptedError):
        return None


def read_block_key(path: str) -> bytes | None:
    """The key in a block file's header, or None if the file is gone or not a block."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    try:
        return parse_header(os.pread(fd, HEADER.size + MAX_KEY_BYTES, 0), where=path).key
    except (OSError, BlockCorruptedError):
        return None
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make a rename or unlink in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | O_CLOEXEC | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_quiet(path: str) -> None:
    """Unlink ``path``; a file already gone is no error."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
