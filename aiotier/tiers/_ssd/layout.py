"""Names in an SSD tier directory: the one place block paths are made and parsed.

The file name is ``blake2b-128(key)``, so no key can name a path outside the directory, and
carries the frame's total size, so a restart can spot a torn file with a ``stat`` and never
has to open one (``docs/ssd.md``, "On-disk layout").
"""

from __future__ import annotations

from typing import Final

from ..framing import block_digest

__all__ = [
    "LOCK_NAME",
    "MARKER_NAME",
    "MARKER_TEXT",
    "RECENCY_NAME",
    "SHARDS",
    "TMP_PREFIX",
    "block_path",
    "block_relpath",
    "key_digest",
    "parse_block_name",
    "tmp_path",
]

MARKER_NAME: Final = "aiotier-ssd"
MARKER_TEXT: Final = "aiotier-ssd 1\n"
LOCK_NAME: Final = "lock"
RECENCY_NAME: Final = "recency"
TMP_PREFIX: Final = ".tmp-"
SHARDS: Final = tuple(f"{i:02x}" for i in range(256))

#: The digest naming a key's file; kept under this name for callers (``aiotier.bench.ssd``).
key_digest = block_digest


def block_relpath(digest: bytes, size: int) -> str:
    """Path of a block file relative to the tier directory: the only place names are made.

    ``<first byte of the digest>/<digest>-<frame size>.blk``, all in lowercase hex; the scan at
    :meth:`SSDTier.open` parses them back (:func:`parse_block_name`).
    """
    h = digest.hex()
    return f"{h[:2]}/{h}-{size:x}.blk"


def block_path(root: str, digest: bytes, size: int) -> str:
    """Where a block file lives: :func:`block_relpath` under the tier directory ``root``."""
    return f"{root}/{block_relpath(digest, size)}"


def tmp_path(root: str, digest: bytes, seq: int) -> str:
    """A write's temporary, in the block's own shard (so the rename stays in one directory);
    ``seq`` keeps concurrent writes of one key apart."""
    h = digest.hex()
    return f"{root}/{h[:2]}/{TMP_PREFIX}{h}-{seq:x}"


def parse_block_name(name: str, shard: str) -> tuple[bytes, int] | None:
    """(digest, size) of a canonical ``<digest>-<size>.blk`` name in ``shard``, else None."""
    if len(name) < 38 or name[32] != "-" or not name.endswith(".blk") or name[:2] != shard:
        return None
    try:
        digest = bytes.fromhex(name[:32])
        size = int(name[33:-4], 16)
    except ValueError:
        return None
    if len(digest) != 16 or digest.hex() != name[:32] or f"{size:x}" != name[33:-4]:
        return None
    return digest, size
