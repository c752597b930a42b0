"""The SSD tier's thread plumbing: disk ops queued on the loop, run on threads in batches.

aiosqlite's shape, sized for many small ops: callers queue ops (:class:`DiskOp`) and await a
future; ops are packed into *hops* (one function call on one thread, many ops), at most
``threads`` of them running at once; each hop's thread posts its outcome back to the loop in
one callback, as aiosqlite's thread does. A hop costs 20-65 µs of loop and thread overhead
whatever it carries, so ops queued together share hops. Opening and closing work goes through
``aiofiles.os.wrap`` on the same threads (:meth:`HopRunner.call`).

The runner knows nothing of blocks, files or the tier's index: an op reads or writes caller
buffers on the thread (:meth:`DiskOp.start` / :meth:`~DiskOp.complete`) and applies its outcome
on the loop (:meth:`DiskOp.finish`). It serves any on-disk layout whose ops are that shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Final, TypeVar

import aiofiles.os

from ...errors import TierUnavailableError
from .syscalls import NowaitProbe

__all__ = ["CANCEL_GRACE", "HOP_MAX_BYTES", "HOP_MAX_OPS", "NEEDS_DISK", "DiskOp", "HopRunner"]

log = logging.getLogger("aiotier.ssd")

_T = TypeVar("_T")

#: Most ops and bytes one hop carries: enough ops to amortise the hop's fixed cost, few enough
#: that several hops run in parallel and a cancelled caller never waits long. The byte cap is
#: at least half of a 64-block batch of 1 MiB blocks, so that such a batch splits evenly over
#: two threads rather than into cap-sized hops that leave a short last hop running alone.
#: Measurements: docs/ssd.md ("Threads, hops and speed").
HOP_MAX_OPS: Final = 32
HOP_MAX_BYTES: Final = 64 << 20
#: How long a cancelled caller waits for a hop already touching its buffer before giving up,
#: and how long :meth:`HopRunner.drain` waits for the queue to empty.
CANCEL_GRACE: Final = 30.0


class _NeedsDisk:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEEDS_DISK"


#: Returned by :meth:`DiskOp.start` for an op that must wait for the disk: it is finished by
#: :meth:`DiskOp.complete` after the hop's other ops.
NEEDS_DISK: Final = _NeedsDisk()


class DiskOp:
    """One unit of disk work: :meth:`start` (and maybe :meth:`complete`) on a thread,
    :meth:`finish` on the loop.

    An op that reads waits for the disk only in :meth:`complete`: :meth:`start` takes what the
    page cache holds and returns :data:`NEEDS_DISK` for the rest, so one cold op never holds
    up the warm ones behind it, and the cold ones of a hop are advised together (the kernel
    fetches them at once, many I/Os in flight from one thread). Anything else does all its
    work in :meth:`start`.

    Subclasses carry what their work needs as plain data (paths, descriptors, offsets,
    buffers) and a callback for :meth:`finish`; never the object that queued them.
    """

    __slots__ = ("group", "index", "nbytes", "started", "withdrawn")

    #: May wait in the thread pool's own queue while every thread is busy (:class:`HopRunner`):
    #: for ops no caller withdraws (writes; a withdrawn op must still be in the runner's queue).
    chains = False

    def __init__(self, nbytes: int) -> None:
        self.group: _Group | None = None
        self.index = 0
        #: Bytes the op moves, for the hop's byte cap.
        self.nbytes = nbytes
        #: Handed to a thread: the op may touch the caller's buffers until it is settled.
        self.started = False
        #: Taken back by a cancelled caller before any thread saw it: skipped.
        self.withdrawn = False

    def start(self, nowait: NowaitProbe) -> Any:
        """On a thread: do the work, or as much as needs no disk wait (then :data:`NEEDS_DISK`).

        Return the outcome; an exception raised here is the outcome.
        """
        raise NotImplementedError

    def advise(self) -> None:
        """On a thread, before :meth:`complete`: tell the kernel what will be read."""

    def complete(self) -> Any:
        """On a thread, after the hop's other ops: finish what :meth:`start` left."""
        raise NotImplementedError

    def finish(self, outcome: Any) -> None:
        """On the loop: apply ``outcome`` (a value or an exception), then :meth:`settle`."""
        self.settle(outcome)

    def settle(self, outcome: Any) -> None:
        """Hand ``outcome`` to whoever awaits this op (its group)."""
        if self.group is not None:
            self.group.settle_one(self.index, outcome)


class _Group:
    """One future for a batch of ops: the event loop's cost of a batch must not grow with its
    ops (a future and a callback per block cost more than a warm block's read).

    The caller awaits :attr:`fut` itself (no shield: one loop iteration less per batch); a
    caller cancelled meanwhile cancels it, and then waits on :attr:`settled` instead.
    """

    __slots__ = ("done", "fut", "remaining", "results", "settled")

    def __init__(
        self,
        fut: asyncio.Future[None] | None,
        n: int,
        done: Callable[[list[Any]], None] | None = None,
    ) -> None:
        self.fut = fut
        #: Called with the outcomes when there is no future (:meth:`HopRunner.start_group`).
        self.done = done
        self.remaining = n
        self.results: list[Any] = [None] * n
        #: Made by a cancelled caller that must wait for the ops still on a thread.
        self.settled: asyncio.Future[None] | None = None

    def settle_one(self, index: int, outcome: Any) -> None:
        self.results[index] = outcome
        self.remaining -= 1
        if self.remaining <= 0:
            for fut in (self.fut, self.settled):
                if fut is not None and not fut.done():
                    fut.set_result(None)
            if self.done is not None:
                done, self.done = self.done, None
                done(self.results)


def run_ops(ops: list[DiskOp], nowait: NowaitProbe) -> list[Any]:
    """Body of one hop: every op in order, each failure kept in its own slot; the ops that
    need the disk last, advised together first.

    An op that finishes late sees exactly what an in-order run would have: what it reads is
    pinned by the descriptor :meth:`DiskOp.start` opened.
    """
    out: list[Any] = [None] * len(ops)
    cold: list[tuple[int, DiskOp]] = []
    for i, op in enumerate(ops):
        try:
            outcome = op.start(nowait)
        except Exception as exc:
            outcome = exc
        if outcome is NEEDS_DISK:
            cold.append((i, op))
        else:
            out[i] = outcome
    if len(cold) > 1:
        for _i, op in cold:
            op.advise()
    for i, op in cold:
        try:
            out[i] = op.complete()
        except Exception as exc:
            out[i] = exc
    return out


class HopRunner:
    """A queue of :class:`DiskOp` run on ``threads`` threads, in hops of at most ``max_ops``
    ops and ``max_bytes`` bytes.

    Ops queued in one loop iteration are split evenly over the free threads, so a batch never
    leaves one thread with a short last hop while the others idle; what does not fit waits in
    the queue, where later ops can still join it. A batch the tier already split per thread
    (:meth:`submit_group`) starts at once. Created in a running loop; used from it only.

    A hop's end reaches the loop as one callback posted by its thread, which settles the ops
    and starts the next hop: a busy loop, one that turns only every few milliseconds, should
    need as few turns as possible per batch (a task and a future chain per hop cost three).
    Ops that :attr:`~DiskOp.chains` go further: while every thread is busy, one hop of them per
    thread waits in the pool's own queue, so a thread that ends a hop goes on to the next at
    once, neither waiting for the loop's next turn nor giving the GIL up to wait for work
    (under a burst of puts a turn is a whole step, and winning the GIL back from a busy loop
    can take longer still; ``docs/ssd.md``). An op queued after them (a read) waits for them
    too: at most one hop per thread more than before.

    For tests and tools, read :attr:`idle` and :attr:`nowait`; the rest is the tier's.
    """

    def __init__(
        self,
        threads: int,
        name: str,
        *,
        max_ops: int = HOP_MAX_OPS,
        max_bytes: int = HOP_MAX_BYTES,
        grace: float = CANCEL_GRACE,
    ) -> None:
        self.threads = threads
        self.name = name
        self.max_ops = max_ops
        self.max_bytes = max_bytes
        self.grace = grace
        #: Whether the file system serves ``RWF_NOWAIT`` reads (learnt on the threads).
        self.nowait = NowaitProbe()
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix=f"aiotier-{name}")
        # Every thread now, not when the pool first needs it: from Python 3.12 no thread may
        # start once the interpreter exits, when an engine left open is closed (and writes
        # its blocks down). Each waits until all have started, so none is reused early.
        started = threading.Barrier(threads, timeout=10)
        for _ in range(threads):
            self._executor.submit(started.wait)
        self._queue: deque[DiskOp] = deque()
        self._flush_scheduled = False
        self._hops = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def idle(self) -> bool:
        """No op queued or on a thread."""
        return self._idle.is_set()

    async def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(*args)`` on one of the threads, outside the queue (opening, closing)."""
        result: _T = await aiofiles.os.wrap(fn)(*args, executor=self._executor)
        return result

    async def drain(self) -> bool:
        """Wait until no op is queued or running, at most :attr:`grace` seconds (before closing:
        a hung disk must not hang the caller); False, logged, if ops still run then."""
        if not self._idle.is_set():
            try:
                await asyncio.wait_for(self._idle.wait(), self.grace)
            except TimeoutError:
                log.error(
                    "ssd tier %r: disk work still running after %ss; closing anyway",
                    self.name,
                    self.grace,
                )
                return False
        return True

    def shutdown(self) -> None:
        """Release the threads once they are done (call after :meth:`drain`)."""
        self._executor.shutdown(wait=False)

    def enqueue(self, *ops: DiskOp) -> None:
        """Queue ``ops`` for the next flush; their :meth:`~DiskOp.finish` reports the outcome."""
        self._queue.extend(ops)
        self._idle.clear()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    async def submit(self, op: DiskOp, *, withdrawable: bool) -> Any:
        """Queue ``op`` and await its outcome (an exception is raised); see :meth:`submit_group`."""
        (outcome,) = await self.submit_group([op], withdrawable=withdrawable)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def submit_group(self, ops: Sequence[DiskOp], *, withdrawable: bool) -> list[Any]:
        """Run ``ops`` (started at once, on the free threads) under one future; their outcomes
        in order.

        A cancelled caller whose ops are already on a thread waits (up to :attr:`grace`) for
        the thread to finish before re-raising: an op may be writing into, or reading from, the
        caller's buffers, and the caller may reuse them as soon as we return. ``withdrawable``
        ops still queued are dropped at once instead.
        """
        fut = self._loop.create_future()
        group = self._start(ops, _Group(fut, len(ops)))
        try:
            await fut
        except asyncio.CancelledError:
            if withdrawable:
                self.withdraw(ops, asyncio.CancelledError("withdrawn: the caller was cancelled"))
            await self._wait_settled(group)
            raise
        return group.results

    def start_group(self, ops: Sequence[DiskOp], done: Callable[[list[Any]], None]) -> None:
        """Run ``ops`` as :meth:`submit_group` does, with no future to await: ``done(outcomes)``
        is called on the loop once every op settled (in the call itself when the pool is shut
        down). :meth:`withdraw` takes back the ops no thread has started."""
        self._start(ops, _Group(None, len(ops), done))

    def _start(self, ops: Sequence[DiskOp], group: _Group) -> _Group:
        """Queue ``ops`` under ``group`` and start them on the free threads now."""
        for i, op in enumerate(ops):
            op.group = group
            op.index = i
        self._queue.extend(ops)
        self._idle.clear()
        self._flush()
        return group

    def withdraw(self, ops: Sequence[DiskOp], outcome: Any) -> None:
        """Take back those of ``ops`` (of one :meth:`start_group`) no thread has started: each
        settles with ``outcome`` at once (and is marked :attr:`~DiskOp.withdrawn`)."""
        taken = [op for op in ops if not op.started and not op.withdrawn]
        for op in taken:
            op.withdrawn = True
        self._maybe_idle()
        for op in taken:
            op.settle(outcome)

    def _flush(self) -> None:
        """Pack queued ops into hops, spreading them over the free threads."""
        self._flush_scheduled = False
        queue = self._queue
        while queue and self._hops < self.threads:
            free = self.threads - self._hops
            if not self._start_hop(-(-len(queue) // free)):
                break
        while queue and queue[0].chains and self._hops < 2 * self.threads:
            self._start_hop(1)
        self._maybe_idle()

    @property
    def free_threads(self) -> int:
        """Threads with no hop to run now."""
        return max(0, self.threads - self._hops)

    def _start_hop(self, max_ops: int) -> bool:
        """Send up to ``max_ops`` queued ops (and :attr:`max_bytes`) to a thread in one hop."""
        queue = self._queue
        batch: list[DiskOp] = []
        nbytes = 0
        limit = min(max_ops, self.max_ops)
        while queue and len(batch) < limit:
            op = queue[0]
            if op.withdrawn:
                queue.popleft()
                continue
            if batch and nbytes + op.nbytes > self.max_bytes:
                break
            queue.popleft()
            op.started = True
            batch.append(op)
            nbytes += op.nbytes
        if not batch:
            return False
        self._hops += 1
        try:
            job = self._executor.submit(run_ops, batch, self.nowait)
        except RuntimeError as exc:  # the pool was shut down: the tier is closing
            self._hop_done(batch, exc)
        else:
            job.add_done_callback(partial(self._post, batch))
        return True

    def _post(self, batch: list[DiskOp], job: Future[list[Any]]) -> None:
        """On the hop's thread: hand its outcome to the loop."""
        try:
            outcome: list[Any] | BaseException = job.result()
        except BaseException as exc:  # run_ops keeps failures per op: this is the pool's own
            outcome = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            self._loop.call_soon_threadsafe(self._hop_done, batch, outcome)

    def _hop_done(self, batch: list[DiskOp], outcome: list[Any] | BaseException) -> None:
        """On the loop: settle the hop's ops, then start the next hops."""
        self._hops -= 1
        if isinstance(outcome, BaseException):
            err = TierUnavailableError(f"ssd tier {self.name!r}: disk work failed: {outcome!r}")
            outcomes: list[Any] = [err] * len(batch)
        else:
            outcomes = outcome
        for op, result in zip(batch, outcomes, strict=True):
            try:
                op.finish(result)
            except Exception:  # finish only touches the index; never let one op stop the rest
                log.exception("ssd tier %r: finishing a disk op failed", self.name)
        if self._queue:
            self._flush()
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        if self._hops == 0 and not any(not op.withdrawn for op in self._queue):
            self._queue.clear()
            self._idle.set()

    async def _wait_settled(self, group: _Group) -> None:
        """Wait, ignoring further cancellation, until every op of ``group`` settled (at most
        :attr:`grace`). Used after a caller was cancelled while its ops were on (or bound for)
        a thread: an op may touch the caller's buffers until then."""
        if group.remaining <= 0:
            return
        settled = group.settled = self._loop.create_future()
        deadline = self._loop.time() + self.grace
        while not settled.done():
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                log.error(
                    "ssd tier %r: a cancelled disk operation is still running after %ss",
                    self.name,
                    self.grace,
                )
                return
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait((settled,), timeout=remaining)
