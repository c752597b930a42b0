"""Blocks with a TTL in the core: deadlines armed where they land in the primary, and what is
past its deadline dropped, counted per tier (``expirations``) and removed below.

The expiry itself travels in the block's bytes (:mod:`aiotier._core.values`); the primary keeps
it per slot (:mod:`aiotier._core.deadlines`) so that hits need not parse anything.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from .._types import BlockEvent
from .arena import Arena
from .coherence import Coherence
from .stats import StepStats
from .table import READY, BlockTable
from .values import MANIFEST_MAGIC, PIECE_KEY_PREFIX, block_expiry

__all__ = ["Expiry"]

#: every key that starts with ``PIECE_KEY_PREFIX`` sorts below this one
_PIECE_KEYS_END = PIECE_KEY_PREFIX[:-1] + bytes([PIECE_KEY_PREFIX[-1] + 1])


class Expiry:
    """The TTL transitions of one engine's core: deadlines armed where blocks with an expiry
    land in the primary, expired blocks dropped (from the primary, from bytes on their way
    down, from the tier a promotion read them from), counted per tier as ``expirations``.

    ``now`` is read from ``wall_clock`` (unix seconds: an expiry is shared by a fleet and kept
    across restarts). A tier that honours expiry (``tier_expiry[ti]``) reclaims its own copies;
    for the others a remove is queued when the primary drops an expired block.
    """

    __slots__ = (
        "_coherence",
        "_events",
        "_forget",
        "_names",
        "_primary_name",
        "_remove",
        "_stats",
        "_table",
        "_tier_expiry",
        "deadlines",
        "wall_clock",
    )

    def __init__(
        self,
        table: BlockTable,
        coherence: Coherence,
        stats: StepStats,
        events: deque[BlockEvent],
        *,
        primary_name: str,
        tier_names: Sequence[str],
        tier_expiry: Sequence[bool],
        forget: Callable[[bytes, int], None],
        remove: Callable[[int, bytes], object],
        wall_clock: Callable[[], float],
    ) -> None:
        self._table = table
        self._coherence = coherence
        self._stats = stats
        self._events = events
        self._primary_name = primary_name
        self._names = tuple(tier_names)
        self._tier_expiry = tuple(tier_expiry) or (False,) * len(self._names)
        self._forget = forget
        self._remove = remove
        self.deadlines = table.deadlines
        self.wall_clock = wall_clock

    def arm(self, slot: int, key: bytes, block: bytes | memoryview) -> float | None:
        """A block landed in ``slot``: its deadline is the one its bytes carry (if any)."""
        expires_at = block_expiry(key, block)
        self.deadlines.arm(slot, expires_at)
        return expires_at

    def check(self, keys: Sequence[bytes]) -> None:
        """Drop those of ``keys`` whose block in the primary, or on its way down, is past its
        deadline: they answer as absent from here on. Cheap when no block has a TTL."""
        at = self.deadlines.at
        index = self._table.index
        if at:
            now = self.wall_clock()
            for k in keys:
                slot = index.get(k)
                if slot is not None:
                    t = at.get(slot)
                    if t is not None and now >= t:
                        self._expire_slot(k, slot)
        in_transit = self._coherence.in_transit
        if in_transit and not in_transit.keys().isdisjoint(keys):
            for k in keys:
                data = in_transit.get(k)
                if data is not None and k not in index:
                    self.live(k, data)

    def live(self, k: bytes, data: bytes | memoryview) -> bool:
        """Whether bytes of ``k`` on their way down may be served: not past the expiry they
        carry (else they are dropped here, counted for the primary)."""
        t = block_expiry(k, data)
        if t is None or self.wall_clock() < t:
            return True
        self.dropped(k, None)
        return False

    def reclaim(self, limit: int) -> int:
        """Free up to ``limit`` primary slots past their deadline (the step boundary's bounded
        sweep); how many were freed."""
        table = self._table
        due = self.deadlines.due(self.wall_clock(), limit)
        freed = 0
        for slot in due:
            k = table.keys[slot]
            if k is not None and table.index.get(k) == slot and table.state[slot] == READY:
                self._expire_slot(k, slot)
                freed += 1
            else:
                self.deadlines.drop(slot)
        return freed

    def landed(self, ti: int, keys: Sequence[bytes], slots: Sequence[int], arena: Arena) -> None:
        """Promoted blocks landed from tier ``ti``: arm their deadlines; one already past it is
        dropped at once (counted for tier ``ti``, and removed there)."""
        # only a value's head and its pieces carry an expiry (no block of the scheduler's does)
        heads = arena.starting_with(slots, MANIFEST_MAGIC)
        pieces = (  # none unless some key sorts below the prefix's end (one C-level pass)
            [j for j, k in enumerate(keys) if k.startswith(PIECE_KEY_PREFIX)]
            if keys and min(keys) < _PIECE_KEYS_END
            else []
        )
        if not heads and not pieces:
            return
        now: float | None = None
        for j in sorted({*heads, *pieces}):
            k, slot = keys[j], slots[j]
            t = self.arm(slot, k, arena.data_view(slot))
            if t is None:
                continue
            if now is None:
                now = self.wall_clock()
            if now >= t:
                self._expire_slot(k, slot, ti)

    def _expire_slot(self, k: bytes, slot: int, ti: int | None = None) -> None:
        self._forget(k, slot)
        self.deadlines.drop(slot)  # an orphan still pinned keeps no deadline
        self.dropped(k, ti)

    def dropped(self, k: bytes, ti: int | None) -> None:
        """``k``'s block was found past its deadline (in tier ``ti``; None: the primary or on
        its way down) and is no longer served: counted; no copy below may serve it, so the
        tiers that do not expire blocks themselves (and ``ti``) get a remove."""
        name = self._primary_name if ti is None else self._names[ti]
        self._stats.counts[("expirations", name)] += 1
        self._events.append(BlockEvent((k,), name, True))
        coherence = self._coherence
        coherence.replaced(k)
        for tj, native in enumerate(self._tier_expiry):
            if tj == ti or (
                not native and (coherence.writing(tj, k) or coherence.holds(tj, k) is not False)
            ):
                self._remove(tj, k)
