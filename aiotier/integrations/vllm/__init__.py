"""aiotier inside vLLM: the offloading manager its scheduler drives, and (with vLLM installed)
the offloading spec and worker vLLM loads by name.

``aiotier.integrations.vllm.manager`` holds the manager, ``.types`` the stand-ins for vLLM's
types, ``.stats`` what ``get_stats`` reports, ``.recency`` how a finished request's use counts
and ``.tier_kinds`` what vLLM knows of each tier; none of them imports vLLM.
:class:`AiotierOffloadingSpec` subclasses vLLM's own ``OffloadingSpec`` and is imported from
``aiotier.integrations.vllm.spec`` on first use, so this package imports without vLLM.
"""

from __future__ import annotations

import importlib
from typing import Any

from aiotier.integrations.vllm.keys import to_tier_key
from aiotier.integrations.vllm.manager import CONFIG_INFO_KEYS, AiotierOffloadingManager
from aiotier.integrations.vllm.stats import metric_definitions
from aiotier.integrations.vllm.types import (
    CacheHitSource,
    LoadStoreSpec,
    Locality,
    LookupResult,
    Medium,
    OffloadingConnectorStats,
    OffloadingEvent,
    OffloadKey,
    OffloadPolicy,
    PrepareStoreOutput,
    PrimaryLoadStoreSpec,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TierFilter,
    TierMatcher,
    VllmTypes,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)

__all__ = [
    "CONFIG_INFO_KEYS",
    "AiotierOffloadingManager",
    "AiotierOffloadingSpec",
    "CacheHitSource",
    "LoadStoreSpec",
    "Locality",
    "LookupResult",
    "Medium",
    "OffloadKey",
    "OffloadPolicy",
    "OffloadingConnectorStats",
    "OffloadingEvent",
    "PrepareStoreOutput",
    "PrimaryLoadStoreSpec",
    "ReqContext",
    "RequestOffloadingContext",
    "ScheduleEndContext",
    "TierFilter",
    "TierMatcher",
    "VllmTypes",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
    "metric_definitions",
    "to_tier_key",
]


def __getattr__(name: str) -> Any:
    """Import the vLLM-facing spec only when asked for: it needs vLLM importable."""
    if name == "AiotierOffloadingSpec":
        return importlib.import_module("aiotier.integrations.vllm.spec").AiotierOffloadingSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
