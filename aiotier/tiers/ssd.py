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
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import stat
import struct
import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import aiofiles.os

from .._core.budget import ByteBudgetLRU
from .._types import MAX_KEY_BYTES, LookupResult, normalize_key
from ..errors import BlockCorruptedError, ConfigError, TieringError, TierUnavailableError
from .base import SecondaryTier, TierUsage
from .framing import (
    HEADER,
    block_digest,
    check_header,
    check_payload,
    checksum,
    encode_header,
    frame_size,
    parse_header,
)

__all__ = ["SSDScan", "SSDTier", "scan_directory"]

log = logging.getLogger("aiotier.ssd")

MARKER_NAME: Final = "aiotier-ssd"
RECENCY_NAME: Final = "recency"
_RECENCY_HEAD: Final = struct.Struct("<4sBQQ")  # magic, version, count, xxh3 of the digests
_RECENCY_MAGIC: Final = b"ATRC"
MARKER_TEXT: Final = "aiotier-ssd 1\n"
LOCK_NAME: Final = "lock"
TMP_PREFIX: Final = ".tmp-"
SHARDS: Final = tuple(f"{i:02x}" for i in range(256))

#: Most blocks and bytes one thread hop carries: enough blocks to amortise the hop's fixed
#: cost, few enough that several hops run in parallel and a cancelled caller never waits long.
#: The byte cap is at least half of a 64-block batch of 1 MiB blocks, so that such a batch
#: splits evenly over two threads rather than into cap-sized hops that leave a short last hop
#: running alone. Measurements: docs/ssd.md ("Threads, hops and speed").
_HOP_MAX_OPS: Final = 32
_HOP_MAX_BYTES: Final = 64 << 20
#: How long a cancelled caller waits for a hop already touching its buffer before giving up.
_CANCEL_GRACE: Final = 30.0
#: Evicted keys kept for removed events before the oldest are dropped (engine not taking).
_EVICTED_KEYS_MAX: Final = 1 << 16
#: Evicted blocks kept for the tier below before the oldest are dropped (engine not taking).
_HANDOVER_MAX_BYTES: Final = 256 << 20

_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_READ_FLAGS: Final = os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW
_TMP_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC | _O_NOFOLLOW


#: The digest naming a key's file; kept under this name for callers (``aiotier.bench.ssd``).
key_digest = block_digest


def block_relpath(digest: bytes, size: int) -> str:
    """Path of a block file relative to the tier directory: the only place names are made.

    ``<first byte of the digest>/<digest>-<frame size>.blk``, all in lowercase hex; the scan at
    :meth:`SSDTier.open` parses them back (``_parse_block_name``).
    """
    h = digest.hex()
    return f"{h[:2]}/{h}-{size:x}.blk"


# -- work done on the tier's threads (no event-loop state touched here) -------------------------


def _skip_views(views: list[memoryview], skip: int) -> list[memoryview]:
    """``views`` without their first ``skip`` bytes."""
    rest: list[memoryview] = []
    for v in views:
        if skip >= v.nbytes:
            skip -= v.nbytes
            continue
        rest.append(v[skip:])
        skip = 0
    return rest


def _read_exact_into(fd: int, views: list[memoryview], offset: int) -> int:
    """``preadv`` until the views are full or EOF; return the bytes read."""
    want = sum(v.nbytes for v in views)
    got = 0
    while got < want:  # a regular file returns short only at EOF
        n = os.preadv(fd, _skip_views(views, got) if got else views, offset + got)
        if n <= 0:
            break
        got += n
    return got


def _write_all(fd: int, chunks: list[memoryview]) -> None:
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


def _drop_file(fd: int, path: str) -> None:
    """Unlink ``path`` if it is still the inode open as ``fd`` (a newer write may have landed)."""
    try:
        cur = os.stat(path, follow_symlinks=False)
        mine = os.fstat(fd)
        if cur.st_ino == mine.st_ino and cur.st_dev == mine.st_dev:
            os.unlink(path)
    except OSError:
        pass


def _open_for_read(path: str) -> int | None:
    try:
        return os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None


#: ``preadv`` flag that fails (EAGAIN) or returns short instead of waiting for the disk; 0 when
#: the platform lacks it or the file system refused it once (every read then blocks).
_nowait_flag: int = getattr(os, "RWF_NOWAIT", 0)


def _preadv_nowait(fd: int, views: list[memoryview]) -> int:
    """Read what the page cache already holds; 0 when a read would have to wait for the disk."""
    global _nowait_flag
    if not _nowait_flag:
        return 0
    try:
        return os.preadv(fd, views, 0, _nowait_flag)
    except BlockingIOError:
        return 0
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        _nowait_flag = 0
        return 0


def _verify_block(
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
        _drop_file(fd, path)
        raise BlockCorruptedError(f"ssd tier {tier_name!r} file {path}: {exc}") from None
    return payload_len


def _read_whole_block(path: str) -> tuple[bytes, bytes] | None:
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


def _read_block_key(path: str) -> bytes | None:
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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quiet(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class _Group:
    """One future for a batch of ops: the event loop's cost of a batch must not grow with its
    blocks (a future and a callback per block cost more than a warm block's read)."""

    __slots__ = ("fut", "remaining", "results")

    def __init__(self, fut: asyncio.Future[None], n: int) -> None:
        self.fut = fut
        self.remaining = n
        self.results: list[Any] = [None] * n

    def settle_one(self, index: int, outcome: Any) -> None:
        self.results[index] = outcome
        self.remaining -= 1
        if self.remaining <= 0 and not self.fut.done():
            self.fut.set_result(None)


class _DiskOp:
    """One queued unit of the SSD tier's disk work: ``run`` on a tier thread, ``finish`` on
    the loop.

    Reads run in two phases instead (``_ReadOp.start`` / ``complete``, see ``_run_ops``).
    """

    __slots__ = ("fut", "group", "index", "nbytes", "started", "withdrawn")

    def __init__(self, nbytes: int) -> None:
        self.fut: asyncio.Future[Any] | None = None
        self.group: _Group | None = None
        self.index = 0
        self.nbytes = nbytes
        self.started = False
        self.withdrawn = False

    def run(self) -> Any:
        raise NotImplementedError

    def finish(self, outcome: Any) -> None:
        """Apply ``outcome`` (a value or an exception) to the index, then :meth:`settle`."""
        self.settle(outcome)

    def settle(self, outcome: Any) -> None:
        """Hand ``outcome`` to whoever awaits this op (its own future or its group)."""
        group = self.group
        if group is not None:
            group.settle_one(self.index, outcome)
        elif self.fut is not None:
            _resolve(self.fut, outcome)


def _resolve(fut: asyncio.Future[Any], outcome: Any) -> None:
    if fut.done():
        return
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


def _run_ops(ops: list[_DiskOp]) -> list[Any]:
    """Body of one thread hop: every op in order, each failure kept in its own slot.

    A read first takes what the page cache holds (``RWF_NOWAIT``: warm blocks cost one
    ``preadv``). The reads that would wait for the disk keep their file open and finish after
    the rest of the hop, all advised ``POSIX_FADV_WILLNEED`` first: the kernel fetches the cold
    blocks at once (one thread, many I/Os in flight). The open file pins what the read sees,
    so finishing late returns exactly what an in-order read would have.
    """
    out: list[Any] = [None] * len(ops)
    cold: list[tuple[int, _ReadOp]] = []
    for i, op in enumerate(ops):
        try:
            if type(op) is _ReadOp:
                n = op.start()
                if n is None:
                    cold.append((i, op))
                    continue
                out[i] = n
            else:
                out[i] = op.run()
        except Exception as exc:
            out[i] = exc
    if len(cold) > 1:
        for _i, op in cold:
            op.advise()
    for i, op in cold:
        try:
            out[i] = op.complete()
        except Exception as exc:
            out[i] = exc
    return out


_run_ops_async = aiofiles.os.wrap(_run_ops)


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
            _unlink_quiet(path)
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


def _parse_block_name(name: str, shard: str) -> tuple[bytes, int] | None:
    """(digest, size) of a canonical ``<digest>-<size>.blk`` name in ``shard``, else None."""
    if len(name) < 38 or name[32] != "-" or not name.endswith(".blk") or name[:2] != shard:
        return None
    try:
        digest = bytes.fromhex(name[:32])
        size = int(name[33:-4], 16)
    except ValueError:
        return None
    if len(digest) != 16 or digest.hex() != name[:32] or f"{size:x}" != name[33:-4]:
        return None
    return digest, size


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
                        _unlink_quiet(entry.path)
                    continue
                parsed = _parse_block_name(name, shard)
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
                        _unlink_quiet(entry.path)
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
                        _unlink_quiet(os.path.join(root, block_relpath(digest, loser)))
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
                _unlink_quiet(p)
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
        lock_fd = os.open(os.path.join(root, LOCK_NAME), os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o600)
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
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o600)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise TierUnavailableError(
                f"{where}: directory is not writable ({exc.strerror or exc})"
            ) from exc
        with contextlib.suppress(FileNotFoundError):  # stale temporaries at the top level
            for name in os.listdir(root):
                if name.startswith(TMP_PREFIX):
                    _unlink_quiet(os.path.join(root, name))
        scan, budget, _evicted = _index_directory(root, capacity, repair=True)
        assert budget is not None
        return _OpenResult(root, lock_fd, budget, scan)
    except BaseException:
        os.close(lock_fd)
        raise


def _close_fd(fd: int) -> None:
    os.close(fd)


_open_dir_async = aiofiles.os.wrap(_open_dir)
_close_fd_async = aiofiles.os.wrap(_close_fd)
_write_recency_async = aiofiles.os.wrap(_write_recency)


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
        self._executor: ThreadPoolExecutor | None = None
        self._lock_fd: int | None = None
        self._open = False
        self._closing = False
        self._queue: deque[_DiskOp] = deque()
        self._flush_scheduled = False
        self._hops = 0
        self._hop_tasks: set[asyncio.Task[None]] = set()
        self._idle: asyncio.Event | None = None
        self._busy: dict[bytes, asyncio.Future[None]] = {}
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
        self._leaving_readers: dict[bytes, list[_ReadOp]] = {}
        # Bytes the engine took at the last take_evicted(), kept (not advertised) until the next
        # one for reads already on their way: a lookup answered HIT just before the hand-over.
        self._handed_taken: dict[bytes, bytes] = {}
        self._last_stamp = 0
        self._tmp_seq = 0
        self._writes = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"<SSDTier name={self.name!r} path={self.path!r} capacity={self.capacity_bytes}>"

    async def __aenter__(self) -> SSDTier:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        """Create and lock the directory and rebuild the index from it (one thread hop)."""
        if self._open:
            return
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(self.io_threads, thread_name_prefix=f"aiotier-{self.name}")
        try:
            res: _OpenResult = await _open_dir_async(
                self.path, self.capacity_bytes, self.name, executor=executor
            )
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self._executor = executor
        self._loop = loop
        self.path = res.root
        self._lock_fd = res.lock_fd
        self._budget = res.budget
        self.last_scan = res.scan
        self.evictions += res.scan.evicted
        self._last_stamp = max(self._last_stamp, res.scan.newest_mtime_ns)
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._open = True
        if res.scan.temporaries or res.scan.torn or res.scan.duplicates or res.scan.evicted:
            log.info(
                "ssd tier %r: removed %d temporaries, %d torn files, %d stale duplicates, "
                "%d blocks over budget",
                self.name,
                res.scan.temporaries,
                res.scan.torn,
                res.scan.duplicates,
                res.scan.evicted,
            )
        if res.scan.foreign:
            log.warning(
                "ssd tier %r: ignoring %d foreign entries under %s",
                self.name,
                res.scan.foreign,
                self.path,
            )

    async def aclose(self) -> None:
        """Let queued and running disk work finish (bounded), release the lock and the threads."""
        if not self._open:
            return
        self._closing = True
        assert self._idle is not None
        assert self._executor is not None
        if not self._idle.is_set():
            try:
                await asyncio.wait_for(self._idle.wait(), _CANCEL_GRACE)
            except TimeoutError:
                log.error(
                    "ssd tier %r: disk work still running after %ss; closing anyway",
                    self.name,
                    _CANCEL_GRACE,
                )
        self._open = False
        executor, self._executor = self._executor, None
        lock_fd, self._lock_fd = self._lock_fd, None
        try:
            try:
                await _write_recency_async(self.path, list(self._budget), executor=executor)
            except OSError as exc:
                log.warning("ssd tier %r: cannot save the LRU order: %s", self.name, exc)
            if lock_fd is not None:
                await _close_fd_async(lock_fd, executor=executor)
        finally:
            executor.shutdown(wait=False)
            self._busy.clear()
            self._handed_taken.clear()

    def _check_open(self) -> None:
        if not self._open or self._closing:
            state = "closing" if self._open else "not open"
            raise TierUnavailableError(f"ssd tier {self.name!r} at {self.path!r} is {state}")

    # -- the op queue --------------------------------------------------------------------------

    def _enqueue(self, *ops: _DiskOp) -> None:
        self._queue.extend(ops)
        assert self._idle is not None
        self._idle.clear()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Pack queued ops into hops, spreading them over the free threads."""
        self._flush_scheduled = False
        queue = self._queue
        while queue and self._hops < self.io_threads:
            free = self.io_threads - self._hops
            if not self._start_hop(-(-len(queue) // free)):
                break
        self._maybe_idle()

    def _start_hop(self, max_ops: int) -> bool:
        """Send up to ``max_ops`` queued ops (and ``_HOP_MAX_BYTES``) to a thread in one hop."""
        queue = self._queue
        batch: list[_DiskOp] = []
        nbytes = 0
        limit = min(max_ops, _HOP_MAX_OPS)
        while queue and len(batch) < limit:
            op = queue[0]
            if op.withdrawn:
                queue.popleft()
                continue
            if batch and nbytes + op.nbytes > _HOP_MAX_BYTES:
                break
            queue.popleft()
            op.started = True
            batch.append(op)
            nbytes += op.nbytes
        if not batch:
            return False
        self._hops += 1
        assert self._loop is not None
        task = self._loop.create_task(self._hop(batch))
        self._hop_tasks.add(task)
        task.add_done_callback(self._hop_tasks.discard)
        return True

    def _maybe_idle(self) -> None:
        if self._hops == 0 and not self._queue and self._idle is not None:
            self._idle.set()

    async def _hop(self, batch: list[_DiskOp]) -> None:
        outcomes: list[Any]
        try:
            outcomes = await _run_ops_async(batch, executor=self._executor)
        except BaseException as exc:  # loop teardown cancelled us; the thread may still run
            err = TierUnavailableError(f"ssd tier {self.name!r}: disk work abandoned: {exc!r}")
            outcomes = [err] * len(batch)
        finally:
            self._hops -= 1
        for op, outcome in zip(batch, outcomes, strict=True):
            try:
                op.finish(outcome)
            except Exception:  # finish only touches the index; never let one op stop the rest
                log.exception("ssd tier %r: finishing a disk op failed", self.name)
        if self._queue and not self._flush_scheduled:
            self._flush()
        self._maybe_idle()

    async def _submit(self, op: _DiskOp, *, withdrawable: bool) -> Any:
        """Queue ``op`` and await its outcome.

        A cancelled caller whose op is already on a thread waits (up to ``_CANCEL_GRACE``) for
        the thread to finish before re-raising: the op may be writing into, or reading from,
        the caller's buffer, and the caller may reuse that buffer as soon as we return.
        """
        assert self._loop is not None
        fut = op.fut = self._loop.create_future()
        self._enqueue(op)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not op.started and withdrawable:
                op.withdrawn = True
                fut.cancel()
                raise
            await _wait_settled(fut)
            raise

    async def _submit_group(self, ops: Sequence[_DiskOp], *, withdrawable: bool) -> list[Any]:
        """Queue ``ops`` under one future; their outcomes in order (same cancellation rule)."""
        assert self._loop is not None
        group = _Group(self._loop.create_future(), len(ops))
        for i, op in enumerate(ops):
            op.group = group
            op.index = i
        self._enqueue(*ops)
        try:
            await asyncio.shield(group.fut)
        except asyncio.CancelledError:
            if withdrawable:
                for op in ops:
                    if not op.started and not op.withdrawn:
                        op.withdrawn = True
                        group.remaining -= 1
                if group.remaining <= 0 and not group.fut.done():
                    group.fut.set_result(None)
            await _wait_settled(group.fut)
            raise
        return group.results

    def _next_stamp(self) -> int:
        """A strictly increasing wall-clock ns stamp: file mtimes carry exact write order.

        File systems stamp mtimes from a coarse clock (a few ms), so writes set their own.
        """
        t = time.time_ns()
        if t <= self._last_stamp:
            t = self._last_stamp + 1
        self._last_stamp = t
        return t

    def _path(self, digest: bytes, size: int) -> str:
        """Where a block file lives: :func:`block_relpath` under the tier's directory."""
        return f"{self.path}/{block_relpath(digest, size)}"

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

    def _read_op(self, key: bytes, buf: memoryview) -> _ReadOp | None:
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
        return _ReadOp(self, key, digest, size, payload_len, _byte_view(buf)[:payload_len])

    async def read_into(self, key: bytes, buf: memoryview) -> int:
        self._check_open()
        op = self._read_op(key, buf)
        if op is None:
            n = None
            if self._handed or self._handed_taken:
                n = self._copy_handed(_as_key(key), buf)
            return -1 if n is None else n
        result: int = await self._submit(op, withdrawable=True)
        return result

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """Read many blocks; they share thread hops, and one bad block never fails the rest."""
        self._check_open()
        if len(keys) != len(bufs):
            raise ValueError(f"{len(keys)} keys but {len(bufs)} buffers")
        out: list[int | Exception] = [-1] * len(keys)
        where: list[int] = []
        ops: list[_ReadOp] = []
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
            results = await self._submit_group(ops, withdrawable=True)
            for i, r in zip(where, results, strict=True):
                out[i] = r if isinstance(r, int) else _as_exception(r)
        return out

    def _read_finished(self, op: _ReadOp, outcome: Any) -> None:
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
            err = TierUnavailableError(
                f"ssd tier {self.name!r}: reading block {op.key[:64]!r}: {outcome}"
            )
            err.__cause__ = outcome
            outcome = err
        op.settle(outcome)

    # -- writes --------------------------------------------------------------------------------

    async def _acquire(self, digests: Sequence[bytes]) -> None:
        """Own every digest in ``digests`` (writes and removes of one key never overlap)."""
        assert self._loop is not None
        while True:
            for d in digests:
                fut = self._busy.get(d)
                if fut is not None:
                    await asyncio.shield(fut)
                    break
            else:
                for d in digests:
                    self._busy[d] = self._loop.create_future()
                return

    def _release(self, digest: bytes) -> None:
        fut = self._busy.pop(digest, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _admit(self, digest: bytes, size: int) -> list[tuple[bytes, int]]:
        """Account a new file of ``size`` bytes; return the (digest, size) evicted for it."""
        victims = self._budget.admit_entries(digest, size)  # fits: checked by _check_write
        self.evictions += len(victims)
        return victims

    def _write_op(self, key: bytes, data: bytes | memoryview) -> _WriteOp:
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
        victims = [(d, s) for d, s in victims if d not in self._busy]
        unlink = [self._path(d, s) for d, s in victims]
        leaving: list[bytes] = []
        if self.handover_evicted:
            for d, s in victims:
                self._leaving[d] = s
                leaving.append(d)
        self._tmp_seq += 1
        final = self._path(digest, size)
        tmp = f"{final.rpartition('/')[0]}/{TMP_PREFIX}{digest.hex()}-{self._tmp_seq:x}"
        old_path = None if old is None or old == size else self._path(digest, old)
        op = _WriteOp(
            self,
            key,
            digest,
            size,
            view,
            final,
            tmp,
            old_path,
            unlink,
            handover=self.handover_evicted,
            stamp=self._next_stamp(),
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
        self._check_open()
        key = self._check_write(key, data)
        digest = block_digest(key)
        await self._acquire((digest,))
        try:
            op = self._write_op(key, data)
        except BaseException:
            self._release(digest)
            raise
        await self._submit(op, withdrawable=False)

    async def write_many(
        self, items: Sequence[tuple[bytes, bytes | memoryview]]
    ) -> list[Exception | None]:
        """Write many blocks through shared thread hops; failures are returned per item."""
        self._check_open()
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
        await self._acquire(digests)
        ops: list[tuple[int, _WriteOp]] = []
        for i in last.values():
            wkey = keys[i]
            assert wkey is not None
            ops.append((i, self._write_op(wkey, items[i][1])))
        for _i, op in ops:
            if self._budget.size_of(op.digest) != op.size:
                op.skip = True  # already evicted by a later block of this batch
        results = await self._submit_group([op for _i, op in ops], withdrawable=False)
        for (i, _op), r in zip(ops, results, strict=True):
            out[i] = _as_exception(r) if isinstance(r, BaseException) else None
        return out

    def _fill_from_handed(self, op: _ReadOp) -> int:
        data = self._handed.get(op.digest)
        if data is None:
            data = self._handed_taken.get(op.digest)
        if data is None or len(data) != op.payload_len:
            return -1
        op.buf[:] = data
        return op.payload_len

    def _write_finished(self, op: _WriteOp, outcome: Any) -> None:
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
            self._release(op.digest)
            if isinstance(outcome, OSError):
                err = TierUnavailableError(
                    f"ssd tier {self.name!r}: writing block {op.key[:64]!r} ({op.size} bytes on "
                    f"disk): {outcome.strerror or outcome}"
                )
                err.__cause__ = outcome
                outcome = err
            op.settle(outcome)
            return
        if not op.skip and self._budget.size_of(op.digest) != op.size:
            # Evicted by another write while ours was on a thread: remove what we just wrote,
            # and report the write done only then (disk and index agree when a write returns).
            self._enqueue(_UnlinkOp(self, op.final, op.digest, then=op))
            if op.report:
                self._note_evicted((op.key,))
            return
        self._release(op.digest)
        op.settle(None)

    def _hand_over(self, op: _WriteOp, evicted: list[tuple[bytes, bytes]]) -> None:
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
        self._check_open()
        key = _as_key(key)
        digest = block_digest(key)
        await self._acquire((digest,))
        in_transit = digest in self._leaving or digest in self._handed
        if in_transit:
            self._supersede(key, digest)
        size = self._budget.discard(digest)
        if size is None:
            self._release(digest)
            return in_transit
        await self._submit(_UnlinkOp(self, self._path(digest, size), digest), withdrawable=False)
        return True

    def contains_hint(self, key: bytes) -> bool | None:
        """Exact: the index in memory is the truth about what is on disk."""
        return self._has(block_digest(_as_key(key)))

    def usage(self) -> TierUsage:
        return TierUsage(len(self._budget), self._budget.used, self._budget.capacity)


# -- ops ----------------------------------------------------------------------------------------


class _ReadOp(_DiskOp):
    __slots__ = (
        "buf",
        "digest",
        "fd",
        "got",
        "hdr",
        "key",
        "path",
        "payload_len",
        "size",
        "tier",
        "writes_seen",
    )

    def __init__(
        self,
        tier: SSDTier,
        key: bytes,
        digest: bytes,
        size: int,
        payload_len: int,
        buf: memoryview,
    ) -> None:
        super().__init__(size)
        self.tier = tier
        self.key = key
        self.digest = digest
        self.size = size
        self.payload_len = payload_len
        self.buf = buf
        # -1: a write of this key is in flight, so a missing file proves nothing
        self.writes_seen = -1 if digest in tier._busy else tier._writes
        # path is named on the thread by start(); fd, hdr and got are set by start() only when
        # the page cache did not hold the whole block (for advise() and complete()).
        self.fd: int
        self.hdr: bytearray
        self.got: int
        self.path: str

    def start(self) -> int | None:
        """Open and read what the page cache holds: the outcome, or None if the disk is needed.

        No ``utime`` on reads: it dirties the inode (a journal write) on every promotion; read
        recency survives a clean restart through the recency file instead.
        """
        self.path = self.tier._path(self.digest, self.size)
        fd = _open_for_read(self.path)
        if fd is None:
            return -1
        try:
            hdr = bytearray(HEADER.size + len(self.key))
            views = [memoryview(hdr), self.buf]
            got = _preadv_nowait(fd, views)
            if got != len(hdr) + self.payload_len:
                self.fd, self.hdr, self.got = fd, hdr, got
                fd = -1  # complete() closes it
                return None
            return _verify_block(fd, self.path, self.key, hdr, self.buf, got, self.tier.name)
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
            got = self.got + _read_exact_into(fd, _skip_views(views, self.got), self.got)
            return _verify_block(fd, self.path, self.key, self.hdr, self.buf, got, self.tier.name)
        finally:
            os.close(fd)

    def finish(self, outcome: Any) -> None:
        self.tier._read_finished(self, outcome)


class _WriteOp(_DiskOp):
    __slots__ = (
        "data",
        "digest",
        "final",
        "handover",
        "key",
        "leaving",
        "old_path",
        "report",
        "size",
        "skip",
        "stamp",
        "tier",
        "tmp",
        "unlink",
    )

    def __init__(
        self,
        tier: SSDTier,
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
    ) -> None:
        super().__init__(size)
        self.tier = tier
        self.key = key
        self.digest = digest
        self.size = size
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

    def run(self) -> tuple[list[tuple[bytes, bytes]], BaseException | None]:
        """Make room, then write; the victims' bytes are returned even when the write fails."""
        evicted: list[tuple[bytes, bytes]] = []
        for victim in self.unlink:  # make room first
            if self.handover:
                got = _read_whole_block(victim)
                if got is not None:
                    evicted.append(got)
            elif self.report:
                key = _read_block_key(victim)
                if key is not None:
                    evicted.append((key, b""))
            _unlink_quiet(victim)
        if self.skip:
            for p in (self.final, self.old_path):
                if p is not None:
                    _unlink_quiet(p)
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
                        _unlink_quiet(p)
            return evicted, exc
        if self.old_path is not None:
            _unlink_quiet(self.old_path)
        return evicted, None

    def _write(self) -> None:
        header = encode_header(self.key, self.data)
        try:
            fd = os.open(self.tmp, _TMP_FLAGS, 0o600)
        except FileExistsError:  # a stale temporary of a crashed process with our pid reuse
            _unlink_quiet(self.tmp)
            fd = os.open(self.tmp, _TMP_FLAGS, 0o600)
        try:
            try:
                _write_all(fd, [memoryview(header), self.data])
                os.utime(fd, ns=(self.stamp, self.stamp))
                if self.tier.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(self.tmp, self.final)
        except BaseException:
            _unlink_quiet(self.tmp)
            raise
        if self.tier.fsync:
            _fsync_dir(os.path.dirname(self.final))

    def finish(self, outcome: Any) -> None:
        self.tier._write_finished(self, outcome)


class _UnlinkOp(_DiskOp):
    __slots__ = ("digest", "path", "then", "tier")

    def __init__(
        self, tier: SSDTier, path: str, digest: bytes, *, then: _DiskOp | None = None
    ) -> None:
        super().__init__(0)
        self.tier = tier
        self.path = path
        self.digest = digest
        self.then = then  # another op, settled once this clean-up is done

    def run(self) -> None:
        _unlink_quiet(self.path)
        if self.tier.fsync:
            _fsync_dir(os.path.dirname(self.path))

    def finish(self, outcome: Any) -> None:
        self.tier._release(self.digest)
        if isinstance(outcome, OSError):
            log.warning("ssd tier %r: removing %s failed: %s", self.tier.name, self.path, outcome)
            outcome = None
        self.settle(outcome)
        if self.then is not None:
            self.then.settle(None)


async def _wait_settled(fut: asyncio.Future[Any]) -> None:
    """Wait, ignoring further cancellation, until ``fut`` settles (at most ``_CANCEL_GRACE``).

    Used after a caller was cancelled while its op was on (or bound for) a thread: the op may
    touch the caller's buffer until then.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _CANCEL_GRACE
    while not fut.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            log.error(
                "ssd tier: a cancelled disk operation is still running after %ss", _CANCEL_GRACE
            )
            return
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait((fut,), timeout=remaining)
    if not fut.cancelled():
        fut.exception()  # mark retrieved: the cancelled caller will not look at it


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
