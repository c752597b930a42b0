"""A batch of reads planned (sans-IO): the keys' slots pinned in the index and put in file
order, queued for one read op per thread.

The loop's share of a batch is the index's pins and one sort; everything else a block needs
(its file and offset, sequence number and length, the buffer cut to it) the op works out on
its thread just before reading it, where it overlaps the other threads' reads instead of
delaying them all: the plan runs on the event loop, serial with the batch. Which op reads a
block is settled on the threads too: an op that runs out takes from the others' queues.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from .index import SSDIndex
from .ops import SlotReads, SlotSource

__all__ = ["ReadBatch"]


class ReadBatch:
    """What ``read_many_into(keys, bufs)`` asks of the disk.

    Building it pins every key the index has (:meth:`SSDIndex.pin_many`) and orders the reads
    by slot, so a cold batch reads each file forwards. :attr:`out` holds each position's
    answer (-1: absent); the ops' threads put theirs in place (a length, or the exception,
    a ``ValueError`` for a buffer too short). :attr:`missing` lists the positions the index
    does not have.
    """

    __slots__ = ("missing", "out", "pos", "source")

    def __init__(
        self,
        index: SSDIndex,
        keys: list[bytes],
        bufs: Sequence[Any],
        files: list[int],
        slots_per_file: int,
        slot_size: int,
        tier_name: str,
    ) -> None:
        self.out: list[int | Exception] = [-1] * len(keys)
        found = index.pin_many(keys)
        pos = sorted(range(len(keys)), key=found.__getitem__)  # file order; absent (-1) first
        absent = found.count(-1)
        self.missing = sorted(pos[:absent])
        del pos[:absent]
        self.pos = pos
        self.source = SlotSource(
            keys, found, bufs, self.out, index.seq, index.length, files, slots_per_file,
            slot_size, tier_name,
        )  # fmt: skip

    def __len__(self) -> int:
        """Reads that go to the disk."""
        return len(self.pos)

    def ops(self, parts: int, done: Callable[[SlotReads, Any], None]) -> list[SlotReads]:
        """The reads as ``parts`` ops, one per thread. Each is queued one of every ``parts``
        blocks: to the kernel, a batch in file order stays one forward stream (its readahead
        keeps working on cold blocks). An op whose queue runs out takes from the others'."""
        source, size = self.source, self.source.slot_size
        todos = source.todos = [deque(self.pos[p::parts]) for p in range(parts)]
        return [SlotReads(source, todo, len(todo) * size, done) for todo in todos]
