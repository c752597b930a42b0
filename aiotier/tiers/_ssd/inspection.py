"""A tier directory summarised without changing it (``aiotier inspect PATH``).

It reads what a restart would: the checkpoint when it is there and fits the slot files, else
every slot header. It takes no lock and writes nothing, so it may look at a directory a tier
has open (the figures are then a snapshot of a moving target).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from .checkpoint import Checkpoint, read_checkpoint
from .directory import open_slot_files, read_marker
from .layout import FORMAT, MARKER_NAME, Geometry
from .scan import scan_slots
from .startup import read_last_open, stale_reason

__all__ = ["SSDInspection", "inspect_directory"]


@dataclass(slots=True)
class SSDInspection:
    """What ``aiotier inspect`` reports of a tier directory."""

    path: str
    format: int
    block_size: int
    slot_size: int
    files: int
    slots: int
    #: The slot files' size, and what the file system has allocated to them.
    file_bytes: int
    allocated_bytes: int
    blocks: int
    free_slots: int
    #: Where the block count comes from: "checkpoint" (closed cleanly) or "scan".
    source: str
    #: Headers that failed their checksum, and keys found twice (a scan's figures).
    torn: int
    duplicates: int
    #: What the last open recorded (``SSDStart`` fields and a Unix time), if anything.
    last_start: dict[str, Any] | None

    @property
    def bytes_used(self) -> int:
        return self.blocks * self.slot_size


def inspect_directory(path: str | os.PathLike[str]) -> SSDInspection:
    """Summarise the SSD tier directory ``path`` (format 2) without changing it."""
    root = os.path.abspath(os.fspath(path))
    where = f"ssd tier directory {root!r}"
    if not os.path.isdir(root):
        raise ConfigError(f"{where}: not a directory")
    text = read_marker(root, where)
    if text is None:
        raise ConfigError(f"{where}: no {MARKER_NAME} marker: not an SSD tier directory")
    g = Geometry.from_marker(text, 0, where)
    fds, sizes, _foreign = open_slot_files(root, where, writable=False)
    try:
        file_slots = {i: g.slots_in(size) for i, size in sizes.items()}
        slots = sum(file_slots.values())
        allocated = sum(os.fstat(fd).st_blocks * 512 for fd in fds.values())
        ck = read_checkpoint(root)
        if isinstance(ck, Checkpoint) and stale_reason(ck, g, fds, sizes) is None:
            blocks, source, torn, duplicates = len(ck.keys), "checkpoint", 0, 0
        else:
            scan = scan_slots(fds, file_slots, g, repair=False)
            blocks, source = len(scan.blocks), "scan"
            torn, duplicates = scan.torn, scan.duplicates
    finally:
        for fd in fds.values():
            os.close(fd)
    return SSDInspection(
        path=root,
        format=FORMAT,
        block_size=g.block_size,
        slot_size=g.slot_size,
        files=len(sizes),
        slots=slots,
        file_bytes=sum(sizes.values()),
        allocated_bytes=allocated,
        blocks=blocks,
        free_slots=slots - blocks,
        source=source,
        torn=torn,
        duplicates=duplicates,
        last_start=read_last_open(root),
    )
