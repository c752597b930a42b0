"""The write-back queues: tier writes and removes as data, applied in order per key.

Each secondary tier has one FIFO of :class:`WriteOp`. The engine's writers for a tier take
batches of neighbouring ops of one kind (:meth:`WriteQueues.next_batch`), perform them, and hand
the results back (:meth:`WriteQueues.writes_applied` / :meth:`WriteQueues.removes_applied`),
then :meth:`WriteQueues.finished`. Up to :data:`IN_FLIGHT` batches of one tier are applied at
once, so the tier's threads always have the next batch while the event loop finishes the last;
batches applied at once share no key (a batch ends before an op whose key is in flight). Order
per key is what keeps tiers coherent: a remove queued after a write of the same key is applied
after it, and two writes of a key land in the order they were queued.

The bytes of demotions wait here in memory; past ``max_bytes`` of them a new demotion is dropped
(counted as ``demotions_dropped{reason="backlog"}``: shed load, not a tier error) rather than
queued, so a slow tier cannot grow the queue without bound. A write
that the tier's admission policy keeps out is not queued either (and counted).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

from .._types import BlockEvent
from .admission import AdmissionPolicy
from .coherence import Coherence
from .staging import StagingBuffers
from .stats import StepStats

__all__ = ["OpKind", "WriteAcks", "WriteOp", "WriteQueues"]

#: Most ops, and bytes of writes, handed to one write_many / remove_many call. A writer takes
#: what queued while its last batch ran: under a busy event loop that turns only every few
#: milliseconds, a batch costs a few turns, so batches grow rather than fall behind.
BATCH: Final = 512
BATCH_BYTES: Final = 64 << 20
#: Batches of one tier applied at once: a second one keeps the tier busy during the loop turns
#: it takes to finish the first (while puts keep the loop busy, a turn is a step of puts).
IN_FLIGHT: Final = 2


class OpKind(enum.Enum):
    WRITE = "write"
    REMOVE = "remove"


class WriteOp:
    """One queued tier mutation. ``done``, when given, is called once with the outcome: for a
    write, whether the tier took it; for a remove (of a ``delete``), whether it removed."""

    __slots__ = ("data", "demotion", "done", "key", "kind", "staged")

    def __init__(
        self,
        kind: OpKind,
        key: bytes,
        data: bytes | memoryview | None = None,
        *,
        demotion: bool = False,
        staged: bool = False,
        done: Callable[[bool], None] | None = None,
    ) -> None:
        self.kind = kind
        self.key = key
        self.data = data
        self.demotion = demotion
        #: ``data`` is a staging buffer (:mod:`.staging`), taken back once the op is over
        self.staged = staged
        self.done = done


def write(
    key: bytes,
    data: bytes | memoryview,
    *,
    demotion: bool = False,
    staged: bool = False,
    done: Callable[[bool], None] | None = None,
) -> WriteOp:
    return WriteOp(OpKind.WRITE, key, data, demotion=demotion, staged=staged, done=done)


def remove(key: bytes, done: Callable[[bool], None] | None = None) -> WriteOp:
    return WriteOp(OpKind.REMOVE, key, done=done)


def _settle(op: WriteOp, outcome: bool) -> None:
    """Tell ``op``'s caller its outcome, once."""
    done = op.done
    if done is not None:
        op.done = None
        done(outcome)


class WriteAcks:
    """The write-through writes of one ``put``, and whether each has its outcome yet.

    :meth:`expect` gives the ``done`` callback of one write; :meth:`when_settled` runs a
    function once every write has its outcome (at once if none is out).
    """

    __slots__ = ("_settled", "pending")

    def __init__(self) -> None:
        self.pending = 0
        self._settled: Callable[[], None] | None = None

    def expect(self) -> Callable[[bool], None]:
        self.pending += 1
        return self._one

    def _one(self, ok: bool) -> None:
        self.pending -= 1
        if not self.pending and self._settled is not None:
            settled, self._settled = self._settled, None
            settled()

    def when_settled(self, fn: Callable[[], None]) -> None:
        if self.pending:
            self._settled = fn
        else:
            fn()


class WriteQueues:
    """Per-tier FIFOs of writes and removes, their byte bound and their outcomes."""

    __slots__ = (
        "_admission",
        "_applying",
        "_below",
        "_coherence",
        "_events",
        "_immutable",
        "_names",
        "_notify",
        "_queues",
        "_staging",
        "_stats",
        "max_bytes",
        "queued_bytes",
    )

    def __init__(
        self,
        names: Sequence[str],
        coherence: Coherence,
        stats: StepStats,
        events: deque[BlockEvent],
        *,
        max_bytes: int,
        below: Sequence[int | None],
        notify: Callable[[int], None],
        admission: Sequence[AdmissionPolicy | None] = (),
        immutable: bool = False,
        staging: StagingBuffers | None = None,
    ) -> None:
        self._names = tuple(names)
        self._admission = tuple(admission) or (None,) * len(self._names)
        self._immutable = immutable  # copies below are the same bytes: no older copy to fear
        self._coherence = coherence
        self._stats = stats
        self._events = events
        self._below = tuple(below)  # per tier: where the blocks it hands over go (write-back)
        self._notify = notify
        self._staging = staging
        self._queues: list[deque[WriteOp]] = [deque() for _ in names]
        # per tier, the keys of the batches being applied (disjoint: see next_batch)
        self._applying: list[set[bytes]] = [set() for _ in names]
        self.max_bytes = max_bytes
        #: bytes copied out for tier writes and not yet written
        self.queued_bytes = 0

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues)

    def idle(self) -> bool:
        """Nothing queued and nothing being applied."""
        return not any(self._queues) and not self._coherence.busy()

    # -- queueing --------------------------------------------------------------------------------

    def push(self, ti: int, op: WriteOp) -> bool:
        """Queue ``op`` for tier ``ti``; False when a write is not queued: the tier's admission
        policy keeps it out (its ``done`` is told True: the tier was not meant to hold it), or
        it is a demotion past the byte bound (``done`` is told False).

        A write kept out removes any older copy the tier may hold; one dropped for the bound
        leaves the key stale there (never read until a later write or remove succeeds).
        ``notify(ti)`` is called when the tier's queue was empty: a writer that found it
        non-empty takes the next batch by itself once it is done with its own.
        """
        coherence = self._coherence
        if op.kind is OpKind.WRITE:
            if self._admission[ti] is None:
                self._stats.counts[("admissions", self._names[ti], "admitted")] += 1
            elif not self._admits(ti, op.key):
                if op.done is not None:
                    _settle(op, True)
                return False
            assert op.data is not None
            size = len(op.data)
            if op.demotion and self.queued_bytes + size > self.max_bytes:
                # load shed by design, not a fault of the tier: its own metric, not tier_errors
                self._stats.count("demotions_dropped", self._names[ti], "backlog")
                coherence.outcome(ti, op.key, ok=False)
                _settle(op, False)
                return False
            self.queued_bytes += size
            coherence.write_queued(ti, op.key)
        else:
            coherence.remove_queued(ti, op.key)
        q = self._queues[ti]
        q.append(op)
        if len(q) == 1:
            self._notify(ti)
        return True

    def _admits(self, ti: int, k: bytes) -> bool:
        """Whether tier ``ti``'s admission policy lets the write of ``k`` in (counted)."""
        policy, name = self._admission[ti], self._names[ti]
        assert policy is not None
        if policy.admit_below(k):
            self._stats.counts[("admissions", name, "admitted")] += 1
            return True
        self._stats.counts[("admissions", name, "rejected")] += 1
        if self._coherence.older_copies(ti, (k,)) and not self._immutable:
            self.push(ti, remove(k))  # an older copy there must not be served
        return False

    def demote(
        self,
        ti: int,
        k: bytes,
        data: bytes | memoryview,
        *,
        staged: bool = False,
        done: Callable[[bool], None] | None = None,
    ) -> None:
        """Send a block's newest bytes down to tier ``ti``; served from memory meanwhile.
        ``staged``: ``data`` is a staging buffer, taken back once the write is over; ``done``
        learns whether the tier took it."""
        if self.push(ti, WriteOp(OpKind.WRITE, k, data, demotion=True, staged=staged, done=done)):
            self._coherence.in_transit[k] = data  # going down: served from here meanwhile
        elif staged and self._staging is not None:
            assert isinstance(data, memoryview)
            self._staging.release(data)

    def demote_many(
        self,
        ti: int,
        keys: Sequence[bytes],
        datas: Sequence[bytes | memoryview],
        *,
        staged: bool = False,
    ) -> None:
        """:meth:`demote` of each key with its bytes, in order: a primary's victims (a burst of
        puts evicts a block per put). With no admission policy and room under the byte bound
        an op is queued here (what :meth:`push` does then); otherwise :meth:`push` decides."""
        q, coherence = self._queues[ti], self._coherence
        in_transit, write_queued = coherence.in_transit, coherence.write_queued
        admitted = ("admissions", self._names[ti], "admitted")
        plain = self._admission[ti] is None
        for k, data in zip(keys, datas, strict=True):
            op = WriteOp(OpKind.WRITE, k, data, demotion=True, staged=staged)
            size = len(data)
            if plain and self.queued_bytes + size <= self.max_bytes:
                self._stats.counts[admitted] += 1
                self.queued_bytes += size
                write_queued(ti, k)
                q.append(op)
                if len(q) == 1:
                    self._notify(ti)
            elif not self.push(ti, op):
                if staged and self._staging is not None:
                    assert isinstance(data, memoryview)
                    self._staging.release(data)
                continue
            in_transit[k] = data  # going down: served from here meanwhile

    def next_batch(self, ti: int) -> list[WriteOp]:
        """Neighbouring ops of one kind, in queue order, up to ``BATCH`` ops and ``BATCH_BYTES``,
        none of whose keys is in a batch being applied (empty when there is none: nothing
        queued, or the first op waits for its key's batch). The batch is being applied until
        :meth:`finished`."""
        q, applying = self._queues[ti], self._applying[ti]
        if not q or q[0].key in applying:
            return []
        kind = q[0].kind
        batch = [q.popleft()]
        nbytes = len(batch[0].data or b"")
        while q and q[0].kind is kind and len(batch) < BATCH and q[0].key not in applying:
            data = q[0].data
            if data is not None:
                nbytes += len(data)
                if nbytes > BATCH_BYTES:
                    break
            batch.append(q.popleft())
        applying.update([op.key for op in batch])
        return batch

    # -- outcomes --------------------------------------------------------------------------------

    def writes_applied(
        self,
        ti: int,
        batch: Sequence[WriteOp],
        errors: Sequence[Exception | None],
        evicted: Sequence[tuple[bytes, bytes | memoryview | None]] = (),
    ) -> None:
        """A batch of writes reached tier ``ti`` (``None``) or failed (an exception, per op).

        ``evicted`` are the blocks the tier evicted meanwhile (its ``take_evictions()``): those
        with their bytes go on to the tier below under write-back; all are removed events.
        """
        name = self._names[ti]
        coherence = self._coherence
        written: list[bytes] = []
        nbytes = 0
        failed = errors.count(None) < len(errors)
        for op, err in zip(batch, errors, strict=True):
            if err is None:
                nbytes += len(op.data or b"")
                written.append(op.key)
            else:
                self._stats.count("tier_errors", name, "write")
            if failed:  # in batch order: a key's last write decides whether it is stale
                coherence.outcome(ti, op.key, ok=err is None)
            if op.done is not None:
                _settle(op, err is None)
        if not failed:
            coherence.outcomes_ok(ti, written)
        if nbytes:
            self._stats.count("write_bytes", name, n=nbytes)
        if written:
            self._events.append(BlockEvent(tuple(written), name, False))
        if evicted:
            # a tier being cleared (or whose clear failed) hands nothing down: its blocks are
            # older than the clear
            below = self._below[ti]
            if below is not None and coherence.readable_tier(ti):
                for k, data in evicted:
                    # deleted, replaced or possibly stale since written here: not handed down
                    if data is None or coherence.removing(ti, k) or coherence.is_stale(ti, k):
                        continue
                    self.demote(below, k, data)
            self._events.append(BlockEvent(tuple([k for k, _ in evicted]), name, True))

    def removes_applied(
        self, ti: int, batch: Sequence[WriteOp], answers: Sequence[bool | Exception]
    ) -> None:
        """A batch of removes reached tier ``ti`` (whether it held the key) or failed."""
        name = self._names[ti]
        removed: list[bytes] = []
        for op, answer in zip(batch, answers, strict=True):
            failed = isinstance(answer, Exception)
            if failed:
                self._stats.count("tier_errors", name, "remove")
            elif answer:
                removed.append(op.key)
            self._coherence.outcome(ti, op.key, ok=not failed)
            _settle(op, answer is True)
        if removed:
            self._events.append(BlockEvent(tuple(removed), name, True))

    def finished(self, ti: int, batch: Sequence[WriteOp], *, released: bool = True) -> None:
        """The ops of ``batch`` are no longer queued or running (applied, failed or dropped).

        ``released``: the tier holds none of their bytes (its call returned, or was never
        made); only then are staging buffers taken back.
        """
        self._applying[ti].difference_update([op.key for op in batch])
        self._retire(ti, batch, released)

    def _retire(self, ti: int, batch: Sequence[WriteOp], released: bool = True) -> None:
        """The ops of ``batch`` leave the queue for good: their outcome settled (False if not
        yet), their bytes no longer counted nor served, their staging buffers taken back when
        ``released``. A pass per batch, not calls per op: a burst of puts demotes every block."""
        coherence = self._coherence
        writes: list[WriteOp] = []
        removes: list[bytes] = []
        for op in batch:
            if op.done is not None:
                _settle(op, False)  # never applied (the writer stopped): not taken
            if op.kind is OpKind.WRITE:
                writes.append(op)
                self.queued_bytes -= len(op.data or b"")
            else:
                removes.append(op.key)
        for k in removes:
            coherence.remove_done(ti, k)
        if not writes:
            return
        coherence.writes_done(ti, [op.key for op in writes])
        demoted = [(op.key, op.data) for op in writes if op.demotion and op.data is not None]
        coherence.landed_many(demoted)
        staging = self._staging
        if released and staging is not None:
            get = coherence.in_transit.get
            staging.release_many([data for op in writes if op.staged
                                  and isinstance(data := op.data, memoryview)
                                  and get(op.key) is not data])  # fmt: skip

    def drop_all(self, *, failed: bool = True) -> int:
        """Give up on every queued op; return how many. Each is counted as a failed one unless
        ``failed=False`` (a clear of every tier makes them moot)."""
        dropped = 0
        for ti, q in enumerate(self._queues):
            batch = list(q)
            q.clear()
            for op in batch:
                if failed:
                    self._stats.count("tier_errors", self._names[ti], op.kind.value)
            self._retire(ti, batch)
            dropped += len(batch)
        return dropped
