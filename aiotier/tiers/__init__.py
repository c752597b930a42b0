"""Secondary tiers: the abstract base and the built-in implementations."""

from .base import SecondaryTier, TierUsage
from .memory import MemoryTier
from .objectstore import ObjectStoreTier  # imports obstore only when a tier is created
from .redis import RedisTier  # imports redis-py only when a RedisTier is created
from .ssd import SSDTier

__all__ = ["MemoryTier", "ObjectStoreTier", "RedisTier", "SSDTier", "SecondaryTier", "TierUsage"]
