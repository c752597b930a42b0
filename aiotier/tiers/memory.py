"""A secondary tier in process memory: blocks under a byte budget, LRU, expiring at their
:attr:`~aiotier.tiers.base.BlockMeta.expires_at`."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from .._core.deadlines import Deadlines
from .._core.gather import gather
from .._types import LookupResult
from ..errors import ConfigError
from ._batches import write_each
from .base import BlockMeta, Buffer, Eviction, SecondaryTier, TierCapabilities, TierSetup, TierUsage

__all__ = ["ByteBudgetLRU", "MemoryTier"]


class ByteBudgetLRU:
    """``key -> size`` in recency order, and what to evict for a new entry to fit.

    It never touches the data: the tier asks :meth:`admit` which keys must go and drops them;
    the accounting here already reflects it.
    """

    __slots__ = ("_entries", "capacity", "used")

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ConfigError(f"capacity_bytes must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self.used = 0
        self._entries: OrderedDict[bytes, int] = OrderedDict()

    def __iter__(self) -> Iterator[bytes]:
        """Keys from least to most recently used."""
        return iter(self._entries)

    def admit(self, key: bytes, size: int) -> list[bytes]:
        """Account ``key`` as most recent with ``size`` bytes (replacing an entry for it);
        return the keys evicted for it, least recent first. Raises ``ValueError`` (changing
        nothing) when ``size`` alone exceeds the budget."""
        if size > self.capacity:
            raise ValueError(f"a {size}-byte entry cannot fit a {self.capacity}-byte budget")
        self.discard(key)
        entries = self._entries
        evicted: list[bytes] = []
        limit = self.capacity - size
        while self.used > limit and entries:
            victim, vsize = entries.popitem(last=False)
            self.used -= vsize
            evicted.append(victim)
        entries[key] = size
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


class MemoryTier(SecondaryTier):
    """Blocks kept in this process (a ``bytes`` as given, a view copied into a buffer the tier
    owns and reuses), least recently used evicted first.

    Every operation completes without suspending, so it is the cheapest tier to promote from;
    it is also the only built-in tier that hands evicted bytes to the tier below for free.
    """

    capabilities = TierCapabilities(
        persistent=False,
        keeps_written_bytes=True,
        cheap_evictions=True,
        clearable=True,
        expiry=True,
    )
    #: Expired blocks reclaimed per ``write_many`` at most (the rest at the next ones, or
    #: when a lookup or read meets them).
    RECLAIM_PER_WRITE = 256

    def __init__(self, capacity_bytes: int, *, name: str = "memory") -> None:
        super().__init__(name)
        self._budget = ByteBudgetLRU(capacity_bytes)
        self._data: dict[bytes, bytes | bytearray] = {}
        self._hand_over = "none"
        self._evictions = 0
        # evicted while the engine wants them handed down: still found here until taken
        self._evicted: dict[bytes, bytes | bytearray] = {}
        # evicted while the engine wants only their keys
        self._evicted_keys: list[bytes] = []
        # the expiry (unix seconds) of blocks that have one
        self._deadlines: Deadlines[bytes] = Deadlines()
        self._expires = self._deadlines.at
        self._expirations = 0

    async def open(self, setup: TierSetup | None = None) -> None:
        if setup is not None:
            self._hand_over = setup.evictions

    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        if self._expires:
            self._expire(keys)
        data, evicted = self._data, self._evicted
        hit, miss = LookupResult.HIT, LookupResult.MISS
        return [hit if k in data or k in evicted else miss for k in keys]

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        if self._expires:
            self._expire(keys)
        return self._copy_into(keys, bufs)

    def _expire(self, keys: Iterable[bytes]) -> None:
        """Drop those of ``keys`` past their expiry: they are absent from here on."""
        expires, now = self._expires, time.time()
        for k in keys:
            t = expires.get(k)
            if t is not None and now >= t:
                self._drop_expired(k)

    def _drop_expired(self, k: bytes) -> None:
        self._deadlines.drop(k)
        self._budget.discard(k)
        self._data.pop(k, None)
        self._evicted.pop(k, None)
        self._expirations += 1

    def _reclaim(self, limit: int) -> None:
        """Drop up to ``limit`` blocks past their expiry, earliest first."""
        for k in self._deadlines.due(time.time(), limit):
            self._drop_expired(k)

    def _set_expiry(
        self,
        items: Sequence[tuple[bytes, Buffer]],
        meta: Sequence[BlockMeta] | None,
        errors: Sequence[Exception | None],
    ) -> None:
        """The written blocks' expiry (the last write of a key wins, as for its bytes)."""
        arm = self._deadlines.arm
        for at, ((k, _), err) in enumerate(zip(items, errors, strict=True)):
            if err is None:
                arm(k, None if meta is None else meta[at].expires_at)

    def _copy_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """Copy each block into its buffer: its length, -1 when absent, or a ``ValueError``
        when it does not fit. Nothing here suspends, so a batch is one loop."""
        data, evicted, touch = self._data, self._evicted, self._budget.touch
        if not evicted and bufs:
            try:
                blobs = gather(data, keys)
            except KeyError:
                pass  # some are absent: one at a time below
            else:
                lengths = list(map(len, blobs))
                if max(lengths) <= min(map(len, bufs)):  # every block fits its buffer
                    for buf, blob, n in zip(bufs, blobs, lengths, strict=True):
                        buf[:n] = blob
                    self._budget.touch_many(keys)
                    return lengths  # type: ignore[return-value]
        out: list[int | Exception] = []
        for key, buf in zip(keys, bufs, strict=True):
            blob = data.get(key)
            if blob is None:
                blob = evicted.get(key)
                if blob is None:
                    out.append(-1)
                    continue
            n = len(blob)
            if n > len(buf):
                out.append(ValueError(
                    f"tier {self.name!r}: block {key[:64]!r} is {n} bytes, buffer holds {len(buf)}"
                ))  # fmt: skip
                continue
            buf[:n] = blob
            touch(key)
            out.append(n)
        return out

    async def write_many(
        self, items: Sequence[tuple[bytes, Buffer]], meta: Sequence[BlockMeta] | None = None
    ) -> list[Exception | None]:
        errors = await write_each(items, self._write)
        if meta is not None or self._expires:
            self._set_expiry(items, meta, errors)
        if self._expires:
            self._reclaim(self.RECLAIM_PER_WRITE)
        return errors

    async def _write(self, key: bytes, data: Buffer) -> None:
        # A block given as a view is copied (the caller reuses its buffer), into the buffer of
        # the copy it replaces or of a victim when there is one: a new large buffer costs
        # several times the copy (fresh pages, each zero-filled on first touch).
        spare = self._data.get(key)
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        for victim in self._budget.admit(key, n):
            old = self._data.pop(victim)
            self._expires.pop(victim, None)
            self._evictions += 1
            if self._hand_over == "bytes":
                self._evicted[victim] = old
                continue
            if self._hand_over == "keys":
                self._evicted_keys.append(victim)
            if spare is None:
                spare = old
        self._evicted.pop(key, None)  # the new version supersedes one awaiting hand-over
        if type(data) is bytes:
            self._data[key] = data  # immutable: kept as it is
        elif type(spare) is bytearray:
            spare[:] = memoryview(data).cast("B")
            self._data[key] = spare
        else:
            self._data[key] = bytearray(memoryview(data).cast("B"))

    async def remove_many(self, keys: Sequence[bytes]) -> list[bool | Exception]:
        out: list[bool | Exception] = []
        for key in keys:
            self._budget.discard(key)
            self._expires.pop(key, None)
            handed = self._evicted.pop(key, None) is not None
            out.append(self._data.pop(key, None) is not None or handed)
        return out

    async def clear(self) -> None:
        self._budget = ByteBudgetLRU(self._budget.capacity)
        self._data.clear()
        self._evicted.clear()
        self._evicted_keys.clear()
        self._deadlines.clear()

    def contains_hint(self, key: bytes) -> bool | None:
        if self._expires:
            self._expire((key,))
        return key in self._data or key in self._evicted

    def contains_hints(self, keys: list[bytes]) -> list[bool | None]:
        if type(self).contains_hint is not MemoryTier.contains_hint:
            return super().contains_hints(keys)  # a subclass's own answer, key by key
        if self._expires:
            self._expire(keys)
        held: list[bool | None] = list(map(self._data.__contains__, keys))  # one C-level pass
        if self._evicted and False in held:
            evicted = self._evicted
            return [h or k in evicted for k, h in zip(keys, held, strict=True)]
        return held

    def usage(self) -> TierUsage:
        budget = self._budget
        return TierUsage(
            len(self._data), budget.used, budget.capacity, None, self._evictions,
            self._expirations,
        )  # fmt: skip

    def take_evictions(self) -> list[Eviction]:
        if self._evicted_keys:
            keys, self._evicted_keys = self._evicted_keys, []
            return [(k, None) for k in keys if k not in self._data]  # not written again since
        out: list[Eviction] = [
            (k, v if type(v) is bytes else memoryview(v)) for k, v in self._evicted.items()
        ]
        self._evicted.clear()
        return out
