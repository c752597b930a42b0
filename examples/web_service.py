"""A Starlette service that caches expensive results in aiotier, with its metrics on its own port.

- ``GET /blob/<name>``: bytes that take a while to compute, through ``engine.get_or_load``:
  concurrent requests for a name that is not cached compute it once (single flight);
  ``x-cache`` says whether this request computed it.
- ``GET /report/<name>``: a JSON document from a function decorated with ``aiotier.cached``
  (values that are not bytes go through a codec; nothing is pickled).
- ``GET /ops/metrics``, ``/ops/healthz``, ``/ops/readyz``: ``aiotier.MetricsApp`` mounted on the
  same port. No scheduler calls ``end_step`` here: the engine exports its metrics every second.

Run it:  pip install aiotier starlette uvicorn && python examples/web_service.py --port 8000
         curl -i http://127.0.0.1:8000/blob/hello ; curl http://127.0.0.1:8000/ops/metrics
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from aiotier import JSON, MemoryTier, MetricsApp, PrimaryTier, SSDTier, TieringEngine, cached

BLOCK = 64 * 1024


async def compute_blob(name: str) -> bytes:
    """Stands for the expensive work (a model call, a render, a query)."""
    await asyncio.sleep(0.05)
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (BLOCK // len(seed)))[: BLOCK // 2]


def create_app(cache_dir: str) -> Starlette:
    metrics = MetricsApp()
    engine = TieringEngine(
        PrimaryTier(64, BLOCK),
        [MemoryTier(16 << 20), SSDTier(cache_dir, 256 << 20)],
        write_policy={"ssd": "write_through"},  # every stored value survives a restart or crash
        meter_provider=metrics.meter_provider,
    )

    @cached(engine, codec=JSON)
    async def report(name: str) -> dict[str, Any]:
        await asyncio.sleep(0.05)  # a slow query
        return {"name": name, "digest": hashlib.sha256(name.encode()).hexdigest()}

    async def blob_route(request: Request) -> Response:
        name = request.path_params["name"]
        computed = False

        async def load() -> bytes:
            nonlocal computed
            computed = True
            return await compute_blob(name)

        data = await engine.get_or_load(name, load)
        headers = {"x-cache": "miss" if computed else "hit"}
        return Response(data, media_type="application/octet-stream", headers=headers)

    async def report_route(request: Request) -> Response:
        return JSONResponse(await report(request.path_params["name"]))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with engine:  # opens the tiers; at shutdown writes the primary down to the SSD
            yield
        metrics.meter_provider.shutdown()

    return Starlette(
        routes=[
            Route("/blob/{name}", blob_route),
            Route("/report/{name}", report_route),
            Mount("/ops", app=metrics),
        ],
        lifespan=lifespan,
    )


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "aiotier-web"))
    args = ap.parse_args()
    uvicorn.run(create_app(args.cache_dir), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
