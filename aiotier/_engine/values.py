"""The cache API's values of any size (``put``, ``get``, ``delete``), over the engine's blocks.

A value that fits a block is one block, as before; a larger one is a manifest block and its
pieces (:mod:`aiotier._core.values`). ``put`` stays synchronous (a caller's thread can run it):
the pieces and the manifest take their slots in one allocation, and a put that cannot keep them
all changes nothing visible. ``get`` joins pieces found in the primary in one copy, reads the
others concurrently, and returns the whole value or None.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .._core.engine_core import EngineCore
from .._core.values import (
    MANIFEST_BYTES,
    MANIFEST_MAGIC,
    Manifest,
    assemble,
    max_value_bytes,
    needs_pieces,
    parse_manifest,
    split_value,
    verified,
)
from .._core.writeback import WriteAcks
from .threads import EngineLock

__all__ = ["Values", "looks_like_manifest"]


def looks_like_manifest(block: bytes) -> bool:
    """Cheap first test of a block read by ``get``: only these may need their pieces."""
    return len(block) == MANIFEST_BYTES and block.startswith(MANIFEST_MAGIC)


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

    def put(self, k: bytes, view: memoryview, acks: WriteAcks | None = None) -> bool:
        """Store the value ``view`` under ``k``: as one block when it fits one, else as pieces
        and a manifest; False (nothing visible changed) when the primary cannot keep it now.
        ``acks`` learns the outcome of its write-through writes. Called with the engine's lock
        held."""
        core = self._core
        block_size = core.arena.block_size
        replaced = self.pieces_of(k)  # a value over several blocks goes whole when replaced
        if not needs_pieces(view, block_size):
            stored = core.put(k, view, acks)
        else:
            stored = self._put_pieces(k, view, block_size, acks)
        if stored:
            self.forget(replaced)
        return stored

    def _put_pieces(
        self, k: bytes, view: memoryview, block_size: int, acks: WriteAcks | None
    ) -> bool:
        if block_size < MANIFEST_BYTES:
            raise ValueError(
                f"value for {k[:64]!r} is {view.nbytes} bytes, block_size is {block_size}: values "
                f"over a block need block_size >= {MANIFEST_BYTES}"
            )
        if view.nbytes > self.max_bytes:
            raise ValueError(
                f"value for {k[:64]!r} is {view.nbytes} bytes; this engine takes values up to "
                f"{self.max_bytes} bytes (num_blocks - 1 blocks of {block_size})"
            )
        manifest, pieces = split_value(view, block_size)
        return self._core.put_value(k, manifest.encode(), pieces, acks)

    async def get(self, block: bytes) -> bytes | None:
        """The value whose manifest ``block`` is, or ``block`` itself when it is not a
        manifest; None when a piece is missing or they do not add up."""
        manifest = parse_manifest(block)
        if manifest is None:
            return block
        keys = manifest.piece_keys()
        with self._guard.lock:
            joined = self._core.join_ready(keys)  # all in the primary: one copy, no task
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
            if core.arena.lengths[slot] != MANIFEST_BYTES:
                return None
            return parse_manifest(core.arena.data_view(slot))
        down = core.coherence.in_transit.get(k)
        return parse_manifest(down) if down is not None else None

    def forget(self, keys: list[bytes]) -> None:
        """Drop pieces from the primary and, in the background, from every tier. Called with
        the engine's lock held."""
        ignore = [_ignore] * self._tiers
        for pk in keys:
            self._core.delete(pk, ignore)


def _ignore(_present: bool) -> None:
    pass
