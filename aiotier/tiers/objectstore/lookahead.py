"""Object bodies fetched by a lookup and kept, under a byte budget, for the read that follows.

An object store answers "is it there?" (HEAD) and "give it to me" (GET) at about the same cost
per request, and the engine reads what a lookup found a moment later. A tier that GETs at
lookup time and keeps the body here pays one request per promoted block instead of two.

Rules (sans-IO: the tier does the requests, this only decides):

- What is held never exceeds ``capacity_bytes``; the oldest bodies make room, and a body is
  kept at most ``ttl`` seconds (the read follows within the engine's promotion timeout).
- A body is handed out once (:meth:`take` removes it).
- A body never outlives a change of its object made through the same tier: a write or remove
  of a name (:meth:`changed`, called as the request starts and again once it has finished),
  or a clear of them all, drops what is held for it, and a fetch that was in flight meanwhile
  is not kept (:meth:`begin` returns a mark that :meth:`keep` checks). What is remembered of
  changes is only what a fetch in flight could still need.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["LookAhead"]


class LookAhead:
    """Fetched bodies by object name, oldest first."""

    __slots__ = (
        "_active", "_bodies", "_changed", "_clock", "_floor", "_seq", "capacity_bytes",
        "held_bytes", "ttl",
    )  # fmt: skip

    def __init__(self, capacity_bytes: int, ttl: float, clock: Callable[[], float]) -> None:
        self.capacity_bytes = capacity_bytes
        self.ttl = ttl
        self._clock = clock
        # name -> (body, etag, size, expires at)
        self._bodies: OrderedDict[str, tuple[Any, str, int, float]] = OrderedDict()
        self.held_bytes = 0
        self._seq = 0  # counts changes; a fetch remembers the count when it began (its mark)
        self._active: Counter[int] = Counter()  # marks of the fetches in flight
        # name -> count at its last change, oldest first; only changes after the oldest mark
        # in flight are kept (older ones cannot refuse anything)
        self._changed: OrderedDict[str, int] = OrderedDict()
        self._floor = 0  # fetches marked below this began before the last clear

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def __len__(self) -> int:
        return len(self._bodies)

    @property
    def remembered_changes(self) -> int:
        """Changes remembered for the fetches in flight (none once no fetch is older)."""
        return len(self._changed)

    def room(self, size: int) -> int:
        """How many more bodies of ``size`` bytes fit once expired bodies are dropped (the
        oldest live ones are not counted as room: they are still to be read)."""
        self._expire()
        if size <= 0:
            return 0
        return max(0, (self.capacity_bytes - self.held_bytes) // size)

    def begin(self) -> int:
        """A fetch starts: the mark to hand to :meth:`keep` and, when it ends, :meth:`end`."""
        mark = self._seq
        self._active[mark] += 1
        return mark

    def end(self, mark: int) -> None:
        active = self._active
        active[mark] -= 1
        if active[mark] > 0:
            return
        del active[mark]
        oldest = min(active, default=self._seq)
        changed = self._changed
        while changed and next(iter(changed.values())) <= oldest:
            changed.popitem(last=False)

    def keep(self, name: str, body: Any, etag: str, size: int, mark: int) -> bool:
        """Hold ``body`` for ``name`` unless the name changed since ``mark`` or the body alone
        exceeds the budget; the oldest bodies make room."""
        if mark < self._floor or self._changed.get(name, -1) > mark or size > self.capacity_bytes:
            return False
        self._drop(name)
        while self._bodies and self.held_bytes + size > self.capacity_bytes:
            self._drop(next(iter(self._bodies)))
        self._bodies[name] = (body, etag, size, self._clock() + self.ttl)
        self.held_bytes += size
        return True

    def take(self, name: str) -> tuple[Any, str] | None:
        """The body held for ``name`` and its ETag (removed), or None."""
        entry = self._bodies.pop(name, None)
        if entry is None:
            return None
        body, etag, size, expires = entry
        self.held_bytes -= size
        if self._clock() >= expires:
            return None
        return body, etag

    def changed(self, name: str) -> None:
        """``name`` is being written or removed through this tier: forget its body, and refuse
        a body of it fetched before now."""
        self._seq += 1
        if self._active:
            self._changed.pop(name, None)
            self._changed[name] = self._seq
        self._drop(name)

    def clear(self) -> None:
        """Forget every body, and refuse those of fetches begun before now (every object may
        be gone)."""
        self._bodies.clear()
        self.held_bytes = 0
        self._seq += 1
        self._floor = self._seq

    def _drop(self, name: str) -> None:
        entry = self._bodies.pop(name, None)
        if entry is not None:
            self.held_bytes -= entry[2]

    def _expire(self) -> None:
        now, bodies = self._clock(), self._bodies
        while bodies:
            name, (_, _, _, expires) = next(iter(bodies.items()))
            if expires > now:
                return
            self._drop(name)
