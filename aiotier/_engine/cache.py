"""The await side of the cache API: ``get`` (promote and await, or read around) and ``delete``.

``put`` is the core's, and awaits only its write-through writes (``TieringEngine.put``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

from .._core.engine_core import EngineCore
from .._core.requests import RequestState
from .._types import LookupResult
from ..tiers.base import SecondaryTier
from .breakers import Breakers, answered
from .reads import TierReads
from .threads import EngineLock

__all__ = ["CacheCalls"]

_now = time.perf_counter


class CacheCalls:
    """``get`` and ``delete`` for one engine."""

    def __init__(
        self,
        core: EngineCore,
        tiers: Sequence[SecondaryTier],
        reads: TierReads,
        guard: EngineLock,
        breakers: Breakers,
        *,
        wait: Callable[[Sequence[bytes], float | None], Awaitable[list[LookupResult]]],
        promotion_timeout: float,
        io_timeout: float,
    ) -> None:
        self._core = core
        self._tiers = tuple(tiers)
        self._reads = reads
        self._guard = guard
        self._breakers = breakers
        self._wait = wait  # the engine's public wait: get is observed like any other caller
        self._promotion_timeout = promotion_timeout
        self._io_timeout = io_timeout

    async def get(self, k: bytes) -> bytes | None:
        """The block's bytes: from the primary, or promoted from a tier and awaited; else None.

        It is the lookup flow (``TierReads.scan``, holding no pin), then the block awaited in
        flight, or read around the primary when it has no room. Observed as one anonymous
        request: one sync and one async delay at most, however many looks it took.
        """
        core, lock = self._core, self._guard.lock
        with lock:
            data = core.values.cached(k)
        if data is not None:
            return data
        call = RequestState("get")  # this call's own delays, observed when it ends
        deferred: float | None = None
        try:
            for _attempt in range(2):  # a second look if the block moved down while promoting
                scan = await self._reads.scan([k], call, -1, prefix=False, hold=False)
                if scan.unplaced:
                    return await self._read_around(k, scan.unplaced[0][1])
                with lock:
                    got = core.answers.in_flight(k)
                    if got is None:  # nothing in flight: a concurrent call may have landed it
                        return core.values.copy_ready(k) or core.coherence.down_copy(k)
                if deferred is None:
                    deferred = _now()
                data = await self._await_block(k, got[0])
                if data is not None or core.closed:
                    return data
            return None
        finally:
            with lock:
                if call.has_sync:
                    core.stats.observe("sync_delay", call.sync_delay)
                if deferred is not None:
                    core.stats.observe("async_delay", _now() - deferred)

    async def _await_block(self, k: bytes, slot: int) -> bytes | None:
        """Wait for the block in flight in ``slot`` and copy it out (pinned meanwhile)."""
        core, lock = self._core, self._guard.lock
        with lock:
            core.table.pin(slot)  # not evicted between landing and being copied out
        try:
            with contextlib.suppress(TimeoutError):
                await self._wait([k], self._promotion_timeout + 1.0)
            with lock:
                if core.table.ready_slot(k) == slot:
                    return core.arena.read(slot)
                # replaced by a put meanwhile (the newer bytes), or pushed down while promoting
                return core.values.copy_ready(k) or core.coherence.down_copy(k)
        finally:
            with lock:
                core.table.unpin(slot)

    async def _read_around(self, k: bytes, ti: int) -> bytes | None:
        """A block tier ``ti`` has but the primary has no room for: read it privately.

        If it moved down meanwhile, it is on its way (``in_transit``) or in a tier below.
        """
        core, lock = self._core, self._guard.lock
        coherence = core.coherence
        buf = bytearray(core.arena.block_size)
        for tj in range(ti, len(self._tiers)):
            if tj > ti:
                with lock:
                    data = coherence.down_copy(k)
                    if data is not None:
                        return data
                    if not coherence.may_read(tj, k):
                        continue
            tier = self._tiers[tj]
            n = await self._read_one(tj, k, buf)
            if n is None:
                with lock:
                    core.stats.count("tier_errors", tier.name, "read")
                return None
            if n >= 0:
                with lock:
                    core.stats.count("read_bytes", tier.name, n=n)
                return bytes(buf[:n])
        with lock:
            return coherence.down_copy(k)

    async def _read_one(self, ti: int, k: bytes, buf: bytearray) -> int | None:
        """One read through tier ``ti``'s circuit breaker; None on a fault or an open circuit."""
        breakers = self._breakers
        if not breakers.allow(ti):
            return None
        ok: bool | None = None
        try:
            async with asyncio.timeout(self._promotion_timeout):
                (n,) = await self._tiers[ti].read_many_into([k], [memoryview(buf)])
            if isinstance(n, Exception):
                raise n
            ok = True
            return n
        except Exception as exc:
            ok = answered([exc])
            return None
        finally:
            breakers.record(ti, ok)

    async def delete(self, k: bytes) -> bool:
        """Remove the block from every tier; True if any tier had it."""
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[bool]] = [loop.create_future() for _ in self._tiers]
        with self._guard.lock:
            present = self._core.delete(k, [partial(_resolve, f) for f in futs])
        if futs:
            done, _ = await asyncio.wait(futs, timeout=self._io_timeout * 2)
            present = present or any(f.result() for f in done if not f.cancelled())
        return present


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)
