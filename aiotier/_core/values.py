"""Values larger than a block, for the cache API: a manifest block under the value's key, and
the value's pieces in blocks of their own.

A piece's key is made of a random value id and the piece's index, never of the value's key: a
``put`` of a new value writes new pieces and then replaces the one manifest block, so a reader
meets one version's manifest and only that version's pieces. The manifest carries the value's
length and a 128-bit digest of all of it, checked when the pieces are put together: a ``get``
returns the whole value or nothing, never a prefix or a mix. The scheduler protocol never sees
any of this: it stores and loads blocks.

A value whose bytes fit in a block is stored as they are, unless they begin with the manifest's
magic: those are stored through a manifest too (where a block can hold one), so a block that
starts with the magic and checks is always a manifest.

A value with a TTL carries its expiry in its own bytes, so that every copy of it, in any tier,
after any eviction or restart, says when it stops being served: a format-2 head (the format-1
fields and ``expires_at``, absolute unix seconds). A value that fits a block together with its
head is stored *inline* (the head with ``pieces=0``, then the value, in one block); a larger one
is pieces and a format-2 manifest. Its pieces' keys carry the expiry too (:func:`piece_expiry`),
so a tier told of it reclaims them as well. Format-1 manifests (no TTL) are still written and
read as before.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import xxhash

__all__ = [
    "HEAD2_BYTES",
    "MANIFEST_MAGIC",
    "PIECE_KEY_PREFIX",
    "Manifest",
    "assemble",
    "block_expiry",
    "check_value_key",
    "encode_inline",
    "max_value_bytes",
    "needs_pieces",
    "parse_manifest",
    "piece_expiry",
    "read_inline",
    "split_value",
    "verified",
]

MANIFEST_MAGIC: Final = b"\x89aiotval"
#: Keys of values' pieces begin with this; the cache API refuses keys of its own that do.
PIECE_KEY_PREFIX: Final = b"\x00aiotier-piece/"
_FORMAT: Final = 1
_FORMAT_TTL: Final = 2
# magic, format, reserved, length, pieces, value id, digest of the value
_HEAD: Final = struct.Struct(">8sB3xQI16s16s")
# format 2: the same, then expires_at (unix seconds, a double)
_HEAD2: Final = struct.Struct(">8sB3xQI16s16sd")
_CHECK: Final = struct.Struct(">Q")  # xxh3-64 of the head
MANIFEST_BYTES: Final = _HEAD.size + _CHECK.size
#: A format-2 head: the manifest of a value with a TTL, or the start of an inline one.
HEAD2_BYTES: Final = _HEAD2.size + _CHECK.size
_EXPIRY: Final = struct.Struct(">d")
_ID_END: Final = len(PIECE_KEY_PREFIX) + 16
#: A piece of a value with a TTL: prefix, value id, expires_at, index.
_TTL_PIECE_KEY_BYTES: Final = _ID_END + _EXPIRY.size + 4


@dataclass(frozen=True, slots=True)
class Manifest:
    """A value of ``length`` bytes in ``pieces`` blocks named by ``value_id``, served until
    ``expires_at`` (unix seconds; None: no TTL). ``pieces == 0``: the value follows the head
    in the same block (inline, format 2 only)."""

    length: int
    pieces: int
    value_id: bytes
    digest: bytes
    expires_at: float | None = None

    def piece_keys(self) -> list[bytes]:
        prefix = PIECE_KEY_PREFIX + self.value_id
        if self.expires_at is not None:
            prefix += _EXPIRY.pack(self.expires_at)
        return [prefix + i.to_bytes(4, "big") for i in range(self.pieces)]

    def encode(self) -> bytes:
        if self.expires_at is None:
            head = _HEAD.pack(
                MANIFEST_MAGIC, _FORMAT, self.length, self.pieces, self.value_id, self.digest
            )
        else:
            head = _HEAD2.pack(
                MANIFEST_MAGIC, _FORMAT_TTL, self.length, self.pieces, self.value_id,
                self.digest, self.expires_at,
            )  # fmt: skip
        return head + _CHECK.pack(xxhash.xxh3_64_intdigest(head))

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


def max_value_bytes(num_blocks: int, block_size: int) -> int:
    """The largest value a primary of ``num_blocks`` blocks can take in one ``put``: its
    pieces and its manifest must all be in the primary at once."""
    return max(num_blocks - 1, 1) * block_size


def needs_pieces(view: memoryview, block_size: int) -> bool:
    """Whether a value goes through a manifest: too large for a block, or it looks like one in
    an engine whose blocks can hold a manifest (in one whose blocks cannot, no block is ever
    taken for a manifest, so lookalikes are stored as they are)."""
    if view.nbytes > block_size:
        return True
    return (
        block_size >= MANIFEST_BYTES
        and view[: len(MANIFEST_MAGIC)].tobytes() == MANIFEST_MAGIC
    )


def check_value_key(key: bytes) -> None:
    """Pieces' keys are the engine's: ``ValueError`` for a caller's key that looks like one."""
    if key.startswith(PIECE_KEY_PREFIX):
        raise ValueError(
            f"key {key[:64]!r} begins with {PIECE_KEY_PREFIX!r}, which names the pieces of "
            "values larger than a block"
        )


def split_value(
    view: memoryview,
    block_size: int,
    value_id: bytes | None = None,
    expires_at: float | None = None,
) -> tuple[Manifest, list[tuple[bytes, memoryview]]]:
    """The manifest of a value and its pieces (views of ``view``, ``block_size`` bytes each but
    the last); format 2 when it has an ``expires_at``."""
    n = -(-view.nbytes // block_size) or 1
    manifest = Manifest(
        view.nbytes, n, value_id if value_id is not None else os.urandom(16),
        xxhash.xxh3_128_digest(view), expires_at,
    )  # fmt: skip
    keys = manifest.piece_keys()
    return manifest, [(keys[i], view[i * block_size : (i + 1) * block_size]) for i in range(n)]


def encode_inline(view: memoryview, expires_at: float) -> bytes:
    """One block holding a value with a TTL: its format-2 head (``pieces=0``), then it."""
    head = Manifest(view.nbytes, 0, bytes(16), xxhash.xxh3_128_digest(view), expires_at)
    return head.encode() + view


def parse_manifest(block: bytes | memoryview) -> Manifest | None:
    """The head a block starts with, or None when it has none (the magic, the format, the
    size or the head's checksum differ). A format-1 manifest or a format-2 one is the whole
    block; an inline value (format 2, ``pieces=0``) is followed by its ``length`` bytes."""
    if len(block) < MANIFEST_BYTES or block[: len(MANIFEST_MAGIC)] != MANIFEST_MAGIC:
        return None
    fmt = block[len(MANIFEST_MAGIC)]
    layout, size = (_HEAD, MANIFEST_BYTES) if fmt == _FORMAT else (_HEAD2, HEAD2_BYTES)
    if fmt not in (_FORMAT, _FORMAT_TTL) or len(block) < size:
        return None
    head = bytes(block[: layout.size])
    (check,) = _CHECK.unpack_from(block, layout.size)
    if xxhash.xxh3_64_intdigest(head) != check:
        return None
    if fmt == _FORMAT:
        _magic, _fmt, length, pieces, value_id, digest = _HEAD.unpack(head)
        expires_at = None
    else:
        _magic, _fmt, length, pieces, value_id, digest, expires_at = _HEAD2.unpack(head)
    if len(block) != (size + length if pieces == 0 and fmt == _FORMAT_TTL else size):
        return None
    if pieces == 0 and fmt == _FORMAT:
        return None
    return Manifest(length, pieces, value_id, digest, expires_at)


_SIZES: Final = struct.Struct(">QI")  # length, pieces: at offset 12 of a head
_SIZES_AT: Final = len(MANIFEST_MAGIC) + 4
_EXPIRY_AT: Final = _HEAD2.size - 8


def read_inline(block: bytes) -> tuple[float, bytes] | None:
    """``(expires_at, value)`` of an inline value (a format-2 head with ``pieces=0`` and the
    value after it), else None. The hits' path: the head's checksum is checked, the value's
    digest is not (a block in the primary holds what was written or verified on its way in,
    as a value without a TTL has none)."""
    if (
        len(block) < HEAD2_BYTES
        or block[len(MANIFEST_MAGIC)] != _FORMAT_TTL
        or not block.startswith(MANIFEST_MAGIC)
    ):
        return None
    length, pieces = _SIZES.unpack_from(block, _SIZES_AT)
    if pieces or length != len(block) - HEAD2_BYTES:
        return None
    (check,) = _CHECK.unpack_from(block, _HEAD2.size)
    if xxhash.xxh3_64_intdigest(memoryview(block)[: _HEAD2.size]) != check:
        return None
    (expires_at,) = _EXPIRY.unpack_from(block, _EXPIRY_AT)
    return expires_at, block[HEAD2_BYTES:]


def piece_expiry(key: bytes) -> float | None:
    """The expiry a piece's key carries (pieces of a value with a TTL), else None."""
    if len(key) != _TTL_PIECE_KEY_BYTES or not key.startswith(PIECE_KEY_PREFIX):
        return None
    (expires_at,) = _EXPIRY.unpack_from(key, _ID_END)
    return float(expires_at)


def block_expiry(key: bytes, block: bytes | memoryview) -> float | None:
    """When the block ``key`` holds stops being served (unix seconds), or None: from its
    format-2 head, or from its key for a piece. Cheap for a block that has neither (a look at
    its first bytes), which is every block of the scheduler protocol."""
    if block[: len(MANIFEST_MAGIC)] == MANIFEST_MAGIC:
        head = parse_manifest(block)
        if head is not None:
            return head.expires_at
    if key.startswith(PIECE_KEY_PREFIX):
        return piece_expiry(key)
    return None


def assemble(manifest: Manifest, pieces: Sequence[bytes | None]) -> bytes | None:
    """The value from its pieces, or None when one is missing or they do not add up to what
    the manifest says (length and digest)."""
    if len(pieces) != manifest.pieces or any(p is None for p in pieces):
        return None
    return verified(manifest, b"".join(pieces))  # type: ignore[arg-type]  # no None left


def verified(manifest: Manifest, value: bytes) -> bytes | None:
    """``value`` if it is the one ``manifest`` names (length and digest), else None."""
    if len(value) != manifest.length or xxhash.xxh3_128_digest(value) != manifest.digest:
        return None
    return value
