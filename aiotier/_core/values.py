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
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import xxhash

__all__ = [
    "MANIFEST_MAGIC",
    "PIECE_KEY_PREFIX",
    "Manifest",
    "assemble",
    "check_value_key",
    "max_value_bytes",
    "needs_pieces",
    "parse_manifest",
    "split_value",
    "verified",
]

MANIFEST_MAGIC: Final = b"\x89aiotval"
#: Keys of values' pieces begin with this; the cache API refuses keys of its own that do.
PIECE_KEY_PREFIX: Final = b"\x00aiotier-piece/"
_FORMAT: Final = 1
# magic, format, reserved, length, pieces, value id, digest of the value
_HEAD: Final = struct.Struct(">8sB3xQI16s16s")
_CHECK: Final = struct.Struct(">Q")  # xxh3-64 of the head
MANIFEST_BYTES: Final = _HEAD.size + _CHECK.size


@dataclass(frozen=True, slots=True)
class Manifest:
    """A value of ``length`` bytes in ``pieces`` blocks named by ``value_id``."""

    length: int
    pieces: int
    value_id: bytes
    digest: bytes

    def piece_keys(self) -> list[bytes]:
        prefix = PIECE_KEY_PREFIX + self.value_id
        return [prefix + i.to_bytes(4, "big") for i in range(self.pieces)]

    def encode(self) -> bytes:
        head = _HEAD.pack(
            MANIFEST_MAGIC, _FORMAT, self.length, self.pieces, self.value_id, self.digest
        )
        return head + _CHECK.pack(xxhash.xxh3_64_intdigest(head))


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
    view: memoryview, block_size: int, value_id: bytes | None = None
) -> tuple[Manifest, list[tuple[bytes, memoryview]]]:
    """The manifest of a value and its pieces (views of ``view``, ``block_size`` bytes each but
    the last)."""
    n = -(-view.nbytes // block_size) or 1
    manifest = Manifest(
        view.nbytes, n, value_id if value_id is not None else os.urandom(16),
        xxhash.xxh3_128_digest(view),
    )  # fmt: skip
    keys = manifest.piece_keys()
    return manifest, [(keys[i], view[i * block_size : (i + 1) * block_size]) for i in range(n)]


def parse_manifest(block: bytes | memoryview) -> Manifest | None:
    """The manifest a block holds, or None when it is not one (the magic, the format or the
    head's checksum differ)."""
    if len(block) != MANIFEST_BYTES or block[: len(MANIFEST_MAGIC)] != MANIFEST_MAGIC:
        return None
    head = bytes(block[: _HEAD.size])
    (check,) = _CHECK.unpack_from(block, _HEAD.size)
    if xxhash.xxh3_64_intdigest(head) != check:
        return None
    _magic, fmt, length, pieces, value_id, digest = _HEAD.unpack(head)
    if fmt != _FORMAT:
        return None
    return Manifest(length, pieces, value_id, digest)


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
