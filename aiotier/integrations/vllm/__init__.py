"""aiotier inside vLLM: the offloading manager its scheduler drives, and (with vLLM installed)
the offloading spec and worker vLLM loads by name.

``aiotier.integrations.vllm.manager`` holds the manager and the stand-ins for vLLM's types; it
imports nothing from vLLM. :class:`AiotierOffloadingSpec` subclasses vLLM's own ``OffloadingSpec``
and is imported from ``aiotier.integrations.vllm.spec`` on first use, so this package imports
without vLLM.
"""

from __future__ import annotations

import importlib
from typing import Any

from aiotier.integrations.vllm.manager import (
    AiotierOffloadingManager,
    LoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    OffloadPolicy,
    PrepareStoreOutput,
    PrimaryLoadStoreSpec,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    VllmTypes,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
    to_tier_key,
)

__all__ = [
    "AiotierOffloadingManager",
    "AiotierOffloadingSpec",
    "LoadStoreSpec",
    "LookupResult",
    "OffloadKey",
    "OffloadPolicy",
    "OffloadingEvent",
    "PrepareStoreOutput",
    "PrimaryLoadStoreSpec",
    "ReqContext",
    "RequestOffloadingContext",
    "ScheduleEndContext",
    "VllmTypes",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
    "to_tier_key",
]


def __getattr__(name: str) -> Any:
    """Import the vLLM-facing spec only when asked for: it needs vLLM importable."""
    if name == "AiotierOffloadingSpec":
        return importlib.import_module("aiotier.integrations.vllm.spec").AiotierOffloadingSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
