"""Secondary tiers: the abstract base and the built-in implementations."""

from .base import SecondaryTier, TierUsage
from .memory import MemoryTier

__all__ = ["MemoryTier", "SecondaryTier", "TierUsage"]
