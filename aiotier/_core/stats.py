"""Per-step metric buffers: plain ints, dicts and lists that the hot path touches cheaply.

The engine adds to these between step boundaries; ``end_step`` hands the aggregates to the
OpenTelemetry instruments (one ``add`` per counter and label set, one ``record`` per sample)
and resets them. Label values are small fixed sets (tier names, results, outcomes, ops).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["StepStats", "TotalStats"]


@dataclass(slots=True)
class StepStats:
    """Everything observed since the last step boundary."""

    # primary-tier lookup answers, kept as plain ints for the hot path
    primary_hit: int = 0
    primary_miss: int = 0
    primary_retry: int = 0
    # (tier, result) -> count for secondary tiers
    lookups: Counter[tuple[str, str]] = field(default_factory=Counter)
    sync_delays: list[float] = field(default_factory=list)
    async_delays: list[float] = field(default_factory=list)
    alloc_failures: Counter[str] = field(default_factory=Counter)  # phase -> count
    alloc_sizes: list[int] = field(default_factory=list)
    promotions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tier, outcome)
    promotion_durations: list[tuple[str, float]] = field(default_factory=list)
    read_bytes: Counter[str] = field(default_factory=Counter)
    write_bytes: Counter[str] = field(default_factory=Counter)
    evictions: Counter[str] = field(default_factory=Counter)
    tier_errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tier, op)

    def lookup_counts(self, primary: str) -> Counter[tuple[str, str]]:
        """All lookup answers by ``(tier, result)``, the primary's included."""
        out = Counter(self.lookups)
        for result, n in (
            ("hit", self.primary_hit),
            ("miss", self.primary_miss),
            ("retry", self.primary_retry),
        ):
            if n:
                out[(primary, result)] += n
        return out

    def samples(self) -> int:
        """How many list entries are buffered (the engine flushes early past a bound)."""
        return (
            len(self.sync_delays)
            + len(self.async_delays)
            + len(self.alloc_sizes)
            + len(self.promotion_durations)
        )


@dataclass(slots=True)
class TotalStats:
    """Counters accumulated over the engine's life, for ``EngineStats`` snapshots."""

    counters: Counter[tuple[str, ...]] = field(default_factory=Counter)

    def merge(self, step: StepStats, primary: str) -> None:
        c = self.counters
        for (tier, result), n in step.lookup_counts(primary).items():
            c[("lookups", tier, result)] += n
        for phase, n in step.alloc_failures.items():
            c[("allocation_failures", phase)] += n
        for (tier, outcome), n in step.promotions.items():
            c[("promotions", tier, outcome)] += n
        for tier, n in step.read_bytes.items():
            c[("read_bytes", tier)] += n
        for tier, n in step.write_bytes.items():
            c[("write_bytes", tier)] += n
        for tier, n in step.evictions.items():
            c[("evictions", tier)] += n
        for (tier, op), n in step.tier_errors.items():
            c[("tier_errors", tier, op)] += n
