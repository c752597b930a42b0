"""OpenTelemetry instruments for the engine, fed once per step from the core's buffers.

Every metric is defined once in :data:`~aiotier._core.metrics.METRICS` (name, kind, unit,
buckets, labels). The hot path never calls OpenTelemetry: it bumps plain counters in
:class:`~aiotier._core.stats.StepStats`, and :meth:`Telemetry.flush` turns a step's aggregates
into one ``add`` per counter and label set and one ``record`` per histogram sample.

:func:`start_prometheus_server` also serves ``/healthz`` and ``/readyz`` for probes: every
engine created with the provider it returns reports its tiers there (see
``docs/operations.md``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import socket
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from opentelemetry import metrics
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation
from opentelemetry.sdk.metrics import MeterProvider as SDKMeterProvider
from opentelemetry.sdk.metrics.export import MetricReader

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

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from ._engine.status import TierHealth

__all__ = [
    "ALLOCATION_SIZE_BUCKETS",
    "ASYNC_DELAY_BUCKETS",
    "METRICS",
    "PROMOTION_DURATION_BUCKETS",
    "SYNC_DELAY_BUCKETS",
    "HealthChecks",
    "MetricDef",
    "Telemetry",
    "start_otlp_exporter",
    "start_prometheus_server",
]

#: An observed metric's values when metrics are collected: (label values, value) pairs.
GaugeSource = Callable[[], Iterable[tuple[tuple[str, ...], int]]]
#: An engine's ``health`` method.
HealthSource = Callable[[], "Mapping[str, TierHealth]"]

# Samples are handed over at the step boundary, where the current span (if any) is the
# scheduler's, not the request's: an exemplar would point at the wrong trace. An empty context
# says so, and spares the SDK a context lookup per call.
_NO_CONTEXT = Context()


class Telemetry:
    """The engine's instruments on one meter; ``flush`` exports one step's buffers.

    ``gauges`` gives, per gauge row of METRICS, where its per-tier values come from. ``health``
    is the engine's, reported on ``/readyz`` when the provider serves one (it is held weakly
    until :meth:`detach`).
    """

    def __init__(
        self,
        meter_provider: MeterProvider | None,
        gauges: Mapping[str, GaugeSource],
        *,
        health: HealthSource | None = None,
    ) -> None:
        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        from . import __version__

        meter = provider.get_meter("aiotier", __version__)
        self._observers = _observers_of(provider, meter)
        self._observers.add(self, gauges)
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
                continue  # observed: the provider's SharedObservers report them
            self._instruments[m.key] = inst
        self._checks: HealthChecks | None = None
        self._health: HealthSource | None = None
        if health is not None and isinstance(provider, _ServingMeterProvider):
            self._checks, self._health = provider.health_checks, health
            self._checks.add(health)

    def detach(self) -> None:
        """The engine closed: its gauges and ``/readyz`` stop reporting it."""
        self._observers.remove(self)
        if self._checks is not None and self._health is not None:
            self._checks.remove(self._health)
            self._checks = self._health = None

    def flush(self, step: StepSnapshot) -> None:
        """One ``add`` per counter and label set, one ``record`` per sample."""
        instruments = self._instruments
        labels = _attributes
        ctx = _NO_CONTEXT
        for key, values in step.samples.items():
            record = instruments[key[0]].record
            attrs = labels(key)
            for v in values:
                record(v, attrs, ctx)
        for key, n in step.counts.items():
            if n:
                instruments[key[0]].add(n, labels(key), ctx)


class HealthChecks:
    """The engines whose tiers ``/readyz`` reports, held weakly (a dropped engine is gone)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # engines come and go on the loop; probes read in a thread
        self._checks: list[weakref.WeakMethod[HealthSource]] = []

    def add(self, health: HealthSource) -> None:
        with self._lock:
            self._checks.append(weakref.WeakMethod(health))

    def remove(self, health: HealthSource) -> None:
        with self._lock:
            self._checks = [c for c in self._checks if c() not in (None, health)]

    def report(self, exclude: frozenset[str] = frozenset()) -> tuple[bool, dict[str, Any]]:
        """Whether every tier of every engine (but those named in ``exclude``) is ready, and
        the JSON document that says so per tier. No engine means not ready."""
        with self._lock:
            live = [h for h in (c() for c in self._checks) if h is not None]
        engines = []
        for health in live:
            try:
                tiers = {name: t.as_dict() for name, t in health().items()}
            except Exception as exc:  # a broken report is an unready engine, not a crash
                engines.append({"ready": False, "error": repr(exc), "tiers": {}})
                continue
            ready = all(t["ready"] for name, t in tiers.items() if name not in exclude)
            engines.append({"ready": ready, "tiers": tiers})
        ready = bool(engines) and all(e["ready"] for e in engines)
        doc: dict[str, Any] = {"ready": ready, "engines": engines}
        if not engines:
            doc["reason"] = "no open engine uses this meter provider"
        if exclude:
            doc["excluded"] = sorted(exclude)
        return ready, doc


@functools.lru_cache(maxsize=4096)
def _attributes(key: tuple[str, ...]) -> dict[str, str] | None:
    """The attributes of ``(metric key, *label values)``, cached: label sets repeat (tier
    names, results, outcomes). The SDK only reads them."""
    names = metric(key[0]).labels
    return dict(zip(names, key[1:], strict=True)) if names else None


class SharedObservers:
    """The observed instruments of one provider (read when metrics are collected), shared by
    every engine that uses it.

    The SDK keeps one callback per instrument name: registered by each engine, a second engine
    on the same provider would report none of its values, and a closed one would go on
    reporting (and stay alive). Engines add their sources here and remove them when they
    close; each instrument's one callback reports every open engine's values, combining a label
    set that several report by the row's ``combine`` (bytes and counts add up; a breaker state
    reports the worst). Sources are held weakly: an engine dropped without closing stops
    reporting when it is collected.
    """

    def __init__(self, meter: Meter) -> None:
        self._lock = threading.Lock()  # engines come and go on loops; readers collect in threads
        self._sources: weakref.WeakKeyDictionary[object, dict[str, Callable[[], Any]]] = (
            weakref.WeakKeyDictionary()
        )
        for m in METRICS:
            if m.kind is MetricKind.GAUGE:
                create: Any = meter.create_observable_gauge
            elif m.kind is MetricKind.OBSERVED_COUNTER:
                create = meter.create_observable_counter
            else:
                continue
            create(
                m.otel_name, callbacks=[functools.partial(self._observe, m)], unit=m.unit,
                description=m.description,
            )  # fmt: skip

    def add(self, owner: object, sources: Mapping[str, GaugeSource]) -> None:
        """``owner`` reports each observed row from its source until :meth:`remove`."""
        refs = {key: _weakly(source) for key, source in sources.items()}
        with self._lock:
            self._sources[owner] = refs

    def remove(self, owner: object) -> None:
        with self._lock:
            self._sources.pop(owner, None)

    def _observe(self, m: MetricDef, options: CallbackOptions) -> list[Observation]:
        with self._lock:
            refs = [r[m.key] for r in self._sources.values() if m.key in r]
        merged: dict[tuple[str, ...], int] = {}
        for ref in refs:
            source = ref()
            if source is None:
                continue  # its engine is gone
            try:
                values = list(source())
            except Exception:
                continue  # one engine's failing source leaves the others' values
            for labels, value in values:
                old = merged.get(labels)
                merged[labels] = (
                    value if old is None else max(old, value) if m.combine == "max" else old + value
                )
        return [
            Observation(value, _attributes((m.key, *labels))) for labels, value in merged.items()
        ]


def _weakly(source: GaugeSource) -> Callable[[], GaugeSource | None]:
    """A reference to ``source`` that does not keep its engine alive (a bound method's)."""
    if inspect.ismethod(source):
        return weakref.WeakMethod(source)
    return lambda: source


_OBSERVERS = "_aiotier_observers"
_OBSERVERS_LOCK = threading.Lock()


def _observers_of(provider: MeterProvider, meter: Meter) -> SharedObservers:
    """The provider's :class:`SharedObservers` (on ``meter``, its aiotier meter), created with
    its first engine. Kept per provider, not per meter: the global proxy provider hands out a
    new meter per call, whose instruments all reach the real provider once one is set. It lives
    on the provider, so exactly as long: a table keyed by provider would keep it alive (its
    instruments reference the provider)."""
    with _OBSERVERS_LOCK:
        shared = getattr(provider, _OBSERVERS, None)
        if not isinstance(shared, SharedObservers):
            shared = SharedObservers(meter)
            with contextlib.suppress(AttributeError):  # a provider that takes no attribute
                setattr(provider, _OBSERVERS, shared)  # reports this engine's alone
        return shared


class _ServingMeterProvider(SDKMeterProvider):
    """A MeterProvider that also stops the HTTP server it was created with on shutdown, and
    knows the engines that use it (for ``/readyz``)."""

    _server: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.health_checks = HealthChecks()

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        super().shutdown(timeout_millis=timeout_millis)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: no log
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow client never holds the process up at exit


def _json(
    start_response: StartResponse, status: str, doc: Mapping[str, Any]
) -> list[bytes]:
    body = json.dumps(doc, indent=1).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(body))), ("Cache-Control", "no-store")])
    return [body]  # fmt: skip


def _probe_app(metrics_app: WSGIApplication, checks: HealthChecks) -> WSGIApplication:
    """``/healthz`` and ``/readyz``; every other path is the Prometheus exposition."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/healthz":  # the process is up and serving HTTP: nothing else is asked
            return _json(start_response, "200 OK", {"status": "ok"})
        if path == "/readyz":
            query = parse_qs(environ.get("QUERY_STRING") or "")
            exclude = frozenset(n for v in query.get("exclude", ()) for n in v.split(",") if n)
            ready, doc = checks.report(exclude)
            return _json(start_response, "200 OK" if ready else "503 Service Unavailable", doc)
        return metrics_app(environ, start_response)

    return app


def start_prometheus_server(
    port: int = 9464,
    host: str = "127.0.0.1",
    *,
    metric_readers: Sequence[MetricReader] = (),
) -> SDKMeterProvider:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port``; return the provider.

    Pass the result as ``TieringEngine(..., meter_provider=...)``: that engine then reports its
    tiers on ``/readyz`` until it closes. ``/healthz`` answers 200 while the process serves
    HTTP; ``/readyz`` answers 200 when every tier of every open engine using this provider is
    open and neither its engine circuit nor its own is open, else 503 (also before an engine
    opens and after it closes); its JSON body gives each tier's state.
    ``/readyz?exclude=redis,object`` leaves tiers out of the verdict (still reported), for a
    probe that should not fail a whole fleet when a shared server is down.

    ``metric_readers`` are added to the provider next to the Prometheus reader (the demo adds
    an in-memory one for its summary). ``provider.shutdown()`` stops the server. The default
    host is loopback only: expose it wider on purpose, not by accident.
    """
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    provider = _ServingMeterProvider(metric_readers=[reader, *metric_readers])

    class Server(_ThreadingServer):
        pass

    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    Server.address_family, addr = info[0][0], str(info[0][4][0])
    app = _probe_app(make_wsgi_app(registry), provider.health_checks)
    try:
        server = make_server(addr, port, app, Server, handler_class=_QuietHandler)
    except BaseException:
        provider.shutdown()
        raise
    threading.Thread(target=server.serve_forever, name="aiotier-http", daemon=True).start()
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

