"""The SSD tier's thread plumbing: disk ops queued on the loop, run on threads in batches.

aiosqlite's shape, sized for many small ops: callers queue ops (:class:`DiskOp`) and await a
future; a flush at the end of the loop iteration packs the queue into *hops* (one function
call on one thread, many ops) and runs at most ``threads`` of them at once; outcomes come back
to the loop as the hop's result. A hop costs 20-65 µs of loop and thread overhead whatever it
carries, so ops queued together share hops.

The runner knows nothing of blocks, files or the tier's index: an op reads or writes caller
buffers on the thread (:meth:`DiskOp.start` / :meth:`~DiskOp.complete`) and applies its outcome
on the loop (:meth:`DiskOp.finish`). It serves any on-disk layout whose ops are that shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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

    __slots__ = ("fut", "group", "index", "nbytes", "started", "withdrawn")

    def __init__(self, nbytes: int) -> None:
        self.fut: asyncio.Future[Any] | None = None
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
        """Hand ``outcome`` to whoever awaits this op (its own future or its group)."""
        group = self.group
        if group is not None:
            group.settle_one(self.index, outcome)
        elif self.fut is not None:
            _resolve(self.fut, outcome)


class _Group:
    """One future for a batch of ops: the event loop's cost of a batch must not grow with its
    ops (a future and a callback per block cost more than a warm block's read)."""

    __slots__ = ("fut", "remaining", "results")

    def __init__(self, fut: asyncio.Future[None], n: int) -> None:
        self.fut = fut
        self.remaining = n
        self.results: list[Any] = [None] * n

    def settle_one(self, index: int, outcome: Any) -> None:
        self.results[index] = outcome
        self.remaining -= 1
        if self.remaining <= 0 and not self.fut.done():
            self.fut.set_result(None)


def _resolve(fut: asyncio.Future[Any], outcome: Any) -> None:
    if fut.done():
        return
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


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


_run_ops_async = aiofiles.os.wrap(run_ops)


class HopRunner:
    """A queue of :class:`DiskOp` run on ``threads`` threads, in hops of at most ``max_ops``
    ops and ``max_bytes`` bytes.

    Ops queued in one loop iteration are split evenly over the free threads, so a batch never
    leaves one thread with a short last hop while the others idle; what does not fit waits in
    the queue, where later ops can still join it. Created in a running loop; used from it only.

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
        self._queue: deque[DiskOp] = deque()
        self._flush_scheduled = False
        self._hops = 0
        self._hop_tasks: set[asyncio.Task[None]] = set()
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
        """Queue ``op`` and await its outcome.

        A cancelled caller whose op is already on a thread waits (up to :attr:`grace`) for the
        thread to finish before re-raising: the op may be writing into, or reading from, the
        caller's buffer, and the caller may reuse that buffer as soon as we return. A
        ``withdrawable`` op still queued is dropped at once instead.
        """
        fut = op.fut = self._loop.create_future()
        self.enqueue(op)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not op.started and withdrawable:
                op.withdrawn = True
                fut.cancel()
                raise
            await self._wait_settled(fut)
            raise

    async def submit_group(self, ops: Sequence[DiskOp], *, withdrawable: bool) -> list[Any]:
        """Queue ``ops`` under one future; their outcomes in order (same cancellation rule)."""
        group = _Group(self._loop.create_future(), len(ops))
        for i, op in enumerate(ops):
            op.group = group
            op.index = i
        self.enqueue(*ops)
        try:
            await asyncio.shield(group.fut)
        except asyncio.CancelledError:
            if withdrawable:
                for op in ops:
                    if not op.started and not op.withdrawn:
                        op.withdrawn = True
                        group.remaining -= 1
                if group.remaining <= 0 and not group.fut.done():
                    group.fut.set_result(None)
            await self._wait_settled(group.fut)
            raise
        return group.results

    def _flush(self) -> None:
        """Pack queued ops into hops, spreading them over the free threads."""
        self._flush_scheduled = False
        queue = self._queue
        while queue and self._hops < self.threads:
            free = self.threads - self._hops
            if not self._start_hop(-(-len(queue) // free)):
                break
        self._maybe_idle()

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
        task = self._loop.create_task(self._hop(batch))
        self._hop_tasks.add(task)
        task.add_done_callback(self._hop_tasks.discard)
        return True

    def _maybe_idle(self) -> None:
        if self._hops == 0 and not self._queue:
            self._idle.set()

    async def _hop(self, batch: list[DiskOp]) -> None:
        outcomes: list[Any]
        try:
            outcomes = await _run_ops_async(batch, self.nowait, executor=self._executor)
        except BaseException as exc:  # loop teardown cancelled us; the thread may still run
            err = TierUnavailableError(f"ssd tier {self.name!r}: disk work abandoned: {exc!r}")
            outcomes = [err] * len(batch)
        finally:
            self._hops -= 1
        for op, outcome in zip(batch, outcomes, strict=True):
            try:
                op.finish(outcome)
            except Exception:  # finish only touches the index; never let one op stop the rest
                log.exception("ssd tier %r: finishing a disk op failed", self.name)
        if self._queue and not self._flush_scheduled:
            self._flush()
        self._maybe_idle()

    async def _wait_settled(self, fut: asyncio.Future[Any]) -> None:
        """Wait, ignoring further cancellation, until ``fut`` settles (at most :attr:`grace`).

        Used after a caller was cancelled while its op was on (or bound for) a thread: the op
        may touch the caller's buffer until then.
        """
        deadline = self._loop.time() + self.grace
        while not fut.done():
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                log.error(
                    "ssd tier %r: a cancelled disk operation is still running after %ss",
                    self.name,
                    self.grace,
                )
                return
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait((fut,), timeout=remaining)
        if not fut.cancelled():
            fut.exception()  # mark retrieved: the cancelled caller will not look at it
