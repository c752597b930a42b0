"""aiotier in one page: a primary arena over a memory tier, used as an async cache.

Run it:  python examples/quickstart.py
"""

from __future__ import annotations

import asyncio

from aiotier import LookupResult, MemoryTier, PrimaryTier, TieringEngine


async def main() -> None:
    primary = PrimaryTier(num_blocks=4, block_size=4096)  # 16 KiB, preallocated
    below = MemoryTier(capacity_bytes=1 << 20, name="memory")  # 1 MiB, LRU

    async with TieringEngine(primary, [below]) as engine:
        for i in range(8):  # twice what the primary holds: the oldest are written back
            await engine.put(f"doc-{i}", f"contents of document {i}".encode())
        await engine.flush()  # wait for the write-back of the evicted blocks to land

        print("doc-7 from the primary:", await engine.get("doc-7"))
        print("doc-0 is below, lookup says:", (await engine.lookup("doc-0")).name)
        await engine.wait(["doc-0"])  # the promotion started by that lookup
        print("after the promotion:", (await engine.lookup("doc-0")).name)
        assert await engine.lookup("doc-0") is LookupResult.HIT

        print("get() promotes and awaits in one call:", await engine.get("doc-1"))
        print("unknown keys are None:", await engine.get("nope"))

        engine.end_step()  # the step boundary: metrics go to OpenTelemetry here
        stats = engine.stats()
        for name, usage in stats.tiers.items():
            print(f"tier {name:8} {usage.blocks} blocks, {usage.bytes_used} bytes")
        print("evicted from the primary:", stats.counters.get(("evictions", "primary"), 0))


if __name__ == "__main__":
    asyncio.run(main())
