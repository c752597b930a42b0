"""The await side of lookups: asking the tiers, running promotion reads, waiting for keys.

Each function here is a thin loop around the core: the core says which keys to ask a tier about
and which reads to start; this module awaits the tiers (each call bounded) and hands every
answer back to the core, which settles it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import Any, TypeVar, overload

from .._core.engine_core import EngineCore
from .._core.inflight import PromotionBatch
from .._core.promotion import Outcome
from .._core.requests import RequestState
from .._core.scan import LookupScan
from .._types import LookupResult
from ..errors import TieringError
from ..tiers._ssd.reading import SSDReads
from ..tiers.base import SecondaryTier
from ..tiers.memory import MemoryTier
from .breakers import Breakers, answered
from .threads import EngineLock

__all__ = ["TierReads"]

_now = time.perf_counter
_T = TypeVar("_T")


class TierReads:
    """Tier lookups and promotion reads for one engine; owns the promotion tasks.

    Every promotion runs on the loop after the lookup that started it has answered RETRY, so
    the key stays in flight until then (``aclose`` cancels it, concurrent lookups join it). A
    tier whose reads never suspend (a :class:`~aiotier.MemoryTier`) is read by a loop callback
    rather than a task: the read returns before anything else runs, so it needs no task, no
    timer to bound it and no waiter. An :class:`~aiotier.SSDTier` is read by a loop callback
    too, and its read ends by a callback from the tier's last thread op (no task, no future
    to wake it: a loop turn fewer each way); the timer still bounds it. A caller that waits
    for keys starts the reads queued for callbacks at once (:meth:`wait`).
    """

    def __init__(
        self,
        core: EngineCore,
        tiers: Sequence[SecondaryTier],
        promotion_timeout: float,
        guard: EngineLock,
        breakers: Breakers,
    ) -> None:
        self._core = core
        self._guard = guard
        self._breakers = breakers
        self._tiers = tuple(tiers)
        self._timeout = promotion_timeout
        #: promotion tasks not finished yet
        self.tasks: set[asyncio.Task[None]] = set()
        #: promotion reads ending by callback that have not stopped yet
        self.reads: set[_Read] = set()
        # set once ``reads`` empties, for a close that waits for them
        self._reads_stopped: asyncio.Future[None] | None = None
        # per tier, batches whose read has not started: they join the next one
        self._queued: dict[int, list[PromotionBatch]] = {}
        #: per tier, whether its lookups and reads never suspend (called at once, unbounded)
        self._inline = tuple(map(_never_suspends, self._tiers))
        # per tier, whether its lookups never suspend (answered from memory: no timer needed)
        self._inline_lookups = tuple(map(_lookups_never_suspend, self._tiers))
        # per tier, whether its reads can end by callback (an SSDTier's own reads)
        self._by_callback = tuple(map(_reads_by_callback, self._tiers))
        # per tier read with no task, the loop callback that reads its queued batches
        self._callbacks: dict[int, asyncio.Handle] = {}

    async def scan(
        self,
        ks: list[bytes],
        rs: RequestState | None,
        exclude: int,
        *,
        prefix: bool,
        hold: bool = True,
    ) -> LookupScan:
        """The lookup flow past the primary-hit fast paths (``lookup``, ``lookup_prefix``,
        ``prefetch`` and ``get``): primary states, then the tiers, then promotions started.
        ``hold=False`` pins nothing for the caller (``get`` copies the bytes out at once)."""
        promotions, lock = self._core.promotions, self._guard.lock
        with lock:
            scan = promotions.begin(ks, rs, exclude, prefix=prefix, hold=hold)
            at_once = not scan.need or not self._tiers  # no tier to ask: one transition
            if at_once:
                batches = promotions.finish(scan, at_once=True)
            elif rs is not None:
                rs.busy += 1  # end_step must not forget a request whose lookup is suspended
        if not at_once:
            started = _now()
            try:
                await self.consult(scan)
            finally:
                if rs is not None:
                    with lock:
                        rs.busy -= 1
            elapsed = _now() - started
            with lock:
                batches = promotions.finish(scan, elapsed)
        self.start(batches)
        return scan

    def cancel_tasks(self) -> None:
        """Cancel every promotion task (each settles its batches as it ends), once: a second
        cancel would cut short a tier winding down from the first. Reads queued for a loop
        callback never start."""
        for handle in self._callbacks.values():
            handle.cancel()
        self._callbacks.clear()
        for task in self.tasks:
            if not task.cancelling():
                task.cancel()
        for read in list(self.reads):  # a read may end as it is stopped
            if not read.cancelled:
                read.cancelled = True
                read.stop()

    async def cancel(self, timeout: float) -> None:
        """Cancel every promotion read and give them ``timeout`` to finish."""
        waits: list[asyncio.Future[Any]] = list(self.tasks)
        self.cancel_tasks()
        if self.reads:
            if self._reads_stopped is None:
                self._reads_stopped = asyncio.get_running_loop().create_future()
            waits.append(self._reads_stopped)
        if waits:
            await asyncio.wait(waits, timeout=timeout)
        self._queued.clear()  # reads that never started: the core counts them cancelled

    async def consult(self, scan: LookupScan) -> None:
        """Ask each tier, in order, about the keys nobody above it had (a tier whose circuit
        is open is not asked: its answer is a fault, as if it had failed)."""
        asks, lock = self._core.promotions.asks(scan, len(self._tiers)), self._guard.lock
        try:
            with lock:
                ti, keys = next(asks)
            while True:
                answers = await self._lookup(ti, keys)
                with lock:
                    ti, keys = asks.send(answers)
        except StopIteration:
            pass

    async def _lookup(self, ti: int, keys: list[bytes]) -> list[LookupResult] | None:
        """Tier ``ti``'s answers for ``keys`` through its breaker; None on a fault."""
        if not self._breakers.allow(ti):
            return None
        tier = self._tiers[ti]
        ok: bool | None = None
        try:
            if self._inline_lookups[ti]:  # returns before anything else runs: no timeout
                answers = _run_now(tier.lookup_many(keys))
            else:
                async with asyncio.timeout(self._timeout):
                    answers = await tier.lookup_many(keys)
            if len(answers) != len(keys):
                raise TieringError(
                    f"tier {tier.name!r} answered {len(answers)} lookups for {len(keys)} keys"
                )
            ok = True
            return answers
        except Exception:
            ok = False
            return None
        finally:
            self._breakers.record(ti, ok)

    def start(self, batches: list[PromotionBatch]) -> None:
        """Read ``batches``: each joins the read of its tier that has not started yet, if any
        (lookups of one scheduler step make one read per tier), else starts one: a task, or a
        loop callback for a tier whose reads never suspend."""
        for batch in batches:
            ti = batch.tier
            queued = self._queued.get(ti)
            if queued is not None:
                queued.append(batch)
                continue
            self._queued[ti] = [batch]
            if self._inline[ti] or self._by_callback[ti]:
                self._callbacks[ti] = asyncio.get_running_loop().call_soon(self._read_queued, ti)
            else:
                self._start_task(ti)

    def _start_task(
        self, ti: int, batches: list[PromotionBatch] | None = None, *, allowed: bool = False
    ) -> None:
        """A promotion task reading tier ``ti``: ``batches``, or those queued when it runs
        (``allowed``: the breaker let this read through already)."""
        name = f"aiotier-promote-{self._tiers[ti].name}"
        read = self._promote(ti, batches, allowed=allowed)
        task = asyncio.get_running_loop().create_task(read, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _read_queued(self, ti: int) -> None:
        """The loop callback reading the batches queued for tier ``ti`` with no task: at once
        (reads that never suspend), or started to end by callback (an SSD tier)."""
        del self._callbacks[ti]
        batches = self._queued.pop(ti)
        if not self._breakers.allow(ti):  # the circuit is open: the read fails unattempted
            self._completed(batches, Outcome.ERROR)
        elif self._inline[ti]:
            self._read_now(ti, batches)
        else:
            self._read_by_callback(ti, batches)

    def _read_queued_now(self) -> None:
        """Start the reads queued for a loop callback now, not a loop turn later: the caller
        is about to wait for their keys. A read that never suspends is then done before the
        caller awaits anything (no future, no timer), and an SSD read's threads start the turn
        sooner."""
        for ti in list(self._callbacks):
            self._callbacks[ti].cancel()
            self._read_queued(ti)

    def _read_now(self, ti: int, batches: list[PromotionBatch]) -> None:
        """Read ``batches`` from tier ``ti``, whose reads never suspend (they copy from this
        process's memory): the call returns before anything else runs."""
        outcome, lengths, ok = Outcome.ERROR, [], False
        try:
            lengths = _run_now(self._tiers[ti].read_many_into(*self._targets(batches)))
            outcome, ok = Outcome.OK, answered(lengths)
        except Exception:
            pass
        self._completed(batches, outcome, lengths)
        self._breakers.record(ti, ok)

    def _read_by_callback(self, ti: int, batches: list[PromotionBatch]) -> None:
        """Start the read of ``batches`` from tier ``ti`` (an SSD tier), which ends by
        :meth:`_read_ended`; a read the tier cannot do that way goes to a task."""
        read = _Read(ti, batches)
        tier = self._tiers[ti]
        assert isinstance(tier, SSDReads)
        self.reads.add(read)
        keys, slots = _keys_and_slots(batches)
        try:
            views = _SlotViews(self._core.arena.slot_view, slots)
            stop = tier.start_reads(keys, views, partial(self._read_ended, read))
        except Exception:
            self._read_ended(read, None, Outcome.ERROR)
            return
        if stop is None:  # a key on its way down: read by read_many_into
            self.reads.discard(read)
            self._start_task(ti, batches, allowed=True)
            return
        read.stop = stop
        if not read.finished:
            read.timer = asyncio.get_running_loop().call_later(
                self._timeout, self._give_up, read
            )

    def _read_ended(
        self,
        read: _Read,
        lengths: list[int | Exception] | None,
        outcome: Outcome = Outcome.OK,
    ) -> None:
        """A read started by :meth:`_read_by_callback` stopped: settle it (unless the timer
        gave it up: then only its slots are let go). ``lengths`` None: it was withdrawn."""
        read.finished = True
        self.reads.discard(read)
        if read.timer is not None:
            read.timer.cancel()
        ok: bool | None = False
        if read.cancelled:
            outcome, ok = Outcome.CANCELLED, None
        elif lengths is None:
            outcome = Outcome.ERROR  # the start raised, or a give-up withdrew the rest
        elif outcome is Outcome.OK:
            ok = answered(lengths)
        try:
            if read.given_up:
                with self._guard.lock:
                    self._core.promotions.release_read_pins(read.held)
            else:
                self._completed(read.batches, outcome, lengths or ())
                self._breakers.record(read.tier, ok)
        finally:
            if not self.reads and self._reads_stopped is not None:
                if not self._reads_stopped.done():
                    self._reads_stopped.set_result(None)
                self._reads_stopped = None

    def _targets(self, batches: list[PromotionBatch]) -> tuple[list[bytes], list[memoryview]]:
        """The keys of ``batches`` and views of the slots reserved for them (the slots stay
        the read's until it completes: no lock needed)."""
        keys, slots = _keys_and_slots(batches)
        return keys, self._core.arena.slot_views(slots)

    def _completed(
        self,
        batches: list[PromotionBatch],
        outcome: Outcome,
        lengths: Sequence[int | Exception] = (),
    ) -> None:
        with self._guard.lock:
            self._core.promotions.completed(batches, outcome, lengths)

    async def _promote(
        self, ti: int, batches: list[PromotionBatch] | None = None, *, allowed: bool = False
    ) -> None:
        """Read the batches queued for tier ``ti`` straight into their reserved slots.

        This task is the read. Past ``promotion_timeout`` a timer gives the promotion up at
        once (its keys turn into MISS) and cancels the task; the slots of those keys stay
        pinned until the task has really ended, since the tier may still write into them. A
        read that returns after ``aclose`` cancelled it is counted cancelled all the same.
        """
        if batches is None:
            batches = self._queued.pop(ti)
        if not (allowed or self._breakers.allow(ti)):  # the circuit is open: fails unattempted
            self._completed(batches, Outcome.ERROR)
            return
        tier = self._tiers[ti]
        keys, views = self._targets(batches)
        read = _Read(ti, batches)
        task = asyncio.current_task()
        assert task is not None
        read.task, read.stop = task, task.cancel
        timer = asyncio.get_running_loop().call_later(self._timeout, self._give_up, read)
        outcome = Outcome.OK
        lengths: list[int | Exception] = []
        ok: bool | None = False
        try:
            lengths = await tier.read_many_into(keys, views)
            ok = answered(lengths)
        except asyncio.CancelledError:
            outcome, ok = Outcome.CANCELLED, None
            if not read.given_up:
                raise
        except Exception:
            outcome = Outcome.ERROR
        finally:
            read.finished = True
            timer.cancel()
            if outcome is Outcome.OK and not read.given_up and task.cancelling():
                outcome, ok = Outcome.CANCELLED, None  # the tier swallowed aclose's cancel
            if read.given_up:  # settled by the timer: the read has stopped now
                with self._guard.lock:
                    self._core.promotions.release_read_pins(read.held)
            else:
                self._completed(batches, outcome, lengths)
                self._breakers.record(ti, ok)

    def _give_up(self, read: _Read) -> None:
        """``promotion_timeout`` passed: give the read up one loop turn later, unless it ends
        first (after a busy stretch of the loop, a read that ended in time has its wake-up
        queued in the turn that runs this timer)."""
        asyncio.get_running_loop().call_soon(self._give_up_now, read)

    def _give_up_now(self, read: _Read) -> None:
        """Every key of the read is a MISS now (unless it ended, or ``aclose`` cancelled it:
        the read then settles as cancelled)."""
        if read.finished or read.cancelled or (read.task is not None and read.task.cancelling()):
            return
        read.given_up = True
        self._breakers.record(read.tier, False)
        with self._guard.lock:
            read.held = self._core.promotions.completed(
                read.batches, Outcome.TIMEOUT, read_stopped=False
            )
        read.stop()

    async def wait(self, ks: Sequence[bytes], timeout: float | None) -> list[LookupResult]:
        """Await until none of ``ks`` is in flight; their settled HIT or MISS."""
        core, lock = self._core, self._guard.lock
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        table, in_flight = core.table, core.answers.in_flight
        if self._callbacks:
            self._read_queued_now()
        with lock:
            if table.all_ready(ks):
                return [LookupResult.HIT] * len(ks)
        for k in ks:
            with lock:
                if in_flight(k) is None:
                    continue  # settled: no need to ask further
            if await self._wait_one(k, deadline, timeout):
                with lock:
                    if table.all_ready(ks):
                        return [LookupResult.HIT] * len(ks)  # the others landed meanwhile too
        with lock:
            return core.answers.settled(ks)

    async def _wait_one(self, k: bytes, deadline: float | None, timeout: float | None) -> bool:
        """Await until ``k`` is not in flight; whether that took any waiting."""
        core, lock = self._core, self._guard.lock
        loop = asyncio.get_running_loop()
        waited = False
        while not core.closed:
            fut: asyncio.Future[None] = loop.create_future()
            waiter = partial(self._guard.call, _wake, fut)  # may be settled from another thread
            with lock:  # asked and registered at once: a settle in between would wake no one
                got = core.answers.in_flight(k)
                if got is not None:
                    core.inflight.add_waiter(k, waiter)
            if got is None:
                break
            try:
                limit = got[1]
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        raise TimeoutError(f"block {k[:64]!r} still in flight after {timeout}s")
                    limit = min(limit, left)
                waited = True
                # woken by the settle, or at the limit: then still in flight (asked again), or
                # a store's RETRY window ran out
                timer = loop.call_later(limit, _wake, fut)
                try:
                    await fut
                finally:
                    timer.cancel()
            finally:
                with lock:
                    core.inflight.remove_waiter(k, waiter)
        return waited


class _Read:
    """One promotion read in flight: what the timer settled if it gave up first."""

    __slots__ = ("batches", "cancelled", "finished", "given_up", "held", "stop", "task",
                 "tier", "timer")  # fmt: skip

    def __init__(self, tier: int, batches: list[PromotionBatch]) -> None:
        self.tier = tier
        self.batches = batches
        self.finished = False  # the tier's call returned, raised or was cancelled
        self.given_up = False
        self.held: list[int] = []  # slots still pinned by the read the timer gave up on
        #: stops the read: cancels its task, or withdraws what no thread has started
        self.stop: Callable[[], object] = _nothing
        self.task: asyncio.Task[None] | None = None  # a read without one ends by callback
        self.cancelled = False  # by aclose (a read without a task)
        self.timer: asyncio.TimerHandle | None = None


class _SlotViews(Sequence[memoryview]):
    """Views of the slots reserved for a read, each made when the tier asks for it: an SSD
    tier's threads do, so the loop makes no view per block (the slots stay the read's until
    it stops: no lock needed)."""

    __slots__ = ("_slots", "_view")

    def __init__(self, view: Callable[[int], memoryview], slots: list[int]) -> None:
        self._view = view
        self._slots = slots

    def __len__(self) -> int:
        return len(self._slots)

    @overload
    def __getitem__(self, i: int) -> memoryview: ...
    @overload
    def __getitem__(self, i: slice) -> list[memoryview]: ...
    def __getitem__(self, i: int | slice) -> memoryview | list[memoryview]:
        if isinstance(i, slice):
            return list(map(self._view, self._slots[i]))
        return self._view(self._slots[i])


def _keys_and_slots(batches: list[PromotionBatch]) -> tuple[list[bytes], list[int]]:
    """The keys of ``batches`` and the slots reserved for them, in order."""
    if len(batches) == 1:
        return batches[0].keys, batches[0].slots
    return [k for b in batches for k in b.keys], [s for b in batches for s in b.slots]


def _nothing() -> None:
    """A read with nothing to stop yet."""


def _reads_by_callback(tier: SecondaryTier) -> bool:
    """An :class:`~aiotier.SSDTier` with its own reads (a subclass may read otherwise)."""
    own: object = type(tier).read_many_into
    return isinstance(tier, SSDReads) and own is SSDReads.read_many_into


def _never_suspends(tier: SecondaryTier) -> bool:
    """A :class:`~aiotier.MemoryTier` with its own lookups and reads (a subclass may await in
    its own)."""
    own: object = type(tier).read_many_into
    return (
        isinstance(tier, MemoryTier)
        and own is MemoryTier.read_many_into
        and _lookups_never_suspend(tier)
    )


def _lookups_never_suspend(tier: SecondaryTier) -> bool:
    """A tier whose ``lookup_many`` is one that answers from its index in memory (a
    :class:`~aiotier.MemoryTier`'s or an :class:`~aiotier.SSDTier`'s, not overridden)."""
    own: object = type(tier).lookup_many
    return (isinstance(tier, MemoryTier) and own is MemoryTier.lookup_many) or (
        isinstance(tier, SSDReads) and own is SSDReads.lookup_many
    )


def _run_now(call: Coroutine[Any, Any, _T]) -> _T:
    """What ``call``, a tier call that never suspends, returns (or raises); one that suspends
    after all is closed, never resumed, and raises ``TieringError``."""
    try:
        call.send(None)
    except StopIteration as returned:
        result: _T = returned.value
        return result
    call.close()
    raise TieringError("a tier call expected never to suspend suspended")


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

