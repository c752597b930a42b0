"""Where a block's bytes go when the primary lets go of them or replaces them.

Evictions under write-back copy the bytes out (before the slot is reused: into a staging
buffer unless the first tier keeps the bytes it is given) and send them to the
first tier unless it keeps a clean copy; a put or store of new bytes removes the older copies
below (write-back), writes the new ones to every tier (write-through) or keeps copies that are
the same bytes (immutable keys); at close the primary's blocks are written down to the first
persistent tier. Part of :class:`~aiotier._core.engine_core.EngineCore`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from typing import TYPE_CHECKING

from .._types import BlockEvent
from .table import READY, Evictions
from .writeback import remove, write

if TYPE_CHECKING:
    from .engine_core import EngineCore

__all__ = ["Demotions"]


class Demotions:
    """The write-back, write-through and immutable-key decisions of one engine."""

    __slots__ = ("_core",)

    def __init__(self, core: EngineCore) -> None:
        self._core = core

    def evicted(self, evicted: Evictions) -> Sequence[bytes]:
        """Account primary evictions (their keys are returned); under write-back copy the bytes
        out (before the slots are reused) for the first tier, unless it already holds them."""
        core = self._core
        keys = evicted.keys
        if not keys:
            return keys
        core.stats.counts[("evictions", core.primary_name)] += len(keys)
        core.events.append(BlockEvent(tuple(keys), core.primary_name, True))
        if core.write_policy == "write_back" and core.tier_names:
            # a clean block's bytes are in the first tier already, unless a remove of them
            # is queued there or the tier lost them
            clean = evicted.clean
            kept = core.coherence.kept(0, list(compress(keys, clean) if 0 in clean else keys))
            if len(kept) == len(keys):
                return keys  # every one is in the first tier already
            demote, staging = core.writes.demote, core.staging
            if staging is None:
                read = core.arena.read
                for k, slot in zip(keys, evicted.slots, strict=True):
                    if k not in kept:
                        demote(0, k, read(slot))
            else:
                view, stage = core.arena.data_view, staging.copy
                for k, slot in zip(keys, evicted.slots, strict=True):
                    if k not in kept:
                        demote(0, k, stage(view(slot)), staged=True)
        return keys

    def readmit(self, k: bytes, data: bytes | memoryview, protected: Sequence[int] = ()) -> bool:
        """Put bytes that are on their way down back into the primary, if there is room (and
        the key has no block there: a pending store of it is newer)."""
        core = self._core
        if k in core.table.index:
            return False
        got = core.table.allocate([k], READY, protected)
        if got is None:
            core.stats.counts[("allocation_failures", "promotion")] += 1
            return False
        (slot,), evicted = got
        self.evicted(evicted)
        core.arena.write(slot, data)
        return True

    def replaced_everywhere(self, k: bytes, slot: int, *, fresh: bool = False) -> None:
        """New bytes of ``k`` landed in ``slot``: no tier may serve an older version.

        ``fresh``: no tier can hold ``k`` (a key never used before, such as a piece of a
        value over several blocks): there is nothing to remove below.
        """
        core = self._core
        coherence = core.coherence
        coherence.replaced(k)
        tiers = range(len(core.tier_names))
        if core.write_policy == "write_through" and core.tier_names:
            data = core.arena.read(slot)
            # on their way down until every tier has them: lookups find these bytes, never an
            # older copy a tier still holds while its write is queued
            for ti in tiers:
                core.writes.demote(ti, k, data)
            core.table.set_clean(slot, True)
            return
        if core.immutable_keys:
            # the same bytes as any copy below: keep those copies (other engines sharing a tier
            # may be reading them), and skip the write-back if the first tier has one
            held = bool(core.tier_names) and not coherence.writing(0, k)
            core.table.set_clean(slot, held and coherence.holds(0, k) is True)
            return
        core.table.set_clean(slot, False)
        if fresh:
            return
        for ti in tiers:
            if coherence.writing(ti, k) or coherence.holds(ti, k) is not False:
                core.writes.push(ti, remove(k))

    def at_close(self, write_down_to: int | None) -> None:
        """The engine is closing: queue what must reach the tiers before they close.

        Copies that a failed write or remove may have left behind are the one thing a restart
        would not know to avoid: their removes are queued once more (a write-down follows
        them). Under write-back, ``write_down_to`` (the first persistent tier; None: skip it)
        gets the primary's blocks it does not hold yet.
        """
        core = self._core
        for ti in range(len(core.tier_names)):
            for k in core.coherence.stale_keys(ti):
                core.writes.push(ti, remove(k))
        if write_down_to is not None and core.write_policy == "write_back":
            self._write_down_primary(write_down_to)

    def _write_down_primary(self, ti: int) -> None:
        """Queue the primary's blocks for tier ``ti``. Blocks that tier already holds are
        skipped: a put or store of a key removes its older copies everywhere, so a copy below
        is always the same bytes."""
        core = self._core
        table, coherence = core.table, core.coherence
        for k, slot in list(table.index.items()):
            if table.state[slot] != READY:
                continue
            hint = coherence.holds(ti, k)
            held = hint or (ti == 0 and table.is_clean(slot) and hint is None)
            if held and not coherence.removing(ti, k):  # a queued remove will take that copy
                continue
            core.writes.push(ti, write(k, core.arena.read(slot)))
