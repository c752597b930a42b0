"""Where a block's bytes go when the primary lets go of them or replaces them.

Evictions under write-back copy the bytes out (before the slot is reused: into a staging
buffer unless the first tier keeps the bytes it is given) and send them to the
first tier unless it keeps a clean copy; a put or store of new bytes removes the older copies
below (write-back), writes the new ones to every tier (write-through) or keeps copies that are
the same bytes (immutable keys); at close the primary's blocks are written down to the first
persistent tier. Part of :class:`~aiotier._core.engine_core.EngineCore`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import compress

from .._types import BlockEvent
from .arena import Arena
from .coherence import Coherence
from .staging import StagingBuffers
from .stats import StepStats
from .table import READY, BlockTable, Evictions, SlotState
from .writeback import WriteQueues, remove, write

__all__ = ["CopyPolicy"]


class CopyPolicy:
    """The write-back, write-through and immutable-key decisions of one engine."""

    __slots__ = (
        "_arena",
        "_coherence",
        "_events",
        "_staging",
        "_stats",
        "_table",
        "_tiers",
        "_writes",
        "immutable_keys",
        "primary_name",
        "write_policy",
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
        tiers: int,
        write_policy: str,
        immutable_keys: bool,
    ) -> None:
        self._table = table
        self._arena = arena
        self._coherence = coherence
        self._writes = writes
        self._staging = staging
        self._stats = stats
        self._events = events
        self._tiers = tiers
        self.primary_name = primary_name
        self.write_policy = write_policy
        self.immutable_keys = immutable_keys

    def allocate(
        self, keys: list[bytes], state: SlotState, protected: Sequence[int] = ()
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
        self, keys: list[bytes], state: SlotState, protected: Sequence[int] = ()
    ) -> list[int]:
        """:meth:`allocate` for the longest leading run of ``keys`` that fits (maybe none)."""
        slots, evicted = self._table.allocate_prefix(keys, state, protected)
        self.evicted(evicted)
        return slots

    def evicted(self, evicted: Evictions) -> Sequence[bytes]:
        """Account primary evictions (their keys are returned); under write-back copy the bytes
        out (before the slots are reused) for the first tier, unless it already holds them."""
        keys = evicted.keys
        if not keys:
            return keys
        self._stats.counts[("evictions", self.primary_name)] += len(keys)
        self._events.append(BlockEvent(tuple(keys), self.primary_name, True))
        if self.write_policy == "write_back" and self._tiers:
            # a clean block's bytes are in the first tier already, unless a remove of them
            # is queued there or the tier lost them
            clean = evicted.clean
            kept = self._coherence.kept(0, list(compress(keys, clean) if 0 in clean else keys))
            if len(kept) == len(keys):
                return keys  # every one is in the first tier already
            demote, staging = self._writes.demote, self._staging
            if staging is None:
                read = self._arena.read
                for k, slot in zip(keys, evicted.slots, strict=True):
                    if k not in kept:
                        demote(0, k, read(slot))
            else:
                view, stage = self._arena.data_view, staging.copy
                for k, slot in zip(keys, evicted.slots, strict=True):
                    if k not in kept:
                        demote(0, k, stage(view(slot)), staged=True)
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
        self._arena.write(got[0][0], data)
        return len(got[1])

    def replaced_everywhere(self, k: bytes, slot: int, *, fresh: bool = False) -> None:
        """New bytes of ``k`` landed in ``slot``: no tier may serve an older version.

        ``fresh``: no tier can hold ``k`` (a key never used before, such as a piece of a
        value over several blocks): there is nothing to remove below.
        """
        coherence, table, writes = self._coherence, self._table, self._writes
        coherence.replaced(k)
        tiers = range(self._tiers)
        if self.write_policy == "write_through" and self._tiers:
            data = self._arena.read(slot)
            # on their way down until every tier has them: lookups find these bytes, never an
            # older copy a tier still holds while its write is queued
            for ti in tiers:
                writes.demote(ti, k, data)
            table.set_clean(slot, True)
            return
        if self.immutable_keys:
            # the same bytes as any copy below: keep those copies (other engines sharing a tier
            # may be reading them), and skip the write-back if the first tier has one
            held = bool(self._tiers) and not coherence.writing(0, k)
            table.set_clean(slot, held and coherence.holds(0, k) is True)
            return
        table.set_clean(slot, False)
        if fresh:
            return
        for ti in tiers:
            if coherence.writing(ti, k) or coherence.holds(ti, k) is not False:
                writes.push(ti, remove(k))

    def at_close(self, write_down_to: int | None) -> None:
        """The engine is closing: queue what must reach the tiers before they close.

        Copies that a failed write or remove may have left behind are the one thing a restart
        would not know to avoid: their removes are queued once more (a write-down follows
        them). Under write-back, ``write_down_to`` (the first persistent tier; None: skip it)
        gets the primary's blocks it does not hold yet.
        """
        for ti in range(self._tiers):
            for k in self._coherence.stale_keys(ti):
                self._writes.push(ti, remove(k))
        if write_down_to is not None and self.write_policy == "write_back":
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
            held = hint or (ti == 0 and table.is_clean(slot) and hint is None)
            if held and not coherence.removing(ti, k):  # a queued remove will take that copy
                continue
            self._writes.push(ti, write(k, self._arena.read(slot)))
