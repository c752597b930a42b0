"""Deadlines of blocks with a TTL: when each stops being served (the primary's, by slot; the
memory and SSD tiers', by key).

Only slots whose block carries an expiry have an entry (``at``: slot -> unix seconds), so the
primary-hit fast paths pay one dict membership test for the others (the prefix fast path one
``isdisjoint`` over its slots, and nothing while no slot has a deadline). A heap of ``(deadline,
slot)`` lets the step boundary reclaim expired slots in deadline order with bounded work;
entries of slots whose deadline changed or went are skipped when they surface (and the heap is
rebuilt when they outnumber the live ones). Plain state: the caller passes ``now``.

:class:`~aiotier._core.expiry.Expiry` arms them and drops what is past them.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Final, Generic, TypeVar

__all__ = ["Deadlines"]

_K = TypeVar("_K", bound=Hashable)

#: The heap is rebuilt from ``at`` when it holds more than this many entries per live one.
_STALE_FACTOR: Final = 4


class Deadlines(Generic[_K]):
    """The expiry of each block that has one, by slot (the primary) or key (a tier)."""

    __slots__ = ("_heap", "at")

    def __init__(self) -> None:
        #: slot or key -> its block's expiry (unix seconds); read directly by the fast paths
        self.at: dict[_K, float] = {}
        self._heap: list[tuple[float, _K]] = []

    def __len__(self) -> int:
        return len(self.at)

    def arm(self, slot: _K, expires_at: float | None) -> None:
        """``slot`` now holds a block expiring at ``expires_at`` (None: never)."""
        if expires_at is None:
            self.at.pop(slot, None)
            return
        self.at[slot] = expires_at
        heap = self._heap
        heapq.heappush(heap, (expires_at, slot))
        if len(heap) > _STALE_FACTOR * len(self.at) + 64:
            self._heap = [(t, s) for s, t in self.at.items()]
            heapq.heapify(self._heap)

    def drop(self, slot: _K) -> None:
        """``slot`` was freed or reused: its deadline goes with its block."""
        self.at.pop(slot, None)

    def expired(self, slot: _K, now: float) -> bool:
        """Whether ``slot`` holds a block past its deadline."""
        t = self.at.get(slot)
        return t is not None and now >= t

    def due(self, now: float, limit: int) -> list[_K]:
        """Up to ``limit`` slots past their deadline at ``now``, earliest first (their entries
        stay until the caller reclaims them: :meth:`drop`)."""
        heap, at = self._heap, self.at
        out: list[_K] = []
        seen: set[_K] = set()  # armed twice with one deadline: two entries, one slot
        while heap and len(out) < limit and heap[0][0] <= now:
            t, slot = heapq.heappop(heap)
            if at.get(slot) == t and slot not in seen:
                seen.add(slot)
                out.append(slot)
        return out

    def clear(self) -> None:
        self.at.clear()
        self._heap.clear()
