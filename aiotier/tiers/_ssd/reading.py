"""The read side of :class:`~aiotier.tiers.ssd.SSDTier`: lookups answered from the index in
memory, reads planned by :class:`~aiotier.tiers._ssd.reads.ReadBatch` and run on the tier's
threads, blocks past their expiry dropped as they are met.

A base class of the tier, beside its lifecycle and write side; it uses the attributes the tier
sets when it opens, declared below.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from ..._types import LookupResult, normalize_key
from ...errors import BlockCorruptedError, TieringError, TierUnavailableError
from .directory import SlotFiles
from .expiry import SSDExpiry
from .handover import Handover
from .hops import HopRunner
from .index import SSDIndex
from .ops import SlotReads, byte_view
from .reads import ReadBatch
from .turns import KeyTurns

__all__ = ["SSDReads", "as_exception", "as_key", "unavailable"]

_HIT, _MISS = LookupResult.HIT, LookupResult.MISS
#: The type of a key that needs no normalising.
_BYTES = frozenset((bytes,))
#: The type of a buffer taken as it is (a primary's slot views).
_VIEWS = frozenset((memoryview,))
#: What a withdrawn read op settles with (its reads never ran).
_WITHDRAWN = asyncio.CancelledError("withdrawn before a thread started it")


class SSDReads:
    """``lookup_many``, ``contains_hint`` and ``read_many_into`` of the SSD tier."""

    name: str
    _expiry: SSDExpiry
    _index: SSDIndex
    _handover: Handover
    _turns: KeyTurns
    _files: SlotFiles | None
    _fds: list[int]
    _per_file: int
    _slot_size: int
    _room: asyncio.Event

    def _check_open(self) -> HopRunner:
        raise NotImplementedError  # the tier's

    def _parts(self, n: int, runner: HopRunner) -> int:
        raise NotImplementedError  # the tier's

    def _clear(self, slots: list[int]) -> None:
        raise NotImplementedError  # the tier's

    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        self._check_open()
        if self._expiry:
            expired = self._expire(keys)
            if expired:
                found = await self.lookup_many([k for k in keys if as_key(k) not in expired])
                hits = iter(found)
                return [_MISS if as_key(k) in expired else next(hits) for k in keys]
        lru, handover = self._index.lru, self._handover
        if handover:
            return [_HIT if (k := as_key(x)) in lru or k in handover else _MISS for x in keys]
        return [_HIT if (x if type(x) is bytes else as_key(x)) in lru else _MISS for x in keys]

    def contains_hint(self, key: bytes) -> bool | None:
        """Exact: the index in memory is the truth about what is on disk."""
        if type(key) is not bytes:
            key = as_key(key)
        if self._expiry.deadlines.at and self._expiry.past((key,)):
            return False
        return key in self._index.lru or key in self._handover

    def contains_hints(self, keys: list[bytes]) -> list[bool | None]:
        """:meth:`contains_hint` of each key in one C-level pass (the engine asks about every
        clean block a full primary drops)."""
        if type(self).contains_hint is not SSDReads.contains_hint or self._expiry.deadlines.at:
            return list(map(self.contains_hint, keys))  # a subclass's answer, or expiry to check
        if set(map(type, keys)) - _BYTES:
            keys = list(map(as_key, keys))
        held: list[bool | None] = list(map(self._index.lru.__contains__, keys))
        if self._handover and False in held:
            handover = self._handover
            return [h or k in handover for k, h in zip(keys, held, strict=True)]
        return held

    def _expire(self, keys: Iterable[bytes]) -> set[bytes]:
        """Those of ``keys`` past their expiry: they answer as absent; each one no write or
        remove is under way for leaves the index now."""
        expired = self._expiry.past(map(as_key, keys))
        self._drop_expired(expired)
        return expired

    def _drop_expired(self, keys: Iterable[bytes]) -> None:
        """Out of the index, their slots cleared (counted); keys a write or remove is under
        way for are left to it."""
        slots: list[int] = []
        for k in keys:
            if k in self._turns:
                continue
            self._expiry.deadlines.drop(k)
            self._handover.supersede(k)
            slot = self._index.plan_remove(k)
            if slot >= 0:
                slots.append(slot)
                self._expiry.expirations += 1
        if slots:
            self._clear(slots)

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """Read many blocks straight into ``bufs``, one op per thread; one bad block never
        fails the rest."""
        runner, batch, keys = self._plan(keys, bufs)
        out = batch.out
        if len(batch):
            ops = batch.ops(self._parts(len(batch), runner), self._reads_done)
            try:
                await runner.submit_group(ops, withdrawable=True)
            finally:
                self._untaken(batch)
        for i in batch.missing:
            if keys[i] in self._handover:  # evicted a moment ago, on its way down
                try:
                    view = byte_view(bufs[i])
                    out[i] = await self._handover.read_into(keys[i], view, self.name)
                except Exception as exc:
                    out[i] = exc
        return out

    def start_reads(
        self,
        keys: Sequence[bytes],
        bufs: Sequence[memoryview],
        done: Callable[[list[int | Exception] | None], None],
    ) -> Callable[[], None] | None:
        """:meth:`read_many_into` with no coroutine (the engine's promotions, one future, task
        and loop turn fewer per batch): ``done`` gets the results on the loop once the read has
        stopped, from this call when nothing goes to a thread. The return value withdraws the
        ops no thread has started, as cancelling :meth:`read_many_into` does; ``done`` then
        gets None once the others have ended. Nothing starts, and None is returned, when a key
        is on its way down (read by :meth:`read_many_into` only); errors raise here. ``bufs``
        holds memoryviews only, and may make each one when the tier's thread asks for it."""
        handover = self._handover
        if handover and any(as_key(k) in handover for k in keys):
            return None
        runner, batch, _keys = self._plan(keys, bufs, views=True)
        if not len(batch):
            done(batch.out)
            return _nothing
        ops = batch.ops(self._parts(len(batch), runner), self._reads_done)

        def ended(results: list[Any]) -> None:
            self._untaken(batch)
            done(None if any(op.withdrawn for op in ops) else batch.out)

        runner.start_group(ops, ended)
        return partial(runner.withdraw, ops, _WITHDRAWN)

    def _plan(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview], *, views: bool = False
    ) -> tuple[HopRunner, ReadBatch, list[bytes]]:
        """The tier's runner, the batch of reads of ``keys`` into ``bufs`` (their slots pinned)
        and the keys as bytes; raises when the tier is closed or the lengths differ. ``views``:
        ``bufs`` holds memoryviews only (maybe made as the threads ask for them)."""
        runner = self._check_open()
        if len(keys) != len(bufs):
            raise ValueError(f"{len(keys)} keys but {len(bufs)} buffers")
        keys = list(keys) if set(map(type, keys)) <= _BYTES else list(map(as_key, keys))
        if not (views or set(map(type, bufs)) <= _VIEWS):  # a view's format: on its thread
            bufs = list(map(byte_view, bufs))  # (raises for what holds no bytes)
        if self._expiry:
            self._expire(keys)  # out of the index: read as absent (-1)
        batch = ReadBatch(
            self._index, keys, bufs, self._fds, self._per_file, self._slot_size, self.name
        )
        return runner, batch, keys

    def _untaken(self, batch: ReadBatch) -> None:
        """After the ops of ``batch`` stopped: let go of the blocks none of them took (their
        ops were taken back before a thread saw them, or one failed whole), each answered as
        not read."""
        left = batch.source.untaken()
        if left:
            err = TierUnavailableError(f"ssd tier {self.name!r}: block not read: its read stopped")
            found = batch.source.found
            self._index.reads_ended([found[i] for i in left])
            for i in left:
                batch.out[i] = err
            self._room.set()

    def _locate(self, slot: int) -> tuple[int, int]:
        f, i = divmod(slot, self._per_file)
        return self._fds[f], i * self._slot_size

    def _reads_done(self, op: SlotReads, outcome: Any) -> None:
        """On the loop, a read op's outcome: unpin its slots, drop and clear the blocks that
        did not verify, translate disk errors (in the batch's answers)."""
        clear: list[int] = []
        try:
            if isinstance(outcome, BaseException):  # the op did not run to its end
                err = self._op_error(op, outcome)
                out = op.source.out
                for i in op.pos:
                    out[i] = err
            elif op.failed:
                out = op.source.out
                for j, r in enumerate(outcome):
                    if r.__class__ is not int:
                        out[op.at[j]] = self._read_error(op, j, r, clear)
            self._index.reads_ended(op.slots)  # after read_failed: a dropped slot may go free
            if clear:
                self._clear(clear)
            self._room.set()
        finally:  # whatever happened, the caller gets an answer
            op.settle(outcome)

    def _op_error(self, op: SlotReads, exc: BaseException) -> Exception:
        """What the caller sees of a read op that failed whole."""
        if isinstance(exc, OSError):
            return unavailable(f"ssd tier {self.name!r}: reading {len(op.pos)} blocks", exc)
        return as_exception(exc)

    def _read_error(self, op: SlotReads, j: int, r: BaseException, clear: list[int]) -> Exception:
        """What the caller sees of a failed read; a block that did not verify leaves the
        index (and its slot is cleared)."""
        key, slot = op.keys[j], op.held[j]
        if isinstance(r, BlockCorruptedError):
            s = self._index.read_failed(key, slot, op.seqs[j])
            if s >= 0:
                clear.append(s)
            assert self._files is not None
            f, i = divmod(slot, self._per_file)
            where = f"ssd tier {self.name!r} {self._files.path(f)} slot {i}"
            return BlockCorruptedError(f"{where}: {r}")
        if isinstance(r, OSError):
            return unavailable(f"ssd tier {self.name!r}: reading block {key[:64]!r}", r)
        return as_exception(r)


def _nothing() -> None:
    """Withdraws nothing: a read that sent nothing to a thread."""


def unavailable(message: str, cause: OSError) -> TierUnavailableError:
    """A disk error as the tier's error, the ``OSError`` kept as its cause."""
    err = TierUnavailableError(f"{message}: {cause.strerror or cause}")
    err.__cause__ = cause
    return err


def as_exception(exc: BaseException) -> Exception:
    return exc if isinstance(exc, Exception) else TieringError(repr(exc))


def as_key(key: object) -> bytes:
    return key if type(key) is bytes else normalize_key(key)
