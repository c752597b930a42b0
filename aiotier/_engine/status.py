"""What an engine tells about itself: ``stats()``, ``health()`` and the gauges read at scrape.

None of it is on the hot path: snapshots are built when asked for, and gauges when metrics are
collected (possibly from the exporter's thread, hence every read of core state under the lock).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._core.breaker import STATE_LEVEL, CircuitState
from .._core.engine_core import EngineCore
from ..tiers.base import SecondaryTier, TierUsage
from ..tiers.primary import PrimaryTier
from .breakers import Breakers
from .threads import EngineLock

__all__ = ["EngineStats", "EngineStatus", "TierHealth"]

BreakerState = Literal["closed", "half_open", "open"]


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine.

    ``counters`` holds totals since the engine was created, keyed by metric and labels, e.g.
    ``("lookups", "primary", "hit")``, ``("promotions", "ssd", "ok")``,
    ``("tier_errors", "redis", "read")``.
    """

    tiers: Mapping[str, TierUsage]
    promotions_in_flight: int
    pinned_blocks: int
    pending_writes: int
    step: int
    counters: Mapping[tuple[str, ...], int]


@dataclass(frozen=True, slots=True)
class TierHealth:
    """One tier as a readiness probe sees it (``engine.health()``, ``/readyz``).

    ``open``: the engine has opened the tier and not closed it. ``breaker``: the engine's circuit
    for the tier (``open`` while calls are skipped, ``half_open`` while a probe call is on its
    way). ``available``: the tier's own word (a Redis or object store tier says False while
    its own circuit is open and it probes its server); None when the tier does not say.
    ``failures`` counts consecutive failed calls, ``open_for`` the seconds the engine's circuit
    has been open.
    """

    name: str
    open: bool
    breaker: BreakerState
    available: bool | None
    failures: int = 0
    open_for: float = 0.0

    @property
    def ready(self) -> bool:
        """Open, the engine's circuit closed, and the tier not saying it is unavailable."""
        return self.open and self.breaker == "closed" and self.available is not False

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape ``/readyz`` serves for this tier."""
        return {
            "ready": self.ready,
            "open": self.open,
            "breaker": self.breaker,
            "available": self.available,
            "failures": self.failures,
            "open_for_seconds": round(self.open_for, 3),
        }


class EngineStatus:
    """Builds an engine's snapshots; the engine's ``stats()`` and ``health()`` delegate here."""

    # weakly referable: the meter's gauges read it without keeping the engine alive
    __slots__ = ("__weakref__", "_breakers", "_core", "_guard", "_is_open", "_primary", "_tiers")

    def __init__(
        self,
        core: EngineCore,
        primary: PrimaryTier,
        tiers: Sequence[SecondaryTier],
        guard: EngineLock,
        breakers: Breakers,
        is_open: Callable[[], bool],
    ) -> None:
        self._core = core
        self._primary = primary
        self._tiers = tuple(tiers)
        self._guard = guard
        self._breakers = breakers
        self._is_open = is_open

    def stats(self) -> EngineStats:
        core = self._core
        tiers = dict(self.usages())
        with self._guard.lock:
            return EngineStats(
                tiers=tiers,
                promotions_in_flight=core.inflight.promoting,
                pinned_blocks=core.table.pinned(),
                pending_writes=len(core.writes),
                step=core.step,
                counters=dict(core.counters()),
            )

    def usages(self) -> list[tuple[str, TierUsage]]:
        out = [(self._primary.name, self._primary.usage())]
        for t in self._tiers:
            try:
                out.append((t.name, t.usage()))
            except Exception:
                with self._guard.lock:
                    self._core.stats.count("tier_errors", t.name, "usage")
        return out

    def usage_by_tier(self) -> list[tuple[tuple[str, ...], int]]:
        """The ``aiotier_tier_usage_bytes`` gauge."""
        return [((name,), u.bytes_used) for name, u in self.usages()]

    def breaker_levels(self) -> list[tuple[tuple[str, ...], int]]:
        """The ``aiotier_tier_breaker_state`` gauge: 0 closed, 1 half-open, 2 open."""
        states = self._breakers.states()
        return [((t.name,), STATE_LEVEL[s]) for t, s in zip(self._tiers, states, strict=True)]

    def tier_events(self) -> list[tuple[tuple[str, ...], int]]:
        """``aiotier_tier_events_total``: each tier's own ``counters()`` (one that raises is
        left out of this collection)."""
        out: list[tuple[tuple[str, ...], int]] = []
        for t in self._tiers:
            try:
                counts = [((t.name, str(event)), int(n)) for event, n in t.counters().items()]
            except Exception:
                continue
            out.extend(counts)
        return out

    def health(self) -> dict[str, TierHealth]:
        is_open = self._is_open()
        out = {self._primary.name: TierHealth(self._primary.name, is_open, "closed", True)}
        with self._guard.lock:
            states = self._breakers.core.states()
            breakers = [self._breakers.breaker(ti) for ti in range(len(self._tiers))]
            figures = [(0, 0.0) if b is None else (b.failures, b.open_for()) for b in breakers]
        for t, state, (failures, open_for) in zip(self._tiers, states, figures, strict=True):
            available = _available(t)
            out[t.name] = TierHealth(
                t.name, is_open, _STATE_NAMES[state], available, failures, open_for
            )
        return out


_STATE_NAMES: dict[CircuitState, BreakerState] = {
    CircuitState.CLOSED: "closed",
    CircuitState.HALF_OPEN: "half_open",
    CircuitState.OPEN: "open",
}


def _available(tier: SecondaryTier) -> bool | None:
    """The tier's own ``available``; a tier whose answer raises is taken as unavailable."""
    try:
        return tier.available
    except Exception:
        return False
