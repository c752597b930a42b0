"""Secondary tiers: the abstract base and the built-in implementations."""

from .base import BlockMeta, SecondaryTier, SimpleTier, TierCapabilities, TierSetup, TierUsage
from .memory import MemoryTier
from .objectstore import ObjectStoreTier  # imports obstore only when a tier is created
from .redis import RedisTier  # imports redis-py only when a RedisTier is created
from .ssd import SSDTier

__all__ = [
    "BlockMeta",
    "MemoryTier",
    "ObjectStoreTier",
    "RedisTier",
    "SSDTier",
    "SecondaryTier",
    "SimpleTier",
    "TierCapabilities",
    "TierSetup",
    "TierUsage",
]
