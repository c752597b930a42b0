"""Names and geometry of an SSD tier directory (format 2): the one place they are made.

A directory holds a marker (the format and the slot geometry, written once when the directory
is created), a lock file, a few slot files of fixed-size slots, and, between a clean close and
the next open, a checkpoint of the index (``docs/ssd.md``, "On-disk layout")::

    aiotier-ssd      "aiotier-ssd 2" then block_size, slot_size, slots_per_file
    lock             flock(LOCK_EX) while a tier has the directory open
    slots-0000 ...   slot files, ``slots_per_file`` slots each (the last one may hold fewer)
    checkpoint       the index at the last clean close; removed when a tier opens
    last-open        how the last open went (for ``aiotier inspect``)

Slot ``s`` lives in file ``s // slots_per_file`` at offset ``(s % slots_per_file) *
slot_size``. Slots start on 4 KiB boundaries, so a slot's header shares no page with another
slot and every block's payload sits at the same offset within its page (``docs/ssd.md``,
"What bounds warm promotion").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from ..._types import MAX_KEY_BYTES
from ...errors import ConfigError
from .slot import HEAD_SIZE

__all__ = [
    "CHECKPOINT_NAME",
    "FILE_BYTES_MAX",
    "FORMAT",
    "LAST_OPEN_NAME",
    "LOCK_NAME",
    "MARKER_NAME",
    "SLOT_ALIGN",
    "TMP_PREFIX",
    "Geometry",
    "slot_file_index",
    "slot_file_name",
]

MARKER_NAME: Final = "aiotier-ssd"
FORMAT: Final = 2
LOCK_NAME: Final = "lock"
CHECKPOINT_NAME: Final = "checkpoint"
LAST_OPEN_NAME: Final = "last-open"
TMP_PREFIX: Final = ".tmp-"
#: Slots start on page boundaries (see the module docstring).
SLOT_ALIGN: Final = 4096
#: The largest slot file made: a few files, not one per block, and none so large that
#: reserving or truncating it takes long; writes to different files never share an inode lock.
FILE_BYTES_MAX: Final = 4 << 30

_SLOT_FILE = re.compile(r"slots-(\d{4,})\Z")


def slot_file_name(index: int) -> str:
    """Name of slot file ``index`` (``slots-0000``)."""
    return f"slots-{index:04d}"


def slot_file_index(name: str) -> int | None:
    """The index of a slot file named ``name``, else None (not one of ours)."""
    m = _SLOT_FILE.match(name)
    if m is None or slot_file_name(int(m.group(1))) != name:
        return None
    return int(m.group(1))


@dataclass(frozen=True, slots=True)
class Geometry:
    """Where slots are: fixed for a directory (``block_size``, ``slot_size``,
    ``slots_per_file``, from its marker) plus the slot count its capacity allows now."""

    block_size: int
    slot_size: int
    slots_per_file: int
    slots: int

    @staticmethod
    def slot_size_for(block_size: int) -> int:
        """Header and longest key, then ``block_size`` bytes, rounded up to :data:`SLOT_ALIGN`."""
        need = HEAD_SIZE + MAX_KEY_BYTES + block_size
        return -(-need // SLOT_ALIGN) * SLOT_ALIGN

    @classmethod
    def new(cls, block_size: int, capacity: int) -> Geometry:
        """The geometry of a new directory for blocks of ``block_size`` in ``capacity`` bytes."""
        slot_size = cls.slot_size_for(block_size)
        return cls(block_size, slot_size, max(1, FILE_BYTES_MAX // slot_size), 0).resized(
            capacity
        )

    def resized(self, capacity: int) -> Geometry:
        """The same slots, as many as ``capacity`` bytes of slot files hold."""
        return Geometry(
            self.block_size, self.slot_size, self.slots_per_file, capacity // self.slot_size
        )

    @property
    def files(self) -> int:
        return -(-self.slots // self.slots_per_file)

    @property
    def nbytes(self) -> int:
        """The slot files' total size: the tier's byte budget as it is on disk."""
        return self.slots * self.slot_size

    def file_slots(self, index: int) -> int:
        """How many slots file ``index`` holds (0 past the last file)."""
        return max(0, min(self.slots_per_file, self.slots - index * self.slots_per_file))

    def slots_in(self, size: int) -> int:
        """The slots a file of ``size`` bytes holds, counting one its end cuts short (the
        file was truncated from outside: the headers and blocks before the cut may be whole)."""
        return min(-(-size // self.slot_size), self.slots_per_file)

    def file_size(self, index: int) -> int:
        return self.file_slots(index) * self.slot_size

    def locate(self, slot: int) -> tuple[int, int]:
        """``(file index, byte offset)`` of ``slot``."""
        f, i = divmod(slot, self.slots_per_file)
        return f, i * self.slot_size

    def marker_text(self) -> str:
        return (
            f"{MARKER_NAME} {FORMAT}\nblock_size {self.block_size}\nslot_size {self.slot_size}\n"
            f"slots_per_file {self.slots_per_file}\n"
        )

    @classmethod
    def from_marker(cls, text: str, capacity: int, where: str) -> Geometry:
        """The geometry a marker written by :meth:`marker_text` describes (``ConfigError`` if
        it is damaged), sized for ``capacity``. The caller has checked the first line."""
        fields: dict[str, int] = {}
        for line in text.splitlines()[1:]:
            name, _, value = line.partition(" ")
            if value.isdigit():
                fields[name] = int(value)
        try:
            block_size = fields["block_size"]
            slot_size = fields["slot_size"]
            per_file = fields["slots_per_file"]
        except KeyError as exc:
            raise ConfigError(f"{where}: the {MARKER_NAME} marker lacks {exc.args[0]}") from None
        if block_size <= 0 or per_file <= 0 or slot_size != cls.slot_size_for(block_size):
            raise ConfigError(f"{where}: the {MARKER_NAME} marker is damaged: {text!r}")
        return cls(block_size, slot_size, per_file, 0).resized(capacity)
