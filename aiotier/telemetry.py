"""OpenTelemetry instruments for the engine, fed once per step from the core's buffers.

Every metric is defined once in :data:`~aiotier._core.metrics.METRICS` (name, kind, unit,
buckets, labels). The hot path never calls OpenTelemetry: it bumps plain counters in
:class:`~aiotier._core.stats.StepStats`. At the step boundary the counts join the engine's
totals, which observable counters read when metrics are collected (no SDK call per step), and
:meth:`Telemetry.flush` makes one ``record`` per histogram sample.

:func:`start_prometheus_server` also serves ``/healthz`` and ``/readyz`` for probes: every
engine created with the provider it returns reports its tiers there (see
``docs/operations.md``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import socket
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs
from wsgiref.simple_server import make_server

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
from ._http_server import BoundedWSGIServer, QuietHandler
from ._validate import check_int, check_positive

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

log = logging.getLogger("aiotier.telemetry")

#: An observed metric's values when metrics are collected: (label values, value) pairs.
GaugeSource = Callable[[], Iterable[tuple[tuple[str, ...], int]]]
#: An engine's counter totals as of its last step boundary, by (metric key, *labels): plain
#: data, held by the observers beyond the engine's life (its last counts stay exported).
Counts = Mapping[tuple[str, ...], int]
#: An engine's ``health`` method.
HealthSource = Callable[[], "Mapping[str, TierHealth]"]

# Samples are handed over at the step boundary, where the current span (if any) is the
# scheduler's, not the request's: an exemplar would point at the wrong trace. A context with no
# span says so, and spares the SDK a context lookup per call. It must not be empty: the SDK
# takes an empty (falsy) context as "none given" and looks the current one up.
_NO_CONTEXT = Context({"aiotier.step_export": True})


class Telemetry:
    """The engine's instruments on one meter; ``flush`` exports one step's samples.

    ``gauges`` gives, per gauge row of METRICS, where its per-tier values come from; ``counts``
    holds the engine's counter totals (both are read when metrics are collected). ``health`` is the
    engine's, reported on ``/readyz`` when the provider serves one (it is held weakly until
    :meth:`detach`).
    """

    def __init__(
        self,
        meter_provider: MeterProvider | None,
        gauges: Mapping[str, GaugeSource],
        *,
        counts: Counts | None = None,
        health: HealthSource | None = None,
    ) -> None:
        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        from . import __version__

        meter = provider.get_meter("aiotier", __version__)
        self._registered = SHARED_OBSERVERS.add(
            self, provider, meter, gauges, counts, global_provider=meter_provider is None
        )
        self._instruments: dict[str, Any] = {}
        for m in METRICS:
            if m.kind is MetricKind.HISTOGRAM:
                self._instruments[m.key] = meter.create_histogram(
                    m.otel_name,
                    unit=m.unit,
                    description=m.description,
                    explicit_bucket_boundaries_advisory=list(m.buckets or ()),
                )  # the other kinds are observed: SHARED_OBSERVERS reports them
        self._checks: HealthChecks | None = None
        self._health: HealthSource | None = None
        if health is not None and isinstance(provider, _ServingMeterProvider):
            self._checks, self._health = provider.health_checks, health
            self._checks.add(health)

    def detach(self) -> None:
        """The engine closed: its gauges and ``/readyz`` stop reporting it."""
        SHARED_OBSERVERS.remove(self._registered)
        if self._checks is not None and self._health is not None:
            self._checks.remove(self._health)
            self._checks = self._health = None

    def flush(self, step: StepSnapshot) -> None:
        """One ``record`` per sample (the step's counts are in the totals ``counts`` reads)."""
        instruments = self._instruments
        labels = _attributes
        ctx = _NO_CONTEXT
        for key, values in step.samples.items():
            record = instruments[key[0]].record
            attrs = labels(key)
            for v in values:
                record(v, attrs, ctx)


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
    """The observed instruments (read when metrics are collected) of every engine in the
    process: one set of instruments per provider, each reporting every engine of its group.

    The SDK keeps one callback per instrument name: registered by each engine, a second engine
    on the same provider would report none of its values, and a closed one would go on
    reporting (and stay alive). Engines register their sources here and unregister when they
    close; an instrument's one callback reports every open engine whose provider is its own —
    engines created on the global proxy provider count as engines of the provider set
    globally later — combining a label set several report by the row's ``combine`` (bytes and
    counts add up; a breaker state reports the worst). An engine that leaves keeps its last
    counts in the observed counters, which never go down. Sources are held weakly: an engine
    dropped without closing leaves when it is collected.
    """

    def __init__(self) -> None:
        # engines come and go on loops, readers collect in threads; reentrant: an engine
        # collected while this thread holds the lock leaves through a finalizer that takes it
        self._lock = threading.RLock()
        # every engine not retired yet, held here (not its engine, which it references weakly)
        # so that one being collected is reported until its finalizer retires it: a collection
        # finds each engine's counts either here or in the retired counts, never in neither
        self._engines: set[_Registered] = set()
        # per provider: the last counts of engines that left, by (metric key, labels)
        self._retired: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], int]] = (
            weakref.WeakKeyDictionary()
        )

    def add(
        self,
        owner: object,
        provider: MeterProvider,
        meter: Meter,
        sources: Mapping[str, GaugeSource],
        counts: Counts | None = None,
        *,
        global_provider: bool,
    ) -> _Registered:
        """``owner`` reports each observed row from its source, and each counter row from
        ``counts``, until :meth:`remove` of the registration returned (or until ``owner`` is
        collected). ``global_provider``: ``provider`` is the global one, as found then."""
        engine = _Registered({key: _weakly(src) for key, src in sources.items()}, counts,
                             None if global_provider else provider)  # fmt: skip
        with self._lock:
            self._engines.add(engine)
            first = getattr(provider, _INSTRUMENTED, False) is not True
            if first:
                with contextlib.suppress(AttributeError):  # a provider that takes no attribute
                    setattr(provider, _INSTRUMENTED, True)  # gets instruments per engine
        if first:
            # Not under the lock: the SDK registers an instrument under its own lock, which a
            # collection holds while it runs the callbacks, which take this one.
            try:
                self._instrument(provider, meter, global_provider=global_provider)
            except BaseException:
                with self._lock, contextlib.suppress(AttributeError):
                    setattr(provider, _INSTRUMENTED, False)
                self._retire(engine)
                raise
        weakref.finalize(owner, self._retire, engine)
        return engine

    def remove(self, engine: _Registered) -> None:
        """The engine closed: its gauges stop, its last counts stay in the counters (the tiers'
        read while it is still registered, then all moved to the retired counts at once)."""
        for m in METRICS:
            if m.kind is MetricKind.OBSERVED_COUNTER:
                self._read(engine, m)  # the counts as of the close
        self._retire(engine)

    def _instrument(self, provider: MeterProvider, meter: Meter, *, global_provider: bool) -> None:
        for m in METRICS:
            if m.kind is MetricKind.GAUGE:
                create: Any = meter.create_observable_gauge
            elif m.kind in _CUMULATIVE:
                create = meter.create_observable_counter
            else:
                continue
            observe = functools.partial(self._observe, m, provider, global_provider)
            create(m.otel_name, callbacks=[observe], unit=m.unit, description=m.description)

    def _retire(self, engine: _Registered) -> None:
        with self._lock:
            if engine.gone:
                return
            engine.gone = True
            self._engines.discard(engine)
            group = _group(engine.provider)
            try:
                retired = self._retired.setdefault(group, {})
            except TypeError:  # a provider that cannot be weakly referenced: counts go
                return
            last = dict(engine.last)  # a collector may be updating it
            if engine.counts is not None:
                last.update((k, n) for k, n in list(engine.counts.items()) if n)
            for key, value in last.items():
                retired[key] = retired.get(key, 0) + value

    def _read(self, engine: _Registered, m: MetricDef) -> list[tuple[tuple[str, ...], int]]:
        """``engine``'s values of row ``m`` now (none when its source is gone or fails)."""
        if m.kind is MetricKind.COUNTER:
            key = m.key  # the items are copied in one C call: safe beside the loop's updates
            items = () if engine.counts is None else list(engine.counts.items())
            return [(k[1:], n) for k, n in items if k[0] == key and n]
        ref = engine.sources.get(m.key)
        source = None if ref is None else ref()
        if source is None:
            return []
        try:
            values = list(source())
        except Exception:
            log.warning("aiotier: reading %s failed; left out of this collection", m.otel_name,
                        exc_info=True)  # fmt: skip
            return []
        if m.kind is MetricKind.OBSERVED_COUNTER:
            engine.last.update({(m.key, *labels): value for labels, value in values})
        return values

    def _observe(
        self, m: MetricDef, provider: MeterProvider, global_provider: bool,
        options: CallbackOptions,
    ) -> list[Observation]:  # fmt: skip
        group = _group(None if global_provider else provider)
        with self._lock:
            engines = [e for e in self._engines if _group(e.provider) is group]
            retired = dict(self._retired.get(group, {})) if m.kind in _CUMULATIVE else {}
        merged: dict[tuple[str, ...], int] = {}
        for key, value in retired.items():
            if key[0] == m.key:
                merged[key[1:]] = value
        for engine in engines:
            for labels, value in self._read(engine, m):
                old = merged.get(labels)
                merged[labels] = (
                    value if old is None else max(old, value) if m.combine == "max" else old + value
                )
        return [
            Observation(value, _attributes((m.key, *labels))) for labels, value in merged.items()
        ]


class _Registered:
    """One engine's sources, and its counters' last values."""

    __slots__ = ("counts", "gone", "last", "provider", "sources")

    def __init__(
        self,
        sources: dict[str, Callable[[], GaugeSource | None]],
        counts: Counts | None,
        provider: MeterProvider | None,
    ) -> None:
        self.sources = sources
        self.counts = counts
        self.provider = provider  # None: the global provider, whichever it is at the time
        self.last: dict[tuple[str, ...], int] = {}
        self.gone = False


def _group(provider: MeterProvider | None) -> MeterProvider:
    """The provider an engine's values are exported through (the global one for None)."""
    return metrics.get_meter_provider() if provider is None else provider


def _weakly(source: GaugeSource) -> Callable[[], GaugeSource | None]:
    """A reference to ``source`` that does not keep its engine alive (a bound method's)."""
    if inspect.ismethod(source):
        return weakref.WeakMethod(source)
    return lambda: source


#: Rows exported as cumulative counts read when metrics are collected.
_CUMULATIVE = frozenset((MetricKind.COUNTER, MetricKind.OBSERVED_COUNTER))
_INSTRUMENTED = "_aiotier_instrumented"
#: Every engine's observed instruments (see :class:`SharedObservers`).
SHARED_OBSERVERS = SharedObservers()


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
    read_timeout: float = 10.0,
    max_connections: int = 64,
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

    A client has ``read_timeout`` seconds to send its request; at most ``max_connections``
    are served at once, and one more is answered 503 at once (``docs/security.md``).
    """
    read_timeout = check_positive("read_timeout", read_timeout)
    max_connections = check_int("max_connections", max_connections)
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    provider = _ServingMeterProvider(metric_readers=[reader, *metric_readers])

    class Server(BoundedWSGIServer):
        pass

    Server.read_timeout, Server.max_connections = read_timeout, max_connections

    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    Server.address_family, addr = info[0][0], str(info[0][4][0])
    app = _probe_app(make_wsgi_app(registry), provider.health_checks)
    try:
        server = make_server(addr, port, app, Server, handler_class=QuietHandler)
    except OSError as exc:
        provider.shutdown()
        raise OSError(exc.errno, f"cannot serve metrics on {host}:{port}: {exc.strerror}") from exc
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

