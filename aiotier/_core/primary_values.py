"""The cache API's synchronous halves on the primary: ``put`` of a block or of a value's
pieces, and ``get``'s hits (the bytes copied out, or put back from the bytes on their way down).

Part of :class:`~aiotier._core.engine_core.EngineCore`; the engine's ``put`` and ``get`` await
around these (write-through acknowledgements, promotions), under the engine's lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from .._types import BlockEvent
from .arena import Arena
from .coherence import Coherence
from .copy_policy import CopyPolicy
from .expiry import Expiry
from .stats import StepStats
from .table import READY, BlockTable
from .writeback import WriteAcks

__all__ = ["PrimaryValues"]


class PrimaryValues:
    """Blocks the cache API stores and reads in the primary."""

    __slots__ = (
        "_arena",
        "_coherence",
        "_copies",
        "_deadlines",
        "_events",
        "_expiry",
        "_forget",
        "_primary_name",
        "_stats",
        "_table",
    )

    def __init__(
        self,
        table: BlockTable,
        arena: Arena,
        copies: CopyPolicy,
        coherence: Coherence,
        expiry: Expiry,
        stats: StepStats,
        events: deque[BlockEvent],
        *,
        primary_name: str,
        forget: Callable[[bytes, int], None],
    ) -> None:
        self._table = table
        self._arena = arena
        self._copies = copies
        self._coherence = coherence
        self._expiry = expiry
        self._stats = stats
        self._events = events
        self._primary_name = primary_name
        self._forget = forget  # EngineCore.forget: drop a key's block, in-flight users kept
        self._deadlines = table.deadlines.at  # never replaced: read directly by get's hits

    def put(
        self,
        k: bytes,
        data: bytes | bytearray | memoryview,
        acks: WriteAcks | None = None,
        *,
        expires_at: float | None = None,
    ) -> bool:
        """Store ``data`` in the primary, replacing ``k`` everywhere; False when no room.
        ``acks`` learns the outcome of each write-through write; ``expires_at``: the block's
        deadline (its bytes carry it too)."""
        table = self._table
        slot = table.index.get(k)
        if (
            slot is not None
            and table.state[slot] == READY
            and table.pins[slot] == 0
            and slot not in table.step_holds
        ):
            self._arena.write(slot, data)  # in place: no new block requested
            table.touch(slot)
        else:
            self._stats.observe("allocation_size", 1)
            allocate = self._copies.allocate  # the victims' bytes are copied out before reuse
            got = allocate([k], READY) if slot is None else self._replace_slot(k, slot)
            if got is None:
                self._stats.counts[("allocation_failures", "store")] += 1
                return False
            (slot,), _ = got
            self._arena.write(slot, data)
        if expires_at is not None or slot in self._deadlines:  # (else nothing to arm or drop)
            self._expiry.deadlines.arm(slot, expires_at)
        self._events.append(BlockEvent((k,), self._primary_name, False))
        self._copies.replaced_everywhere_many((k,), (slot,), acks=acks)
        return True

    def put_value(
        self,
        k: bytes,
        head: bytes,
        pieces: Sequence[tuple[bytes, memoryview]],
        acks: WriteAcks | None = None,
        *,
        expires_at: float | None = None,
    ) -> bool:
        """Store a value's ``pieces`` (keys never used before) and then ``head``, the block
        naming them, under ``k``: one allocation, so none of them evicts another, and all or
        nothing (False, changing nothing, when the primary cannot hold them all now).
        ``expires_at``: the deadline of every one of them."""
        old = self._table.index.get(k)
        keys = [pk for pk, _ in pieces]
        keys.append(k)
        self._stats.observe("allocation_size", len(keys))
        got = self._copies.allocate(keys, READY, () if old is None else (old,))
        if got is None:
            self._stats.counts[("allocation_failures", "store")] += 1
            return False
        slots, _ = got
        if old is not None:
            self._forget(k, old)
        write, replaced = self._arena.write, self._copies.replaced_everywhere
        for (pk, data), slot in zip(pieces, slots, strict=False):
            write(slot, data)
            replaced(pk, slot, fresh=True, acks=acks)
        write(slots[-1], head)
        replaced(k, slots[-1], acks=acks)
        if expires_at is not None:
            for slot in slots:
                self._expiry.deadlines.arm(slot, expires_at)
        self._events.append(BlockEvent(tuple(keys), self._primary_name, False))
        return True

    def _replace_slot(self, k: bytes, old: int) -> tuple[list[int], Sequence[bytes]] | None:
        """A fresh slot for ``k`` whose current slot is pinned, pending or promoting; the old
        one is forgotten only once the allocation succeeded, so a full arena changes nothing."""
        got = self._copies.allocate([k], READY, (old,))
        if got is not None:
            self._forget(k, old)
        return got

    def cached(self, k: bytes) -> bytes | None:
        """``get``'s hit: the bytes of ``k`` from the primary, or on their way down (put back
        into the primary if there is room), counted as a primary hit; None otherwise.

        Bytes on their way down are the newest unless a store of the key is pending or a
        promotion of it in flight: then those are awaited instead. A block past its deadline
        is dropped here and answers None.
        """
        at = self._deadlines
        if at:  # blocks with a TTL: one past its deadline goes now
            slot = self._table.index.get(k)
            t = None if slot is None else at.get(slot)
            if t is not None and self._expiry.wall_clock() >= t:
                self._expiry.check((k,))
        data = self.copy_ready(k)
        if data is None and k not in self._table.index:
            down = self._coherence.in_transit.get(k)
            if down is not None and self._expiry.live(k, down):
                self._copies.readmit(k, down)
                data = bytes(down)
        if data is not None:
            self._stats.primary_hit += 1
        return data

    def join_ready(self, keys: Sequence[bytes]) -> bytes | None:
        """The blocks of ``keys`` joined in one copy when every one is loadable from the
        primary (each counted as a primary hit and marked recently used); None otherwise."""
        table = self._table
        slots: list[int] = []
        for k in keys:
            slot = table.ready_slot(k)
            if slot is None:
                return None
            slots.append(slot)
        for slot in slots:
            table.touch(slot)
        self._stats.primary_hit += len(slots)
        view = self._arena.data_view
        return b"".join([view(slot) for slot in slots])

    def copy_ready(self, k: bytes) -> bytes | None:
        """The bytes of ``k`` if it is loadable from the primary (marking it recently used)."""
        slot = self._table.ready_slot(k)
        if slot is None:
            return None
        self._table.touch(slot)
        return self._arena.read(slot)
