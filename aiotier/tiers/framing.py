"""The self-describing block frame shared by persistent tiers (SSD files, Redis values).

Layout (little-endian)::

    offset size field
    0      4    magic  b"ATBK"
    4      1    format version (1, or 2: the block expires)
    5      1    flags (0; reserved)
    6      2    key length K
    8      8    payload length N
    16     8    xxh3-64 of the payload (version 2: of the expiry and the payload)
    24     K    the block key
    24+K   8    version 2 only: expires_at, unix seconds (a little-endian double)
    ..     N    the payload

A block written with an expiry (:attr:`~aiotier.tiers.base.BlockMeta.expires_at`) is a
version-2 frame, for stores that keep no expiry of their own (an object store): a reader learns
it from :func:`frame_expiry` and treats the block as absent past it. Readers of version 1 only
refuse a version-2 frame (never misread it).

The checksum is xxh3-64 because verifying must cost far less than moving the bytes: it runs
near memory bandwidth, an order of magnitude faster than ``zlib.crc32``. What it costs on the
benchmark machine is reported by ``aiotier bench`` (``xxh3_GBps`` of ``ssd_open`` in
``docs/benchmarks.md``).
A frame that fails any check (:func:`check_header`, :func:`check_payload`: the one place the
rules live) raises :class:`~aiotier.errors.BlockCorruptedError`; its bytes are never handed out.
Nothing in a frame is ever evaluated or unpickled.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Final

import xxhash

from .._types import Buffer
from ..errors import BlockCorruptedError

__all__ = [
    "FORMAT_VERSION",
    "GIL_HELD_HASH",
    "HEADER",
    "MAGIC",
    "FrameHeader",
    "block_digest",
    "check_header",
    "check_payload",
    "checksum",
    "checksum_held",
    "encode_frame",
    "encode_header",
    "frame_expiry",
    "frame_size",
    "parse_header",
    "payload_into",
    "verify_payload",
]

MAGIC: Final = b"ATBK"
FORMAT_VERSION: Final = 1
_EXPIRING_VERSION: Final = 2
HEADER: Final = struct.Struct("<4sBBHQQ")
_EXPIRY: Final = struct.Struct("<d")

checksum = xxhash.xxh3_64_intdigest
#: The most bytes python-xxhash hashes in one call holding the GIL; above it lets the GIL go.
GIL_HELD_HASH: Final = 64 << 10


def checksum_held(data: memoryview) -> int:
    """:data:`checksum` of ``data`` (a flat byte view) hashed without letting the GIL go: in
    pieces of at most :data:`GIL_HELD_HASH` bytes (xxh3's streaming digest is its one-shot
    one). For a thread that must not give the GIL up per block: while the event loop computes,
    winning it back takes up to a switch interval (5 ms; ``docs/ssd.md``, "Writes under a busy
    event loop"), far longer than the hash (~10 µs for 256 KiB)."""
    n = data.nbytes
    if n <= GIL_HELD_HASH:
        return checksum(data)
    hasher = xxhash.xxh3_64()
    update = hasher.update
    for at in range(0, n, GIL_HELD_HASH):
        update(data[at : at + GIL_HELD_HASH])
    return hasher.intdigest()


class FrameHeader:
    """The decoded fixed header plus key of one frame."""

    __slots__ = ("checksum", "key", "payload_len", "payload_offset")

    def __init__(self, key: bytes, payload_len: int, checksum: int) -> None:
        self.key = key
        self.payload_len = payload_len
        self.checksum = checksum
        self.payload_offset = HEADER.size + len(key)


def block_digest(key: bytes) -> bytes:
    """16 bytes naming ``key`` wherever a tier stores it: BLAKE2b-128, collision-resistant, so
    hostile keys can neither collide nor choose a name.

    SSD file names and Redis keys are both derived from it (as hex); changing it would orphan
    every stored block, so it is pinned by tests.
    """
    return hashlib.blake2b(key, digest_size=16).digest()


def frame_size(key: bytes, payload_len: int) -> int:
    """Total bytes of a frame holding ``payload_len`` bytes under ``key``."""
    return HEADER.size + len(key) + payload_len


def encode_header(key: bytes, payload: Buffer, digest: int | None = None) -> bytes:
    """Header and key for ``payload``; the payload follows it unchanged (no copy made here).
    ``digest``: the payload's :data:`checksum` when the caller computed it already."""
    if digest is None:
        digest = checksum(payload)
    return HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(key), len(payload), digest) + key


def encode_frame(key: bytes, payload: Buffer, expires_at: float | None = None) -> bytes:
    """A whole frame (header, key, payload) as one value, for stores that take one buffer;
    version 2, carrying ``expires_at``, when there is one."""
    if expires_at is None:
        return b"".join((encode_header(key, payload), payload))
    tail = _EXPIRY.pack(expires_at) + payload
    n = len(payload)
    head = HEADER.pack(MAGIC, _EXPIRING_VERSION, 0, len(key), n, checksum(tail))
    return b"".join((head, key, tail))


def frame_expiry(frame: Buffer) -> float | None:
    """The expiry a frame carries (version 2), else None. Call it on a frame that passed
    :func:`payload_into` (which verified the expiry with the payload)."""
    mv = memoryview(frame)
    if len(mv) < HEADER.size or mv[4] != _EXPIRING_VERSION:
        return None
    (key_len,) = struct.unpack_from("<H", mv, 6)
    (expires_at,) = _EXPIRY.unpack_from(mv, HEADER.size + key_len)
    return float(expires_at)


def payload_into(frame: Buffer, key: bytes, buf: memoryview) -> int:
    """Verify a whole frame of ``key`` and copy its payload into the start of ``buf`` (the only
    copy made); the payload's length, else :class:`~aiotier.errors.BlockCorruptedError` (a frame
    that fails :func:`check_header` or :func:`check_payload`) or ``ValueError`` (longer than
    ``buf``). Messages name the block, not the tier."""
    mv = memoryview(frame)
    key_len, n, digest = check_header(mv, key, len(mv), expiring=True)
    checked = mv[HEADER.size + key_len :]  # version 2: the expiry, then the payload
    check_payload(checked, key, digest)
    payload = checked[len(checked) - n :]
    if n > len(buf):
        raise ValueError(f"block {key[:64]!r} is {n} bytes, buffer holds {len(buf)}")
    buf[:n] = payload
    return n


def check_header(
    head: Buffer,
    key: bytes | None = None,
    frame_len: int | None = None,
    *,
    expiring: bool = False,
) -> tuple[int, int, int]:
    """Check the start of a frame: its fixed header and stored key; ``(key_len, payload_len,
    checksum)`` when they hold, else :class:`~aiotier.errors.BlockCorruptedError`.

    Every reader of frames (SSD files, Redis values through redis-py or the zero-copy reader,
    :func:`parse_header`) validates through here, so the rules exist once: long enough for a
    header, right magic and version, the stored key equal to ``key`` (any key when ``key`` is
    None), and, when ``frame_len`` (the frame's total length) is given, key and payload lengths
    adding up to it exactly. ``head`` holds the frame's first bytes: the header and the stored
    key, or all of the frame when it is shorter than that (bytes past ``frame_len`` are never
    looked at). Without ``frame_len``, ``len(head)`` bounds the frame and the payload length is
    not checked (a header read on its own). The payload's checksum is :func:`check_payload`'s.
    ``expiring``: a version-2 frame (an expiry between key and payload) is accepted too.

    Messages name what is wrong, not where: callers prefix the tier and file or key.
    """
    size = len(head) if frame_len is None else frame_len
    if size < HEADER.size:
        raise BlockCorruptedError(f"frame of {size} bytes is shorter than a header")
    magic, version, _flags, key_len, payload_len, digest = HEADER.unpack_from(head)
    if magic != MAGIC:
        raise BlockCorruptedError(f"bad magic {bytes(magic)!r}, not an aiotier block")
    if version != FORMAT_VERSION and not (expiring and version == _EXPIRING_VERSION):
        raise BlockCorruptedError(f"unsupported block format version {version}")
    if key is not None and key_len != len(key):
        raise BlockCorruptedError(f"frame holds a key of {key_len} bytes, not {key[:64]!r}")
    if size < HEADER.size + key_len:
        raise BlockCorruptedError(f"frame of {size} bytes is truncated inside its key")
    if key is not None and head[HEADER.size : HEADER.size + key_len] != key:
        raise _other_key(head[HEADER.size : HEADER.size + key_len], key)
    if frame_len is not None:
        extra = _EXPIRY.size if version == _EXPIRING_VERSION else 0
        _check_payload_len(frame_len - HEADER.size - key_len - extra, payload_len, key)
    return key_len, payload_len, digest


def check_payload(payload: Buffer, key: bytes, digest: int) -> None:
    """Raise :class:`~aiotier.errors.BlockCorruptedError` unless ``payload`` has checksum
    ``digest`` (the header's; ``key`` only names the block in the message)."""
    if checksum(payload) != digest:
        raise BlockCorruptedError(f"key {key[:64]!r}: payload checksum mismatch")


def _other_key(stored: Buffer, key: bytes) -> BlockCorruptedError:
    return BlockCorruptedError(f"frame holds key {bytes(stored[:64])!r}, not {key[:64]!r}")


def _check_payload_len(held: int, payload_len: int, key: bytes | None) -> None:
    if held != payload_len:
        who = "" if key is None else f"key {key[:64]!r}: "
        raise BlockCorruptedError(
            f"{who}frame holds {held} payload bytes, header says {payload_len}"
        )


def _located(where: str, exc: BlockCorruptedError) -> BlockCorruptedError:
    return BlockCorruptedError(f"{where}: {exc}" if where else str(exc))


def parse_header(buf: Buffer, *, where: str = "") -> FrameHeader:
    """Decode the header and key at the start of ``buf`` (which must hold at least both).

    For tiers of your own: it applies :func:`check_header`'s rules with any key accepted.
    """
    try:
        key_len, payload_len, digest = check_header(buf)
    except BlockCorruptedError as exc:
        raise _located(where, exc) from None
    return FrameHeader(bytes(buf[HEADER.size : HEADER.size + key_len]), payload_len, digest)


def verify_payload(header: FrameHeader, key: bytes, payload: Buffer, *, where: str = "") -> None:
    """Check that ``payload`` is exactly what ``header`` promised for ``key``."""
    try:
        if header.key != key:
            raise _other_key(header.key, key)
        _check_payload_len(len(payload), header.payload_len, key)
        check_payload(payload, key, header.checksum)
    except BlockCorruptedError as exc:
        raise _located(where, exc) from None
