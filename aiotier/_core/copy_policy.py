"""Where a block's bytes go when the primary lets go of them or replaces them.

Each tier's write policy (:class:`~aiotier._core.write_routes.WriteRoutes`) decides. Evictions
copy the bytes out (before the slot is reused: into a staging buffer unless the tier keeps the
bytes it is given) for the write-back tier the primary feeds, unless it keeps a clean copy; a
put or store of new bytes writes them to every write-through tier and removes the older copies
from the others, or keeps copies that are the same bytes (immutable keys); at close the
primary's blocks are written down to the first persistent tier when it is write-back. Part of
:class:`~aiotier._core.engine_core.EngineCore`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from itertools import compress

from .._types import BlockEvent
from .arena import Arena
from .coherence import Coherence
from .staging import StagingBuffers
from .stats import StepStats
from .table import READY, BlockTable, Evictions
from .values import block_expiry
from .write_routes import WriteRoutes
from .writeback import WriteAcks, WriteQueues, remove, write

__all__ = ["CopyPolicy"]


class CopyPolicy:
    """The write-back, write-through and immutable-key decisions of one engine."""

    __slots__ = (
        "_arena",
        "_coherence",
        "_events",
        "_others",
        "_staging",
        "_stats",
        "_table",
        "_tiers",
        "_writes",
        "immutable_keys",
        "primary_name",
        "routes",
    )

    def __init__(
        self,
        table: BlockTable,
        arena: Arena,
        coherence: Coherence,
        writes: WriteQueues,
        staging: StagingBuffers | None,
        stats: StepStats,
        events: deque[BlockEvent],
        *,
        primary_name: str,
        routes: WriteRoutes,
        immutable_keys: bool,
    ) -> None:
        self._table = table
        self._arena = arena
        self._coherence = coherence
        self._writes = writes
        self._staging = staging
        self._stats = stats
        self._events = events
        self._tiers = len(routes.policies)
        # the tiers a put removes older copies from: those it does not write through
        self._others = tuple(ti for ti in range(self._tiers) if ti not in routes.through)
        self.primary_name = primary_name
        self.routes = routes
        self.immutable_keys = immutable_keys

    def allocate(
        self, keys: list[bytes], state: int, protected: Sequence[int] = ()
    ) -> tuple[list[int], Sequence[bytes]] | None:
        """Slots for ``keys`` in ``state`` (``BlockTable.allocate``), the victims' bytes copied
        out before the slots are reused (:meth:`evicted`): the slots and the evicted keys, or
        None with nothing changed when there is no room."""
        got = self._table.allocate(keys, state, protected)
        if got is None:
            return None
        slots, evicted = got
        return slots, self.evicted(evicted)

    def allocate_prefix(
        self, keys: list[bytes], state: int, protected: Sequence[int] = ()
    ) -> list[int]:
        """:meth:`allocate` for the longest leading run of ``keys`` that fits (maybe none)."""
        slots, evicted = self._table.allocate_prefix(keys, state, protected)
        self.evicted(evicted)
        return slots

    def evicted(self, evicted: Evictions) -> Sequence[bytes]:
        """Account primary evictions (their keys are returned); copy the bytes out (before the
        slots are reused) for the write-back tier the primary feeds, unless it holds them."""
        keys = evicted.keys
        if not keys:
            return keys
        self._stats.counts[("evictions", self.primary_name)] += len(keys)
        self._events.append(BlockEvent(tuple(keys), self.primary_name, True))
        ti = self.routes.from_primary
        if ti is not None:
            # a clean block's bytes are in that tier already, unless a remove of them is
            # queued there or the tier lost them
            clean = evicted.clean
            kept: Collection[bytes] = ()
            if 1 in clean:
                kept = self._coherence.kept(ti, list(compress(keys, clean)))
                if len(kept) == len(keys):
                    return keys  # every one is there already
            down, slots = keys, evicted.slots
            if kept:
                down = [k for k in keys if k not in kept]
                slots = [s for k, s in zip(keys, slots, strict=True) if k not in kept]
            staging = self._staging
            if staging is None:
                self._writes.demote_many(ti, down, list(map(self._arena.read, slots)))
            else:
                view, stage = self._arena.data_view, staging.copy
                datas: list[bytes | memoryview] = []
                for slot in slots:  # (a loop, not a comprehension: no frame of its own)
                    datas.append(stage(view(slot)))
                self._writes.demote_many(ti, down, datas, staged=True)
        return keys

    def readmit(
        self, k: bytes, data: bytes | memoryview, protected: Sequence[int] = ()
    ) -> int | None:
        """Put bytes that are on their way down back into the primary, if there is room (and
        the key has no block there: a pending store of it is newer). None when they were not
        put back, else how many blocks were evicted to make room."""
        if k in self._table.index:
            return None
        got = self.allocate([k], READY, protected)
        if got is None:
            self._stats.counts[("allocation_failures", "promotion")] += 1
            return None
        slot = got[0][0]
        self._arena.write(slot, data)
        self._table.deadlines.arm(slot, block_expiry(k, data))
        return len(got[1])

    def replaced_everywhere(
        self, k: bytes, slot: int, *, fresh: bool = False, acks: WriteAcks | None = None
    ) -> None:
        """New bytes of ``k`` landed in ``slot``: :meth:`replaced_everywhere_many` of one."""
        self.replaced_everywhere_many((k,), (slot,), fresh=fresh, acks=acks)

    def replaced_everywhere_many(
        self,
        keys: Sequence[bytes],
        slots: Sequence[int],
        *,
        fresh: bool = False,
        acks: WriteAcks | None = None,
    ) -> None:
        """New bytes of each of ``keys`` (distinct) landed in its slot: no tier may serve an
        older version.

        ``fresh``: no tier can hold the keys (keys never used before, such as the pieces of a
        value over several blocks): there is nothing to remove below. ``acks`` learns the
        outcome of each write-through write.
        """
        coherence, table, writes = self._coherence, self._table, self._writes
        coherence.replaced_many(keys)
        through = self.routes.through
        if through:
            # on their way down until every tier has them: lookups find these bytes, never an
            # older copy a tier still holds while its write is queued
            read, demote = self._arena.read, writes.demote
            for k, slot in zip(keys, slots, strict=True):
                data = read(slot)
                for ti in through:
                    demote(ti, k, data, done=None if acks is None else acks.expect())
        fed = self.routes.from_primary
        if self.immutable_keys and fed is not None:
            # the same bytes as any copy below: keep those copies (other engines sharing a tier
            # may be reading them), and skip the write-back if the fed tier has one
            writing, holds = coherence.writing, coherence.holds
            for k, slot in zip(keys, slots, strict=True):
                table.set_clean(slot, not writing(fed, k) and holds(fed, k) is True)
            return
        table.set_clean_many(slots, fed is None)
        if fresh or self.immutable_keys:
            return
        for ti in self._others:
            for k in coherence.older_copies(ti, keys):
                writes.push(ti, remove(k))

    def at_close(self, write_down_to: int | None) -> None:
        """The engine is closing: queue what must reach the tiers before they close.

        Copies that a failed write or remove may have left behind are the one thing a restart
        would not know to avoid: their removes are queued once more (a write-down follows
        them). ``write_down_to`` (:meth:`WriteRoutes.write_down_to`; None: skip it) gets the
        primary's blocks it does not hold yet.
        """
        for ti in range(self._tiers):
            for k in self._coherence.stale_keys(ti):
                self._writes.push(ti, remove(k))
        if write_down_to is not None:
            self._write_down_primary(write_down_to)

    def _write_down_primary(self, ti: int) -> None:
        """Queue the primary's blocks for tier ``ti``. Blocks that tier already holds are
        skipped: a put or store of a key removes its older copies everywhere, so a copy below
        is always the same bytes."""
        table, coherence = self._table, self._coherence
        for k, slot in list(table.index.items()):
            if table.state[slot] != READY:
                continue
            hint = coherence.holds(ti, k)
            fed = ti == self.routes.from_primary
            held = hint or (fed and table.is_clean(slot) and hint is None)
            if held and not coherence.removing(ti, k):  # a queued remove will take that copy
                continue
            self._writes.push(ti, write(k, self._arena.read(slot)))
