"""The slot header of SSD format 2: what starts every slot, how it is written and checked.

Layout (little-endian), at the start of a slot::

    offset size field
    0      8    xxh3-64 of bytes 8 .. 48+K (the header checksum; 0 = cleared)
    8      4    magic  b"ATSL"
    12     2    slot format version (2)
    14     2    reserved (0)
    16     8    write sequence number (tier-wide, increasing, from 1)
    24     24   the shared block frame header (``framing``: magic, version, K, N, payload xxh3)
    48     K    the key
    48+K   N    the payload

The frame header inside is the one every persistent tier writes, checked by the same code
(:func:`~aiotier.tiers.framing.check_header`, :func:`~aiotier.tiers.framing.check_payload`).
Around it the slot adds what a slot needs: its own magic and version, so a slot is known
without its index; the sequence number, so the newest of two copies of a key wins after a crash
and a read knows it found the very write the index points at; and a checksum of the header,
so the start-up scan, which reads headers only, tells a whole header from a torn one.

A read knows the key, sequence number and length it expects, so it compares the header with
them and needs only one hash call, the payload's (:func:`check_slot`). The scan knows nothing
and checks the header checksum instead (:func:`parse_head`). Clearing a slot writes zeros over
the header checksum alone (:data:`CLEARED`): reads already under way still verify, the scan
sees a free slot.
"""

from __future__ import annotations

import struct
from typing import Final

from ..._types import MAX_KEY_BYTES, Buffer
from ...errors import BlockCorruptedError
from ..framing import HEADER, check_header, check_payload, checksum, encode_header

__all__ = [
    "CLEARED",
    "HEAD_MAX",
    "HEAD_SIZE",
    "PREFIX",
    "SLOT_MAGIC",
    "SLOT_VERSION",
    "check_slot",
    "encode_head",
    "parse_head",
]

SLOT_MAGIC: Final = b"ATSL"
SLOT_VERSION: Final = 2
#: Header checksum, magic, version, reserved, sequence number.
PREFIX: Final = struct.Struct("<Q4sHHQ")
_BODY: Final = struct.Struct("<4sHHQ")
#: A slot header without its key.
HEAD_SIZE: Final = PREFIX.size + HEADER.size
#: The longest slot header (with a key of the longest length).
HEAD_MAX: Final = HEAD_SIZE + MAX_KEY_BYTES
#: What clearing a slot writes at its start.
CLEARED: Final = bytes(8)
_KEY_LEN: Final = struct.Struct("<H")
_KEY_LEN_AT: Final = PREFIX.size + 6  # the frame header's key length


def encode_head(key: bytes, seq: int, payload: Buffer, digest: int | None = None) -> bytes:
    """The slot header (with the key) of ``payload`` written as write ``seq`` of ``key``;
    ``digest``: the payload's checksum when the caller computed it already."""
    body = _BODY.pack(SLOT_MAGIC, SLOT_VERSION, 0, seq) + encode_header(key, payload, digest)
    return checksum(body).to_bytes(8, "little") + body


def check_slot(head: Buffer, key: bytes, seq: int, payload: memoryview) -> int:
    """Check a slot read as ``head`` (header and key) and ``payload``, against what the index
    expects there: write ``seq`` of ``key`` with ``payload.nbytes`` bytes. The payload length,
    else :class:`~aiotier.errors.BlockCorruptedError`. One hash call: the payload's."""
    _hc, magic, version, _reserved, stored_seq = PREFIX.unpack_from(head)
    if magic != SLOT_MAGIC or version != SLOT_VERSION:
        raise BlockCorruptedError(f"key {key[:64]!r}: not a format-{SLOT_VERSION} slot")
    if stored_seq != seq:
        raise BlockCorruptedError(
            f"key {key[:64]!r}: the slot holds write {stored_seq}, the index expects {seq}"
        )
    frame = memoryview(head)[PREFIX.size :]
    _key_len, n, digest = check_header(frame, key, HEADER.size + len(key) + payload.nbytes)
    check_payload(payload, key, digest)
    return n


def parse_head(buf: Buffer, off: int, block_size: int) -> tuple[bytes, int, int] | int:
    """``(key, seq, payload length)`` of the slot header at ``buf[off:]``, or why there is none:
    0 (blank: never written, or not ours), 1 (cleared), 2 (torn or damaged).

    ``buf`` holds at least :data:`HEAD_MAX` bytes from ``off`` (or up to the slot's end). The
    payload is not checked here: its checksum is checked by every read.
    """
    if len(buf) - off < HEAD_SIZE:
        return 2
    hc, magic, version, _reserved, seq = PREFIX.unpack_from(buf, off)
    if magic != SLOT_MAGIC or version != SLOT_VERSION:
        return 2 if hc else 0
    if hc == 0:
        return 1
    (key_len,) = _KEY_LEN.unpack_from(buf, off + _KEY_LEN_AT)
    end = off + HEAD_SIZE + key_len
    if key_len > MAX_KEY_BYTES or end > len(buf):
        return 2
    head = bytes(buf[off:end])  # one copy of at most HEAD_MAX bytes, from any buffer type
    if checksum(memoryview(head)[8:]) != hc:
        return 2
    try:
        _kl, n, _digest = check_header(head[PREFIX.size :])
    except BlockCorruptedError:
        return 2
    if n > block_size or seq == 0:
        return 2
    return head[HEAD_SIZE:], seq, n
