"""``/metrics``, ``/healthz`` and ``/readyz`` as an ASGI app a service mounts on its own port.

:func:`aiotier.telemetry.start_prometheus_server` serves the same three paths on a port of its
own, which a web service behind one port (or several workers sharing one) cannot use.
``aiotier.MetricsApp`` imports this module (and the Prometheus client) on first use.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any
from urllib.parse import parse_qs

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .telemetry import _ServingMeterProvider

__all__ = ["MetricsApp"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class MetricsApp:
    """An ASGI app: ``GET /metrics`` (Prometheus text), ``/healthz`` and ``/readyz``.

    Pass :attr:`meter_provider` to the engines it should report
    (``TieringEngine(..., meter_provider=app.meter_provider)``) and mount it, e.g.
    ``Mount("/ops", app=metrics)`` in Starlette or ``fastapi_app.mount("/ops", metrics)``.
    ``/healthz`` answers 200 while the process serves; ``/readyz`` answers 200 when every tier
    of every open engine on the provider is ready (``?exclude=redis`` leaves tiers out of the
    verdict), else 503, with a JSON body per tier: the same documents as
    ``start_prometheus_server``. The exposition is rendered in a thread, off the event loop.
    ``metric_readers`` are added to the provider beside the Prometheus reader.
    """

    def __init__(self, *, metric_readers: Sequence[MetricReader] = ()) -> None:
        self._registry = CollectorRegistry()
        reader = PrometheusMetricReader(registry=self._registry)
        self._provider = _ServingMeterProvider(metric_readers=[reader, *metric_readers])

    @property
    def meter_provider(self) -> MeterProvider:
        """The provider whose engines this app reports; ``shutdown()`` it when the app stops."""
        return self._provider

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # served alone: nothing to start, the provider to stop
            await _lifespan(receive, send, self._provider.shutdown)
            return
        if scope["type"] != "http":
            return
        path = _route_path(scope)
        if scope["method"] not in ("GET", "HEAD"):
            await _respond(send, 405, b"method not allowed\n", b"text/plain", allow=b"GET, HEAD")
        elif path == "/metrics":
            body = await asyncio.to_thread(generate_latest, self._registry)
            await _respond(send, 200, body, CONTENT_TYPE_LATEST.encode())
        elif path == "/healthz":
            await _respond_json(send, 200, {"status": "ok"})
        elif path == "/readyz":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            exclude = frozenset(n for v in query.get("exclude", ()) for n in v.split(",") if n)
            ready, doc = self._provider.health_checks.report(exclude)
            await _respond_json(send, 200 if ready else 503, doc)
        else:
            await _respond(send, 404, b"not found: /metrics, /healthz, /readyz\n", b"text/plain")


def _route_path(scope: Scope) -> str:
    """The path below where the app is mounted (ASGI's ``root_path`` taken off the path)."""
    path: str = scope.get("path") or "/"
    root: str = scope.get("root_path") or ""
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


async def _respond_json(send: Send, status: int, doc: Mapping[str, Any]) -> None:
    await _respond(send, status, json.dumps(doc, indent=1).encode(), b"application/json")


async def _respond(
    send: Send, status: int, body: bytes, content_type: bytes, *, allow: bytes = b""
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
    ]
    if allow:
        headers.append((b"allow", allow))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send, stop: Callable[[], object]) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            stop()
            await send({"type": "lifespan.shutdown.complete"})
            return
