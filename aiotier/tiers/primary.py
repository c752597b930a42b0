"""The primary tier: a preallocated arena, its block table and its eviction policy."""

from __future__ import annotations

from .._core.arena import Arena
from .._core.policy import make_policy
from .._core.table import BlockTable
from ..errors import ConfigError
from .base import TierUsage

__all__ = ["PrimaryTier"]


class PrimaryTier:
    """The small fast tier: ``num_blocks`` slots of ``block_size`` bytes, evicted by ``policy``.

    It is plain synchronous state; the engine drives it. A block holds up to ``block_size`` bytes
    and remembers its length.
    """

    def __init__(self, num_blocks: int, block_size: int, *, policy: str = "lru") -> None:
        if not isinstance(policy, str):
            raise ConfigError(f"policy must be 'lru' or 'arc', got {policy!r}")
        self.arena = Arena(num_blocks, block_size)
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

    def usage(self) -> TierUsage:
        lengths = self.arena.lengths
        used = sum(lengths[s] for s in self.table.index.values())
        return TierUsage(len(self.table.index), used, self.arena.nbytes)
