"""RedisTier's zero-copy MGET reader under uvloop, whose transports are not asyncio.Transport.

uvloop is not a dependency of aiotier; these tests run where it is installed and skip otherwise.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
import redis.asyncio as redis_asyncio

from aiotier.errors import BlockCorruptedError
from aiotier.tiers import RedisTier
from aiotier.tiers.framing import encode_header

uvloop = pytest.importorskip(
    "uvloop", reason="uvloop is not installed (pip install uvloop) to run the reader under it"
)

pytestmark = pytest.mark.redis


def run_on_uvloop(scenario: Any) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario)


async def _mgets(raw: redis_asyncio.Redis) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get("cmdstat_mget", {}).get("calls", 0))


def test_fast_reads_work_under_uvloop(redis_url: str) -> None:
    async def scenario() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        raw = redis_asyncio.Redis.from_url(redis_url)
        tier = RedisTier(redis_url, read_streams=4)
        await tier.open()
        try:
            assert tier._fast_target is not None
            sizes = [0, 1, 1000, 40_000, 300_000] + [256 * 1024] * 64
            items = [(f"uv-{i}".encode(), os.urandom(n)) for i, n in enumerate(sizes)]
            assert await tier.write_many(items) == [None] * len(items)
            bad = bytearray(encode_header(b"bad", b"x" * 50_000) + b"x" * 50_000)
            bad[-1] ^= 1
            await raw.set(tier.redis_key(b"bad"), bytes(bad))
            keys = [k for k, _ in items] + [b"absent", b"bad"]
            arena = memoryview(bytearray(len(keys) * 300_000))
            views = [arena[i * 300_000 : (i + 1) * 300_000] for i in range(len(keys))]
            before = await _mgets(raw)
            results = await tier.read_many_into(keys, views)
            after = await _mgets(raw)
            assert results[: len(items)] == sizes
            assert results[-2] == -1
            assert isinstance(results[-1], BlockCorruptedError)
            for (_k, data), view in zip(items, views[: len(items)], strict=True):
                assert bytes(view[: len(data)]) == data
            # ~17 MiB: the zero-copy reader split it over its four streams; redis-py would
            # have sent one MGET on its own connection.
            assert after - before == 4
            assert tier._fast is not None and tier._fast._idle  # connections reused, in step
            out = memoryview(bytearray(16))
            (too_big,) = await tier.read_many_into([b"uv-2"], [out])
            assert isinstance(too_big, ValueError)
            assert not isinstance(too_big, BlockCorruptedError)
            assert await tier.read_many_into([b"uv-1"], [out]) == [1]
            assert bytes(out[:1]) == items[1][1]
        finally:
            await tier.aclose()
            await raw.aclose()

    run_on_uvloop(scenario())
