"""The primary arena: one preallocated buffer cut into equal slots, each remembering its length."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import mul

from ..errors import ConfigError
from .gather import gather

__all__ = ["Arena", "check_geometry"]


def check_geometry(num_blocks: object, block_size: object) -> None:
    """``TypeError``/``ConfigError`` unless both are positive ints."""
    for field, value in (("num_blocks", num_blocks), ("block_size", block_size)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{field} must be an int, got {type(value).__name__}")
        if value <= 0:
            raise ConfigError(f"{field} must be > 0, got {value}")


class Arena:
    """``num_blocks`` slots of ``block_size`` bytes in one buffer: a ``bytearray`` of its own,
    or ``buffer`` (writable, at least ``num_blocks * block_size`` bytes: shared memory).

    Views are zero-copy ``memoryview`` slices, so tiers read straight into a slot and loaders
    read straight out of it.
    """

    __slots__ = ("_buf", "_view", "block_size", "lengths", "num_blocks")

    def __init__(
        self, num_blocks: int, block_size: int, *, buffer: memoryview | None = None
    ) -> None:
        check_geometry(num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        nbytes = num_blocks * block_size
        if buffer is not None:
            if buffer.readonly or buffer.nbytes < nbytes:
                raise ConfigError(
                    f"an arena of {num_blocks} x {block_size} bytes needs a writable buffer of "
                    f"at least {nbytes} bytes, got {buffer.nbytes} "
                    f"({'read-only' if buffer.readonly else 'writable'})"
                )
            self._buf: bytearray | memoryview = buffer
            self._view = buffer.cast("B")[:nbytes]
        else:
            try:
                self._buf = bytearray(nbytes)
            except MemoryError as exc:
                raise ConfigError(
                    f"cannot allocate a {num_blocks} x {block_size}-byte primary arena"
                ) from exc
            self._view = memoryview(self._buf)
        self.lengths = [0] * num_blocks  # a list: indexed on the interpreter's fast path

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_size

    def slot_view(self, slot: int) -> memoryview:
        """The whole writable slot (``block_size`` bytes)."""
        off = slot * self.block_size
        return self._view[off : off + self.block_size]

    def slot_views(self, slots: list[int]) -> list[memoryview]:
        """:meth:`slot_view` of each slot."""
        view, bs = self._view, self.block_size
        return [view[s * bs : s * bs + bs] for s in slots]

    def data_view(self, slot: int) -> memoryview:
        """A read-only view of exactly the bytes stored in ``slot``."""
        off = slot * self.block_size
        return self._view[off : off + self.lengths[slot]].toreadonly()

    def data_views(self, slots: list[int]) -> list[memoryview]:
        """:meth:`data_view` of each slot."""
        return list(map(self.data_view, slots))

    def starting_with(self, slots: Sequence[int], prefix: bytes) -> list[int]:
        """The positions in ``slots`` of those whose stored bytes start with ``prefix``."""
        bs, lengths, n = self.block_size, self.lengths, len(prefix)
        if isinstance(self._buf, bytearray):  # compared in place, no view per slot
            if len(slots) > 1 and prefix and prefix[0] not in gather(
                self._buf, list(map(mul, slots, repeat(bs)))
            ):  # no slot starts with its first byte (one C-level pass): none with it all
                return []
            at = self._buf.startswith
            return [j for j, s in enumerate(slots) if lengths[s] >= n and at(prefix, s * bs)]
        view = self._view
        return [
            j
            for j, s in enumerate(slots)
            if lengths[s] >= n and view[s * bs : s * bs + n] == prefix
        ]

    def read(self, slot: int) -> bytes:
        off = slot * self.block_size
        return self._view[off : off + self.lengths[slot]].tobytes()

    def write(self, slot: int, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        off = slot * self.block_size
        self._view[off : off + n] = data
        self.lengths[slot] = n

    def set_lengths(self, slots: list[int], lengths: list[int], *, checked: bool = False) -> None:
        """:meth:`set_length` of each pair (``checked``: the caller knows each length fits)."""
        bs, out = self.block_size, self.lengths
        if len(slots) != len(lengths):
            raise ValueError(f"{len(lengths)} lengths for {len(slots)} slots")
        if not checked and lengths and not (min(lengths) >= 0 and max(lengths) <= bs):  # in C
            slot, n = next((s, n) for s, n in zip(slots, lengths, strict=True) if not 0 <= n <= bs)
            raise ValueError(f"length {n} of slot {slot} is not in 0..{bs}")
        for slot, n in zip(slots, lengths, strict=True):
            out[slot] = n

    def fill_lengths(self, slots: list[int]) -> None:
        """Each of ``slots`` holds a whole block."""
        bs, out = self.block_size, self.lengths
        for slot in slots:
            out[slot] = bs

    def set_length(self, slot: int, n: int) -> None:
        """Record that ``n`` bytes were written into ``slot`` through its view."""
        if not 0 <= n <= self.block_size:
            raise ValueError(f"length {n} of slot {slot} is not in 0..{self.block_size}")
        self.lengths[slot] = n
