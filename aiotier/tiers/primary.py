"""The primary tier: a preallocated arena, its block table and its eviction policy."""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import Any

from .._core.arena import Arena, check_geometry
from .._core.eviction import POLICIES, make_policy
from .._core.table import BlockTable
from ..errors import ConfigError
from .base import TierUsage

__all__ = ["PrimaryTier"]


class PrimaryTier:
    """The small fast tier: ``num_blocks`` slots of ``block_size`` bytes, evicted by ``policy``.

    It is plain synchronous state; the engine drives it. A block holds up to ``block_size`` bytes
    and remembers its length. With ``shared_memory=True`` the slots live in a POSIX
    shared-memory segment (:attr:`shared_memory_name`) that worker processes map with
    :class:`~aiotier.SharedArena`; ``shared_memory_stem`` (which implies ``shared_memory``)
    names it, the stem then the geometry, for workers that derive the name rather than being
    told it. The engine removes
    its name when it closes (and so does the tier's garbage collection, or the process's exit,
    if no engine ever did; never a forked child's). Creating one
    makes system calls (and may start Python's resource tracker process): do it before the
    event loop runs, or in a thread (``await asyncio.to_thread(PrimaryTier, ...)``).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        policy: str = "lru",
        shared_memory: bool = False,
        shared_memory_stem: str | None = None,
    ) -> None:
        if not isinstance(policy, str) or policy not in POLICIES:
            expected = ", ".join(repr(n) for n in POLICIES)
            raise ConfigError(f"policy must be one of {expected}, got {policy!r}")
        check_geometry(num_blocks, block_size)
        self._segment: Any = None
        self._release: weakref.finalize[Any, PrimaryTier] | None = None
        if shared_memory or shared_memory_stem is not None:
            from ..shared_arena import create_segment

            self._segment = create_segment(num_blocks, block_size, shared_memory_stem)
            self._release = weakref.finalize(self, _unlink, self._segment, os.getpid())
            # at exit the resource tracker removes it; a finalizer would also run in every
            # forked child that exits, under its parent's feet
            self._release.atexit = False
        try:
            buffer = None if self._segment is None else self._segment.buf
            self.arena = Arena(num_blocks, block_size, buffer=buffer)
        except BaseException:
            self.release_shared_memory()
            raise
        self.policy_name = policy
        self.table = BlockTable(num_blocks, make_policy(policy, num_blocks))
        self.name = "primary"

    @property
    def num_blocks(self) -> int:
        return self.arena.num_blocks

    @property
    def block_size(self) -> int:
        return self.arena.block_size

    def __repr__(self) -> str:
        return (
            f"<PrimaryTier num_blocks={self.num_blocks} block_size={self.block_size} "
            f"policy={self.policy_name!r}>"
        )

    @property
    def shared_memory_name(self) -> str | None:
        """The shared-memory segment holding the slots (``shared_memory=True``), else None."""
        return None if self._segment is None else str(self._segment.name)

    @property
    def shared_memory_released(self) -> bool:
        """The segment's name was removed (its engine closed): no worker can attach any more."""
        return self._release is not None and not self._release.alive

    def release_shared_memory(self) -> None:
        """Remove the segment's name (once; later calls do nothing): no process can attach any
        more, those attached keep their mapping. The engine calls this when it closes."""
        # the segment object stays referenced: the arena's views of it live as long as we do
        if self._release is not None:
            self._release()

    def usage(self) -> TierUsage:
        # a metrics reader's thread asks while the loop changes the index: copied at once
        # (in C, under the GIL), then summed
        slots = list(self.table.index.values())
        lengths = self.arena.lengths
        return TierUsage(len(slots), sum(lengths[s] for s in slots), self.arena.nbytes)


def _unlink(segment: Any, owner: int) -> None:
    if os.getpid() != owner:  # a forked child dropping its copy: the segment is its parent's
        return
    with contextlib.suppress(FileNotFoundError):
        segment.unlink()
