"""The index checkpoint: written at a clean close, loaded (and removed) by the next open.

A restart after a clean close reads one file instead of every slot's header. The file says
which key is in which slot, with its sequence number and length, in LRU order, so the order
reads gave the blocks survives the restart; it carries the geometry it was written for and an
xxh3-64 checksum of everything, so a damaged, foreign or stale checkpoint is refused and the
tier falls back to the header scan. The open that loads it removes it before the tier takes a
write, so a later crash can never load an index older than the slots.

A checkpoint put back from a backup is older than the slots it describes. It is bound to them
by a **seal**: the close sets every slot file's modification time to a random nanosecond of
the last second (:func:`seal_files`) and records that value; any later write or clearing of a
slot makes the kernel set the file's modification time to the time of that write, so the seal
no longer matches and the checkpoint is refused (``stale``), whatever else in it still fits.

Layout (little-endian)::

    HEAD                  magic b"ATCP", version, geometry, next_seq, seal, blocks N, dirty D
    N x u64, N x u64, N x u64, N x u16   slots, sequence numbers, lengths, key lengths
    D x u64               free slots whose header may still be valid
    keys                  the N keys, back to back
    u64                   xxh3-64 of all of the above
"""

from __future__ import annotations

import os
import secrets
import struct
import sys
import time
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Final

from ..._types import MAX_KEY_BYTES
from ...errors import ConfigError
from ..framing import checksum
from .index import SSDIndex
from .layout import CHECKPOINT_NAME, TMP_PREFIX, Geometry
from .syscalls import fsync_dir, open_regular, replace_file

__all__ = [
    "Checkpoint",
    "read_checkpoint",
    "remove_checkpoint",
    "seal_files",
    "unsealed",
    "write_checkpoint",
]

_MAGIC: Final = b"ATCP"
_VERSION: Final = 2
# magic, version, reserved, block_size, slot_size, slots_per_file, slots, next_seq, seal, N, D
_HEAD: Final = struct.Struct("<4sHHQQQQQQQQ")
_TRAILER: Final = 8


@dataclass(slots=True)
class Checkpoint:
    """A verified checkpoint: the index as it was at the last clean close."""

    geometry: Geometry
    next_seq: int
    #: The slot files' modification time (ns) when it was written (see the module doc).
    seal: int
    keys: list[bytes]
    slots: array[int]
    seqs: array[int]
    lengths: array[int]
    dirty: array[int]


def _le(typecode: str, raw: bytes | memoryview) -> array[int]:
    a = array(typecode)
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def _raw(a: array[int]) -> bytes:
    if sys.byteorder != "little":
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def seal_files(fds: Iterable[int]) -> int | None:
    """Set the modification time of every file ``fds`` to one fresh random value and return
    it; None when a file system does not keep it to the nanosecond (a seal it cannot tell
    from the time of a later write: no checkpoint is written)."""
    seal = time.time_ns() - 1 - secrets.randbelow(1_000_000_000)
    for fd in fds:
        os.utime(fd, ns=(os.fstat(fd).st_atime_ns, seal))
        if os.fstat(fd).st_mtime_ns != seal:
            return None
    return seal


def unsealed(ck: Checkpoint, fds: Mapping[int, int]) -> bool:
    """Whether a slot file was written (or replaced, or touched) since ``ck`` sealed it."""
    return any(os.fstat(fd).st_mtime_ns != ck.seal for fd in fds.values())


def write_checkpoint(root: str, geometry: Geometry, index: SSDIndex, fds: Iterable[int]) -> bool:
    """Seal the slot files ``fds`` and save ``index`` as ``root/checkpoint`` (through a
    temporary renamed into place); False when the files cannot be sealed (nothing saved)."""
    seal = seal_files(fds)
    if seal is None:
        return False
    keys: list[bytes] = []
    slots, seqs, lengths = array("Q"), array("Q"), array("Q")
    for key, slot, seq, length in index.entries():
        keys.append(key)
        slots.append(slot)
        seqs.append(seq)
        lengths.append(length)
    key_lens = array("H", map(len, keys))
    dirty = array("Q", index.dirty_free())
    g = geometry
    head = _HEAD.pack(
        _MAGIC, _VERSION, 0, g.block_size, g.slot_size, g.slots_per_file, g.slots,
        index.next_seq, seal, len(keys), len(dirty),
    )  # fmt: skip
    body = b"".join((head, _raw(slots), _raw(seqs), _raw(lengths), _raw(key_lens), _raw(dirty),
                     *keys))  # fmt: skip
    blob = body + checksum(body).to_bytes(8, "little")
    replace_file(root, CHECKPOINT_NAME, blob, tmp_prefix=TMP_PREFIX, sync=True)
    return True


def read_checkpoint(root: str) -> Checkpoint | str:
    """The checkpoint in ``root``, verified, or why there is none to use."""
    path = os.path.join(root, CHECKPOINT_NAME)
    try:
        fd = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    try:
        size = os.fstat(fd).st_size
        blob = os.pread(fd, size, 0)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    finally:
        os.close(fd)
    return parse_checkpoint(blob)


def parse_checkpoint(blob: bytes) -> Checkpoint | str:
    """A checkpoint from its bytes, or why they are not one."""
    if len(blob) < _HEAD.size + _TRAILER:
        return "damaged (too short)"
    view = memoryview(blob)
    if checksum(view[:-_TRAILER]) != int.from_bytes(blob[-_TRAILER:], "little"):
        return "damaged (checksum mismatch)"
    magic, version, _r, block_size, slot_size, per_file, slots, next_seq, seal, n, d = (
        _HEAD.unpack_from(blob)
    )
    if magic != _MAGIC or version != _VERSION:
        return f"not a checkpoint of this version ({bytes(magic)!r} {version})"
    at = _HEAD.size
    fixed = 26 * n + 8 * d
    if len(blob) < at + fixed + _TRAILER:
        return "damaged (truncated)"
    slot_a = _le("Q", view[at : at + 8 * n])
    seq_a = _le("Q", view[at + 8 * n : at + 16 * n])
    len_a = _le("Q", view[at + 16 * n : at + 24 * n])
    key_lens = _le("H", view[at + 24 * n : at + 26 * n])
    dirty = _le("Q", view[at + 26 * n : at + fixed])
    offs = list(accumulate(key_lens, initial=at + fixed))
    if offs[-1] != len(blob) - _TRAILER:
        return "damaged (its keys do not add up)"
    keys = [blob[a:b] for a, b in pairwise(offs)]
    if n and (
        max(slot_a) >= slots
        or max(len_a) > block_size
        or max(key_lens) > MAX_KEY_BYTES
        or len(set(slot_a)) != n
        or len(set(keys)) != n
    ):
        return "damaged (entries out of range or repeated)"
    geometry = Geometry(block_size, slot_size, per_file, slots)
    return Checkpoint(geometry, next_seq, seal, keys, slot_a, seq_a, len_a, dirty)


def remove_checkpoint(root: str) -> None:
    """Remove the checkpoint for good (before the tier takes a write: see the module doc)."""
    path = os.path.join(root, CHECKPOINT_NAME)
    if os.path.lexists(path):
        try:
            os.unlink(path)
        except OSError as exc:
            raise ConfigError(
                f"cannot remove the checkpoint {path} ({exc.strerror or exc}): it is not the "
                f"tier's; remove it"
            ) from exc
        fsync_dir(root)
