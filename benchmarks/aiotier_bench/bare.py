"""The bare promotion protocol: what ``memory_promote``'s batch costs with only the state that
any engine answering the SPEC's way must keep, and nothing else.

:class:`BareEngine` does what ``lookup_prefix`` + ``wait`` + ``end_step`` of an anonymous
caller do in ``memory_promote``, against the same :class:`~aiotier.MemoryTier` through its
public API: the primary's index, slot owners, states, pins, clean flags, lengths and LRU order;
slots reserved synchronously (a second lookup sees the key in flight); a tier lookup and a
promotion read, each an awaited call with a timer bounding it; the read as an asyncio task
straight into the arena; a waiter's future with its own timer; RETRY pins of the caller held
until the step boundary; evicted blocks checked clean and still in the tier (write-back's
question); per-step counters and delay samples handed over at ``end_step``.

It leaves out all the rest the engine does: request contexts, key checks, the promotion share,
coherence with writes in flight, admission, circuit breakers, the lock for other threads,
failures of any kind (it raises instead), OpenTelemetry. So its figure bounds what a Python
engine over this asyncio loop can reach on the machine that runs it: a ceiling measured in the
same run, as ``same_work_all_cpus`` is for SSD promotion.

``inline=True`` makes the design choice the engine makes for a tier whose calls never suspend
(a ``MemoryTier``): the lookup is called at once, in ``lookup_prefix``, and the read in a loop
callback right after it, or in ``wait`` if a caller waits first, with no timer or task (nothing
can time out in a call that returns before anything else runs). That is the ceiling of an
engine built that way.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Coroutine, Sequence
from typing import TypeVar

from aiotier import LookupResult, MemoryTier

__all__ = ["BareEngine"]

_PROMOTING, _READY = 2, 3
_TIMEOUT = 5.0
_now = time.perf_counter
_T = TypeVar("_T")


class _Batch:
    __slots__ = ("keys", "slots", "started", "waiters")

    def __init__(self, keys: list[bytes], slots: list[int], started: float) -> None:
        self.keys = keys
        self.slots = slots
        self.started = started
        self.waiters: list[asyncio.Future[None]] = []


class BareEngine:
    """A primary of ``num_blocks`` slots of ``block_size`` bytes over one memory tier."""

    def __init__(
        self, num_blocks: int, block_size: int, tier: MemoryTier, *, inline: bool = False
    ) -> None:
        self._tier = tier
        self._inline = inline
        self._bs = block_size
        self._index: dict[bytes, int] = {}
        self._owners: list[bytes | None] = [None] * num_blocks
        self._state = [0] * num_blocks
        self._pins = [0] * num_blocks
        self._clean = [0] * num_blocks
        self._lengths = [0] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._view = memoryview(bytearray(num_blocks * block_size))
        self._flying: dict[bytes, _Batch] = {}
        self._held: list[list[int]] = []  # RETRY pins of this step, released at its boundary
        self._deferred: list[float] = []  # deferral starts of this step's lookups
        self._counts: Counter[tuple[str, ...]] = Counter()
        self._samples: list[tuple[str, float]] = []
        self.totals: Counter[tuple[str, ...]] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._queued: list[_Batch] = []  # inline: batches whose read has not run yet
        self._handle: asyncio.Handle | None = None  # inline: the loop callback reading them

    async def lookup_prefix(self, keys: list[bytes]) -> int | None:
        """None when the promotion of every key started (the only case the bench makes)."""
        index = self._index
        if any(k in index for k in keys):
            raise NotImplementedError("the bare protocol promotes keys the primary lacks")
        started = _now()
        call = self._tier.lookup_many(keys)
        answers = await (call if self._inline else _bounded(call))
        if answers.count(LookupResult.HIT) != len(keys):
            raise NotImplementedError("the bare protocol promotes keys the tier has")
        counts = self._counts
        counts[("lookups", "primary", "miss")] += len(keys)
        counts[("lookups", self._tier.name, "hit")] += len(keys)
        slots = self._allocate(keys)
        pins = self._pins
        for s in slots:
            pins[s] += 2  # the read's pin and the caller's RETRY pin
        self._held.append(slots)
        now = _now()
        batch = _Batch(keys, slots, now)
        self._flying.update(dict.fromkeys(keys, batch))
        self._deferred.append(now)
        self._samples.append(("sync_delay", now - started))
        if self._inline:
            self._queued.append(batch)
            if self._handle is None:
                self._handle = asyncio.get_running_loop().call_soon(self._read_queued)
            return None
        task = asyncio.get_running_loop().create_task(self._promote(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return None

    def _allocate(self, keys: list[bytes]) -> list[int]:
        free, index, owners, state = self._free, self._index, self._owners, self._state
        need = len(keys) - len(free)
        if need > 0:
            pins, victims = self._pins, []
            for s in self._lru:
                if state[s] == _READY and not pins[s]:
                    victims.append(s)
                    if len(victims) == need:
                        break
            if len(victims) < need:
                raise NotImplementedError("the bare protocol never runs out of slots")
            lru, clean, held = self._lru, self._clean, self._tier.contains_hint
            for s in victims:
                del lru[s]
                k = owners[s]
                assert k is not None
                if not clean[s] or not held(k):
                    raise NotImplementedError("the bare protocol demotes nothing")
                del index[k]
            self._counts[("evictions", "primary")] += len(victims)
            free += victims
        slots = free[-len(keys) :]
        slots.reverse()
        del free[-len(keys) :]
        index.update(zip(keys, slots, strict=True))
        for k, s in zip(keys, slots, strict=True):
            owners[s] = k
            state[s] = _PROMOTING
        self._lru.update(dict.fromkeys(slots))
        return slots

    async def _promote(self, batch: _Batch) -> None:
        view, bs = self._view, self._bs
        views = [view[s * bs : s * bs + bs] for s in batch.slots]
        call = self._tier.read_many_into(batch.keys, views)
        lengths = await (call if self._inline else _bounded(call))
        state, clean, pins, out = self._state, self._clean, self._pins, self._lengths
        read = 0
        for s, n in zip(batch.slots, lengths, strict=True):
            if not isinstance(n, int) or n < 0:
                raise NotImplementedError("the bare protocol reads every block")
            state[s] = _READY
            clean[s] = 1
            pins[s] -= 1
            out[s] = n
            read += n
        flying = self._flying
        for k in batch.keys:
            del flying[k]
        name = self._tier.name
        self._counts[("promotions", name, "ok")] += len(lengths)
        self._counts[("read_bytes", name)] += read
        self._samples.append(("promotion_duration", _now() - batch.started))
        for fut in batch.waiters:
            if not fut.done():
                fut.set_result(None)

    def _read_queued(self) -> None:
        """Inline: read the queued batches (each call returns before anything else runs)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        queued, self._queued = self._queued, []
        for batch in queued:
            _drive(self._promote(batch))

    async def wait(self, keys: Sequence[bytes]) -> None:
        """Until the first key's promotion (the batch of all of them) settled. Inline: the
        reads still queued run now, as the engine runs them for a caller about to wait."""
        if self._handle is not None:
            self._read_queued()
        batch = self._flying.get(keys[0])
        if batch is None:
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        batch.waiters.append(fut)
        timer = loop.call_later(_TIMEOUT, fut.cancel)
        try:
            await fut
        finally:
            timer.cancel()

    def end_step(self) -> None:
        now = _now()
        pins = self._pins
        for slots in self._held:
            for s in slots:
                pins[s] -= 1
        self._held = []
        self._samples.extend(("async_delay", now - t) for t in self._deferred)
        self._deferred = []
        self.totals.update(self._counts)
        self._counts = Counter()
        self._samples = []


def _drive(call: Coroutine[object, object, None]) -> None:
    """Run ``call``, a coroutine that never suspends, to its end."""
    try:
        call.send(None)
    except StopIteration:
        return
    raise RuntimeError("the bare protocol's inline read suspended")


async def _bounded(call: Awaitable[_T]) -> _T:
    """Await ``call`` with a timer cancelling it past the timeout, as every tier call is."""
    task = asyncio.current_task()
    assert task is not None
    timer = asyncio.get_running_loop().call_later(_TIMEOUT, task.cancel)
    try:
        return await call
    finally:
        timer.cancel()
