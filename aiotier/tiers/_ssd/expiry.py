"""Blocks with an expiry on an SSD tier: their deadlines in memory, and kept across restarts.

The index says which block is in which slot; this says, for blocks written with a
:attr:`~aiotier.tiers.base.BlockMeta.expires_at`, when they stop being served (a
:class:`~aiotier._core.deadlines.Deadlines` by key). A block past it answers MISS, leaves the
index and has its slot cleared, like a remove.

Across restarts the deadlines live in the ``expiry`` file, written at every clean close beside
the checkpoint (through a temporary renamed into place)::

    magic b"ATEX", version (u16), reserved (u16), entries N (u64)
    N x (key length u16, write sequence number u64, expires_at f64, key)
    u64                   xxh3-64 of all of the above

Each entry is bound to one write of its key by the write's sequence number (sequence numbers
are tier-wide and never reused for a block that was on disk), so an entry only ever applies to
the very bytes it was written for, whether the next open loads the checkpoint or scans the
headers after a crash; a key written again since has another number and its entry is ignored.
The file is not part of the slot format: a directory without one (older, or a first start)
simply has no deadlines, and blocks written after the last clean close and found by a scan after
a crash come back without theirs. The engine never serves such a block past its expiry
all the same: it checks the expiry the value carries in its bytes when it reads it.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Final

from ..._core.deadlines import Deadlines
from ..base import BlockMeta, Buffer
from ..framing import checksum
from .index import SSDIndex
from .layout import TMP_PREFIX
from .syscalls import open_regular, replace_file, unlink_quiet

__all__ = ["EXPIRY_NAME", "SSDExpiry", "load_expiry", "save_expiry"]

EXPIRY_NAME: Final = "expiry"
_MAGIC: Final = b"ATEX"
_VERSION: Final = 1
_HEAD: Final = struct.Struct("<4sHHQ")
_ENTRY: Final = struct.Struct("<HQd")
_TRAILER: Final = 8


def save_expiry(root: str, index: SSDIndex, deadlines: Deadlines[bytes]) -> None:
    """Write the deadlines of the blocks in ``index`` to ``root/expiry`` (durably); with
    none, no file (a directory of a tier that never saw a TTL has none)."""
    parts: list[bytes] = []
    lru, seq = index.lru, index.seq
    for key, t in deadlines.at.items():
        slot = lru.get(key)
        if slot is not None:
            parts.append(_ENTRY.pack(len(key), seq[slot], t) + key)
    if not parts:
        unlink_quiet(os.path.join(root, EXPIRY_NAME))
        return
    body = _HEAD.pack(_MAGIC, _VERSION, 0, len(parts)) + b"".join(parts)
    blob = body + checksum(body).to_bytes(8, "little")
    replace_file(root, EXPIRY_NAME, blob, tmp_prefix=TMP_PREFIX, sync=True)


def load_expiry(root: str, index: SSDIndex, deadlines: Deadlines[bytes]) -> str:
    """Arm the deadlines ``root/expiry`` holds for blocks of ``index`` (the very writes they
    were saved for); what happened, for the log: "absent", "loaded N", or why it was refused."""
    try:
        fd = open_regular(os.path.join(root, EXPIRY_NAME), os.O_RDONLY)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    try:
        blob = os.pread(fd, os.fstat(fd).st_size, 0)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    finally:
        os.close(fd)
    if len(blob) < _HEAD.size + _TRAILER:
        return "damaged (too short)"
    if checksum(memoryview(blob)[:-_TRAILER]) != int.from_bytes(blob[-_TRAILER:], "little"):
        return "damaged (checksum mismatch)"
    magic, version, _r, n = _HEAD.unpack_from(blob)
    if magic != _MAGIC or version != _VERSION:
        return f"not an expiry file of this version ({bytes(magic)!r} {version})"
    at, end = _HEAD.size, len(blob) - _TRAILER
    lru, seq = index.lru, index.seq
    loaded = 0
    for _ in range(n):
        if at + _ENTRY.size > end:
            return "damaged (truncated)"
        key_len, q, t = _ENTRY.unpack_from(blob, at)
        at += _ENTRY.size
        key = blob[at : at + key_len]
        at += key_len
        slot = lru.get(key)
        if slot is not None and seq[slot] == q:
            deadlines.arm(key, t)
            loaded += 1
    return f"loaded {loaded}"


class SSDExpiry:
    """One SSD tier's deadlines by key, and how many blocks it dropped past theirs."""

    __slots__ = ("deadlines", "expirations")

    def __init__(self) -> None:
        self.deadlines: Deadlines[bytes] = Deadlines()
        #: Blocks dropped because they were past their expiry (``usage().expirations``).
        self.expirations = 0

    def __bool__(self) -> bool:
        """Whether any block has a deadline (else every check is skipped)."""
        return bool(self.deadlines.at)

    def past(self, keys: Iterable[bytes]) -> set[bytes]:
        """Those of ``keys`` past their deadline now."""
        at, now = self.deadlines.at, time.time()
        return {k for k in keys if (t := at.get(k)) is not None and now >= t}

    def due(self, limit: int) -> list[bytes]:
        """Up to ``limit`` keys past their deadline, earliest first."""
        return self.deadlines.due(time.time(), limit)

    def written(
        self,
        items: Sequence[tuple[bytes, Buffer]],
        meta: Sequence[BlockMeta] | None,
        outcomes: Sequence[Exception | None],
    ) -> None:
        """A ``write_many`` ended: each written key's deadline is its write's (None: none)."""
        if meta is None and not self.deadlines.at:
            return
        arm = self.deadlines.arm
        for i, ((k, _), err) in enumerate(zip(items, outcomes, strict=True)):
            if err is None and type(k) is bytes:
                arm(k, None if meta is None else meta[i].expires_at)
