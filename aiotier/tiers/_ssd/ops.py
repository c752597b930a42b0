"""The SSD tier's disk operations as data: reads, writes and clearings of slots, each a run of
several slots done in one thread hop, and the callback that applies the outcome on the loop.

An op holds file descriptors, offsets, keys, sequence numbers and the caller's buffers, never
the tier or its index: the tier builds ops from its index plans and learns their outcome
through the ``done`` callback it passed in; :class:`~.hops.HopRunner` runs them. One op carries
many slots so that the event loop's cost of a batch does not grow with an object, a future and
a callback per block; the tier makes one op per thread for a batch, so the batch still spreads
over every thread.

Between two blocks a read or clear yields its CPU (:func:`~.syscalls.yield_cpu`): with as many
copying threads as CPUs, the event loop could otherwise wait for a CPU until the kernel's next
tick (a kernel built without preemption switches no sooner); after a yield it waits at most one
block's copy. Writes go to adjacent slots in runs of one ``pwritev`` each instead, their
payloads hashed without letting the GIL go: every system call (and every hash of more than
64 KiB in one call) is a moment the thread gives the GIL up, and a thread that wants it back
while the loop is busy can wait for milliseconds (``docs/ssd.md``, "Writes under a busy event
loop").
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from ...errors import BlockCorruptedError
from ..framing import checksum_held
from .hops import NEEDS_DISK, DiskOp
from .slot import CLEARED, HEAD_SIZE, check_slot, encode_head
from .syscalls import NowaitProbe, pwrite_all, read_exact_into, skip_views, yield_cpu

__all__ = [
    "WRITE_OP_MAX",
    "SlotClears",
    "SlotOp",
    "SlotReads",
    "SlotSource",
    "SlotWrites",
    "byte_view",
    "read_slot",
]


#: Cold reads this close together are advised as one range (the bytes between are few).
_MERGE_GAP = 64 << 10
#: Most blocks of one write op, and so most adjacent slots written by one ``pwritev``: 3 buffers
#: each at most (header, payload, one run of zeros), well under ``IOV_MAX`` (1024 on Linux).
WRITE_OP_MAX: Final = 128
#: Written over the unused end of a slot followed by another in the same ``pwritev``; a slot
#: with a longer unused end ends its run instead.
_ZEROS = memoryview(bytes(64 << 10))


def _advise(fd: int, start: int, end: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)


def _verify(head: bytearray, key: bytes, seq: int, view: memoryview, got: int) -> int:
    if got != len(head) + view.nbytes:
        raise BlockCorruptedError(
            f"key {key[:64]!r}: slot truncated: {got} of {len(head) + view.nbytes} bytes read"
        )
    return check_slot(head, key, seq, view)


def _write_runs(
    fds: list[int], runs: list[list[int]], write: Callable[[list[int]], object], fsync: bool
) -> list[OSError | None]:
    """``write(run)`` for each run of the op's slots (one file each), then with ``fsync`` one
    ``fdatasync`` per file written (a file that fails to sync fails each of its writes): per
    slot the ``OSError`` or None. The CPU is yielded between two runs (see the module doc)."""
    errors: list[OSError | None] = [None] * len(fds)
    touched: dict[int, list[int]] = {}
    for n, run in enumerate(runs):
        if n:
            yield_cpu()
        try:
            write(run)
        except OSError as exc:
            for i in run:
                errors[i] = exc
            continue
        touched.setdefault(fds[run[0]], []).extend(run)
    if fsync:
        for fd, written in touched.items():
            try:
                os.fdatasync(fd)
            except OSError as exc:
                for i in written:
                    errors[i] = exc
    return errors


def byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    """A caller's buffer as the ops take it: a flat view of its bytes."""
    view = data if type(data) is memoryview else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def read_slot(fd: int, offset: int, key: bytes, seq: int, length: int) -> bytes | None:
    """The payload of write ``seq`` of ``key`` in the slot at ``offset``, verified; None when
    the slot holds anything else (a victim's bytes, read before its slot is overwritten)."""
    try:
        head = os.pread(fd, HEAD_SIZE + len(key), offset)
        payload = os.pread(fd, length, offset + len(head))
        check_slot(head, key, seq, memoryview(payload))
    except (OSError, BlockCorruptedError):
        return None
    return payload


class SlotOp(DiskOp):
    """An op on slots of open files (``fds[i]`` at ``offsets[i]``) whose outcome the tier
    applies: ``done(op, outcome)`` on the loop, a callback passed in rather than the tier."""

    __slots__ = ("done", "fds", "offsets")

    def __init__(
        self, fds: list[int], offsets: list[int], nbytes: int, done: Callable[[Any, Any], None]
    ) -> None:
        DiskOp.__init__(self, nbytes)  # not super(): ops are made per batch, on the loop
        self.fds = fds
        self.offsets = offsets
        self.done = done

    def finish(self, outcome: Any) -> None:
        self.done(self, outcome)


class SlotSource:
    """A read batch's blocks as the loop planned them, shared by its ops: per position the
    key, the slot its read pinned (-1: absent), the caller's buffer and the answer (:attr:`out`,
    filled in by the ops' threads); the index's sequence numbers and lengths per slot (stable
    while the slot is pinned: a held slot is neither evicted nor freed); where slots are; and
    the positions each op has still to take (:attr:`todos`)."""

    __slots__ = ("bufs", "files", "found", "keys", "length", "out", "per_file", "seq",
                 "slot_size", "tier_name", "todos")  # fmt: skip

    def __init__(
        self,
        keys: list[bytes],
        found: list[int],
        bufs: Sequence[Any],
        out: list[Any],
        seq: Sequence[int],
        length: Sequence[int],
        files: list[int],
        per_file: int,
        slot_size: int,
        tier_name: str,
    ) -> None:
        self.keys = keys
        self.found = found
        self.bufs = bufs
        self.out = out
        self.seq = seq
        self.length = length
        self.files = files
        self.per_file = per_file
        self.slot_size = slot_size
        self.tier_name = tier_name
        #: Per op of the batch, the positions no thread has taken yet (file order).
        self.todos: list[deque[int]] = []

    def untaken(self) -> list[int]:
        """Take every position no op has taken (no thread takes one after this): after the
        ops stopped, the blocks none of them read, their slots still pinned."""
        left: list[int] = []
        for todo in self.todos:
            while todo:
                try:
                    left.append(todo.popleft())
                except IndexError:  # a thread took it meanwhile
                    break
        return left


class SlotReads(SlotOp):
    """Blocks read straight into caller buffers: per block one ``preadv`` of header and payload
    at the slot's offset in an open file, then :func:`~.slot.check_slot` (one hash call).

    The op reads the positions of its batch (:class:`SlotSource`) queued in :attr:`todo`; once
    they run out, it takes the last ones queued for the batch's other ops (the
    :attr:`SlotSource.todos`), so the threads of a batch end within a block or two of each
    other however unevenly they run. Its thread works out each block's file, offset and length
    just before reading it (:meth:`_take`), so the loop makes no pass per block for it.
    :meth:`start` takes what the page cache holds (``RWF_NOWAIT``); blocks that would wait for
    the disk are advised ``WILLNEED`` together and read by :meth:`complete`, so one cold block
    never holds up the warm ones. Each answer goes to the batch's ``out`` at its position, from
    the thread; the outcome is the op's own list (per block read, its length or the exception;
    :attr:`failed` when any is an exception).
    """

    __slots__ = ("at", "cold", "failed", "held", "keys", "out", "pos", "seqs", "slots",
                 "source", "todo", "views")  # fmt: skip

    def __init__(
        self,
        source: SlotSource,
        todo: deque[int],
        nbytes: int,
        done: Callable[[SlotReads, Any], None],
    ) -> None:
        """Read the blocks at the positions ``todo`` of ``source`` (and what the other ops of
        the batch leave)."""
        SlotOp.__init__(self, [], [], nbytes, done)
        self.source = source
        self.todo = todo
        #: The positions this op took, and the slots pinned for them (loop-side data for
        #: ``done``: they are let go there).
        self.pos: list[int] = []
        self.slots: list[int] = []
        #: Per block read (filled in by :meth:`_take`): its position, key, slot, sequence
        #: number and the caller's buffer cut to its length.
        self.at: list[int] = []
        self.keys: list[bytes] = []
        self.held: list[int] = []
        self.seqs: list[int] = []
        self.views: list[memoryview] = []
        #: Per block read, its answer (a length or the exception).
        self.out: list[Any] = []
        self.failed = False
        self.cold: list[tuple[int, bytearray, int]] = []

    def _take(self, i: int) -> None:
        """On the thread: position ``i`` is this op's; its file, offset, sequence number and
        buffer (a buffer shorter than its block gets a ``ValueError``, and no read)."""
        src = self.source
        slot, view = src.found[i], src.bufs[i]
        self.pos.append(i)
        self.slots.append(slot)
        if view.__class__ is not memoryview or view.format != "B" or view.ndim != 1:
            view = byte_view(view)
        n = src.length[slot]
        if view.nbytes < n:
            src.out[i] = ValueError(
                f"ssd tier {src.tier_name!r}: block {src.keys[i][:64]!r} is {n} bytes, "
                f"buffer holds {view.nbytes}"
            )
            return
        f, k = divmod(slot, src.per_file)
        self.fds.append(src.files[f])
        self.offsets.append(k * src.slot_size)
        self.at.append(i)
        self.keys.append(src.keys[i])
        self.held.append(slot)
        self.seqs.append(src.seq[slot])
        self.views.append(view[:n])
        self.out.append(None)

    def resolve(self) -> None:
        """On the thread: take every position left in :attr:`todo`."""
        todo = self.todo
        while self._take_from(todo, todo.popleft, len(self.keys)):
            pass

    def _take_next(self) -> bool:
        """Take the next block to read: the first left in :attr:`todo`, else the last left in
        another op's (the block that op would reach last); False when no op has one left."""
        own, had = self.todo, len(self.keys)
        if self._take_from(own, own.popleft, had):
            return True
        return any(self._take_from(todo, todo.pop, had) for todo in self.source.todos)

    def _take_from(self, todo: deque[int], pop: Callable[[], int], had: int) -> bool:
        """Take positions from ``todo`` by ``pop`` until this op has more than ``had`` blocks
        to read (True) or ``todo`` is empty (False)."""
        keys = self.keys
        while todo:
            try:
                i = pop()
            except IndexError:  # taken meanwhile by another op
                return False
            self._take(i)
            if len(keys) > had:
                return True
        return False

    def _publish(self, out: list[Any]) -> list[Any]:
        """On the thread, last: each answer put in the batch's ``out``."""
        shared = self.source.out
        for i, r in zip(self.at, out, strict=True):
            shared[i] = r
            if r.__class__ is not int:
                self.failed = True
        return out

    def start(self, nowait: NowaitProbe) -> Any:
        fds, offsets, keys, seqs, views = self.fds, self.offsets, self.keys, self.seqs, self.views
        out, cold = self.out, self.cold
        if nowait.resting:
            self.resolve()
            if self._forward_run(0):
                # The tier is reading from the disk: this op is one stream, read in order
                # unprobed.
                nowait.rest_on()
                cold.extend((i, bytearray(HEAD_SIZE + len(k)), 0) for i, k in enumerate(keys))
                return NEEDS_DISK
        # Each block is taken just before its read: the op's first read starts at once, and
        # the other threads' ops get the GIL while it runs rather than after a whole plan.
        i = -1
        while i + 1 < len(keys) or self._take_next():
            i += 1
            if i:
                yield_cpu()
            key, view = keys[i], views[i]
            head = bytearray(HEAD_SIZE + len(key))
            try:
                got = nowait.preadv(fds[i], [memoryview(head), view], offsets[i])
                if got == len(head) + view.nbytes:
                    out[i] = check_slot(head, key, seqs[i], view)
                    continue
            except (OSError, BlockCorruptedError) as exc:
                out[i] = exc
                continue
            cold.append((i, head, got))
            self.resolve()  # the rest, to tell whether it reads one file forwards
            if i + 2 < len(keys) and self._forward_run(i):
                # The rest of the op reads one file forwards: read it in order without probing
                # or advising, so the kernel's readahead sees (and streams) a sequential read.
                scattered = len(cold) - 1
                cold.extend((j, bytearray(HEAD_SIZE + len(keys[j])), 0)
                            for j in range(i + 1, len(keys)))  # fmt: skip
                break
        else:
            scattered = len(cold)
        if not cold:
            return self._publish(out)
        # The scattered cold blocks: one WILLNEED per run of near ones, so the kernel fetches
        # them all at once, in a few large requests. A hole of up to twice a read's length is
        # advised with it (another thread's block, most likely), a larger one splits the run.
        fd, start, end = -1, 0, 0
        for i, head, got in cold[:scattered]:
            lo, hi = offsets[i] + got, offsets[i] + len(head) + views[i].nbytes
            if fds[i] == fd and start <= lo <= end + max(_MERGE_GAP, 2 * (hi - lo)):
                end = max(end, hi)
                continue
            _advise(fd, start, end)
            fd, start, end = fds[i], lo, hi
        _advise(fd, start, end)
        return NEEDS_DISK

    def _forward_run(self, i: int) -> bool:
        """Whether blocks ``i`` on are each in the same file a little after the one before
        (at most a read's length or two of another thread's blocks between them)."""
        fds, offsets, keys, views = self.fds, self.offsets, self.keys, self.views
        for j in range(i, len(keys) - 1):
            end = offsets[j] + HEAD_SIZE + len(keys[j]) + views[j].nbytes
            hole = offsets[j + 1] - end
            if fds[j + 1] != fds[j] or not 0 <= hole <= max(_MERGE_GAP, 2 * (end - offsets[j])):
                return False
        return True

    def complete(self) -> list[Any]:
        """Read the rest of the cold blocks (waiting for the disk), verify them."""
        out = self.out
        for n, (i, head, got) in enumerate(self.cold):
            if n:
                yield_cpu()
            view = self.views[i]
            try:
                views = skip_views([memoryview(head), view], got)
                got += read_exact_into(self.fds[i], views, self.offsets[i] + got)
                out[i] = _verify(head, self.keys[i], self.seqs[i], view, got)
            except (OSError, BlockCorruptedError) as exc:
                out[i] = exc
        self.cold = []
        return self._publish(out)


class SlotWrites(SlotOp):
    """Blocks written into their planned slots, then with ``fsync`` one ``fdatasync`` per file
    touched (a group commit).

    Victims' bytes are read first when they go to the tier below. Then each run of adjacent
    slots is one ``pwritev`` (:meth:`_runs`, :meth:`_chunks`). The header comes first, so a
    victim's header is the first thing overwritten; a process killed mid-write leaves a slot
    whose header or payload checksum fails (a read, or the start-up scan for a key found twice,
    treats it as free; ``docs/ssd.md``). The outcome is ``(handed, errors)``: per block the
    victim's payload (or None) and the exception (or None).
    """

    __slots__ = ("datas", "fsync", "keys", "seqs", "slot_size", "tags", "victims")

    chains = True

    def __init__(
        self, fsync: bool, slot_size: int, done: Callable[[SlotWrites, Any], None]
    ) -> None:
        SlotOp.__init__(self, [], [], 0, done)
        self.fsync = fsync
        self.slot_size = slot_size
        self.keys: list[bytes] = []
        self.seqs: list[int] = []
        self.datas: list[memoryview] = []
        #: Per block: ``(key, seq, length)`` of the victim to read first, or None.
        self.victims: list[tuple[bytes, int, int] | None] = []
        #: Per block, what the loop's completion needs (the index plan, ...): loop-side data.
        self.tags: list[Any] = []

    def add(
        self,
        fd: int,
        offset: int,
        key: bytes,
        seq: int,
        data: memoryview,
        victim: tuple[bytes, int, int] | None,
        tag: Any,
    ) -> None:
        self.fds.append(fd)
        self.offsets.append(offset)
        self.keys.append(key)
        self.seqs.append(seq)
        self.datas.append(data)
        self.victims.append(victim)
        self.tags.append(tag)
        self.nbytes += data.nbytes

    def start(self, nowait: NowaitProbe) -> tuple[list[bytes | None], list[OSError | None]]:
        fds, offsets = self.fds, self.offsets
        handed: list[bytes | None] = [None] * len(fds)
        for i, victim in enumerate(self.victims):
            if victim is not None:
                handed[i] = read_slot(fds[i], offsets[i], *victim)
        return handed, _write_runs(fds, self._runs(), self._write_run, self.fsync)

    def _write_run(self, run: list[int]) -> None:
        first = run[0]
        pwrite_all(self.fds[first], self._chunks(run), self.offsets[first])

    def _runs(self) -> list[list[int]]:
        """The op's blocks in runs of adjacent slots of one file, each written at once. A run
        goes on past a slot only when that slot's unused end is at most :data:`_ZEROS` long."""
        fds, offsets, stride = self.fds, self.offsets, self.slot_size
        keys, datas, room = self.keys, self.datas, self.slot_size - HEAD_SIZE
        runs: list[list[int]] = []
        at, fd, joinable = -1, -1, False
        for f, off, i in sorted(zip(fds, offsets, range(len(fds)), strict=True)):
            if joinable and f == fd and off == at + stride:
                runs[-1].append(i)
            else:
                runs.append([i])
            fd, at = f, off
            tail = room - len(keys[i]) - datas[i].nbytes  # the slot's unused end
            joinable = tail <= _ZEROS.nbytes and len(runs[-1]) < WRITE_OP_MAX
        return runs

    def _chunks(self, run: list[int]) -> list[memoryview]:
        """What one ``pwritev`` writes for ``run``: per slot its header and its payload, and
        zeros over the unused end of every slot but the last. The payloads are hashed holding
        the GIL (:func:`~aiotier.tiers.framing.checksum_held`): the ``pwritev`` is then the
        run's one release of it."""
        datas, keys, seqs = self.datas, self.keys, self.seqs
        room, last = self.slot_size - HEAD_SIZE, run[-1]
        chunks: list[memoryview] = []
        for i in run:
            data = datas[i]
            chunks.append(memoryview(encode_head(keys[i], seqs[i], data, checksum_held(data))))
            chunks.append(data)
            if i != last and (tail := room - len(keys[i]) - data.nbytes):
                chunks.append(_ZEROS[:tail])
        return chunks


class SlotClears(SlotOp):
    """Slots' headers cleared (zeros over the header checksum), then with ``fsync`` one
    ``fdatasync`` per file. The outcome is per slot the exception, or None."""

    __slots__ = ("fsync", "slots")

    def __init__(self, fsync: bool, done: Callable[[SlotClears, Any], None]) -> None:
        SlotOp.__init__(self, [], [], 0, done)
        self.fsync = fsync
        self.slots: list[int] = []

    def add(self, fd: int, offset: int, slot: int) -> None:
        self.fds.append(fd)
        self.offsets.append(offset)
        self.slots.append(slot)

    def start(self, nowait: NowaitProbe) -> list[OSError | None]:
        fds, offsets = self.fds, self.offsets
        def clear(run: list[int]) -> None:
            os.pwrite(fds[run[0]], CLEARED, offsets[run[0]])

        return _write_runs(fds, [[i] for i in range(len(fds))], clear, self.fsync)
