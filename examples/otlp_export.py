"""Export the engine's metrics over OTLP/HTTP (extra ``otlp``) to a collector.

Run it:  python examples/otlp_export.py [http://127.0.0.1:4318/v1/metrics]
With no collector listening the engine carries on: the exporter logs its failed attempts
(retried with back-off) and ``shutdown`` gives up on them after its own timeout, a few seconds.
"""

from __future__ import annotations

import asyncio
import sys

from aiotier import MemoryTier, PrimaryTier, RequestContext, TieringEngine
from aiotier.telemetry import start_otlp_exporter


async def main(endpoint: str) -> None:
    provider = start_otlp_exporter(endpoint, interval_seconds=5.0)
    try:
        async with TieringEngine(
            PrimaryTier(8, 1024), [MemoryTier(1 << 20)], meter_provider=provider
        ) as engine:
            for step in range(20):
                req = RequestContext(f"req-{step}")
                keys = [f"block-{i}" for i in range(step % 12)]
                hits = await engine.lookup_prefix(keys, req)
                out = engine.prepare_store(keys[hits or 0 :], req)
                if out is not None:
                    engine.complete_store(list(out.keys_to_store), req)
                engine.end_step(new_req_ids=[req.req_id], finished_req_ids=[req.req_id])
                await asyncio.sleep(0.01)
        print("ran 20 steps; metrics sent to", endpoint, "(see the exporter's log for failures)")
    finally:
        # flush and stop the exporter thread without blocking the event loop
        await asyncio.to_thread(provider.shutdown)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:4318/v1/metrics"))
