"""A secondary tier on a local disk: one checksummed file per block, bounded, crash-safe.

Layout under ``path`` (see ``docs/ssd.md``)::

    aiotier-ssd            marker: "aiotier-ssd <format>"; refuses foreign, non-empty dirs
    lock                   flock(LOCK_EX) held while a tier has the directory open
    recency                LRU order (digests) saved by a clean close, consumed by the next open
    00/ .. ff/             256 shards, by the first byte of the key's digest
      <digest>-<size>.blk  one block: the shared frame (header, key, payload), ``size`` in hex
      .tmp-<digest>-<n>    a write in progress; renamed into place when complete

The file name is ``blake2b-128(key)``, so no key can name a path outside ``path``, and carries
the frame's total size, so a restart can spot a torn file with a ``stat`` and never has to open
one. The index lives in memory, keyed by digest; a restart rebuilds it from names and mtimes
(writes stamp strictly increasing mtimes), refined by the ``recency`` file after a clean close.

Every file operation runs on the tier's own thread pool, through ``aiofiles.os.wrap`` of whole
operations: a read is open + ``preadv`` straight into the caller's buffer + verify + close in
one thread hop. Operations queued in the same loop iteration share hops (one hop carries many
blocks), and at most ``io_threads`` hops are in flight.

This module keeps what decides: the index and budget, the hand-over of evicted blocks, the
start-up scan and the directory lock. What runs on the threads is in ``tiers/_ssd``: the hop
runner (``hops``), the ops it runs (``ops``) and their system calls (``syscalls``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import struct
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .._core.budget import ByteBudgetLRU
from .._types import MAX_KEY_BYTES, LookupResult, normalize_key
from ..errors import BlockCorruptedError, ConfigError, TieringError, TierUnavailableError
from ._ssd.hops import HopRunner
from ._ssd.layout import (
    LOCK_NAME,
    MARKER_NAME,
    MARKER_TEXT,
    RECENCY_NAME,
    SHARDS,
    TMP_PREFIX,
    block_relpath,
    key_digest,
    parse_block_name,
)
from ._ssd.ops import BlockFiles, ReadOp, UnlinkOp, WriteOp
from ._ssd.syscalls import O_CLOEXEC, unlink_quiet
from ._ssd.turns import KeyTurns
from .base import SecondaryTier, TierUsage
from .framing import HEADER, block_digest, checksum, frame_size

__all__ = ["SSDScan", "SSDTier", "block_relpath", "key_digest", "scan_directory"]

log = logging.getLogger("aiotier.ssd")

_RECENCY_HEAD: Final = struct.Struct("<4sBQQ")  # magic, version, count, xxh3 of the digests
_RECENCY_MAGIC: Final = b"ATRC"
#: Evicted keys kept for removed events before the oldest are dropped (engine not taking).
_EVICTED_KEYS_MAX: Final = 1 << 16
#: Evicted blocks kept for the tier below before the oldest are dropped (engine not taking).
_HANDOVER_MAX_BYTES: Final = 256 << 20


# -- start-up scan ------------------------------------------------------------------------------


@dataclass(slots=True)
class SSDScan:
    """What a scan of a tier directory found (and, when repairing, removed)."""

    blocks: int = 0
    bytes: int = 0
    temporaries: int = 0
    torn: int = 0
    duplicates: int = 0
    evicted: int = 0
    foreign: int = 0
    newest_mtime_ns: int = 0
    seconds: float = 0.0


def _read_recency(root: str, *, consume: bool) -> tuple[list[bytes], int]:
    """Digests in LRU order as saved by the last clean close (oldest first), and the file's
    mtime; ``([], 0)`` when there is none or it does not verify.

    The file is removed when consumed, so after a crash the order falls back to file mtimes.
    """
    path = os.path.join(root, RECENCY_NAME)
    try:
        with open(path, "rb") as f:
            blob = f.read()
            mtime = os.fstat(f.fileno()).st_mtime_ns
    except FileNotFoundError:
        return [], 0
    finally:
        if consume:
            unlink_quiet(path)
    if len(blob) < _RECENCY_HEAD.size:
        return [], 0
    magic, version, count, digest = _RECENCY_HEAD.unpack_from(blob)
    body = memoryview(blob)[_RECENCY_HEAD.size :]
    if magic != _RECENCY_MAGIC or version != 1 or len(body) != 16 * count:
        return [], 0
    if checksum(body) != digest:
        return [], 0
    return [bytes(body[i : i + 16]) for i in range(0, len(body), 16)], mtime


def _write_recency(root: str, digests: list[bytes]) -> None:
    body = b"".join(digests)
    head = _RECENCY_HEAD.pack(_RECENCY_MAGIC, 1, len(digests), checksum(body))
    tmp = os.path.join(root, TMP_PREFIX + RECENCY_NAME)
    with open(tmp, "wb") as f:
        f.write(head)
        f.write(body)
    os.replace(tmp, os.path.join(root, RECENCY_NAME))


def _index_directory(
    root: str, capacity: int | None, *, repair: bool
) -> tuple[SSDScan, ByteBudgetLRU | None, list[str]]:
    """Index the block files under ``root`` by recency. With ``repair`` (``SSDTier.open``),
    remove temporaries, torn files, stale duplicates and blocks over the budget; without
    (``scan_directory``), change nothing.

    One ``stat`` per file and no open: its size against the size in its name finds torn files,
    its mtime gives recency (refined by the ``recency`` file of a clean close). With
    ``capacity``, least-recent blocks are evicted down to the budget. Returns the scan figures,
    the rebuilt budget (with ``capacity``) and the evicted files' paths.
    """
    t0 = time.perf_counter()
    info = SSDScan()
    saved, saved_mtime = _read_recency(root, consume=repair)
    rank = dict.fromkeys(saved)
    found: dict[bytes, tuple[int, int]] = {}  # digest -> (mtime_ns, size)
    newest = saved_mtime
    for shard in SHARDS:
        try:
            it = os.scandir(os.path.join(root, shard))
        except FileNotFoundError:
            continue
        with it:
            for entry in it:
                name = entry.name
                if name.startswith(TMP_PREFIX):
                    info.temporaries += 1
                    if repair:
                        unlink_quiet(entry.path)
                    continue
                parsed = parse_block_name(name, shard)
                if parsed is None:
                    info.foreign += 1
                    continue
                digest, size = parsed
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    info.foreign += 1
                    continue
                if st.st_size != size or size < HEADER.size:
                    info.torn += 1
                    if repair:
                        unlink_quiet(entry.path)
                    continue
                mtime = st.st_mtime_ns
                newest = max(newest, mtime)
                prev = found.get(digest)
                if prev is not None:
                    # A crash between renaming a resized block into place and unlinking its old
                    # file leaves two files; the newer one holds the block's latest write.
                    info.duplicates += 1
                    if prev[0] <= mtime:
                        loser = prev[1]
                        found[digest] = (mtime, size)
                    else:
                        loser = size
                    if repair:
                        unlink_quiet(os.path.join(root, block_relpath(digest, loser)))
                    continue
                found[digest] = (mtime, size)
    info.newest_mtime_ns = newest
    # Blocks the recency file does not list go first, by mtime; then its exact LRU order.
    unlisted = sorted((v[0], d) for d, v in found.items() if d not in rank)
    order = [d for _m, d in unlisted]
    order += [d for d in saved if d in found]
    evicted_paths: list[str] = []
    budget: ByteBudgetLRU | None = None
    if capacity is not None:
        budget = ByteBudgetLRU(capacity)
        for digest in order:
            budget.load(digest, found[digest][1])
        for digest in budget.over_budget():
            evicted_paths.append(os.path.join(root, block_relpath(digest, found[digest][1])))
        if repair:
            for p in evicted_paths:
                unlink_quiet(p)
        info.evicted = len(evicted_paths)
        info.blocks = len(budget)
        info.bytes = budget.used
    else:
        info.blocks = len(found)
        info.bytes = sum(v[1] for v in found.values())
    info.seconds = time.perf_counter() - t0
    return info, budget, evicted_paths


def scan_directory(path: str | os.PathLike[str]) -> SSDScan:
    """Summarise an SSD tier directory without changing it (for ``aiotier inspect``)."""
    root = os.fspath(path)
    if not os.path.isdir(root):
        raise ConfigError(f"{root!r} is not a directory")
    info, _budget, _evicted = _index_directory(root, None, repair=False)
    return info


def _log_scan(tier_name: str, root: str, scan: SSDScan) -> None:
    """Say once what opening a directory repaired or left alone."""
    if scan.temporaries or scan.torn or scan.duplicates or scan.evicted:
        log.info(
            "ssd tier %r: removed %d temporaries, %d torn files, %d stale duplicates, "
            "%d blocks over budget",
            tier_name,
            scan.temporaries,
            scan.torn,
            scan.duplicates,
            scan.evicted,
        )
    if scan.foreign:
        log.warning(
            "ssd tier %r: ignoring %d foreign entries under %s", tier_name, scan.foreign, root
        )


class _OpenResult:
    __slots__ = ("budget", "lock_fd", "root", "scan")

    def __init__(self, root: str, lock_fd: int, budget: ByteBudgetLRU, scan: SSDScan) -> None:
        self.root = root
        self.lock_fd = lock_fd
        self.budget = budget
        self.scan = scan


def _open_dir(root: str, capacity: int, tier_name: str) -> _OpenResult:
    """Create/validate the directory, take its lock, rebuild the index (one thread hop)."""
    root = os.path.abspath(root)
    where = f"ssd tier {tier_name!r} at {root!r}"
    if os.path.lexists(root) and not os.path.isdir(root):
        raise ConfigError(f"{where}: path exists and is not a directory")
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise TierUnavailableError(f"{where}: cannot create the directory: {exc}") from exc
    marker = os.path.join(root, MARKER_NAME)
    try:
        with open(marker, encoding="ascii") as f:
            text = f.read(64)
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as exc:
        raise TierUnavailableError(f"{where}: cannot read {MARKER_NAME}: {exc}") from exc
    if text is None:
        extra = set(os.listdir(root)) - {LOCK_NAME}
        if extra:
            raise ConfigError(
                f"{where}: directory is not empty and has no {MARKER_NAME} marker; refusing to "
                f"use it (found e.g. {sorted(extra)[0]!r})"
            )
    elif text != MARKER_TEXT:
        raise TieringError(f"{where}: unsupported on-disk format {text.strip()!r}")
    try:
        lock_fd = os.open(os.path.join(root, LOCK_NAME), os.O_RDWR | os.O_CREAT | O_CLOEXEC, 0o600)
    except OSError as exc:
        raise TierUnavailableError(
            f"{where}: directory is not writable ({exc.strerror or exc})"
        ) from exc
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise TierUnavailableError(
                f"{where}: directory is locked by another open SSDTier (this or another "
                f"process); one tier per directory"
            ) from exc
        try:
            if text is None:
                tmp = os.path.join(root, TMP_PREFIX + MARKER_NAME)
                with open(tmp, "w", encoding="ascii") as f:
                    f.write(MARKER_TEXT)
                os.replace(tmp, marker)
            for shard in SHARDS:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(os.path.join(root, shard), 0o700)
            # A read-only or full filesystem shows itself here, not at the first write.
            probe = os.path.join(root, f"{TMP_PREFIX}probe-{os.getpid()}")
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o600)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise TierUnavailableError(
                f"{where}: directory is not writable ({exc.strerror or exc})"
            ) from exc
        with contextlib.suppress(FileNotFoundError):  # stale temporaries at the top level
            for name in os.listdir(root):
                if name.startswith(TMP_PREFIX):
                    unlink_quiet(os.path.join(root, name))
        scan, budget, _evicted = _index_directory(root, capacity, repair=True)
        assert budget is not None
        return _OpenResult(root, lock_fd, budget, scan)
    except BaseException:
        os.close(lock_fd)
        raise


# -- the tier -----------------------------------------------------------------------------------


class SSDTier(SecondaryTier):
    """Blocks as checksummed files under ``path``, bounded by ``capacity_bytes`` (LRU).

    ``capacity_bytes`` counts whole files (header and key included). ``fsync=True`` makes each
    completed write durable before it is reported (file and directory fsynced); without it a
    crash may lose recent writes, never return wrong bytes. ``io_threads`` sizes the tier's own
    thread pool, which also bounds the thread hops in flight (default: one less than the CPU
    count, 1 to 4; fewer threads keep the event loop's lag lower, more help on fast disks).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        capacity_bytes: int,
        *,
        fsync: bool = False,
        name: str = "ssd",
        io_threads: int | None = None,
    ) -> None:
        super().__init__(name)
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int):
            raise ConfigError(f"capacity_bytes must be an int, got {capacity_bytes!r}")
        if capacity_bytes <= 0:
            raise ConfigError(f"capacity_bytes must be positive, got {capacity_bytes}")
        if io_threads is None:
            io_threads = _default_io_threads()
        if not isinstance(io_threads, int) or isinstance(io_threads, bool) or io_threads < 1:
            raise ConfigError(f"io_threads must be a positive int, got {io_threads!r}")
        #: The tier's directory; made absolute by :meth:`open` (``abspath`` may ask the OS).
        self.path: str = os.fspath(path)
        self.fsync = bool(fsync)
        self.io_threads = io_threads
        self.capacity_bytes = capacity_bytes
        self.last_scan: SSDScan | None = None
        self._budget = ByteBudgetLRU(capacity_bytes)
        self._runner: HopRunner | None = None
        self._lock_fd: int | None = None
        self._open = False
        self._closing = False
        self._turns = KeyTurns()
        self._evicted: deque[tuple[bytes, bytes]] = deque()
        # Keys evicted with nothing handed over, for the engine's removed events (bounded: a
        # tier used without an engine never has them taken).
        self._evicted_keys: deque[bytes] = deque(maxlen=_EVICTED_KEYS_MAX)
        self._evicted_bytes = 0
        # A block evicted for the tier below stays findable until the engine has taken it:
        # first as its file (``_leaving``: digest -> size, while a hop reads then unlinks it),
        # then as bytes in memory (``_handed``: digest -> payload, until take_evicted()).
        self._leaving: dict[bytes, int] = {}
        self._handed: dict[bytes, bytes] = {}
        self._leaving_readers: dict[bytes, list[ReadOp]] = {}
        # Bytes the engine took at the last take_evicted(), kept (not advertised) until the next
        # one for reads already on their way: a lookup answered HIT just before the hand-over.
        self._handed_taken: dict[bytes, bytes] = {}
        self._files = BlockFiles(self.path, name, fsync=self.fsync)
        self._writes = 0

    def __repr__(self) -> str:
        return f"<SSDTier name={self.name!r} path={self.path!r} capacity={self.capacity_bytes}>"

    async def __aenter__(self) -> SSDTier:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def runner(self) -> HopRunner | None:
        """The thread pool and op queue, once opened: a seam for tests and tools, to read
        (``runner.idle``: no disk work queued or running; ``runner.nowait``: whether the file
        system serves ``RWF_NOWAIT`` reads). Do not submit to it."""
        return self._runner

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        """Create and lock the directory and rebuild the index from it (one thread hop)."""
        if self._open:
            return
        runner = HopRunner(self.io_threads, self.name)
        try:
            res = await runner.call(_open_dir, self.path, self.capacity_bytes, self.name)
        except BaseException:
            runner.shutdown()
            raise
        self._runner = runner
        self.path = res.root
        self._lock_fd = res.lock_fd
        self._budget = res.budget
        self.last_scan = res.scan
        self.evictions += res.scan.evicted
        stamp = max(self._files.last_stamp, res.scan.newest_mtime_ns)
        self._files = BlockFiles(res.root, self.name, fsync=self.fsync, last_stamp=stamp)
        self._closing = False
        self._open = True
        _log_scan(self.name, res.root, res.scan)

    async def aclose(self) -> None:
        """Let queued and running disk work finish (bounded), release the lock and the threads."""
        if not self._open:
            return
        self._closing = True
        runner = self._runner
        assert runner is not None
        await runner.drain()
        self._open = False
        lock_fd, self._lock_fd = self._lock_fd, None
        try:
            try:
                await runner.call(_write_recency, self.path, list(self._budget))
            except OSError as exc:
                log.warning("ssd tier %r: cannot save the LRU order: %s", self.name, exc)
            if lock_fd is not None:
                await runner.call(os.close, lock_fd)
        finally:
            runner.shutdown()
            self._turns.clear()
            self._handed_taken.clear()

    def _check_open(self) -> HopRunner:
        """The runner to queue disk work on; ``TierUnavailableError`` unless open."""
        if not self._open or self._closing:
            state = "closing" if self._open else "not open"
            raise TierUnavailableError(f"ssd tier {self.name!r} at {self.path!r} is {state}")
        assert self._runner is not None
        return self._runner

    # -- reads ---------------------------------------------------------------------------------

    def _has(self, digest: bytes) -> bool:
        return digest in self._budget or digest in self._leaving or digest in self._handed

    async def lookup(self, key: bytes) -> LookupResult:
        self._check_open()
        return LookupResult.HIT if self._has(block_digest(_as_key(key))) else LookupResult.MISS

    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        self._check_open()
        has = self._has
        hit, miss = LookupResult.HIT, LookupResult.MISS
        return [hit if has(block_digest(_as_key(k))) else miss for k in keys]

    def _copy_handed(self, key: bytes, buf: memoryview) -> int | None:
        """Serve a block evicted a moment ago from memory (rare: the engine has not taken it)."""
        digest = block_digest(key)
        data = self._handed.get(digest)
        if data is None:
            data = self._handed_taken.get(digest)
        if data is None:
            return None
        if len(data) > buf.nbytes:
            raise ValueError(
                f"ssd tier {self.name!r}: block {key[:64]!r} is {len(data)} bytes, buffer "
                f"holds {buf.nbytes}"
            )
        _byte_view(buf)[: len(data)] = data
        return len(data)

    def _read_op(self, key: bytes, buf: memoryview) -> ReadOp | None:
        key = _as_key(key)
        digest = block_digest(key)
        size = self._budget.size_of(digest)
        if size is None:
            size = self._leaving.get(digest)
            if size is None:
                return None
        else:
            self._budget.touch(digest)
        payload_len = size - HEADER.size - len(key)
        if payload_len < 0:  # the file cannot hold this key: not a block of this key
            self._budget.discard(digest)
            raise BlockCorruptedError(
                f"ssd tier {self.name!r}: key {key[:64]!r}: block file of {size} bytes cannot "
                f"hold its header"
            )
        if buf.nbytes < payload_len:
            raise ValueError(
                f"ssd tier {self.name!r}: block {key[:64]!r} is {payload_len} bytes, buffer "
                f"holds {buf.nbytes}"
            )
        view = _byte_view(buf)[:payload_len]
        # writes_seen -1: a write of this key is in flight, so a missing file proves nothing
        seen = -1 if digest in self._turns else self._writes
        return ReadOp(self._files, key, digest, size, payload_len, view, seen, self._read_finished)

    async def read_into(self, key: bytes, buf: memoryview) -> int:
        runner = self._check_open()
        op = self._read_op(key, buf)
        if op is None:
            n = None
            if self._handed or self._handed_taken:
                n = self._copy_handed(_as_key(key), buf)
            return -1 if n is None else n
        result: int = await runner.submit(op, withdrawable=True)
        return result

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """Read many blocks; they share thread hops, and one bad block never fails the rest."""
        runner = self._check_open()
        if len(keys) != len(bufs):
            raise ValueError(f"{len(keys)} keys but {len(bufs)} buffers")
        out: list[int | Exception] = [-1] * len(keys)
        where: list[int] = []
        ops: list[ReadOp] = []
        for i, (k, b) in enumerate(zip(keys, bufs, strict=True)):
            try:
                op = self._read_op(k, b)
                if op is None and (self._handed or self._handed_taken):
                    n = self._copy_handed(_as_key(k), b)
                    if n is not None:
                        out[i] = n
            except Exception as exc:
                out[i] = exc
                continue
            if op is not None:
                where.append(i)
                ops.append(op)
        if ops:
            results = await runner.submit_group(ops, withdrawable=True)
            for i, r in zip(where, results, strict=True):
                out[i] = r if isinstance(r, int) else _as_exception(r)
        return out

    def _read_finished(self, op: ReadOp, outcome: Any) -> None:
        if type(outcome) is int and outcome >= 0:
            op.settle(outcome)  # read and verified (the common case): the index is unchanged
            return
        if outcome == -1 and op.digest in self._leaving:
            # Evicted, and its file already read for the tier below: the bytes arrive in
            # memory when that write's hop ends (_write_finished settles this read then).
            self._leaving_readers.setdefault(op.digest, []).append(op)
            return
        if outcome == -1 and (op.digest in self._handed or op.digest in self._handed_taken):
            outcome = self._fill_from_handed(op)  # evicted while we read: from memory
        if outcome == -1 or isinstance(outcome, BlockCorruptedError):
            # The file is gone or was dropped: forget it, unless a write started meanwhile
            # (it may have put a new file under the same name; a later read will tell).
            if op.writes_seen == self._writes and self._budget.size_of(op.digest) == op.size:
                self._budget.discard(op.digest)
        elif isinstance(outcome, OSError):
            msg = f"ssd tier {self.name!r}: reading block {op.key[:64]!r}: {outcome}"
            outcome = _unavailable(msg, outcome)
        op.settle(outcome)

    # -- writes --------------------------------------------------------------------------------

    def _admit(self, digest: bytes, size: int) -> list[tuple[bytes, int]]:
        """Account a new file of ``size`` bytes; return the (digest, size) evicted for it."""
        victims = self._budget.admit_entries(digest, size)  # fits: checked by _check_write
        self.evictions += len(victims)
        return victims

    def _write_op(self, key: bytes, data: bytes | memoryview) -> WriteOp:
        """Admit one block into the budget and build its write (the digest is already owned)."""
        view = _byte_view(data)
        size = frame_size(key, view.nbytes)
        digest = block_digest(key)
        old = self._budget.size_of(digest)
        victims = self._admit(digest, size)
        self._writes += 1
        if self._leaving or self._handed:  # a newer write supersedes evicted bytes in transit
            self._supersede(key, digest)
        # A victim another op is writing is cleaned up by that op when it finishes.
        victims = [(d, s) for d, s in victims if d not in self._turns]
        leaving: list[bytes] = []
        if self.handover_evicted:
            for d, s in victims:
                self._leaving[d] = s
                leaving.append(d)
        op = self._files.write(
            key,
            digest,
            size,
            view,
            old,
            victims,
            handover=self.handover_evicted,
            done=self._write_finished,
        )
        op.leaving = leaving
        op.report = self.report_evicted and not self.handover_evicted
        return op

    def _supersede(self, key: bytes, digest: bytes) -> None:
        """Forget evicted bytes of ``key`` still waiting for the tier below."""
        self._leaving.pop(digest, None)
        self._handed_taken.pop(digest, None)
        if self._handed.pop(digest, None) is not None:
            kept = [(k, d) for k, d in self._evicted if k != key]
            self._evicted = deque(kept)
            self._evicted_bytes = sum(len(d) for _k, d in kept)

    def _check_write(self, key: bytes, data: bytes | memoryview) -> bytes:
        key = _as_key(key)
        if len(key) > MAX_KEY_BYTES:
            raise ValueError(f"block key is {len(key)} bytes, more than {MAX_KEY_BYTES}")
        n = _byte_view(data).nbytes
        size = frame_size(key, n)
        if size > self.capacity_bytes:
            raise ValueError(
                f"ssd tier {self.name!r}: block {key[:64]!r} of {n} bytes ({size} on disk) "
                f"exceeds the tier's {self.capacity_bytes}-byte capacity"
            )
        return key

    async def write(self, key: bytes, data: bytes | memoryview) -> None:
        runner = self._check_open()
        key = self._check_write(key, data)
        digest = block_digest(key)
        await self._turns.acquire((digest,))
        try:
            op = self._write_op(key, data)
        except BaseException:
            self._turns.release(digest)
            raise
        await runner.submit(op, withdrawable=False)

    async def write_many(
        self, items: Sequence[tuple[bytes, bytes | memoryview]]
    ) -> list[Exception | None]:
        """Write many blocks through shared thread hops; failures are returned per item."""
        runner = self._check_open()
        out: list[Exception | None] = [None] * len(items)
        last: dict[bytes, int] = {}  # digest -> index of its last write in ``items``
        keys: list[bytes | None] = []
        for i, (k, d) in enumerate(items):
            try:
                key = self._check_write(k, d)
            except Exception as exc:
                out[i] = exc
                keys.append(None)
                continue
            keys.append(key)
            last[block_digest(key)] = i  # an earlier write of the same key is superseded
        if not last:
            return out
        digests = list(last)
        await self._turns.acquire(digests)
        ops: list[tuple[int, WriteOp]] = []
        for i in last.values():
            wkey = keys[i]
            assert wkey is not None
            ops.append((i, self._write_op(wkey, items[i][1])))
        for _i, op in ops:
            if self._budget.size_of(op.digest) != op.size:
                op.skip = True  # already evicted by a later block of this batch
        results = await runner.submit_group([op for _i, op in ops], withdrawable=False)
        for (i, _op), r in zip(ops, results, strict=True):
            out[i] = _as_exception(r) if isinstance(r, BaseException) else None
        return out

    def _fill_from_handed(self, op: ReadOp) -> int:
        data = self._handed.get(op.digest)
        if data is None:
            data = self._handed_taken.get(op.digest)
        if data is None or len(data) != op.payload_len:
            return -1
        op.buf[:] = data
        return op.payload_len

    def _write_finished(self, op: WriteOp, outcome: Any) -> None:
        if not isinstance(outcome, BaseException):
            evicted, failure = outcome
            if op.report:
                self._note_evicted(k for k, _ in evicted)
            else:
                self._hand_over(op, evicted)
            if failure is not None:
                outcome = failure
        for d in op.leaving:
            self._leaving.pop(d, None)
            for reader in self._leaving_readers.pop(d, ()):
                reader.settle(self._fill_from_handed(reader))
        if isinstance(outcome, BaseException):
            # A failed write leaves no file for the key (the older version was dropped too:
            # no tier may return older bytes after a newer write was accepted).
            if self._budget.size_of(op.digest) == op.size:
                self._budget.discard(op.digest)
            self._turns.release(op.digest)
            if isinstance(outcome, OSError):
                outcome = _unavailable(
                    f"ssd tier {self.name!r}: writing block {op.key[:64]!r} ({op.size} bytes on "
                    f"disk): {outcome.strerror or outcome}",
                    outcome,
                )
            op.settle(outcome)
            return
        if not op.skip and self._budget.size_of(op.digest) != op.size:
            # Evicted by another write while ours was on a thread: remove what we just wrote,
            # and report the write done only then (disk and index agree when a write returns).
            assert self._runner is not None
            unlink = UnlinkOp(self._files, op.final, op.digest, self._turns.release, then=op)
            self._runner.enqueue(unlink)
            if op.report:
                self._note_evicted((op.key,))
            return
        self._turns.release(op.digest)
        op.settle(None)

    def _hand_over(self, op: WriteOp, evicted: list[tuple[bytes, bytes]]) -> None:
        if not evicted or not self.handover_evicted:
            return
        for key, data in evicted:
            digest = block_digest(key)
            if digest in self._leaving or (op.skip and digest == op.digest):
                # still ours to hand over: neither removed nor written again meanwhile
                self._evicted.append((key, data))
                self._evicted_bytes += len(data)
                self._handed[digest] = data
        while self._evicted_bytes > _HANDOVER_MAX_BYTES and self._evicted:
            key, data = self._evicted.popleft()
            self._evicted_bytes -= len(data)
            digest = block_digest(key)
            if self._handed.get(digest) is data:
                del self._handed[digest]

    def _note_evicted(self, keys: Iterable[bytes]) -> None:
        """Remember evicted keys for removed events, unless written here again meanwhile."""
        budget = self._budget
        self._evicted_keys.extend(k for k in keys if block_digest(k) not in budget)

    def take_evicted_keys(self) -> list[bytes]:
        out = list(self._evicted_keys)
        self._evicted_keys.clear()
        return out

    def take_evicted(self) -> list[tuple[bytes, bytes]]:
        out = list(self._evicted)
        self._evicted.clear()
        self._evicted_bytes = 0
        self._handed_taken, self._handed = self._handed, {}
        return out

    async def remove(self, key: bytes) -> bool:
        runner = self._check_open()
        key = _as_key(key)
        digest = block_digest(key)
        await self._turns.acquire((digest,))
        in_transit = digest in self._leaving or digest in self._handed
        if in_transit:
            self._supersede(key, digest)
        size = self._budget.discard(digest)
        if size is None:
            self._turns.release(digest)
            return in_transit
        path = self._files.path(digest, size)
        op = UnlinkOp(self._files, path, digest, self._turns.release)
        await runner.submit(op, withdrawable=False)
        return True

    def contains_hint(self, key: bytes) -> bool | None:
        """Exact: the index in memory is the truth about what is on disk."""
        return self._has(block_digest(_as_key(key)))

    def usage(self) -> TierUsage:
        return TierUsage(len(self._budget), self._budget.used, self._budget.capacity)


def _unavailable(message: str, cause: OSError) -> TierUnavailableError:
    """A disk error as the tier's error, the ``OSError`` kept as its cause."""
    err = TierUnavailableError(message)
    err.__cause__ = cause
    return err


def _as_exception(exc: BaseException) -> Exception:
    return exc if isinstance(exc, Exception) else TieringError(repr(exc))


def _default_io_threads() -> int:
    """One core is left to the event loop: workers copying warm pages compete with it for
    CPU and the GIL (loop lag), and WILLNEED on a hop's cold blocks gives even one thread
    read depth."""
    return max(1, min(4, (os.cpu_count() or 1) - 1))


def _as_key(key: object) -> bytes:
    return key if type(key) is bytes else normalize_key(key)


def _byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view
