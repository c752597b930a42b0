"""The eviction policies a primary can be configured with, by name."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigError
from .lfuda import LFUDAPolicy
from .policy import ARCPolicy, EvictionPolicy, LRUPolicy

__all__ = ["POLICIES", "make_policy"]

#: Policy classes by the names ``PrimaryTier(policy=...)`` and the config file accept.
POLICIES: dict[str, Callable[[int], EvictionPolicy]] = {
    "lru": LRUPolicy,
    "arc": ARCPolicy,
    "lfuda": LFUDAPolicy,
}


def make_policy(name: str, num_blocks: int) -> EvictionPolicy:
    """A new policy for ``num_blocks`` slots, from its name."""
    factory = POLICIES.get(name) if isinstance(name, str) else None
    if factory is None:
        expected = ", ".join(repr(n) for n in POLICIES)
        raise ConfigError(f"unknown eviction policy {name!r}; expected one of {expected}")
    return factory(num_blocks)
