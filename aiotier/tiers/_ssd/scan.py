"""The header scan: the index rebuilt from the slots themselves, after a crash (or whenever no
checkpoint can be used).

Only headers are read (:func:`~.slot.parse_head`): a slot whose header checksum fails is torn
and counted free; a slot never written or cleared is free. Of two copies of one key the newest
sequence number wins; since a replaced copy is cleared right after its replacement landed, two
copies only exist when the process died in between, and then the newest is read whole and
verified before it wins (a write cut short by the crash must not hide the older copy it was
replacing). Losing copies are cleared. The blocks come back in write order, the best recency a
crash leaves.

Small slots are read in large sequential chunks (a file's headers and payloads together cost
less than a system call per slot); large ones one header at a time, with the next headers
advised ahead so a cold disk serves many at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .layout import Geometry
from .ops import read_slot
from .slot import CLEARED, HEAD_MAX, parse_head

__all__ = ["SlotScan", "scan_slots"]

#: Slots up to this size are scanned by reading whole chunks of their files.
_CHUNKED_SLOT_MAX = 16 << 10
_CHUNK_BYTES = 8 << 20
#: Headers of large slots advised ahead of the one being read.
_ADVISE_AHEAD = 64


@dataclass(slots=True)
class SlotScan:
    """What a header scan found: the blocks (oldest write first) and the free slots' kinds."""

    #: ``(key, slot, seq, length)`` in write order.
    blocks: list[tuple[bytes, int, int, int]] = field(default_factory=list)
    cleared: int = 0
    torn: int = 0
    #: Older copies of a key (and newest copies that did not verify), cleared by the scan.
    duplicates: int = 0
    #: Losing copies whose clearing failed: free slots whose header is still valid.
    dirty: list[int] = field(default_factory=list)


def _heads(fd: int, first: int, count: int, g: Geometry) -> list[bytes | memoryview]:
    """The first bytes of each of ``count`` slots of a file, from slot ``first`` on."""
    size = g.slot_size
    head = min(size, HEAD_MAX)
    out: list[bytes | memoryview] = []
    if size <= _CHUNKED_SLOT_MAX:
        per_chunk = max(1, _CHUNK_BYTES // size)
        for c in range(first, first + count, per_chunk):
            n = min(per_chunk, first + count - c)
            chunk = memoryview(os.pread(fd, n * size, c * size))
            out.extend(chunk[i * size : i * size + head] for i in range(n))
        return out
    for i in range(first, first + count):
        if (i - first) % _ADVISE_AHEAD == 0:
            with contextlib.suppress(OSError):
                for j in range(i, min(first + count, i + _ADVISE_AHEAD)):
                    os.posix_fadvise(fd, j * size, head, os.POSIX_FADV_WILLNEED)
        out.append(os.pread(fd, head, i * size))
    return out


def scan_slots(
    fds: Mapping[int, int], file_slots: Mapping[int, int], g: Geometry, *, repair: bool
) -> SlotScan:
    """Read the header of every slot of the files ``fds`` (file index -> descriptor; file
    ``f`` holds ``file_slots[f]`` slots). With ``repair``, clear the losing copies of keys
    found twice."""
    out = SlotScan()
    best: dict[bytes, tuple[int, int, int]] = {}  # key -> (seq, slot, length)
    twice: dict[bytes, list[tuple[int, int, int]]] = {}
    block_size = g.block_size
    for f, fd in sorted(fds.items()):
        base = f * g.slots_per_file
        count = file_slots[f]
        for step in range(0, count, 4096):  # bounded memory: a few thousand heads at a time
            n = min(4096, count - step)
            for i, buf in enumerate(_heads(fd, step, n, g)):
                got = parse_head(buf, 0, block_size)
                if type(got) is int:  # 0 (blank) is a free slot like the others
                    if got == 1:
                        out.cleared += 1
                    elif got:
                        out.torn += 1
                    continue
                assert isinstance(got, tuple)
                key, seq, length = got
                cand = (seq, base + step + i, length)
                prev = best.get(key)
                if prev is None:
                    best[key] = cand
                    continue
                twice.setdefault(key, [prev]).append(cand)
                if seq > prev[0]:
                    best[key] = cand
    losers: list[int] = []
    for key, cands in twice.items():
        cands.sort(reverse=True)
        winner = None
        for seq, slot, length in cands:
            if winner is None:
                file, off = g.locate(slot)
                if read_slot(fds[file], off, key, seq, length) is not None:
                    winner = (seq, slot, length)
                    continue
            losers.append(slot)
        if winner is None:
            del best[key]
        else:
            best[key] = winner
    out.duplicates = len(losers)
    out.blocks = sorted(((k, s, q, n) for k, (q, s, n) in best.items()), key=lambda b: b[2])
    if repair:
        for slot in losers:
            file, off = g.locate(slot)
            try:
                os.pwrite(fds[file], CLEARED, off)
            except OSError:
                out.dirty.append(slot)
    return out
