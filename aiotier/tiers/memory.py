"""A secondary tier in process memory: blocks under a byte budget, LRU."""

from __future__ import annotations

from collections.abc import Sequence

from .._core.budget import ByteBudgetLRU
from .._core.gather import gather
from .._types import LookupResult
from .base import SecondaryTier, TierUsage

__all__ = ["MemoryTier"]


class MemoryTier(SecondaryTier):
    """Blocks kept in this process (a ``bytes`` as given, a view copied into a buffer the tier
    owns and reuses), least recently used evicted first.

    Every operation completes without suspending, so it is the cheapest tier to promote from;
    it is also the only built-in tier that hands evicted bytes to the tier below for free.
    """

    persistent = False
    cheap_handover = True
    keeps_written_bytes = True

    def __init__(self, capacity_bytes: int, *, name: str = "memory") -> None:
        super().__init__(name)
        self._budget = ByteBudgetLRU(capacity_bytes)
        self._data: dict[bytes, bytes | bytearray] = {}
        # evicted while the engine wants them handed down: still found here until taken
        self._evicted: dict[bytes, bytes | bytearray] = {}

    async def lookup(self, key: bytes) -> LookupResult:
        return LookupResult.HIT if self.contains_hint(key) else LookupResult.MISS

    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        data, evicted = self._data, self._evicted
        hit, miss = LookupResult.HIT, LookupResult.MISS
        return [hit if k in data or k in evicted else miss for k in keys]

    async def read_into(self, key: bytes, buf: memoryview) -> int:
        (n,) = self._copy_into([key], [buf])
        if isinstance(n, Exception):
            raise n
        return n

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        if type(self).read_into is not MemoryTier.read_into:  # a subclass reads its own way
            return await super().read_many_into(keys, bufs)
        return self._copy_into(keys, bufs)

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

    async def write(self, key: bytes, data: bytes | memoryview) -> None:
        # A block given as a view is copied (the caller reuses its buffer), into the buffer of
        # the copy it replaces or of a victim when there is one: a new large buffer costs
        # several times the copy (fresh pages, each zero-filled on first touch).
        spare = self._data.get(key)
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        for victim in self._budget.admit(key, n):
            old = self._data.pop(victim)
            self.evictions += 1
            if self.handover_evicted:
                self._evicted[victim] = old
            elif spare is None:
                spare = old
        self._evicted.pop(key, None)  # the new version supersedes one awaiting hand-over
        if type(data) is bytes:
            self._data[key] = data  # immutable: kept as it is
        elif type(spare) is bytearray:
            spare[:] = memoryview(data).cast("B")
            self._data[key] = spare
        else:
            self._data[key] = bytearray(memoryview(data).cast("B"))

    async def remove(self, key: bytes) -> bool:
        self._budget.discard(key)
        handed = self._evicted.pop(key, None) is not None
        return self._data.pop(key, None) is not None or handed

    async def clear(self) -> None:
        self._budget = ByteBudgetLRU(self._budget.capacity)
        self._data.clear()
        self._evicted.clear()

    def contains_hint(self, key: bytes) -> bool | None:
        return key in self._data or key in self._evicted

    def usage(self) -> TierUsage:
        return TierUsage(len(self._data), self._budget.used, self._budget.capacity)

    def take_evicted(self) -> Sequence[tuple[bytes, bytes | memoryview]]:
        out = [(k, v if type(v) is bytes else memoryview(v)) for k, v in self._evicted.items()]
        self._evicted.clear()
        return out
