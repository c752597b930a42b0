"""The cache API's values of any size (``put``, ``get``, ``delete``), over the engine's blocks.

A value that fits a block is one block, as before; a larger one is a manifest block and its
pieces (:mod:`aiotier._core.values`). A value with a TTL carries its expiry in a head: inline
in its one block when it fits with it, else in its manifest; ``get`` answers None for one past
it (wherever it was found) and drops it. ``put`` stays synchronous (a caller's thread can run it):
the pieces and the manifest take their slots in one allocation, and a put that cannot keep them
all changes nothing visible. ``get`` joins pieces found in the primary in one copy, reads the
others concurrently, and returns the whole value or None.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .._core.engine_core import EngineCore
from .._core.values import (
    HEAD2_BYTES,
    MANIFEST_BYTES,
    MANIFEST_MAGIC,
    Manifest,
    assemble,
    encode_inline,
    max_value_bytes,
    needs_pieces,
    parse_manifest,
    read_inline,
    split_value,
    verified,
)
from .._core.writeback import WriteAcks
from .threads import EngineLock

__all__ = ["Values", "has_head"]


def has_head(block: bytes) -> bool:
    """Cheap first test of a block read by ``get``: only these may need their pieces, or
    carry an expiry (every other block is the value itself)."""
    return block.startswith(MANIFEST_MAGIC)


class Values:
    """Values over several blocks for one engine."""

    __slots__ = ("_core", "_get_block", "_guard", "_tiers", "max_bytes")

    def __init__(
        self,
        core: EngineCore,
        tiers: int,
        guard: EngineLock,
        get_block: Callable[[bytes], Awaitable[bytes | None]],
    ) -> None:
        self._core = core
        self._tiers = tiers
        self._guard = guard
        self._get_block = get_block
        #: The largest value a ``put`` takes (its pieces and manifest fill the primary at most).
        self.max_bytes = max_value_bytes(core.arena.num_blocks, core.arena.block_size)

    def put(
        self,
        k: bytes,
        view: memoryview,
        acks: WriteAcks | None = None,
        expires_at: float | None = None,
    ) -> bool:
        """Store the value ``view`` under ``k``: as one block when it fits one (with its head
        when it has an ``expires_at``), else as pieces and a manifest; False (nothing visible
        changed) when the primary cannot keep it now. ``acks`` learns the outcome of its
        write-through writes. Called with the engine's lock held."""
        core = self._core
        block_size = core.arena.block_size
        # a value over several blocks goes whole when replaced (a key held nowhere has none)
        held = k in core.table.index or k in core.coherence.in_transit
        replaced = self.pieces_of(k) if held else []
        if expires_at is None and not needs_pieces(view, block_size):
            stored = core.values.put(k, view, acks)
        elif expires_at is not None and view.nbytes + HEAD2_BYTES <= block_size:
            head = encode_inline(view, expires_at)
            stored = core.values.put(k, head, acks, expires_at=expires_at)
        else:
            stored = self._put_pieces(k, view, block_size, acks, expires_at)
        if stored and replaced:
            self.forget(replaced)
        return stored

    def check_ttl_fits(self, ttl: float) -> None:
        """``ValueError`` naming ``ttl`` when this engine's blocks cannot hold a value's head."""
        block_size = self._core.arena.block_size
        if block_size < HEAD2_BYTES:
            raise ValueError(
                f"ttl={ttl!r}: a value with a TTL carries its expiry in a {HEAD2_BYTES}-byte "
                f"head, and this engine's block_size is {block_size}"
            )

    def _put_pieces(
        self,
        k: bytes,
        view: memoryview,
        block_size: int,
        acks: WriteAcks | None,
        expires_at: float | None,
    ) -> bool:
        need = MANIFEST_BYTES if expires_at is None else HEAD2_BYTES
        if block_size < need:
            raise ValueError(
                f"value for {k[:64]!r} is {view.nbytes} bytes, block_size is {block_size}: values "
                f"over a block need block_size >= {need}"
            )
        if view.nbytes > self.max_bytes:
            raise ValueError(
                f"value for {k[:64]!r} is {view.nbytes} bytes; this engine takes values up to "
                f"{self.max_bytes} bytes (num_blocks - 1 blocks of {block_size})"
            )
        manifest, pieces = split_value(view, block_size, expires_at=expires_at)
        put_value = self._core.values.put_value
        return put_value(k, manifest.encode(), pieces, acks, expires_at=expires_at)

    def inline(self, block: bytes) -> bytes | None:
        """The value a block with a head holds in itself, when it is live; None when it is not
        (pieces to fetch, or past its expiry: :meth:`get` drops it). A primary hit's path:
        lock-free (a caller's thread may ask), no digest (:func:`read_inline`)."""
        got = read_inline(block)
        if got is None or got[0] <= self._core.expiry.wall_clock():
            return None
        return got[1]

    async def get(self, k: bytes, block: bytes) -> bytes | None:
        """The value whose head ``block`` is (its manifest, or itself inline), or ``block``
        itself when it has no head; None when a piece is missing, they do not add up, or the
        value is past its expiry (then dropped from the primary and every tier)."""
        manifest = parse_manifest(block)
        if manifest is None:
            return block
        if manifest.expired(self._core.expiry.wall_clock()):
            with self._guard.lock:
                self._drop_expired(k, manifest)
            return None
        if manifest.pieces == 0:
            return verified(manifest, block[HEAD2_BYTES:])
        keys = manifest.piece_keys()
        with self._guard.lock:
            joined = self._core.values.join_ready(keys)  # all in the primary: one copy, no task
        if joined is not None:
            return verified(manifest, joined)
        pieces = await asyncio.gather(*(self._get_block(pk) for pk in keys))
        return assemble(manifest, pieces)

    def pieces_of(self, k: bytes) -> list[bytes]:
        """The piece keys of the value under ``k`` when its manifest is in the primary (or on
        its way down), to delete with it. Called with the engine's lock held."""
        manifest = self._manifest_held(k)
        return manifest.piece_keys() if manifest is not None else []

    # -- helpers ---------------------------------------------------------------------------------

    def _manifest_held(self, k: bytes) -> Manifest | None:
        """Cheap unless ``k``'s block is manifest-sized (every ``put`` asks)."""
        core = self._core
        slot = core.table.ready_slot(k)
        if slot is not None:
            if core.arena.lengths[slot] not in (MANIFEST_BYTES, HEAD2_BYTES):
                return None
            return parse_manifest(core.arena.data_view(slot))
        down = core.coherence.in_transit.get(k)
        return parse_manifest(down) if down is not None else None

    def _drop_expired(self, k: bytes, manifest: Manifest) -> None:
        """A value read past its expiry (it expired while ``get`` awaited it, or it was read
        around the primary): its pieces go, and so does ``k`` where it is this value. A newer
        value stored meanwhile stays: the primary drops only a slot past its own deadline, and
        only a key the primary no longer has is dropped below (counted for the primary)."""
        core = self._core
        core.expiry.check((k,))
        if k not in core.table.index and k not in core.coherence.in_transit:
            core.expiry.dropped(k, None)
        self.forget(manifest.piece_keys())

    def forget(self, keys: list[bytes]) -> None:
        """Drop pieces from the primary and, in the background, from every tier. Called with
        the engine's lock held."""
        ignore = [_ignore] * self._tiers
        for pk in keys:
            self._core.delete(pk, ignore)


def _ignore(_present: bool) -> None:
    pass
