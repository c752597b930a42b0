"""What vLLM knows of each tier below the primary: its medium and locality (for events and
per-request tier filters, vLLM PR #48123) and the cache-hit source of blocks promoted from it.

A memory tier is host memory (``CPU``, ``LOCAL``, ``HOST``), an SSD local storage (``STORAGE``,
``LOCAL``, ``DISK``), Redis and object stores remote storage (``STORAGE``, ``REMOTE``,
``EXTERNAL_UNSPECIFIED``); a wrapper such as ``aiotier.testing.FaultyTier`` is the kind of the
tier it wraps.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from aiotier import MemoryTier, SecondaryTier, SSDTier

from .types import VllmTypes

__all__ = ["TierKinds"]


def _kind(tier: object, media: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(medium, locality, cache hit source)`` member names of a tier below the primary."""
    name = getattr(tier, "name", "")
    while isinstance(getattr(tier, "inner", None), SecondaryTier):
        tier = tier.inner  # type: ignore[attr-defined]
    if isinstance(tier, MemoryTier):
        kind = ("CPU", "LOCAL", "HOST")
    elif isinstance(tier, SSDTier):
        kind = ("STORAGE", "LOCAL", "DISK")
    else:
        kind = ("STORAGE", "REMOTE", "EXTERNAL_UNSPECIFIED")
    medium = media.get(name)
    if isinstance(medium, Enum) and medium.name in ("CPU", "STORAGE"):
        kind = (medium.name, *kind[1:])
    return kind


class TierKinds:
    """The tiers below the primary as vLLM sees them, in ``types``' classes."""

    def __init__(
        self, tiers: Sequence[SecondaryTier], types: VllmTypes, media: Mapping[str, Any]
    ) -> None:
        kinds = [_kind(t, media) for t in tiers]
        self.names = [t.name for t in tiers]
        self.medium = {t.name: types.medium[m] for t, (m, _, _) in zip(tiers, kinds, strict=True)}
        self.locality = {
            t.name: types.locality[loc] for t, (_, loc, _) in zip(tiers, kinds, strict=True)
        }
        self.source = {
            t.name: types.cache_hit_source[src] for t, (_, _, src) in zip(tiers, kinds, strict=True)
        }
        self.excluded = functools.lru_cache(maxsize=64)(self._excluded)

    def _excluded(self, tier_filter: Any) -> str | None:
        """The tier a request's ``load_tier_filter`` leaves out ("": none); None when it leaves
        out more than one (the primary alone then answers: aiotier skips one tier at most)."""
        if tier_filter is None:
            return ""
        left_out = [
            name
            for name in self.names
            if not tier_filter.allows(self.medium[name], self.locality[name])
        ]
        if not left_out:
            return ""
        return left_out[0] if len(left_out) == 1 and len(self.names) > 1 else None
