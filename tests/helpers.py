"""Shared test helpers: wait for a condition with a deadline instead of sleeping; checks every
tier must pass."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

from aiotier import LookupResult, MemoryTier, SimpleTier, TierUsage
from aiotier.tiers.base import SecondaryTier


async def eventually(cond: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``cond`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {what or cond}")
        await asyncio.sleep(0.002)


class FakeClock:
    """An injected clock (seconds) that moves only when a test sets ``now``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def aiotier_tasks(kind: str = "") -> list[asyncio.Task[object]]:
    """The engine's background tasks still running: promotions (``kind="promote"``), writers
    (``"writer"``), the step ticker (``"step"``), or all of them. Engines name their tasks
    ``aiotier-<kind>-...``."""
    prefix = f"aiotier-{kind}"
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(prefix) and not t.done()]


def block(i: int, size: int = 64) -> bytes:
    """Block ``i``'s bytes: ``size`` copies of ``i % 256``."""
    return bytes([i % 256]) * size


async def seeded(n: int, name: str = "memory", capacity: int = 1 << 20) -> MemoryTier:
    """A ``MemoryTier`` holding ``k0`` … ``k{n-1}`` (each ``block(i)``)."""
    tier = MemoryTier(capacity, name=name)
    await tier.write_many([(b"k%d" % i, block(i)) for i in range(n)])
    return tier


# One key through a tier's batch contract, raising a per-key failure (as a caller that drives
# a tier by hand expects).


async def lookup_one(tier: SecondaryTier, key: bytes) -> LookupResult:
    (answer,) = await tier.lookup_many([key])
    return answer


async def read_one(tier: SecondaryTier, key: bytes, buf: memoryview) -> int:
    (n,) = await tier.read_many_into([key], [buf])
    if isinstance(n, Exception):
        raise n
    return n


async def write_one(tier: SecondaryTier, key: bytes, data: bytes | memoryview) -> None:
    (error,) = await tier.write_many([(key, data)])
    if error is not None:
        raise error


async def remove_one(tier: SecondaryTier, key: bytes) -> bool:
    (found,) = await tier.remove_many([key])
    if isinstance(found, Exception):
        raise found
    return found


class DictTier(SimpleTier):
    """The smallest user-written tier: a dict of bytes, written key by key (the four methods
    of ``SimpleTier`` and ``usage``), no ``clear`` or batched forms of its own."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.data: dict[bytes, bytes] = {}

    async def lookup(self, key: bytes) -> LookupResult:
        return LookupResult.HIT if key in self.data else LookupResult.MISS

    async def read_into(self, key: bytes, buf: memoryview) -> int:
        data = self.data.get(key)
        if data is None:
            return -1
        buf[: len(data)] = data
        return len(data)

    async def write(self, key: bytes, data: bytes | memoryview) -> None:
        self.data[key] = bytes(data)

    async def remove(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None

    def usage(self) -> TierUsage:
        return TierUsage(len(self.data), sum(map(len, self.data.values())), None)


async def check_written_views_may_be_reused(tier: SecondaryTier, n: int = 3) -> None:
    """A tier keeps no reference to a written view once ``write_many`` returned: the engine
    reuses the buffers it demotes from. Each block reads back as written after its buffer was
    overwritten."""
    staging = [bytearray(os.urandom(4096)) for _ in range(n)]
    want = [bytes(b) for b in staging]
    items = [(f"reused-{i}".encode(), memoryview(b)) for i, b in enumerate(staging)]
    assert await tier.write_many(items) == [None] * n
    for b in staging:
        b[:] = bytes(len(b))
    for (key, _), data in zip(items, want, strict=True):
        buf = memoryview(bytearray(8192))
        got = await read_one(tier, key, buf)
        assert bytes(buf[:got]) == data
