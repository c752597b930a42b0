"""Block-sized buffers reused for bytes copied out of the primary on their way down.

Under write-back every eviction copies a block out of its arena slot before the slot is reused.
A fresh ``bytes`` of a large block costs several times the copy: the allocator maps new pages,
the kernel zero-fills each on first touch, and unmaps them again when the block is freed (about
155 µs against 35 µs for 256 KiB on the reference machine; ``docs/architecture.md``). The
engine therefore copies into buffers it keeps and reuses once the write that carried one is
over.

At each ``end_step`` (:meth:`StagingBuffers.trim`) the free buffers beyond what the step just
ended copied into are halved: a steady load keeps what it reuses, and the memory of a burst
goes back within a few steps once the load drops. A buffer comes back only through
:meth:`StagingBuffers.release`, called when nothing the engine knows of still refers to it: the
tier's call ended (a tier keeps no reference to the data it was given, the ``write``
contract), and no lookup can still find it among the bytes on their way down. A buffer that
never comes back (a clear dropped it, a tier call timed out while a thread may still read it)
is simply left to the garbage collector: reuse is an optimisation, never something
correctness waits for.
"""

from __future__ import annotations

__all__ = ["StagingBuffers"]


class StagingBuffers:
    """A free list of ``block_size`` buffers, keeping at most ``max_free`` between uses."""

    __slots__ = ("_copied", "_free", "block_size", "max_free")

    def __init__(self, block_size: int, max_free: int) -> None:
        self.block_size = block_size
        self.max_free = max_free
        self._free: list[bytearray] = []
        self._copied = 0  # copies since the last trim

    def __len__(self) -> int:
        """Buffers free for reuse now."""
        return len(self._free)

    def copy(self, data: memoryview) -> memoryview:
        """``data`` copied into a free buffer (a new one when none is free): a view of exactly
        its bytes, to hand to :meth:`release` once nothing refers to it any more."""
        buf = self._free.pop() if self._free else bytearray(self.block_size)
        self._copied += 1
        n = data.nbytes
        buf[:n] = data
        return memoryview(buf)[:n]

    def release(self, view: memoryview) -> None:
        """Take back the buffer under ``view`` (from :meth:`copy`) for the next copy."""
        buf = view.obj
        if len(self._free) < self.max_free and type(buf) is bytearray:
            self._free.append(buf)

    def release_many(self, views: list[memoryview]) -> None:
        """:meth:`release` of each of ``views`` (a write batch's buffers, in one call)."""
        free, room = self._free, self.max_free - len(self._free)
        for view in views:
            if room <= 0:
                return
            buf = view.obj
            if type(buf) is bytearray:
                free.append(buf)
                room -= 1

    def trim(self) -> None:
        """At a step boundary: of the free buffers beyond as many as were copied into since the
        last trim, let half go."""
        extra = len(self._free) - self._copied
        if extra > 0:
            del self._free[len(self._free) - (extra + 1) // 2 :]
        self._copied = 0
