"""OpenTelemetry instruments for the engine, fed once per step from the core's buffers.

Every metric is defined once in :data:`~aiotier._core.metrics.METRICS` (name, kind, unit,
buckets, labels). The hot path never calls OpenTelemetry: it bumps plain counters in
:class:`~aiotier._core.stats.StepStats`, and :meth:`Telemetry.flush` turns a step's aggregates
into one ``add`` per counter and label set and one ``record`` per histogram sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.sdk.metrics import MeterProvider as SDKMeterProvider

from ._core.metrics import (
    ALLOCATION_SIZE_BUCKETS,
    ASYNC_DELAY_BUCKETS,
    METRICS,
    PROMOTION_DURATION_BUCKETS,
    SYNC_DELAY_BUCKETS,
    MetricDef,
    MetricKind,
    metric,
)
from ._core.stats import StepSnapshot

__all__ = [
    "ALLOCATION_SIZE_BUCKETS",
    "ASYNC_DELAY_BUCKETS",
    "METRICS",
    "PROMOTION_DURATION_BUCKETS",
    "SYNC_DELAY_BUCKETS",
    "MetricDef",
    "Telemetry",
    "start_otlp_exporter",
    "start_prometheus_server",
]

UsageSource = Callable[[], Iterable[tuple[str, int]]]

# Samples are handed over at the step boundary, where the current span (if any) is the
# scheduler's, not the request's: an exemplar would point at the wrong trace. An empty context
# says so, and spares the SDK a context lookup per call.
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
            if m.kind is MetricKind.COUNTER:
                inst: Any = meter.create_counter(
                    m.otel_name, unit=m.unit, description=m.description
                )
            elif m.kind is MetricKind.HISTOGRAM:
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
        self._attrs: dict[tuple[str, ...], dict[str, str] | None] = {}

    def _labels(self, key: tuple[str, ...]) -> dict[str, str] | None:
        """Attribute dicts by ``(metric key, *label values)``, cached: label sets repeat."""
        try:
            return self._attrs[key]
        except KeyError:
            names = metric(key[0]).labels
            attrs = dict(zip(names, key[1:], strict=True)) if names else None
            self._attrs[key] = attrs
            return attrs

    def _observe_usage(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(used, self._labels(("tier_usage", t))) for t, used in self._usage()]

    def flush(self, step: StepSnapshot) -> None:
        """One ``add`` per counter and label set, one ``record`` per sample."""
        instruments = self._instruments
        labels = self._labels
        ctx = _NO_CONTEXT
        for key, values in step.samples.items():
            record = instruments[key[0]].record
            attrs = labels(key)
            for v in values:
                record(v, attrs, ctx)
        for key, n in step.counts.items():
            if n:
                instruments[key[0]].add(n, labels(key), ctx)


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

