"""OpenTelemetry instruments for the engine, fed once per step from the core's buffers.

Every metric is defined once in :data:`METRICS` (name, kind, unit, buckets, labels). The hot path
never calls OpenTelemetry: it bumps plain counters in :class:`~aiotier._core.stats.StepStats`,
and :meth:`Telemetry.flush` turns a step's aggregates into one ``add`` per counter and label set
and one ``record`` per histogram sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.sdk.metrics import MeterProvider as SDKMeterProvider

from ._core.stats import StepStats

__all__ = [
    "METRICS",
    "MetricDef",
    "Telemetry",
    "start_otlp_exporter",
    "start_prometheus_server",
]

SYNC_DELAY_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0)
ASYNC_DELAY_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
ALLOCATION_SIZE_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
PROMOTION_DURATION_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One metric: OTel instrument name and unit chosen so Prometheus shows ``prometheus``."""

    key: str
    otel_name: str
    prometheus: str
    kind: str  # "counter" | "histogram" | "gauge"
    unit: str
    labels: tuple[str, ...]
    description: str
    buckets: tuple[float, ...] | None = None


METRICS: tuple[MetricDef, ...] = (
    MetricDef("sync_delay", "aiotier.lookup_sync_delay", "aiotier_lookup_sync_delay_seconds",
              "histogram", "s", (),
              "Per request and step: time spent in lookups that consulted a secondary tier.",
              SYNC_DELAY_BUCKETS),
    MetricDef("async_delay", "aiotier.lookup_async_delay", "aiotier_lookup_async_delay_seconds",
              "histogram", "s", (),
              "Per request: from its first RETRY to the step boundary that observes it.",
              ASYNC_DELAY_BUCKETS),
    MetricDef("alloc_failures", "aiotier.allocation_failures",
              "aiotier_allocation_failures_total", "counter", "1", ("phase",),
              "Allocations of primary blocks that could not be satisfied (store or promotion)."),
    MetricDef("alloc_size", "aiotier.allocation_size", "aiotier_allocation_size_blocks",
              "histogram", "blocks", (),
              "New primary blocks requested per prepare_store/put (also when it fails).",
              ALLOCATION_SIZE_BUCKETS),
    MetricDef("lookups", "aiotier.lookups", "aiotier_lookups_total", "counter", "1",
              ("tier", "result"), "Lookup answers per tier consulted (hit, miss, retry)."),
    MetricDef("promotions", "aiotier.promotions", "aiotier_promotions_total", "counter", "1",
              ("tier", "outcome"), "Blocks promoted into the primary, by source tier and outcome."),
    MetricDef("promotion_duration", "aiotier.promotion_duration",
              "aiotier_promotion_duration_seconds", "histogram", "s", ("tier",),
              "Duration of one promotion read (a batch of blocks from one tier).",
              PROMOTION_DURATION_BUCKETS),
    MetricDef("read_bytes", "aiotier.read", "aiotier_read_bytes_total", "counter", "By",
              ("tier",), "Bytes read from a secondary tier by promotions."),
    MetricDef("write_bytes", "aiotier.write", "aiotier_write_bytes_total", "counter", "By",
              ("tier",), "Bytes written to a secondary tier (demotions, write-through)."),
    MetricDef("evictions", "aiotier.evictions", "aiotier_evictions_total", "counter", "1",
              ("tier",), "Blocks evicted by a tier's policy or budget."),
    MetricDef("tier_errors", "aiotier.tier_errors", "aiotier_tier_errors_total", "counter", "1",
              ("tier", "op"), "Tier operations that raised, timed out or returned corrupt bytes."),
    MetricDef("tier_usage", "aiotier.tier_usage", "aiotier_tier_usage_bytes", "gauge", "By",
              ("tier",), "Bytes held by each tier, read when metrics are collected."),
)  # fmt: skip

_BY_KEY = {m.key: m for m in METRICS}

UsageSource = Callable[[], Iterable[tuple[str, int]]]

# Samples are handed over at the step boundary, where the current span (if any) is the
# scheduler's, not the request's: an exemplar would point at the wrong trace. An empty context
# says so, and spares the SDK a context lookup per call (about a third of its cost here).
_NO_CONTEXT = Context()


class Telemetry:
    """The engine's instruments on one meter; ``flush`` exports one step's buffers."""

    def __init__(self, meter_provider: MeterProvider | None, usage: UsageSource) -> None:
        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        from . import __version__

        meter = provider.get_meter("aiotier", __version__)
        self._usage = usage
        self._instruments: dict[str, Any] = {}
        for m in METRICS:
            if m.kind == "counter":
                inst: Any = meter.create_counter(
                    m.otel_name, unit=m.unit, description=m.description
                )
            elif m.kind == "histogram":
                inst = meter.create_histogram(
                    m.otel_name,
                    unit=m.unit,
                    description=m.description,
                    explicit_bucket_boundaries_advisory=list(m.buckets or ()),
                )
            else:
                inst = meter.create_observable_gauge(
                    m.otel_name, callbacks=[self._observe_usage], unit=m.unit,
                    description=m.description,
                )
            self._instruments[m.key] = inst
        self._attrs: dict[tuple[str, ...], dict[str, str]] = {}

    def _labels(self, key: str, values: tuple[str, ...]) -> dict[str, str]:
        """Cached attribute dicts: label sets repeat every step."""
        k = (key, *values)
        attrs = self._attrs.get(k)
        if attrs is None:
            attrs = dict(zip(_BY_KEY[key].labels, values, strict=True))
            self._attrs[k] = attrs
        return attrs

    def _observe_usage(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(used, self._labels("tier_usage", (t,))) for t, used in self._usage()]

    def flush(self, s: StepStats, primary: str) -> None:
        i = self._instruments
        ctx = _NO_CONTEXT
        record = i["sync_delay"].record
        for v in s.sync_delays:
            record(v, None, ctx)
        record = i["async_delay"].record
        for v in s.async_delays:
            record(v, None, ctx)
        record = i["alloc_size"].record
        for n in s.alloc_sizes:
            record(n, None, ctx)
        record = i["promotion_duration"].record
        for tier, v in s.promotion_durations:
            record(v, self._labels("promotion_duration", (tier,)), ctx)
        self._add("alloc_failures", ((k,) for k in s.alloc_failures), s.alloc_failures.values())
        lookups = s.lookup_counts(primary)
        self._add("lookups", lookups.keys(), lookups.values())
        self._add("promotions", s.promotions.keys(), s.promotions.values())
        self._add("read_bytes", ((k,) for k in s.read_bytes), s.read_bytes.values())
        self._add("write_bytes", ((k,) for k in s.write_bytes), s.write_bytes.values())
        self._add("evictions", ((k,) for k in s.evictions), s.evictions.values())
        self._add("tier_errors", s.tier_errors.keys(), s.tier_errors.values())

    def _add(self, key: str, label_sets: Iterable[tuple[str, ...]], values: Iterable[int]) -> None:
        add = self._instruments[key].add
        for labels, n in zip(label_sets, values, strict=True):
            if n:
                add(n, self._labels(key, labels), _NO_CONTEXT)


class _ServingMeterProvider(SDKMeterProvider):
    """A MeterProvider that also stops the HTTP server it was created with on shutdown."""

    _server: Any = None

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        super().shutdown(timeout_millis=timeout_millis)


def start_prometheus_server(port: int = 9464, host: str = "127.0.0.1") -> SDKMeterProvider:
    """Serve ``/metrics`` on ``host:port`` from a private registry; return the provider to use.

    Pass the result as ``TieringEngine(..., meter_provider=...)``. ``provider.shutdown()`` stops
    the server. The default host is loopback only: expose it wider on purpose, not by accident.
    """
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    provider = _ServingMeterProvider(metric_readers=[reader])
    server, _thread = start_http_server(port, addr=host, registry=registry)
    provider._server = server
    return provider


def start_otlp_exporter(
    endpoint: str | None = None,
    *,
    interval_seconds: float = 10.0,
    headers: dict[str, str] | None = None,
    timeout_seconds: float = 10.0,
) -> SDKMeterProvider:
    """Export to an OTLP/HTTP endpoint (extra ``otlp``) from a background thread, never the loop.

    ``endpoint`` defaults to ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` or the OTLP default
    ``http://localhost:4318/v1/metrics``. ``provider.shutdown()`` flushes and stops it.
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            "start_otlp_exporter needs the 'otlp' extra: pip install 'aiotier[otlp]'"
        ) from exc
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    exporter = OTLPMetricExporter(endpoint=endpoint, headers=headers, timeout=timeout_seconds)
    reader = PeriodicExportingMetricReader(
        exporter, export_interval_millis=interval_seconds * 1000
    )
    return SDKMeterProvider(metric_readers=[reader])

