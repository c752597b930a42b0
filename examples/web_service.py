"""An async web service that caches expensive blobs behind aiotier and exposes /metrics.

A plain ASGI app (no framework): ``GET /blob/<name>`` returns a blob that takes a while to
compute, served from the tiers when it was computed before; ``GET /metrics`` is the Prometheus
text of the engine's metrics. The engine runs its step boundary on a 1 s timer.

Run it:  pip install uvicorn && python examples/web_service.py --port 8000
         curl -i http://127.0.0.1:8000/blob/hello ; curl http://127.0.0.1:8000/metrics
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest

from aiotier import MemoryTier, PrimaryTier, SSDTier, TieringEngine

BLOCK = 64 * 1024
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def compute_blob(name: str) -> bytes:
    """Stands for the expensive work (a model call, a render, a query)."""
    await asyncio.sleep(0.05)
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (BLOCK // len(seed)))[: BLOCK // 2]


class App:
    def __init__(self, cache_dir: str) -> None:
        self.registry = CollectorRegistry()
        reader = PrometheusMetricReader(registry=self.registry)
        self.provider = MeterProvider(metric_readers=[reader])
        self.engine = TieringEngine(
            PrimaryTier(64, BLOCK),
            [MemoryTier(16 << 20), SSDTier(cache_dir, 256 << 20)],
            meter_provider=self.provider,
            step_interval=1.0,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            await self.http(scope, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.engine.open()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.engine.aclose()
                self.provider.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope: Scope, send: Send) -> None:
        path: str = scope["path"]
        if path == "/metrics":
            body = await asyncio.to_thread(generate_latest, self.registry)
            await respond(send, 200, body, b"text/plain; version=0.0.4")
        elif path.startswith("/blob/") and len(path) > len("/blob/"):
            name = path[len("/blob/") :]
            data = await self.engine.get(name)
            state = b"hit"
            if data is None:
                data = await compute_blob(name)
                await self.engine.put(name, data)
                state = b"miss"
            await respond(send, 200, data, b"application/octet-stream", [(b"x-cache", state)])
        else:
            await respond(send, 404, b"not found\n", b"text/plain")


async def respond(
    send: Send,
    status: int,
    body: bytes,
    ctype: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
    headers += extra or []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "aiotier-web"))
    args = ap.parse_args()
    uvicorn.run(App(args.cache_dir), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
