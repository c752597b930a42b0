"""Every metric the engine exports, defined once: adding a metric means adding a row here.

The core counts into :class:`~aiotier._core.stats.StepStats` under a row's ``key`` and its label
values; :mod:`aiotier.telemetry` creates one OpenTelemetry instrument per row, records each
step's samples at its boundary and reads the counters' totals (``EngineStats.counters``, under the
same keys) when metrics are collected. The OpenTelemetry name and unit of each row are chosen
so that the Prometheus exporter shows ``prometheus``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["METRICS", "MetricDef", "MetricKind", "metric"]


class MetricKind(enum.StrEnum):
    COUNTER = "counter"
    """Counted by the core per step; exported as its total, read when metrics are collected."""
    HISTOGRAM = "histogram"
    """One sample per observation, recorded at the step boundary."""
    GAUGE = "gauge"
    """Read when metrics are collected, not buffered per step."""
    OBSERVED_COUNTER = "observed_counter"
    """A cumulative count read when metrics are collected (a tier's own counters)."""


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One metric: its key in the step buffers, its instrument, its labels and buckets."""

    key: str
    otel_name: str
    prometheus: str
    kind: MetricKind
    unit: str
    labels: tuple[str, ...]
    description: str
    buckets: tuple[float, ...] | None = None
    #: How an observed row combines the values several engines on one meter report for the
    #: same labels: "sum" (bytes held, counts) or "max" (a state, worst first).
    combine: str = "sum"


SYNC_DELAY_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0)
ASYNC_DELAY_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
ALLOCATION_SIZE_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
PROMOTION_DURATION_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)

_C, _H, _G = MetricKind.COUNTER, MetricKind.HISTOGRAM, MetricKind.GAUGE
_OC = MetricKind.OBSERVED_COUNTER

METRICS: tuple[MetricDef, ...] = (
    MetricDef("sync_delay", "aiotier.lookup_sync_delay", "aiotier_lookup_sync_delay_seconds",
              _H, "s", (),
              "Per request and step: time spent in lookups that consulted a secondary tier.",
              SYNC_DELAY_BUCKETS),
    MetricDef("async_delay", "aiotier.lookup_async_delay", "aiotier_lookup_async_delay_seconds",
              _H, "s", (),
              "Per request: from its first RETRY to the step boundary that observes it.",
              ASYNC_DELAY_BUCKETS),
    MetricDef("allocation_failures", "aiotier.allocation_failures",
              "aiotier_allocation_failures_total", _C, "1", ("phase",),
              "Allocations of primary blocks that could not be satisfied (store or promotion)."),
    MetricDef("allocation_size", "aiotier.allocation_size", "aiotier_allocation_size_blocks",
              _H, "blocks", (),
              "New primary blocks requested per prepare_store/put (also when it fails).",
              ALLOCATION_SIZE_BUCKETS),
    MetricDef("lookups", "aiotier.lookups", "aiotier_lookups_total", _C, "1",
              ("tier", "result"), "Lookup answers per tier consulted (hit, miss, retry)."),
    MetricDef("promotions", "aiotier.promotions", "aiotier_promotions_total", _C, "1",
              ("tier", "outcome"), "Blocks promoted into the primary, by source tier and outcome."),
    MetricDef("promotion_duration", "aiotier.promotion_duration",
              "aiotier_promotion_duration_seconds", _H, "s", ("tier",),
              "Duration of one promotion read (the blocks lookups found in one tier since its "
              "last read started).",
              PROMOTION_DURATION_BUCKETS),
    MetricDef("read_bytes", "aiotier.read", "aiotier_read_bytes_total", _C, "By",
              ("tier",), "Bytes read from a secondary tier by promotions."),
    MetricDef("write_bytes", "aiotier.write", "aiotier_write_bytes_total", _C, "By",
              ("tier",), "Bytes written to a secondary tier (demotions, write-through)."),
    MetricDef("evictions", "aiotier.evictions", "aiotier_evictions_total", _C, "1",
              ("tier",), "Blocks evicted by a tier's policy or budget."),
    MetricDef("expirations", "aiotier.expirations", "aiotier_expirations_total", _C, "1",
              ("tier",),
              "Blocks dropped because they were past their TTL (found by the engine, or by a "
              "tier that expires blocks itself and counts it)."),
    MetricDef("tier_errors", "aiotier.tier_errors", "aiotier_tier_errors_total", _C, "1",
              ("tier", "op"), "Tier operations that raised, timed out or returned corrupt bytes."),
    MetricDef("admissions", "aiotier.admissions", "aiotier_admissions_total", _C, "1",
              ("tier", "decision"),
              "Blocks a tier's admission policy let in (admitted) or kept out (rejected)."),
    MetricDef("prefetches", "aiotier.prefetches", "aiotier_prefetches_total", _C, "1",
              ("outcome",),
              "Prefetches by what was ready at their deadline: complete, partial or none."),
    MetricDef("demotions_dropped", "aiotier.demotions_dropped",
              "aiotier_demotions_dropped_total", _C, "1", ("tier", "reason"),
              "Demotions not written to a tier, shed by design rather than failed: reason "
              "backlog = the pending-write bound (max_pending_write_bytes) was reached."),
    MetricDef("tier_usage", "aiotier.tier_usage", "aiotier_tier_usage_bytes", _G, "By",
              ("tier",), "Bytes held by each tier, read when metrics are collected."),
    MetricDef("tier_breaker_state", "aiotier.tier_breaker_state", "aiotier_tier_breaker_state",
              _G, "1", ("tier",),
              "The engine's circuit breaker for each secondary tier: 0 closed, 1 half-open (a "
              "probe call is on its way), 2 open (calls are skipped).", combine="max"),
    MetricDef("tier_events", "aiotier.tier_events", "aiotier_tier_events_total", _OC, "1",
              ("tier", "event"),
              "What happened inside a tier that the engine cannot see, as the tier counts it "
              "(SecondaryTier.counters(): requests, retries, ...), read when collected."),
)  # fmt: skip

_BY_KEY = {m.key: m for m in METRICS}


def metric(key: str) -> MetricDef:
    """The row for ``key``; ``KeyError`` names a metric that does not exist."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"no metric {key!r} in aiotier._core.metrics.METRICS") from None
