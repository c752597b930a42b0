"""What ``get_stats`` gives vLLM: its CPU manager's figures, and aiotier's per tier.

vLLM turns the payload into Prometheus metrics on its own scrape endpoint, for the metric names
its offloading spec declares (:func:`metric_definitions` gives them, in vLLM's classes). The CPU
manager's figures keep vLLM's names (``vllm:kv_offload_cpu_*``) so dashboards built for it work
unchanged; tier figures use vLLM's tiering names with a ``tier`` label (``"0:primary"``,
``"1:<tier name>"``, ...) as its tiering manager reports them (PR #45959), counting what
happened since the previous call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from aiotier import EngineStats

__all__ = ["MetricDef", "StatsTaker", "metric_definitions", "tier_labels"]

CPU_CACHE_USAGE_PERC = "vllm:kv_offload_cpu_cache_usage_perc"
CPU_ALLOCATION_SIZE = "vllm:kv_offload_cpu_allocation_size"
CPU_CACHE_WRITE_USAGE_PERC = "vllm:kv_offload_cpu_cache_write_usage_perc"
CPU_CACHE_READ_USAGE_PERC = "vllm:kv_offload_cpu_cache_read_usage_perc"
READ_BYTES = "vllm:kv_offload_tiering_read_bytes"
WRITE_BYTES = "vllm:kv_offload_tiering_write_bytes"
PROMOTION_JOB_FAILURES = "vllm:kv_offload_tiering_promotion_job_failures"
CHUNK_QUERIES = "vllm:kv_offload_tiering_chunk_queries"
CHUNK_HITS = "vllm:kv_offload_tiering_chunk_hits"
PROMOTION_ALLOCATION_FAILURES = "vllm:kv_offload_tiering_promotion_allocation_failures"
ACTIVE_PROMOTION_JOBS = "vllm:kv_offload_tiering_active_promotion_jobs"
EVICTIONS = "vllm:kv_offload_aiotier_evictions"
TIER_ERRORS = "vllm:kv_offload_aiotier_tier_errors"
TIER_USAGE_BYTES = "vllm:kv_offload_aiotier_tier_usage_bytes"


class MetricDef(NamedTuple):
    kind: str  # "counter", "gauge" or "histogram"
    documentation: str
    labelnames: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


_TIER = ("tier",)
METRICS: Mapping[str, MetricDef] = {
    CPU_CACHE_USAGE_PERC: MetricDef("gauge", "Share of aiotier's primary slots in use (pinned "
                                    "by a load or a store in flight)."),
    CPU_ALLOCATION_SIZE: MetricDef("histogram", "Blocks each prepare_store tried to allocate "
                                   "in aiotier's primary.",
                                   buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512)),
    CPU_CACHE_WRITE_USAGE_PERC: MetricDef("gauge", "Share of aiotier's primary slots a store "
                                          "in flight writes."),
    CPU_CACHE_READ_USAGE_PERC: MetricDef("gauge", "Share of aiotier's primary slots pinned "
                                         "other than by a store (loads, promotions)."),
    CHUNK_QUERIES: MetricDef("counter", "Lookups a tier answered HIT or MISS.", _TIER),
    CHUNK_HITS: MetricDef("counter", "Lookups a tier answered HIT.", _TIER),
    READ_BYTES: MetricDef("counter", "Bytes promoted from a tier into the primary.", _TIER),
    WRITE_BYTES: MetricDef("counter", "Bytes written to a tier.", _TIER),
    PROMOTION_JOB_FAILURES: MetricDef("counter", "Promotion reads from a tier that failed or "
                                      "timed out.", _TIER),
    PROMOTION_ALLOCATION_FAILURES: MetricDef("counter", "Promotions that found no primary slot."),
    ACTIVE_PROMOTION_JOBS: MetricDef("gauge", "Promotion reads from a tier in flight.", _TIER),
    EVICTIONS: MetricDef("counter", "Blocks a tier evicted.", _TIER),
    TIER_ERRORS: MetricDef("counter", "Failed tier calls, by operation.", ("tier", "op")),
    TIER_USAGE_BYTES: MetricDef("gauge", "Bytes a tier holds.", _TIER),
}  # fmt: skip


def metric_definitions(base: Any) -> dict[str, Any]:
    """The metrics :meth:`AiotierOffloadingManager.get_stats` reports, as vLLM's metadata
    classes from its ``vllm.v1.kv_offload.base`` module: what an offloading spec's
    ``build_metric_definitions`` returns so that vLLM exports them."""
    out: dict[str, Any] = {}
    for name, m in METRICS.items():
        if m.kind == "counter":
            out[name] = base.OffloadingCounterMetadata(m.documentation, m.labelnames)
        elif m.kind == "gauge":
            out[name] = base.OffloadingGaugeMetadata(m.documentation, m.labelnames)
        else:
            out[name] = base.OffloadingHistogramMetadata(m.documentation, m.labelnames, m.buckets)
    return out


def tier_labels(primary: str, tiers: Sequence[str]) -> dict[str, tuple[str]]:
    """Each tier's ``tier`` label, as vLLM's tiering manager names its tiers."""
    out = {primary: ("0:primary",)}
    for i, name in enumerate(tiers, 1):
        out[name] = (f"{i}:{name}",)
    return out


class StatsTaker:
    """Turns engine snapshots into vLLM payloads: counters as growth since the last call."""

    def __init__(self, labels: Mapping[str, tuple[str]]) -> None:
        self._labels = labels
        self._last: Counter[tuple[str, ...]] = Counter()

    def take(
        self,
        stats: Any,
        snap: EngineStats,
        num_blocks: int,
        storing: int,
        allocation_sizes: Sequence[int],
        promotions_by_tier: Mapping[str, int],
    ) -> Any:
        """Fill ``stats`` (vLLM's payload, empty) from ``snap`` and return it."""
        n = max(num_blocks, 1)
        usage = min(snap.pinned_blocks / n, 1.0)
        write = min(storing / n, usage)
        stats.set_gauge(CPU_CACHE_USAGE_PERC, usage)
        stats.set_gauge(CPU_CACHE_WRITE_USAGE_PERC, write)
        stats.set_gauge(CPU_CACHE_READ_USAGE_PERC, max(usage - write, 0.0))
        for size in allocation_sizes:
            stats.observe_histogram(CPU_ALLOCATION_SIZE, size)
        labels = self._labels
        grown = Counter(snap.counters)
        grown.subtract(self._last)
        self._last = Counter(snap.counters)
        for key, value in grown.items():
            if value <= 0:
                continue
            name, *rest = key
            tier = labels.get(rest[0]) if rest else None
            metrics = _COUNTED.get((name, rest[1] if len(rest) > 1 else ""), ())
            if name == "allocation_failures" and rest == ["promotion"]:
                stats.increase_counter(PROMOTION_ALLOCATION_FAILURES, value)
            elif name == "tier_errors" and tier is not None and len(rest) > 1:
                stats.increase_counter(TIER_ERRORS, value, (*tier, rest[1]))
            elif tier is not None:
                for metric in metrics or _COUNTED.get((name, "*"), ()):
                    stats.increase_counter(metric, value, tier)
        for name, label in labels.items():
            if name in promotions_by_tier or label != ("0:primary",):
                stats.set_gauge(ACTIVE_PROMOTION_JOBS, promotions_by_tier.get(name, 0), label)
            usage_of = snap.tiers.get(name)
            if usage_of is not None:
                stats.set_gauge(TIER_USAGE_BYTES, usage_of.bytes_used, label)
        return stats


#: (aiotier counter, its outcome label or "*" for any) -> vLLM metrics it adds to, per tier
_COUNTED: Mapping[tuple[str, str], tuple[str, ...]] = {
    ("lookups", "hit"): (CHUNK_QUERIES, CHUNK_HITS),
    ("lookups", "miss"): (CHUNK_QUERIES,),
    ("read_bytes", "*"): (READ_BYTES,),
    ("write_bytes", "*"): (WRITE_BYTES,),
    ("promotions", "error"): (PROMOTION_JOB_FAILURES,),
    ("promotions", "timeout"): (PROMOTION_JOB_FAILURES,),
    ("evictions", "*"): (EVICTIONS,),
}
