"""Per-step metric buffers: plain dicts and lists that the hot path touches cheaply.

Counters are keyed by ``(metric key, *label values)`` and samples likewise, with the keys of
:data:`~aiotier._core.metrics.METRICS`; so a new metric needs a row there and nothing here. The
step boundary hands the buffers over with :meth:`StepStats.take`: telemetry makes one ``record``
per sample, and :class:`TotalStats` keeps the counters' totals, which ``EngineStats`` and the
exported (observable) counters read.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = ["StepSnapshot", "StepStats", "TotalStats"]

CountKey = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StepSnapshot:
    """One step's buffers, handed over at the step boundary."""

    counts: Counter[CountKey]
    samples: dict[CountKey, list[float]]


class StepStats:
    """Everything observed since the last step boundary.

    The primary tier's lookup answers are plain ints (the primary-hit path bumps one attribute);
    :meth:`take` folds them into ``("lookups", primary, result)``.
    """

    __slots__ = ("_primary", "counts", "primary_hit", "primary_miss", "primary_retry", "samples")

    def __init__(self, primary: str) -> None:
        self._primary = primary
        self.primary_hit = 0
        self.primary_miss = 0
        self.primary_retry = 0
        self.counts: Counter[CountKey] = Counter()
        self.samples: dict[CountKey, list[float]] = {}

    def count(self, key: str, *labels: str, n: int = 1) -> None:
        self.counts[(key, *labels)] += n

    def observe(self, key: str, value: float, *labels: str) -> None:
        k = (key, *labels)
        values = self.samples.get(k)
        if values is None:
            self.samples[k] = [value]
        else:
            values.append(value)

    def sample_count(self) -> int:
        """How many samples are buffered (flushed early past a bound). Asked without the
        engine's lock, while caller threads may add a sample key: the values are copied at once
        (in C, under the GIL)."""
        return sum(map(len, list(self.samples.values())))

    def peek_counts(self) -> Counter[CountKey]:
        """The counters so far, the primary's lookups included, without resetting anything."""
        out = Counter(self.counts)
        self._fold_primary(out)
        return out

    def take(self) -> StepSnapshot:
        """The buffers of this step; the buffers start empty again."""
        counts = self.counts
        self._fold_primary(counts)
        snap = StepSnapshot(counts, self.samples)
        self.primary_hit = self.primary_miss = self.primary_retry = 0
        self.counts = Counter()
        self.samples = {}
        return snap

    def _fold_primary(self, counts: Counter[CountKey]) -> None:
        primary = self._primary
        if self.primary_hit:
            counts[("lookups", primary, "hit")] += self.primary_hit
        if self.primary_miss:
            counts[("lookups", primary, "miss")] += self.primary_miss
        if self.primary_retry:
            counts[("lookups", primary, "retry")] += self.primary_retry


class TotalStats:
    """Counters accumulated over the engine's life, for ``EngineStats`` snapshots."""

    __slots__ = ("counters",)

    def __init__(self) -> None:
        self.counters: Counter[CountKey] = Counter()

    def merge(self, counts: Counter[CountKey]) -> None:
        self.counters.update(counts)
