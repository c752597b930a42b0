"""The SSD tier's disk operations as data: what one block read, write or unlink needs on a
thread, and the callback that applies its outcome on the loop.

An op holds paths, the key, the caller's buffer and flags, and the :class:`BlockFiles` of its
directory; it never holds the tier. The tier builds ops from its index (``SSDTier._read_op``,
``_write_op``) and learns their outcome through the ``done`` / ``release`` callbacks it passed
in; :class:`~.hops.HopRunner` runs them. A layout of fixed-size slots in preallocated files
would bring its own ops (reads and writes at offsets of open descriptors) and keep the runner.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ..framing import HEADER, encode_header
from .hops import NEEDS_DISK, DiskOp
from .layout import block_path, tmp_path
from .syscalls import (
    TMP_FLAGS,
    NowaitProbe,
    fsync_dir,
    open_for_read,
    read_block_key,
    read_exact_into,
    read_whole_block,
    skip_views,
    unlink_quiet,
    verify_block,
    write_all,
)

__all__ = ["BlockFiles", "BlockOp", "ReadOp", "UnlinkOp", "WriteOp"]

log = logging.getLogger("aiotier.ssd")


class BlockFiles:
    """One tier directory's block files: what every op on them shares (the root, the tier's
    name for messages, ``fsync``), and the names and stamps each write needs."""

    __slots__ = ("_tmp_seq", "fsync", "last_stamp", "root", "tier_name")

    def __init__(self, root: str, tier_name: str, *, fsync: bool, last_stamp: int = 0) -> None:
        self.root = root
        self.tier_name = tier_name
        self.fsync = fsync
        #: The newest mtime written or found by the scan (ns): the next write stamps later.
        self.last_stamp = last_stamp
        self._tmp_seq = 0

    def path(self, digest: bytes, size: int) -> str:
        return block_path(self.root, digest, size)

    def next_stamp(self) -> int:
        """A strictly increasing wall-clock ns stamp: file mtimes carry exact write order.

        File systems stamp mtimes from a coarse clock (a few ms), so writes set their own.
        """
        t = time.time_ns()
        if t <= self.last_stamp:
            t = self.last_stamp + 1
        self.last_stamp = t
        return t

    def write(
        self,
        key: bytes,
        digest: bytes,
        size: int,
        data: memoryview,
        old_size: int | None,
        victims: list[tuple[bytes, int]],
        *,
        handover: bool,
        done: Callable[[WriteOp, Any], None],
    ) -> WriteOp:
        """The write of a block of ``size`` bytes on disk, replacing a file of ``old_size``
        and unlinking the ``(digest, size)`` victims first."""
        self._tmp_seq += 1
        return WriteOp(
            self,
            key,
            digest,
            size,
            data,
            self.path(digest, size),
            tmp_path(self.root, digest, self._tmp_seq),
            None if old_size is None or old_size == size else self.path(digest, old_size),
            [self.path(d, s) for d, s in victims],
            handover=handover,
            stamp=self.next_stamp(),
            done=done,
        )


class BlockOp(DiskOp):
    """An op on one block's file, whose outcome the tier applies to its index: ``done(op,
    outcome)`` on the loop, a callback passed in rather than a reference to the tier."""

    __slots__ = ("digest", "done", "files", "key", "size")

    def __init__(
        self,
        files: BlockFiles,
        key: bytes,
        digest: bytes,
        size: int,
        done: Callable[[Any, Any], None],
    ) -> None:
        DiskOp.__init__(self, size)  # not super(): ops are made per block, on the loop
        self.files = files
        self.key = key
        self.digest = digest
        #: The block file's size: header, key and payload.
        self.size = size
        self.done = done

    def finish(self, outcome: Any) -> None:
        self.done(self, outcome)


class ReadOp(BlockOp):
    """Read one block file (header and payload) straight into the caller's buffer, verified.

    The outcome is the payload length, -1 when the file is gone, or the exception.
    """

    __slots__ = ("buf", "fd", "got", "hdr", "path", "payload_len", "writes_seen")

    def __init__(
        self,
        files: BlockFiles,
        key: bytes,
        digest: bytes,
        size: int,
        payload_len: int,
        buf: memoryview,
        writes_seen: int,
        done: Callable[[ReadOp, Any], None],
    ) -> None:
        BlockOp.__init__(self, files, key, digest, size, done)
        self.payload_len = payload_len
        self.buf = buf
        #: The tier's write count when the read was queued (-1: a write of this key was in
        #: flight), so that a missing file proves the block gone only if no write began since.
        self.writes_seen = writes_seen
        # path is named on the thread by start(); fd, hdr and got are set by start() only when
        # the page cache did not hold the whole block (for advise() and complete()).
        self.fd: int
        self.hdr: bytearray
        self.got: int
        self.path: str

    def start(self, nowait: NowaitProbe) -> Any:
        """Open and read what the page cache holds: the outcome, or NEEDS_DISK.

        No ``utime`` on reads: it dirties the inode (a journal write) on every promotion; read
        recency survives a clean restart through the recency file instead.
        """
        self.path = block_path(self.files.root, self.digest, self.size)
        fd = open_for_read(self.path)
        if fd is None:
            return -1
        try:
            hdr = bytearray(HEADER.size + len(self.key))
            views = [memoryview(hdr), self.buf]
            got = nowait.preadv(fd, views, 0)
            if got != len(hdr) + self.payload_len:
                self.fd, self.hdr, self.got = fd, hdr, got
                fd = -1  # complete() closes it
                return NEEDS_DISK
            return verify_block(fd, self.path, self.key, hdr, self.buf, got, self.files.tier_name)
        finally:
            if fd >= 0:
                os.close(fd)

    def advise(self) -> None:
        with contextlib.suppress(OSError):
            os.posix_fadvise(self.fd, self.got, 0, os.POSIX_FADV_WILLNEED)

    def complete(self) -> int:
        """Read the rest (waiting for the disk), verify, close."""
        fd = self.fd
        try:
            views = [memoryview(self.hdr), self.buf]
            got = self.got + read_exact_into(fd, skip_views(views, self.got), self.got)
            name = self.files.tier_name
            return verify_block(fd, self.path, self.key, self.hdr, self.buf, got, name)
        finally:
            os.close(fd)


class WriteOp(BlockOp):
    """Make room (unlink the victims, reading them first if they are handed over), then write
    one block to a temporary and rename it into place.

    The outcome is ``(victims, failure)``: the victims' ``(key, payload)`` are returned even
    when the write fails, since their files are gone either way.
    """

    __slots__ = (
        "data",
        "final",
        "handover",
        "leaving",
        "old_path",
        "report",
        "skip",
        "stamp",
        "tmp",
        "unlink",
    )

    def __init__(
        self,
        files: BlockFiles,
        key: bytes,
        digest: bytes,
        size: int,
        data: memoryview,
        final: str,
        tmp: str,
        old_path: str | None,
        unlink: list[str],
        *,
        handover: bool,
        stamp: int,
        done: Callable[[WriteOp, Any], None],
    ) -> None:
        BlockOp.__init__(self, files, key, digest, size, done)
        self.data = data
        self.final = final
        self.tmp = tmp
        self.old_path = old_path
        self.unlink = unlink
        self.handover = handover
        self.stamp = stamp
        #: Evicted by a later block of its own batch before it was written: only clean up.
        self.skip = False
        #: Victims being handed over to the tier below (digests in the tier's ``_leaving``).
        self.leaving: list[bytes] = []
        #: Name the victims (their keys, read from the headers) when nothing is handed over.
        self.report = False

    def start(self, nowait: NowaitProbe) -> tuple[list[tuple[bytes, bytes]], BaseException | None]:
        """Make room, then write; the victims' bytes are returned even when the write fails."""
        evicted: list[tuple[bytes, bytes]] = []
        for victim in self.unlink:  # make room first
            if self.handover:
                got = read_whole_block(victim)
                if got is not None:
                    evicted.append(got)
            elif self.report:
                key = read_block_key(victim)
                if key is not None:
                    evicted.append((key, b""))
            unlink_quiet(victim)
        if self.skip:
            for p in (self.final, self.old_path):
                if p is not None:
                    unlink_quiet(p)
            if self.handover:
                evicted.append((self.key, bytes(self.data)))
            elif self.report:
                evicted.append((self.key, b""))
            return evicted, None
        try:
            self._write()
        except Exception as exc:
            # No older bytes may survive a newer write that was accepted and then failed.
            for p in (self.final, self.old_path):
                if p is not None:
                    with contextlib.suppress(OSError):
                        unlink_quiet(p)
            return evicted, exc
        if self.old_path is not None:
            unlink_quiet(self.old_path)
        return evicted, None

    def _write(self) -> None:
        header = encode_header(self.key, self.data)
        try:
            fd = os.open(self.tmp, TMP_FLAGS, 0o600)
        except FileExistsError:  # a stale temporary of a crashed process with our pid reuse
            unlink_quiet(self.tmp)
            fd = os.open(self.tmp, TMP_FLAGS, 0o600)
        try:
            try:
                write_all(fd, [memoryview(header), self.data])
                os.utime(fd, ns=(self.stamp, self.stamp))
                if self.files.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(self.tmp, self.final)
        except BaseException:
            unlink_quiet(self.tmp)
            raise
        if self.files.fsync:
            fsync_dir(os.path.dirname(self.final))


class UnlinkOp(DiskOp):
    """Unlink one block file. A failure is logged, not raised: the index has already forgotten
    the block."""

    __slots__ = ("digest", "files", "path", "release", "then")

    def __init__(
        self,
        files: BlockFiles,
        path: str,
        digest: bytes,
        release: Callable[[bytes], None],
        *,
        then: DiskOp | None = None,
    ) -> None:
        DiskOp.__init__(self, 0)
        self.files = files
        self.path = path
        self.digest = digest
        self.release = release  # ends the digest's turn on the loop
        self.then = then  # another op, settled once this clean-up is done

    def start(self, nowait: NowaitProbe) -> None:
        unlink_quiet(self.path)
        if self.files.fsync:
            fsync_dir(os.path.dirname(self.path))

    def finish(self, outcome: Any) -> None:
        self.release(self.digest)
        if isinstance(outcome, OSError):
            name = self.files.tier_name
            log.warning("ssd tier %r: removing %s failed: %s", name, self.path, outcome)
            outcome = None
        self.settle(outcome)
        if self.then is not None:
            self.then.settle(None)
