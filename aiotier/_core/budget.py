"""A byte budget with least-recently-used eviction, for secondary tiers (memory, SSD)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

from ..errors import ConfigError

__all__ = ["ByteBudgetLRU"]


class ByteBudgetLRU:
    """Tracks ``key -> size`` in recency order and says what to evict to fit a new entry.

    It never touches the data itself: a tier asks :meth:`admit` (or :meth:`admit_entries`)
    which keys must go, drops them, and the accounting here already reflects it. Every
    eviction, at admission or after an index rebuild (:meth:`over_budget`), runs the same loop.
    """

    __slots__ = ("_entries", "capacity", "used")

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ConfigError(f"capacity_bytes must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self.used = 0
        self._entries: OrderedDict[bytes, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[bytes]:
        """Keys from least to most recently used."""
        return iter(self._entries)

    def size_of(self, key: bytes) -> int | None:
        return self._entries.get(key)

    def admit(self, key: bytes, size: int) -> list[bytes]:
        """Account ``key`` as most recent with ``size`` bytes; return the keys evicted for it.

        An existing entry for ``key`` is replaced. Raises ``ValueError`` (changing nothing) when
        ``size`` alone exceeds the budget.
        """
        return [victim for victim, _size in self.admit_entries(key, size)]

    def admit_entries(self, key: bytes, size: int) -> list[tuple[bytes, int]]:
        """:meth:`admit`, returning each evicted entry with its size, least recent first (a
        tier whose names include the size, such as the SSD tier's files, needs both)."""
        if size > self.capacity:
            raise ValueError(f"a {size}-byte entry cannot fit a {self.capacity}-byte budget")
        self.discard(key)
        evicted = self._evict_down_to(self.capacity - size)
        self._entries[key] = size
        self.used += size
        return evicted

    def touch(self, key: bytes) -> None:
        if key in self._entries:
            self._entries.move_to_end(key)

    def touch_many(self, keys: Iterable[bytes]) -> None:
        """:meth:`touch` of each key, in order."""
        entries = self._entries
        move = entries.move_to_end
        for key in keys:
            if key in entries:
                move(key)

    def discard(self, key: bytes) -> int | None:
        """Forget ``key``; return its size, or None if it was not tracked."""
        size = self._entries.pop(key, None)
        if size is not None:
            self.used -= size
        return size

    def load(self, key: bytes, size: int) -> None:
        """Add an entry as most recent without evicting (index rebuild at start-up)."""
        self.discard(key)
        self._entries[key] = size
        self.used += size

    def over_budget(self) -> list[bytes]:
        """Evict least-recent entries until within budget (after :meth:`load`); return them."""
        return [victim for victim, _size in self._evict_down_to(self.capacity)]

    def _evict_down_to(self, limit: int) -> list[tuple[bytes, int]]:
        """The one eviction loop: drop least-recent entries until at most ``limit`` bytes are
        used; return them with their sizes, in eviction order."""
        entries = self._entries
        evicted: list[tuple[bytes, int]] = []
        while self.used > limit and entries:
            victim, vsize = entries.popitem(last=False)
            self.used -= vsize
            evicted.append((victim, vsize))
        return evicted
