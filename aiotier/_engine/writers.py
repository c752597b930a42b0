"""The writer tasks: :data:`~aiotier._core.writeback.IN_FLIGHT` per secondary tier, applying
its queued writes and removes in order per key.

The queues and every decision about them live in :class:`~aiotier._core.writeback.WriteQueues`;
a writer only takes the next batch (one that shares no key with the batch another writer of the
tier applies), awaits the tier (bounded by ``io_timeout``), and hands the outcome back. Two
writers per tier keep the tier busy while the loop finishes a batch: under a burst of puts a
batch's end reaches its writer a loop turn or two after the tier finished it, and a turn is a
whole step of puts. ``drain`` awaits the moment every queue is empty and nothing is being
applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TypeVar, cast

from .._core.engine_core import EngineCore
from .._core.values import MANIFEST_MAGIC, PIECE_KEY_PREFIX, block_expiry
from .._core.writeback import IN_FLIGHT, OpKind, WriteOp
from ..errors import TieringError
from ..tiers.base import BlockMeta, SecondaryTier
from .breakers import Breakers, answered
from .threads import EngineLock

__all__ = ["Writers", "block_metas", "bounded_call"]

_T = TypeVar("_T")


async def bounded_call(
    tier: SecondaryTier,
    call: Callable[[], Awaitable[list[_T]]],
    n: int,
    timeout: float,
    breakers: Breakers,
    ti: int,
    op: str,
) -> list[_T]:
    """One batched tier call within ``timeout``, through the tier's circuit breaker; a fault,
    or a call the open circuit refused, becomes ``n`` per-key errors."""
    if not breakers.allow(ti):
        return [cast(_T, breakers.refused(ti, op))] * n
    ok: bool | None = None
    try:
        async with asyncio.timeout(timeout):
            answers = await call()
        if len(answers) != n:
            raise TieringError(f"tier {tier.name!r} answered {len(answers)} of {n}")
        ok = answered(answers)
        return answers
    except Exception as exc:
        ok = False
        return [cast(_T, exc)] * n
    finally:
        breakers.record(ti, ok)


_NO_META = BlockMeta()
_HEAD = len(MANIFEST_MAGIC)


def block_metas(items: Sequence[tuple[bytes, bytes | memoryview]]) -> list[BlockMeta] | None:
    """Each block's :class:`BlockMeta`, from what its bytes (or a piece's key) carry; None when
    none has any (most batches: every block of the scheduler protocol)."""
    metas: list[BlockMeta] | None = None
    for i, (k, data) in enumerate(items):
        if data[:_HEAD] != MANIFEST_MAGIC and not k.startswith(PIECE_KEY_PREFIX):
            continue  # block_expiry's own first look, without a call per block
        expires_at = block_expiry(k, data)
        if expires_at is not None:
            if metas is None:
                metas = [_NO_META] * len(items)
            metas[i] = BlockMeta(expires_at=expires_at)
    return metas


class Writers:
    """Writer tasks over the core's write queues, and the events that wake and drain them.

    The core calls :meth:`notify` when a tier's queue was empty, which wakes one of the tier's
    idle writers (the other stays asleep: one op needs one writer); a writer done with a batch
    looks for the next by itself.
    """

    def __init__(
        self,
        core: EngineCore,
        tiers: Sequence[SecondaryTier],
        io_timeout: float,
        guard: EngineLock,
        breakers: Breakers,
    ) -> None:
        self._core = core
        self._guard = guard
        self._breakers = breakers
        self._tiers = tuple(tiers)
        self._io_timeout = io_timeout
        # per tier, the futures of its writers waiting for work, oldest first
        self._idle_writers: list[list[asyncio.Future[None]]] = []
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []
        self._running = asyncio.Event()  # cleared while paused: no new batch starts
        self._running.set()
        self._pauses = 0  # pause() calls not resumed yet
        self._applying = 0  # batches being applied now
        self._applied = asyncio.Event()  # set when the last batch being applied finishes

    def notify(self, ti: int) -> None:
        """An op was queued for tier ``ti`` (the core calls this, maybe from another thread)."""
        self._guard.call(self._wake, ti)

    def _wake(self, ti: int) -> None:
        self._idle.clear()
        if self._idle_writers:
            idle = self._idle_writers[ti]
            while idle:
                fut = idle.pop(0)
                if not fut.done():
                    fut.set_result(None)
                    return

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for ti, t in enumerate(self._tiers):
            self._idle_writers.append([])
            for _ in range(IN_FLIGHT):
                task = loop.create_task(self._run(ti), name=f"aiotier-writer-{t.name}")
                self._tasks.append(task)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def pause(self, timeout: float) -> None:
        """Start no new batch, and return once none is being applied (or ``timeout`` passed:
        ``TimeoutError``, still paused). Each call is undone by one :meth:`resume`."""
        self._pauses += 1
        self._running.clear()
        async with asyncio.timeout(timeout):
            while self._applying:
                self._applied.clear()
                await self._applied.wait()

    def resume(self) -> None:
        self._pauses -= 1
        if not self._pauses:
            self._running.set()

    def done(self) -> bool:
        return all(t.done() for t in self._tasks)

    async def drain(self, timeout: float, *, discard: bool) -> None:
        """Await every queued write and remove; past ``timeout`` drop them (and count them)
        when ``discard``, else raise ``TimeoutError`` leaving them queued."""
        writes, lock = self._core.writes, self._guard.lock
        try:
            async with asyncio.timeout(timeout):
                while True:
                    with lock:
                        if writes.idle():
                            break
                    self._idle.clear()
                    await self._idle.wait()
        except TimeoutError:
            with lock:
                queued = len(writes)
                if discard:
                    writes.drop_all()
            if not discard:
                raise TimeoutError(
                    f"{queued} tier operations still queued after {timeout}s"
                ) from None

    async def _run(self, ti: int) -> None:
        """Apply tier ``ti``'s queued writes and removes, batching neighbours; beside the tier's
        other writer, on other keys."""
        writes, lock = self._core.writes, self._guard.lock
        idle_writers, loop = self._idle_writers[ti], asyncio.get_running_loop()
        while True:
            if not self._running.is_set():
                await self._running.wait()
            with lock:
                batch = writes.next_batch(ti)
                idle = not batch and writes.idle()
            if not batch:
                if idle:
                    self._idle.set()
                woken = loop.create_future()
                idle_writers.append(woken)
                await woken
                continue
            self._applying += 1
            released = False  # until the tier is known to hold none of the batch's bytes
            try:
                if batch[0].kind is OpKind.WRITE:
                    released = await self._write(ti, batch)
                else:
                    await self._remove(ti, batch)
            finally:
                with lock:
                    writes.finished(ti, batch, released=released)
                self._applying -= 1
                if not self._applying:
                    self._applied.set()

    async def _write(self, ti: int, batch: list[WriteOp]) -> bool:
        """Write ``batch`` to tier ``ti``; whether the tier holds none of its bytes now (its
        call ended, returning or raising, or was never made: a call cut short by the timeout
        may still be using them, on a thread)."""
        tier = self._tiers[ti]
        items = [(op.key, op.data or b"") for op in batch]
        meta = block_metas(items)  # the blocks' expiry, carried down with every write
        called = returned = False

        async def call() -> list[Exception | None]:
            nonlocal called, returned
            called = True
            try:
                answers = await (
                    tier.write_many(items) if meta is None else tier.write_many(items, meta)
                )
            except asyncio.CancelledError:
                raise  # cut short by the timeout: a thread may still be reading the buffers
            except BaseException:
                returned = True  # ended on its own, by raising
                raise
            returned = True
            return answers

        errors = await bounded_call(
            tier, call, len(items), self._io_timeout, self._breakers, ti, "write"
        )
        evicted = tier.take_evictions()
        with self._guard.lock:
            self._core.writes.writes_applied(ti, batch, errors, evicted)
        return returned or not called

    async def _remove(self, ti: int, batch: list[WriteOp]) -> None:
        tier = self._tiers[ti]
        keys = [op.key for op in batch]
        answers = await bounded_call(
            tier, partial(tier.remove_many, keys), len(keys), self._io_timeout,
            self._breakers, ti, "remove",
        )  # fmt: skip
        with self._guard.lock:
            self._core.writes.removes_applied(ti, batch, answers)
