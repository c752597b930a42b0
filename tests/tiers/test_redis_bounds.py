"""A huge value planted under a block's Redis key is never read whole, on any read path.

Anyone who can write the namespace can ``SET`` anything under a block's key. The zero-copy
reader skips a payload longer than its buffer; redis-py's path (``fast_reads=False``, the path
of ``rediss://`` and clusters) and single-key reads ask for at most one byte past the longest
frame the buffer takes.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis_asyncio
from helpers import read_one, write_one

from aiotier.errors import BlockCorruptedError, TieringError
from aiotier.tiers import RedisTier
from aiotier.tiers.framing import encode_header

pytestmark = pytest.mark.redis

MiB = 1 << 20
BLOCK = 256 * 1024


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[redis_asyncio.Redis]:
    client = redis_asyncio.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def frame(key: bytes, payload: bytes) -> bytes:
    return encode_header(key, payload) + payload


@pytest.mark.parametrize("fast_reads", [True, False])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("kind", ["garbage", "a larger block"])
async def test_a_96_mib_value_under_a_block_key_is_refused_without_reading_it(
    redis_url: str, raw: redis_asyncio.Redis, fast_reads: bool, batched: bool, kind: str
) -> None:
    tier = RedisTier(redis_url, fast_reads=fast_reads, timeout=30.0)
    await tier.open()
    try:
        await write_one(tier, b"fine", b"ok")
        big = b"\0" * (96 * MiB) if kind == "garbage" else frame(b"k", bytes(96 * MiB))
        await raw.set(tier.redis_key(b"k"), big)
        del big
        gc.collect()
        bufs = [memoryview(bytearray(BLOCK)), memoryview(bytearray(BLOCK))]
        tracemalloc.start()
        try:
            if batched:
                got, fine = await tier.read_many_into([b"k", b"fine"], bufs)
                assert fine == 2 and bytes(bufs[1][:2]) == b"ok"
            else:
                with pytest.raises((TieringError, ValueError)) as info:
                    await read_one(tier, b"k", bufs[0])
                got = info.value
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        if kind == "garbage":
            assert isinstance(got, BlockCorruptedError)
            assert await raw.exists(tier.redis_key(b"k")) == 0  # failed verification: deleted
        else:
            assert isinstance(got, ValueError) and "buffer holds" in str(got)
            assert await raw.exists(tier.redis_key(b"k")) == 1  # a block, too big: kept
        assert peak < 4 * MiB, f"peak {peak / MiB:.1f} MiB: the value was read"
    finally:
        await tier.aclose()


async def test_a_value_one_byte_longer_than_its_frame_is_corrupted(
    redis_url: str, raw: redis_asyncio.Redis
) -> None:
    tier = RedisTier(redis_url, fast_reads=False)
    await tier.open()
    try:
        await raw.set(tier.redis_key(b"k"), frame(b"k", b"x" * 100) + b"!")
        buf = memoryview(bytearray(100))
        (got,) = await tier.read_many_into([b"k"], [buf])
        assert isinstance(got, BlockCorruptedError)
        await raw.set(tier.redis_key(b"k"), frame(b"k", b"x" * 100))
        assert await tier.read_many_into([b"k"], [buf]) == [100]  # exactly the buffer: read
    finally:
        await tier.aclose()
