"""``MetricsApp`` mounted in a service's own ASGI app: the Prometheus text of the engines on its
provider, liveness and readiness, scraped over real HTTP on 127.0.0.1 (uvicorn)."""

from __future__ import annotations

import asyncio
import re
import socket
import urllib.error
import urllib.request

import uvicorn
from helpers import eventually
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from aiotier import MemoryTier, MetricsApp, PrimaryTier, TieringEngine


def _scrape(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def test_a_mounted_metrics_app_serves_metrics_and_probes_on_the_services_port() -> None:
    metrics = MetricsApp()

    async def home(request: object) -> PlainTextResponse:
        return PlainTextResponse("the service")

    app = Starlette(routes=[Route("/", home), Mount("/ops", app=metrics)])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    serving = asyncio.ensure_future(server.serve())
    base = f"http://127.0.0.1:{port}"
    try:
        await eventually(lambda: server.started, what="uvicorn started")
        assert await asyncio.to_thread(_scrape, f"{base}/") == (200, b"the service")
        status, body = await asyncio.to_thread(_scrape, f"{base}/ops/readyz")
        assert status == 503 and b"no open engine" in body  # nothing to report yet
        engine = TieringEngine(
            PrimaryTier(4, 64), [MemoryTier(1 << 20)], meter_provider=metrics.meter_provider
        )
        async with engine:
            assert await engine.put("k", b"v")
            assert await engine.get("k") == b"v"
            assert await engine.get("missing") is None
            status, body = await asyncio.to_thread(_scrape, f"{base}/ops/readyz")
            assert status == 200 and b'"ready": true' in body
            status, body = await asyncio.to_thread(_scrape, f"{base}/ops/healthz")
            assert (status, body) == (200, b'{\n "status": "ok"\n}')

            async def counted() -> bool:
                _, text = await asyncio.to_thread(_scrape, f"{base}/ops/metrics")
                primary = {
                    m.group(1): m.group(2)
                    for m in re.finditer(
                        rb'aiotier_lookups_total\{[^}]*result="(\w+)",tier="primary"\} (\S+)', text
                    )
                }
                return primary == {b"hit": b"1.0", b"miss": b"1.0"}

            deadline = asyncio.get_running_loop().time() + 10
            while not await counted():  # exported within a second with no end_step
                assert asyncio.get_running_loop().time() < deadline, "counters never moved"
                await asyncio.sleep(0.05)
        status, _ = await asyncio.to_thread(_scrape, f"{base}/ops/readyz")
        assert status == 503  # the engine closed
    finally:
        server.should_exit = True
        await serving
        metrics.meter_provider.shutdown()
