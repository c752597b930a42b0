"""A batch of reads planned (sans-IO): the keys' slots pinned in the index, in file order,
as the parallel lists the read ops take slices of."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress
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
        found = index.pin_many(keys)
        pos = sorted(range(len(keys)), key=found.__getitem__)  # file order; absent (-1) first
        absent = found.count(-1)
        self.missing = sorted(pos[:absent])
        del pos[:absent]
        slots = [found[i] for i in pos]
        length = index.length
        lengths = [length[s] for s in slots]
        views = [views[i] for i in pos]
        if lengths and max(lengths) > min(map(len, views)):  # a buffer too short: rare
            fits = [len(v) >= n for v, n in zip(views, lengths, strict=True)]
            for j, fit in enumerate(fits):
                if not fit:
                    index.read_ended(slots[j])
                    self.out[pos[j]] = ValueError(
                        f"ssd tier {tier_name!r}: block {keys[pos[j]][:64]!r} is {lengths[j]} "
                        f"bytes, buffer holds {len(views[j])}"
                    )
            pos, slots = list(compress(pos, fits)), list(compress(slots, fits))
            lengths, views = list(compress(lengths, fits)), list(compress(views, fits))
        self.pos = pos
        self.slots = slots
        self.fds = [files[s // slots_per_file] for s in slots]
        self.offsets = [s % slots_per_file * slot_size for s in slots]
        seq = index.seq
        self.seqs = [seq[s] for s in slots]
        self.views = [v[:n] for v, n in zip(views, lengths, strict=True)]
        self.nbytes = sum(lengths)

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
