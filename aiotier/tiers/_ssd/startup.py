"""How an SSD tier starts: its index from the checkpoint of a clean close, else from a header
scan, and the record of how that went (``SSDStart``: logged, in ``usage().started``, in
``tier.last_start`` and, for ``aiotier inspect``, in the directory's ``last-open`` file)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .checkpoint import Checkpoint, read_checkpoint, remove_checkpoint, unsealed
from .index import SSDIndex
from .layout import LAST_OPEN_NAME, TMP_PREFIX, Geometry
from .scan import scan_slots
from .syscalls import replace_file

__all__ = ["SSDStart", "load_index", "read_last_open", "stale_reason", "write_last_open"]

log = logging.getLogger("aiotier.ssd")

#: How a start found the directory: created now, closed cleanly (checkpoint loaded), or not
#: (no usable checkpoint: a crash, a kill, or a damaged checkpoint; header scan).
After = Literal["new", "clean", "crash"]


@dataclass(slots=True)
class SSDStart:
    """How the last ``open()`` of a tier went."""

    after: After = "new"
    #: "loaded", "absent", or why the checkpoint was refused ("damaged (...)", "stale (...)").
    checkpoint: str = "absent"
    blocks: int = 0
    slots: int = 0
    #: Headers that failed their checksum (writes cut short): counted free.
    torn: int = 0
    #: Older copies of keys found by the scan (a crash between a write and the clearing of the
    #: copy it replaced), and newest copies that did not verify: cleared.
    duplicates: int = 0
    #: Blocks in slots past a capacity made smaller since the last start.
    dropped: int = 0
    #: Entries of the directory that are not the tier's (left alone).
    foreign: int = 0
    seconds: float = 0.0

    @property
    def per_block_us(self) -> float:
        """Start-up time per block found (µs)."""
        return self.seconds / max(1, self.blocks) * 1e6

    def describe(self) -> str:
        how = {
            "new": "created",
            "clean": "after a clean close: checkpoint loaded",
            "crash": f"without a usable checkpoint ({self.checkpoint}): header scan",
        }[self.after]
        extra = [
            f"{n} {what}"
            for n, what in (
                (self.torn, "torn slots freed"),
                (self.duplicates, "older copies cleared"),
                (self.dropped, "blocks past the capacity dropped"),
            )
            if n
        ]
        return (
            f"opened {how}, {self.blocks} blocks in {self.slots} slots in {self.seconds:.3f} s "
            f"({self.per_block_us:.1f} µs per block)" + (f"; {', '.join(extra)}" if extra else "")
        )


def stale_reason(
    ck: Checkpoint, g: Geometry, fds: Mapping[int, int], sizes: Mapping[int, int]
) -> str | None:
    """Why a verified checkpoint does not describe the slot files ``fds`` (of ``sizes``), or
    None."""
    c = ck.geometry
    if (c.block_size, c.slot_size, c.slots_per_file) != (g.block_size, g.slot_size,
                                                          g.slots_per_file):  # fmt: skip
        return "stale (written for another slot geometry)"
    if sorted(sizes) != list(range(c.files)) or any(
        size != c.file_size(i) for i, size in sizes.items()
    ):
        return "stale (the slot files changed since it was written)"
    if unsealed(ck, fds):
        return "stale (the slot files were written after it)"
    return None


def load_index(
    root: str, fds: Mapping[int, int], sizes: Mapping[int, int], g: Geometry, *, new: bool
) -> tuple[SSDIndex, SSDStart]:
    """The index of the slot files ``fds`` (file index -> descriptor, ``sizes`` their sizes),
    for ``g.slots`` slots (blocks past them are dropped), and how it was built. The
    checkpoint is consumed either way."""
    start = SSDStart(slots=g.slots)
    ck = read_checkpoint(root)
    if isinstance(ck, Checkpoint):
        ck = stale_reason(ck, g, fds, sizes) or ck
    remove_checkpoint(root)
    index = SSDIndex(g.slots)
    limit = g.slots
    if isinstance(ck, Checkpoint):
        start.after, start.checkpoint = "clean", "loaded"
        keep = [i for i, s in enumerate(ck.slots) if s < limit]
        if len(keep) == len(ck.slots):
            index.load_many(ck.keys, ck.slots, ck.seqs, ck.lengths)
        else:
            index.load_many(
                [ck.keys[i] for i in keep],
                [ck.slots[i] for i in keep],
                [ck.seqs[i] for i in keep],
                [ck.lengths[i] for i in keep],
            )
        start.dropped = len(ck.slots) - len(keep)
        dirty = {s for s in ck.dirty if s < limit}
        index.next_seq = max(index.next_seq, ck.next_seq)
    else:
        start.after = "new" if new else "crash"
        start.checkpoint = ck
        file_slots = {i: g.slots_in(size) for i, size in sizes.items()}
        scan = scan_slots(fds, file_slots, g, repair=True)
        start.torn, start.duplicates = scan.torn, scan.duplicates
        kept = [b for b in scan.blocks if b[1] < limit]
        start.dropped = len(scan.blocks) - len(kept)
        index.load_many([b[0] for b in kept], [b[1] for b in kept], [b[2] for b in kept],
                        [b[3] for b in kept])  # fmt: skip
        dirty = {s for s in scan.dirty if s < limit}
    index.loaded(dirty)
    start.blocks = len(index)
    return index, start


def write_last_open(root: str, start: SSDStart) -> None:
    """Record how this open went, for ``aiotier inspect`` (best effort: a tool's convenience)."""
    record: dict[str, Any] = {**asdict(start), "per_block_us": start.per_block_us,
                              "time": time.time()}  # fmt: skip
    try:
        data = json.dumps(record).encode()
        replace_file(root, LAST_OPEN_NAME, data, tmp_prefix=TMP_PREFIX, sync=False)
    except OSError as exc:
        log.warning("cannot record how the tier opened in %s: %s", root, exc)


def read_last_open(root: str) -> dict[str, Any] | None:
    """What :func:`write_last_open` recorded, or None."""
    try:
        with open(os.path.join(root, LAST_OPEN_NAME), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
