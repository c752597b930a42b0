"""aiotier: an asyncio-native tiering engine for blocks of bytes.

A small preallocated primary arena sits over larger, slower secondary tiers (memory, a local
SSD, a shared Redis/Valkey, an S3-compatible object store). Lookups answer HIT, MISS or RETRY;
blocks found below the primary are promoted by background tasks; metrics are buffered per step
and exported through OpenTelemetry.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("aiotier")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

from ._core.admission import AdmissionPolicy, AdmitAfter, AdmitAll, AdmitTinyLFU
from ._core.breaker import BreakerPolicy
from ._types import (
    BlockEvent,
    LoadSpec,
    LookupResult,
    PrepareStoreOutput,
    RequestContext,
    StoreSpec,
)
from .blocking import BlockingEngine
from .caching import BYTES, JSON, TEXT, Codec, cached
from .engine import EngineOptions, EngineStats, TierHealth, TieringEngine
from .errors import (
    BlockCorruptedError,
    BlockNotReadyError,
    ConfigError,
    TieringError,
    TierUnavailableError,
)
from .shared_arena import SharedArena
from .tiers.base import (
    BlockMeta,
    SecondaryTier,
    SimpleTier,
    TierCapabilities,
    TierSetup,
    TierUsage,
)
from .tiers.memory import MemoryTier
from .tiers.objectstore import ObjectStoreTier  # obstore is imported only when one is created
from .tiers.primary import PrimaryTier
from .tiers.redis import RedisTier  # redis-py is imported only when a RedisTier is created
from .tiers.ssd import SSDTier

__all__ = [
    "BYTES",
    "JSON",
    "TEXT",
    "AdmissionPolicy",
    "AdmitAfter",
    "AdmitAll",
    "AdmitTinyLFU",
    "BlockCorruptedError",
    "BlockEvent",
    "BlockMeta",
    "BlockNotReadyError",
    "BlockingEngine",
    "BreakerPolicy",
    "Codec",
    "ConfigError",
    "EngineOptions",
    "EngineStats",
    "LoadSpec",
    "LookupResult",
    "MemoryTier",
    "MetricsApp",
    "ObjectStoreTier",
    "PrepareStoreOutput",
    "PrimaryTier",
    "RedisTier",
    "RequestContext",
    "SSDTier",
    "SecondaryTier",
    "SharedArena",
    "SimpleTier",
    "StoreSpec",
    "TierCapabilities",
    "TierHealth",
    "TierSetup",
    "TierUnavailableError",
    "TierUsage",
    "TieringEngine",
    "TieringError",
    "__version__",
    "cached",
]


def __getattr__(name: str) -> Any:
    """``MetricsApp`` is imported on first use: it brings the Prometheus client along."""
    if name == "MetricsApp":
        return import_module("aiotier.web").MetricsApp
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
