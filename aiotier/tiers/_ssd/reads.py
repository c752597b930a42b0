"""A batch of reads planned (sans-IO): the keys' slots pinned in the index, in file order,
as the parallel lists the read ops take slices of."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .index import SSDIndex
from .ops import SlotReads

__all__ = ["ReadBatch"]


class ReadBatch:
    """What ``read_many_into(keys, views)`` asks of the disk.

    Building it pins every key the index has (:meth:`SSDIndex.pin_many`) and orders the reads
    by slot, so a cold batch reads each file forwards. :attr:`out` holds each position's
    answer so far (-1: absent; a ``ValueError`` for a buffer too short, whose slot is let go at
    once); :attr:`missing` the positions the index does not have.
    """

    __slots__ = ("fds", "keys", "missing", "nbytes", "offsets", "out", "pos", "seqs", "slots",
                 "views")  # fmt: skip

    def __init__(
        self,
        index: SSDIndex,
        keys: list[bytes],
        views: Sequence[memoryview],
        files: list[int],
        slots_per_file: int,
        slot_size: int,
        tier_name: str,
    ) -> None:
        self.keys = keys
        self.out: list[int | Exception] = [-1] * len(keys)
        self.missing: list[int] = []
        order: list[tuple[int, int]] = []
        for i, slot in enumerate(index.pin_many(keys)):
            if slot >= 0:
                order.append((slot, i))
            else:
                self.missing.append(i)
        order.sort()
        lengths, seqs = index.length, index.seq
        self.pos: list[int] = []
        self.fds: list[int] = []
        self.offsets: list[int] = []
        self.seqs: list[int] = []
        self.views: list[memoryview] = []
        self.slots: list[int] = []
        self.nbytes = 0
        for slot, i in order:
            length = lengths[slot]
            view = views[i]
            if view.nbytes < length:
                index.read_ended(slot)
                self.out[i] = ValueError(
                    f"ssd tier {tier_name!r}: block {keys[i][:64]!r} is {length} bytes, buffer "
                    f"holds {view.nbytes}"
                )
                continue
            f, j = divmod(slot, slots_per_file)
            self.pos.append(i)
            self.fds.append(files[f])
            self.offsets.append(j * slot_size)
            self.seqs.append(seqs[slot])
            self.views.append(view[:length])
            self.slots.append(slot)
            self.nbytes += length

    def __len__(self) -> int:
        """Reads that go to the disk."""
        return len(self.pos)

    def ops(self, parts: int, done: Callable[[SlotReads, Any], None]) -> list[SlotReads]:
        """The reads as ``parts`` ops, one per thread. Each takes one of every ``parts`` blocks:
        to the kernel, a batch in file order stays one forward stream (its readahead keeps
        working on cold blocks)."""
        keys = [self.keys[i] for i in self.pos]
        ops = []
        for p in range(parts):
            cut = slice(p, None, parts)
            reads = (self.fds[cut], self.offsets[cut], keys[cut], self.seqs[cut], self.views[cut])
            ops.append(SlotReads(*reads, self.slots[cut], self.nbytes // parts, done))
        return ops

    def settle(self, results: list[list[Any]]) -> list[int | Exception]:
        """:attr:`out` with the ops' results (in the order :meth:`ops` made them) in place."""
        parts = len(results)
        for p, res in enumerate(results):
            for i, r in zip(self.pos[p::parts], res, strict=True):
                self.out[i] = r
        return self.out
