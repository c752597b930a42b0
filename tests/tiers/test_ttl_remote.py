"""TTL on the shared tiers against their real servers: Redis expires a value itself (``SET ...
PXAT``), an object store keeps the expiry in the object's frame, answers MISS past it and
deletes the object. Real servers expire on their own clocks: the tests poll with a deadline."""

from __future__ import annotations

import asyncio
import time

import obstore
import pytest
import redis.asyncio as redis_asyncio
from helpers import eventually
from seaweedfs_fixtures import S3Endpoint

from aiotier import LookupResult, ObjectStoreTier, PrimaryTier, RedisTier, TieringEngine
from aiotier.tiers.base import BlockMeta
from aiotier.tiers.framing import encode_frame, frame_expiry

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
BLOCK = 4096
TTL = 1.0


def expirations(engine: TieringEngine) -> dict[str, int]:
    return {k[1]: v for k, v in engine.stats().counters.items() if k[0] == "expirations"}


async def lookup_until_miss(engine: TieringEngine, key: str, timeout: float = 15.0) -> None:
    """Poll ``lookup`` (a HIT promotes the value; the primary copy is dropped again) until the
    tier answers MISS."""

    async def missed() -> bool:
        engine.clear_primary()
        answer = await engine.lookup(key)
        if answer is RETRY:
            await engine.wait([key])
        return answer is MISS

    deadline = time.monotonic() + timeout
    while not await missed():
        assert time.monotonic() < deadline, f"{key!r} still served {timeout}s on"


@pytest.mark.redis
async def test_redis_expires_values_itself_and_they_are_a_miss(redis_url: str) -> None:
    tier = RedisTier(redis_url)
    raw = redis_asyncio.Redis.from_url(redis_url)
    try:
        async with TieringEngine(
            PrimaryTier(8, BLOCK), [tier], write_policy="write_through"
        ) as e:
            assert await e.put("k", b"v" * 100, ttl=TTL)
            assert await e.put("big", bytes(3 * BLOCK), ttl=TTL)
            assert await e.put("keep", b"k" * 100)
            await e.flush()
            # the server holds every block with its expiry: the value's, its pieces' too
            ttls = [await raw.pttl(tier.redis_key(k)) for k in (b"k", b"big", b"keep")]
            assert 0 < ttls[0] <= TTL * 1000 and 0 < ttls[1] <= TTL * 1000
            assert ttls[2] == -1  # no expiry
            assert sum([await raw.pttl(key) > 0 for key in await raw.keys("*")]) == 5
            e.clear_primary()
            await lookup_until_miss(e, "k")
            assert await e.lookup_prefix(["k"]) == 0
            assert await e.get("k") is None
            assert await e.get("big") is None
            assert await e.get_or_load("k", _load_fresh) == b"fresh"
            assert await e.get("keep") == b"k" * 100
            await e.flush()
            assert await raw.exists(tier.redis_key(b"keep")) == 1
            # keep, and k loaded afresh: the server reclaims the rest (its active expiry
            # samples keys a few times a second)
            deadline = time.monotonic() + 10
            while await raw.dbsize() != 2:
                assert time.monotonic() < deadline, await raw.keys("*")
                await asyncio.sleep(0.05)
    finally:
        await raw.aclose()


async def _load_fresh() -> bytes:
    return b"fresh"


@pytest.mark.s3
async def test_object_store_reads_the_expiry_from_the_frame_and_deletes_the_object(
    s3: S3Endpoint,
) -> None:
    tier = ObjectStoreTier(s3.bucket, endpoint_url=s3.url, prefix=s3.prefix)
    async with TieringEngine(PrimaryTier(8, BLOCK), [tier], write_policy="write_through") as e:
        assert await e.put("k", b"v" * 100, ttl=TTL)
        assert await e.put("keep", b"k" * 100)
        await e.flush()
        got = await obstore.get_async(s3.store(), tier.object_name(b"k"))
        body = bytes(await got.bytes_async())
        assert frame_expiry(body) is not None  # the expiry travels in the object
        e.clear_primary()
        until = time.time() + TTL
        await eventually(lambda: time.time() > until, 10.0)
        assert await e.lookup("k") is MISS  # known expired from memory: no request
        assert await e.get("k") is None
        assert await e.get("keep") == b"k" * 100
        e.end_step()
        assert expirations(e) == {"object": 1}
    names = [o["path"] async for chunk in obstore.list(s3.store(), prefix=s3.prefix) for o in chunk]
    assert names == [tier.object_name(b"keep")]  # the expired object was deleted


@pytest.mark.s3
async def test_a_fresh_object_tier_finds_the_expiry_in_the_body(s3: S3Endpoint) -> None:
    """Another engine (or a restart) reads objects it never wrote: the frame says."""
    writer = ObjectStoreTier(s3.bucket, endpoint_url=s3.url, prefix=s3.prefix)
    await writer.open()
    soon = time.time() + TTL
    assert await writer.write_many(
        [(b"k", b"v" * 100), (b"keep", b"k" * 100)], [BlockMeta(expires_at=soon), BlockMeta()]
    ) == [None, None]
    await writer.aclose()
    await eventually(lambda: time.time() > soon, 10.0)
    reader = ObjectStoreTier(s3.bucket, endpoint_url=s3.url, prefix=s3.prefix)
    async with TieringEngine(PrimaryTier(8, BLOCK), [reader]) as e:
        assert await e.lookup("k") is MISS  # the look-ahead GET saw the expiry
        assert await e.lookup("keep") is RETRY
        e.end_step()
        assert expirations(e) == {"object": 1}
    assert reader.usage().expirations == 1
    names = [o["path"] async for chunk in obstore.list(s3.store(), prefix=s3.prefix) for o in chunk]
    assert names == [reader.object_name(b"keep")]


def test_an_expiring_frame_round_trips_and_old_readers_refuse_it() -> None:
    from aiotier.errors import BlockCorruptedError
    from aiotier.tiers.framing import check_header, payload_into

    frame = encode_frame(b"key", b"payload", 1234.5)
    buf = memoryview(bytearray(16))
    assert payload_into(frame, b"key", buf) == 7 and bytes(buf[:7]) == b"payload"
    assert frame_expiry(frame) == 1234.5
    assert frame_expiry(encode_frame(b"key", b"payload")) is None
    with pytest.raises(BlockCorruptedError, match="version 2"):
        check_header(frame, b"key", len(frame))  # a reader of version 1 (SSD slots)
    damaged = bytearray(frame)
    damaged[24 + 3] ^= 1  # the expiry is covered by the checksum
    with pytest.raises(BlockCorruptedError, match="checksum"):
        payload_into(bytes(damaged), b"key", buf)
