"""A secondary tier on a local disk: fixed-size slots in a few preallocated files (format 2).

Layout under ``path`` (``docs/ssd.md``; names in ``_ssd/layout.py``)::

    aiotier-ssd      marker: "aiotier-ssd 2" and the slot geometry; refuses foreign dirs
    lock             flock(LOCK_EX) held while a tier has the directory open
    slots-0000 ...   slot files, every byte reserved at open(): a header, the key, the block
    checkpoint       the index at the last clean close, consumed by the next open()

The tier learns its block size from the engine when it opens
(:class:`~aiotier.tiers.base.TierSetup`), or from ``block_size=`` when
used on its own, or from the directory it reopens. Each slot holds one block; its header
(``_ssd/slot.py``) carries the key, a write sequence number and checksums, and every read
checks that it found the very write of the very key the index points at.

This module is the shell: it asks the sans-IO index (``_ssd/index.py``: which slot to read,
which to write and what that evicts, which to clear), through a batch's plan
(``_ssd/reads.py``, ``_ssd/writes.py``), and performs its plans on the tier's threads through
the hop runner (``_ssd/hops.py``), all file work in ``aiofiles.os.wrap``-ed functions, never
on the event loop. A batch is one op per thread (``_ssd/ops.py``), so a 64-block promotion
costs the loop a few list appends per block and a couple of futures.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

from .._validate import check_bool, check_int
from ..errors import ConfigError, TieringError, TierUnavailableError
from ._ssd.checkpoint import write_checkpoint
from ._ssd.directory import SlotFiles, open_directory
from ._ssd.expiry import SSDExpiry, load_expiry, save_expiry
from ._ssd.handover import Handover
from ._ssd.hops import CANCEL_GRACE, HOP_MAX_BYTES, HOP_MAX_OPS, HopRunner
from ._ssd.index import SSDIndex, WritePlan
from ._ssd.inspection import SSDInspection, inspect_directory
from ._ssd.ops import WRITE_OP_MAX, SlotClears, SlotWrites
from ._ssd.reading import SSDReads, as_exception, as_key, unavailable
from ._ssd.startup import SSDStart
from ._ssd.turns import KeyTurns
from ._ssd.writes import WriteBatch, writes_ended
from .base import BlockMeta, Buffer, Eviction, SecondaryTier, TierCapabilities, TierSetup, TierUsage

__all__ = ["SSDInspection", "SSDStart", "SSDTier", "inspect_directory"]

log = logging.getLogger("aiotier.ssd")

#: Evicted keys kept for removed events before the oldest are dropped (engine not taking).
_EVICTED_KEYS_MAX: Final = 1 << 16
#: A batch smaller than this stays on one thread: a hop costs more than it would save.
_SPLIT_BYTES: Final = 512 << 10
#: Keys a clear plans and hands to the threads at once (the loop's part of a chunk is ~0.5 ms).
_CLEAR_CHUNK: Final = 256

class SSDTier(SSDReads, SecondaryTier):
    """Blocks in fixed-size slots of a few preallocated files under ``path``, at most
    ``capacity_bytes`` of slot files (LRU eviction frees slots).

    ``fsync=True`` makes a completed write durable before it is reported (``fdatasync`` of its
    file, one per file per batch): such a block survives the process being killed, and a power
    cut. Without it a crash may lose recent writes, never return wrong bytes. ``io_threads``
    sizes the tier's thread pool (default: the CPU count, 2 to 4). ``block_size`` is for a tier
    used without an engine (an engine gives its own); a directory keeps the block size it was
    created for.

    Blocks written with an expiry (:attr:`~aiotier.tiers.base.BlockMeta.expires_at`) answer
    MISS past it and have their slots cleared; their deadlines are kept across clean restarts
    (``_ssd/expiry.py``).
    """

    capabilities = TierCapabilities(clearable=True, expiry=True)
    #: Expired blocks reclaimed per ``write_many`` at most (the rest at the next ones, or when
    #: a lookup or read meets them).
    RECLAIM_PER_WRITE = 256

    def __init__(
        self,
        path: str | os.PathLike[str],
        capacity_bytes: int,
        *,
        fsync: bool = False,
        name: str = "ssd",
        io_threads: int | None = None,
        block_size: int | None = None,
    ) -> None:
        super().__init__(name)
        check_int("capacity_bytes", capacity_bytes)
        if io_threads is None:
            io_threads = _default_io_threads()
        check_int("io_threads", io_threads)
        check_bool("fsync", fsync)
        if block_size is not None:
            check_int("block_size", block_size)
        #: The tier's directory; made absolute by :meth:`open` (``abspath`` may ask the OS).
        self.path: str = os.fspath(path)
        self.fsync = fsync
        self.io_threads = io_threads
        self.capacity_bytes = capacity_bytes
        #: The largest block the slots hold: from the engine, the argument or the directory.
        self.block_size: int | None = block_size
        #: How the last :meth:`open` went (None before the first).
        self.last_start: SSDStart | None = None
        self._index = SSDIndex(0)
        self._files: SlotFiles | None = None
        self._fds: list[int] = []
        self._per_file = 1
        self._slot_size = 0
        self._runner: HopRunner | None = None
        self._open = False
        self._closing = False
        self._turns = KeyTurns()
        self._handover = Handover()
        # what take_evictions hands over (TierSetup.evictions); counted either way
        self._hand_over = "none"
        self._evictions = 0
        # Keys evicted with nothing handed over, for the engine's removed events (bounded: a
        # tier used without an engine never has them taken).
        self._evicted_keys: deque[bytes] = deque(maxlen=_EVICTED_KEYS_MAX)
        # Set when disk work ended: a write that found every slot busy looks again.
        self._room = asyncio.Event()
        # the expiry of blocks written with one (saved at a clean close: _ssd/expiry.py)
        self._expiry = SSDExpiry()

    def __repr__(self) -> str:
        return f"<SSDTier name={self.name!r} path={self.path!r} capacity={self.capacity_bytes}>"

    async def __aenter__(self) -> SSDTier:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _set_block_size(self, block_size: int) -> None:
        """The engine's block size (from :meth:`open`'s setup); slots are sized for it."""
        check_int("block_size", block_size)
        if self.block_size is not None and self.block_size != block_size:
            raise ConfigError(
                f"ssd tier {self.name!r} at {self.path!r} holds blocks of {self.block_size} "
                f"bytes; the engine's blocks are {block_size} bytes"
            )
        self.block_size = block_size

    # -- seams for tests and tools ------------------------------------------------------------

    @property
    def runner(self) -> HopRunner | None:
        """The thread pool and op queue, once opened: a seam for tests and tools, to read
        (``runner.idle``: no disk work queued or running; ``runner.nowait``: whether the file
        system serves ``RWF_NOWAIT`` reads). Do not submit to it."""
        return self._runner

    @property
    def index(self) -> SSDIndex:
        """The index (key -> slot, slot states): a seam for tests and tools, to read."""
        return self._index

    def locate(self, key: bytes) -> tuple[str, int] | None:
        """``(slot file path, byte offset)`` of the slot holding ``key``, or None: for tests and
        tools that look at the files."""
        slot = self._index.lru.get(as_key(key))
        if slot is None or self._files is None:
            return None
        f, i = divmod(slot, self._per_file)
        return self._files.path(f), i * self._slot_size

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self, setup: TierSetup | None = None) -> None:
        """Create or check the directory, take its lock, load the index (the checkpoint of a
        clean close, else a header scan) and reserve the slot files' space (one thread hop).
        ``setup`` gives the engine's block size (the slots are sized for it) and what
        :meth:`take_evictions` hands over."""
        if setup is not None:
            if setup.block_size is not None:
                self._set_block_size(setup.block_size)
            self._hand_over = setup.evictions
        if self._open:
            return
        runner = HopRunner(self.io_threads, self.name)
        try:
            files, index, start = await runner.call(
                open_directory, self.path, self.capacity_bytes, self.block_size, self.name
            )
        except BaseException:
            runner.shutdown()
            raise
        self._expiry.deadlines.clear()
        try:
            expiry_note = await runner.call(load_expiry, files.root, index, self._expiry.deadlines)
        except BaseException:
            await runner.call(files.close)
            runner.shutdown()
            raise
        if expiry_note.startswith(("loaded", "absent")):
            log.debug("ssd tier %r: expiry file %s", self.name, expiry_note)
        else:
            log.warning("ssd tier %r: expiry file %s: ignored", self.name, expiry_note)
        g = files.geometry
        self._runner = runner
        self._files = files
        self._fds = [files.fds[i] for i in range(g.files)]
        self._per_file, self._slot_size = g.slots_per_file, g.slot_size
        self.path = files.root
        self.block_size = g.block_size
        self._index = index
        self.last_start = start
        self._room = asyncio.Event()  # of this loop (a tier may be reopened in another)
        self._closing = False
        self._open = True
        log.info("ssd tier %r at %s: %s", self.name, files.root, start.describe())
        if start.foreign:
            log.warning(
                "ssd tier %r: ignoring %d foreign entries under %s",
                self.name, start.foreign, files.root,
            )  # fmt: skip

    async def aclose(self) -> None:
        """Let queued and running disk work finish (bounded), save the checkpoint, release the
        files, the lock and the threads."""
        if not self._open:
            return
        self._closing = True
        runner, files = self._runner, self._files
        assert runner is not None and files is not None
        settled = await runner.drain()
        self._open = False
        try:
            if settled:  # else disk work still runs: the next open scans instead
                try:
                    saved = await runner.call(
                        write_checkpoint, files.root, files.geometry, self._index,
                        files.fds.values(),
                    )  # fmt: skip
                except OSError as exc:
                    log.warning("ssd tier %r: cannot save the checkpoint: %s", self.name, exc)
                else:
                    if not saved:
                        log.warning(
                            "ssd tier %r: no checkpoint saved: the file system does not keep "
                            "file times to the nanosecond, which the checkpoint's seal needs; "
                            "the next open scans the slot headers", self.name,
                        )  # fmt: skip
                try:
                    deadlines = self._expiry.deadlines
                    await runner.call(save_expiry, files.root, self._index, deadlines)
                except OSError as exc:
                    log.warning("ssd tier %r: cannot save the expiry file: %s", self.name, exc)
            await runner.call(files.close)
        finally:
            runner.shutdown()
            self._turns.clear()
            self._handover.clear()

    def _check_open(self) -> HopRunner:
        """The runner to queue disk work on; ``TierUnavailableError`` unless open."""
        if not self._open or self._closing:
            state = "closing" if self._open else "not open"
            raise TierUnavailableError(f"ssd tier {self.name!r} at {self.path!r} is {state}")
        assert self._runner is not None
        return self._runner

    def _parts(self, n: int, runner: HopRunner) -> int:
        """Read ops to split a batch of ``n`` blocks into (:func:`_split`); one while the tier
        reads from the disk."""
        nbytes = n * (self.block_size or 0)
        if runner.nowait.resting:
            # The tier found the disk a moment ago: one thread reads the batch in file order,
            # a single stream for the kernel's readahead (a second thread taking every other
            # block of one file resets it: see NowaitProbe).
            return max(1, -(-nbytes // HOP_MAX_BYTES))
        return _split(n, nbytes, runner.threads, HOP_MAX_OPS)

    def _write_parts(self, n: int, runner: HopRunner) -> int:
        """Write ops to split a batch of ``n`` blocks into (:func:`_split`): larger than read
        ops, since each op's thread must win the GIL back after every system call (the hop's
        start, each ``pwritev``, its end), which takes a switch interval (5 ms) while the event
        loop is busy; a write op is one ``pwritev`` per run of adjacent slots. Spread over the
        free threads only: a batch that arrives while others are written (the engine keeps two
        in flight) goes whole to the next thread that frees, with fewer system calls."""
        threads = max(1, runner.free_threads)
        return _split(n, n * (self.block_size or 0), threads, WRITE_OP_MAX)

    # -- writes --------------------------------------------------------------------------------

    async def write_many(
        self, items: Sequence[tuple[bytes, Buffer]], meta: Sequence[BlockMeta] | None = None
    ) -> list[Exception | None]:
        """Write many blocks, one op per thread; failures are returned per item. Of several
        writes of one key only the last is carried out, and the earlier ones report its outcome
        (``tiers/_batches.py``). A batch larger than the tier keeps its last blocks (the earlier
        ones are evicted by the later)."""
        runner = self._check_open()
        batch = WriteBatch(items, self.block_size, self.name)
        if not batch.pending:
            return batch.outcomes()
        await self._turns.acquire(batch.pending_keys())
        try:
            while batch.pending:
                # a close that began while this waited (for its keys' turn, for room) has
                # drained the disk work and is saving the index: nothing more may land
                runner = self._check_open()
                parts = self._write_parts(len(batch.pending), runner)
                ops = [
                    SlotWrites(self.fsync, self._slot_size, self._writes_done) for _ in range(parts)
                ]
                ops = batch.plan(self._index, ops, self._locate, self._planned)
                if not ops:
                    await self._wait_for_room()
                    continue
                batch.settle(ops, await runner.submit_group(ops, withdrawable=False))
        finally:  # the writes never planned (cancelled, or no room in time)
            self._turns.release(batch.pending_keys())
        outcomes = batch.outcomes()
        self._expiry.written(items, meta, outcomes)
        if self._expiry:
            self._drop_expired(self._expiry.due(self.RECLAIM_PER_WRITE))
        return outcomes

    def _planned(self, plan: WritePlan) -> object | None:
        """The tier's part of a planned write: the key's bytes in transit are older, dropped;
        its victim is counted, then handed over (the token for ``Handover.arrived``, returned)
        or reported."""
        handover, victim = self._handover, plan.victim
        if handover:
            handover.supersede(plan.key)
        if victim is None:
            return None
        deadlines = self._expiry.deadlines
        if deadlines.at:  # (most tiers hold no block with an expiry: no call per block)
            deadlines.drop(victim.key)
        self._evictions += 1
        if self._hand_over == "bytes":
            return handover.leave(victim.key)
        if self._hand_over == "keys":
            self._evicted_keys.append(victim.key)
        return None

    def _writes_done(self, op: SlotWrites, outcome: Any) -> None:
        """On the loop, a write op's outcome (:func:`~._ssd.writes.writes_ended`): the index
        moves to the new slots or drops the keys whose write failed, replaced copies are
        cleared, victims' bytes handed over."""
        results: list[Exception | None] = [None] * len(op.tags)
        try:
            errors, clear, dropped = writes_ended(op, outcome, self._index, self._handover)
            for j, err in enumerate(errors):
                if err is not None:
                    results[j] = self._write_error(op.keys[j], err)
            if dropped and self._hand_over == "keys":
                self._evicted_keys.extend(dropped)  # their older copies are gone too
            if clear:
                self._clear(clear)
            self._room.set()
        finally:  # whatever happened, the keys' turns end and the caller gets an answer
            self._turns.release(op.keys)
            op.settle(results)

    def _write_error(self, key: bytes, err: BaseException) -> Exception:
        if isinstance(err, OSError):
            return unavailable(f"ssd tier {self.name!r}: writing block {key[:64]!r}", err)
        return err if isinstance(err, Exception) else TieringError(repr(err))

    async def _wait_for_room(self) -> None:
        """Until some disk work ended (every slot was being written or read), bounded."""
        self._room.clear()
        try:
            await asyncio.wait_for(self._room.wait(), CANCEL_GRACE)
        except TimeoutError:
            raise TierUnavailableError(
                f"ssd tier {self.name!r}: no slot became free in {CANCEL_GRACE}s (all "
                f"{self._index.slots} are being written or read)"
            ) from None

    # -- removes and clearing -----------------------------------------------------------------

    def _clear_op(self, slots: list[int], *, sync: bool | None = None) -> SlotClears:
        op = SlotClears(self.fsync if sync is None else sync, self._clears_done)
        for slot in slots:
            fd, off = self._locate(slot)
            op.add(fd, off, slot)
        return op

    def _clear(self, slots: list[int]) -> None:
        """Clear the headers of slots that left the index (nobody waits for it)."""
        assert self._runner is not None
        self._runner.enqueue(self._clear_op(slots))

    def _clears_done(self, op: SlotClears, outcome: Any) -> None:
        errors = [outcome] * len(op.slots) if isinstance(outcome, BaseException) else outcome
        try:
            for slot, err in zip(op.slots, errors, strict=True):
                if err is not None:
                    log.warning("ssd tier %r: clearing slot %d failed: %s", self.name, slot, err)
                self._index.cleared(slot, err is None)
            self._room.set()
        finally:
            op.settle([None if e is None else as_exception(e) for e in errors])

    async def remove_many(self, keys: Sequence[bytes]) -> list[bool | Exception]:
        """Drop many keys: their slots' headers cleared in one op (durably with ``fsync``)."""
        runner = self._check_open()
        wanted = list(dict.fromkeys(as_key(k) for k in keys))
        await self._turns.acquire(wanted)
        try:
            found: dict[bytes, bool] = {}
            slots: list[int] = []
            for key in wanted:
                self._expiry.deadlines.drop(key)
                in_transit = self._handover.supersede(key)
                slot = self._index.plan_remove(key)
                found[key] = in_transit or slot >= 0
                if slot >= 0:
                    slots.append(slot)
            errors: list[Any] = []
            if slots:
                errors = await runner.submit(self._clear_op(slots), withdrawable=False)
        finally:
            self._turns.release(wanted)
        failed = sum(e is not None for e in errors)
        if failed:  # gone from the index either way; a restart may find them (then: verified)
            log.warning("ssd tier %r: %d removes not cleared on disk", self.name, failed)
        return [found[as_key(k)] for k in keys]

    async def clear(self) -> None:
        """Every block dropped: the index emptied and every slot's header cleared, in chunks of
        :data:`_CLEAR_CHUNK` (each a hop; the loop's share of one stays short), then every file
        synced whatever ``fsync`` says (a cleared block must not come back after a crash).
        Raises :class:`~aiotier.errors.TieringError` when a header could not be cleared."""
        runner = self._check_open()
        self._handover.drop_all()
        self._evicted_keys.clear()
        self._expiry.deadlines.clear()
        keys = list(self._index.lru)
        failed: list[Any] = []
        for i in range(0, len(keys), _CLEAR_CHUNK):
            chunk = keys[i : i + _CLEAR_CHUNK]
            await self._turns.acquire(chunk)
            try:
                slots = [slot for key in chunk if (slot := self._index.plan_remove(key)) >= 0]
                if slots:
                    op = self._clear_op(slots, sync=False)
                    errors = await runner.submit(op, withdrawable=False)
                    failed += [e for e in errors if e is not None]
            finally:
                self._turns.release(chunk)
        if not failed:
            try:
                await runner.call(_sync_files, list(self._fds))
            except OSError as exc:
                failed.append(exc)
        if failed:
            raise TieringError(
                f"ssd tier {self.name!r}: {len(failed)} slot header(s) or files not cleared "
                f"on disk (first: {failed[0]})"
            )

    # -- evictions and usage -------------------------------------------------------------------

    def take_evictions(self) -> list[Eviction]:
        if self._evicted_keys:
            lru = self._index.lru
            gone: list[Eviction] = [(k, None) for k in self._evicted_keys if k not in lru]
            self._evicted_keys.clear()  # (those written here again since are not gone)
            return gone
        taken: list[Eviction] = []
        taken += self._handover.take()
        return taken

    def usage(self) -> TierUsage:
        """Blocks held; bytes are whole slots (what they take of the reserved files)."""
        n = len(self._index)
        capacity = self._index.slots * self._slot_size if self._open else self.capacity_bytes
        started = self.last_start.after if self.last_start is not None else None
        return TierUsage(
            n, n * self._slot_size, capacity, started, self._evictions, self._expiry.expirations
        )


def _sync_files(fds: list[int]) -> None:
    for fd in fds:
        os.fdatasync(fd)


def _split(n: int, nbytes: int, threads: int, per_op: int) -> int:
    """Ops for a batch of ``n`` blocks of ``nbytes`` in all: one per thread when the batch is
    large enough to pay for the hops, each at most ``per_op`` blocks and ``HOP_MAX_BYTES``."""
    parts = min(threads, n, max(1, nbytes // _SPLIT_BYTES))
    return max(parts, -(-n // per_op), -(-nbytes // HOP_MAX_BYTES))


def _default_io_threads() -> int:
    """One thread per CPU, 2 to 4: warm reads are copies, and a batch split over every CPU
    moves the most bytes; the loop's own work for a batch runs while no copy does."""
    return max(2, min(4, os.cpu_count() or 1))
