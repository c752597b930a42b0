"""Engines sharing blocks through a real Redis, across processes, and surviving its loss."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as redis_asyncio
from helpers import lookup_one
from redis_fixtures import RedisServerFactory

from aiotier import LookupResult, PrimaryTier, RequestContext, TieringEngine
from aiotier.tiers import RedisTier

pytestmark = pytest.mark.redis

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
BLOCK = 4096
REPO = Path(__file__).resolve().parents[2]


def block(i: int) -> bytes:
    return i.to_bytes(4, "little") * (BLOCK // 4)


def engine_on(url: str, **tier_kwargs: object) -> TieringEngine:
    tier = RedisTier(url, **tier_kwargs)  # type: ignore[arg-type]
    return TieringEngine(PrimaryTier(32, BLOCK), [tier], write_policy="write_through")


async def wait_in_redis(url: str, tier: RedisTier, keys: list[bytes], timeout: float = 10) -> None:
    """Poll the server (with a deadline) until every key's value is there."""
    client = redis_asyncio.Redis.from_url(url)
    try:
        deadline = time.monotonic() + timeout
        while await client.exists(*(tier.redis_key(k) for k in keys)) != len(keys):
            if time.monotonic() > deadline:
                pytest.fail(f"blocks did not reach redis within {timeout}s")
            await asyncio.sleep(0.02)
    finally:
        await client.aclose()


@pytest.fixture
async def two_engines(redis_url: str) -> AsyncIterator[tuple[TieringEngine, TieringEngine]]:
    async with engine_on(redis_url) as a, engine_on(redis_url) as b:
        yield a, b


async def test_two_engines_share_blocks_through_one_server(
    redis_url: str, two_engines: tuple[TieringEngine, TieringEngine]
) -> None:
    a, b = two_engines
    keys = [f"shared-{i}".encode() for i in range(8)]
    for i, k in enumerate(keys):
        assert await a.put(k, block(i))
    tier_a = a.tiers[0]
    assert isinstance(tier_a, RedisTier)
    await wait_in_redis(redis_url, tier_a, keys)

    req = RequestContext("r1")
    assert await b.lookup_prefix(keys, req) is None  # promotions of all 8 start at once
    assert await b.wait(keys) == [HIT] * 8
    assert await b.lookup_prefix(keys, req) == 8
    spec = b.prepare_load(keys, req)
    assert [bytes(v) for v in spec.buffers] == [block(i) for i in range(8)]
    b.complete_load(keys, req)
    assert await b.get(b"never-written") is None


@pytest.mark.parametrize("immutable", [False, True])
async def test_a_store_keeps_the_fleets_copy_only_with_immutable_keys(
    redis_url: str, immutable: bool
) -> None:
    """Engine B stores a block it computed itself that engine A already shared: by default B
    removes the server's copy (a key may be rewritten with other bytes); with content-addressed
    keys (``immutable_keys=True``) the copy stays for the rest of the fleet."""
    async with engine_on(redis_url) as a:
        assert await a.put(b"doc-hash-1", block(1))
        tier_a = a.tiers[0]
        assert isinstance(tier_a, RedisTier)
        await wait_in_redis(redis_url, tier_a, [b"doc-hash-1"])
    b = TieringEngine(
        PrimaryTier(32, BLOCK),
        [RedisTier(redis_url)],
        write_policy="write_back",
        immutable_keys=immutable,
    )
    client = redis_asyncio.Redis.from_url(redis_url)
    try:
        async with b:
            assert await b.put(b"doc-hash-1", block(1))
            await b.flush(timeout=10)
            assert await client.exists(tier_a.redis_key(b"doc-hash-1")) == int(immutable)
    finally:
        await client.aclose()


async def test_engines_in_other_namespaces_do_not_see_each_other(redis_url: str) -> None:
    async with (
        engine_on(redis_url, namespace="model-a") as a,
        engine_on(redis_url, namespace="model-b") as b,
    ):
        assert await a.put(b"k", block(1))
        tier_a = a.tiers[0]
        assert isinstance(tier_a, RedisTier)
        await wait_in_redis(redis_url, tier_a, [b"k"])
        assert await b.lookup(b"k") is MISS
        assert await b.get(b"k") is None


async def test_corrupted_value_in_redis_is_a_miss_for_the_engine(redis_url: str) -> None:
    async with engine_on(redis_url) as e:
        tier = e.tiers[0]
        assert isinstance(tier, RedisTier)
        raw = redis_asyncio.Redis.from_url(redis_url)
        try:
            await raw.set(tier.redis_key(b"junk"), b"\x80\x04pickled?" + b"\x00" * 100)
            answer = await e.lookup(b"junk")
            assert answer in (RETRY, MISS)
            assert await e.wait([b"junk"]) == [MISS]
            assert await e.get(b"junk") is None
            assert await raw.exists(tier.redis_key(b"junk")) == 0  # dropped
        finally:
            await raw.aclose()


CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from aiotier import LookupResult, PrimaryTier, TieringEngine
    from aiotier.tiers import RedisTier

    url, n = sys.argv[1], int(sys.argv[2])

    def block(i):
        return i.to_bytes(4, "little") * (4096 // 4)

    async def main():
        tier = RedisTier(url)
        engine = TieringEngine(PrimaryTier(32, 4096), [tier], write_policy="write_through")
        async with engine:
            # read what the parent wrote
            parent = [f"parent-{i}".encode() for i in range(n)]
            await engine.lookup_prefix(parent)
            seen = await engine.wait(parent)
            ok = [await engine.get(k) == block(1000 + i) for i, k in enumerate(parent)]
            # write our own blocks; aclose drains the write queue
            for i in range(n):
                assert await engine.put(f"child-{i}".encode(), block(2000 + i))
        print(json.dumps({"seen": [r.value for r in seen], "ok": ok}))

    asyncio.run(main())
    """
)


async def test_two_processes_share_blocks(redis_url: str) -> None:
    n = 6
    async with engine_on(redis_url) as parent:
        keys = [f"parent-{i}".encode() for i in range(n)]
        for i, k in enumerate(keys):
            assert await parent.put(k, block(1000 + i))
        tier = parent.tiers[0]
        assert isinstance(tier, RedisTier)
        await wait_in_redis(redis_url, tier, keys)

        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, redis_url, str(n),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        report = json.loads(out.decode().strip().splitlines()[-1])
        assert report["seen"] == ["hit"] * n
        assert report["ok"] == [True] * n

        child_keys = [f"child-{i}".encode() for i in range(n)]
        await parent.lookup_prefix(child_keys)
        assert await parent.wait(child_keys) == [HIT] * n
        for i, k in enumerate(child_keys):
            assert await parent.get(k) == block(2000 + i)


async def test_server_loss_is_invisible_to_callers_and_writes_resume(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory()
    timeout = 0.5
    tier = RedisTier(server.url, timeout=timeout, failure_threshold=2, probe_interval=0.05)
    async with TieringEngine(
        PrimaryTier(8, BLOCK), [tier], write_policy="write_through", promotion_timeout=2.0
    ) as e:
        assert await e.put(b"before", block(1))
        await wait_in_redis(server.url, tier, [b"before"])

        server.kill()
        bound = timeout + 0.5
        for i in range(5):
            t0 = time.monotonic()
            assert await e.lookup(f"remote-{i}".encode()) is MISS
            assert await e.get(f"remote-{i}".encode()) is None
            assert await e.lookup_prefix([b"x", b"y"]) == 0
            assert time.monotonic() - t0 < 3 * bound, "lookups answer within the timeout"
        # put keeps working in the primary, and its block is served from there
        for i in range(12):  # more than the primary holds: evictions while the server is away
            assert await e.put(f"while-down-{i}".encode(), block(100 + i))
        assert await e.get(b"while-down-11") == block(111)
        assert await e.lookup(b"while-down-11") is HIT
        assert not tier.available
        errors = sum(v for k, v in e.stats().counters.items() if k[:2] == ("tier_errors", "redis"))
        assert errors >= 1

        server.start()  # same port, empty

        async def back() -> bool:
            return tier.available

        deadline = time.monotonic() + 10
        while not await back():
            assert time.monotonic() < deadline, "the tier did not reconnect"
            await asyncio.sleep(0.02)
        assert await e.put(b"after", block(7))
        await wait_in_redis(server.url, tier, [b"after"])

        # another engine (a fresh process would do the same) finds it in the server
        async with engine_on(server.url) as other:
            assert await other.get(b"after") == block(7)


async def test_64_key_lookup_prefix_costs_one_round_trip(redis_url: str) -> None:
    keys = [f"prefix-{i}".encode() for i in range(64)]
    async with engine_on(redis_url) as writer:
        for i, k in enumerate(keys[:48]):
            assert await writer.put(k, block(i))
        tier = writer.tiers[0]
        assert isinstance(tier, RedisTier)
        await wait_in_redis(redis_url, tier, keys[:48])
    raw = redis_asyncio.Redis.from_url(redis_url)
    try:
        async with TieringEngine(PrimaryTier(64, BLOCK), [RedisTier(redis_url)]) as e:
            await e.lookup_prefix([b"warm-up"])  # the lookup script is loaded once per server
            before = (await raw.info("commandstats")).copy()
            assert await e.lookup_prefix(keys) is None  # RETRY: 48 promotions started
            assert await e.wait(keys) == [HIT] * 48 + [MISS] * 16
            after = await raw.info("commandstats")
            assert await e.lookup_prefix(keys) == 48
    finally:
        await raw.aclose()

    def calls(stats: dict[str, dict[str, int]], cmd: str) -> int:
        return int(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0))

    assert calls(after, "evalsha") - calls(before, "evalsha") == 1  # all 64 lookups
    assert calls(after, "mget") - calls(before, "mget") == 1  # all 48 reads
    assert calls(after, "get") == calls(before, "get")


async def test_server_killed_with_promotions_in_flight(
    redis_server_factory: RedisServerFactory,
) -> None:
    """Reads already sent when the server dies end as MISS / None, promptly, without raising."""
    import signal

    server = redis_server_factory()
    timeout = 0.5
    tier = RedisTier(server.url, timeout=timeout, probe_interval=0.05)
    keys = [f"inflight-{i}".encode() for i in range(16)]
    async with engine_on(server.url) as writer:
        for i, k in enumerate(keys):
            assert await writer.put(k, block(i))
        writer_tier = writer.tiers[0]
        assert isinstance(writer_tier, RedisTier)
        await wait_in_redis(server.url, writer_tier, keys)

    async with TieringEngine(PrimaryTier(32, BLOCK), [tier], promotion_timeout=2.0) as e:
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)  # requests go out but are not answered
        t0 = time.monotonic()
        gets = asyncio.gather(*(e.get(k) for k in keys[:8]))
        prefix = asyncio.ensure_future(e.lookup_prefix(keys[8:]))
        await asyncio.sleep(0.1)
        server.kill()  # now the connections die under them
        assert await gets == [None] * 8
        assert await prefix == 0
        assert await e.wait(keys) == [MISS] * 16
        assert time.monotonic() - t0 < 3 * timeout + 1.0
        assert e.stats().promotions_in_flight == 0

        server.start()
        deadline = time.monotonic() + 10
        while not tier.available:
            assert time.monotonic() < deadline, "the tier did not reconnect"
            await asyncio.sleep(0.02)
        assert await e.put(b"after-restart", block(99))
        assert await lookup_one(tier, b"after-restart") is MISS  # write_back: still only in primary
    async with engine_on(server.url) as writer:
        assert await writer.put(b"written-again", block(5))
        writer_tier = writer.tiers[0]
        assert isinstance(writer_tier, RedisTier)
        await wait_in_redis(server.url, writer_tier, [b"written-again"])


async def test_a_write_that_timed_out_never_brings_older_bytes_back(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory()
    size = 1 << 20
    tier = RedisTier(server.url, timeout=0.5, failure_threshold=10)
    async with TieringEngine(
        PrimaryTier(64, size), [tier], write_policy="write_through", promotion_timeout=1.0
    ) as e:
        if server.proc is None:
            pytest.fail("no server process")
        os.kill(server.proc.pid, signal.SIGSTOP)  # the next write batch is cut short
        for i in range(30):
            await e.put(b"f%d" % i, bytes(size))
        await e.put(b"k", b"OLD" * 1000)
        for i in range(30, 40):
            await e.put(b"f%d" % i, bytes(size))
        deadline = time.monotonic() + 10
        while not e.stats().counters.get(("tier_errors", tier.name, "write"), 0):
            if time.monotonic() > deadline:
                pytest.fail("the stalled write batch never timed out")
            await asyncio.sleep(0.05)
        os.kill(server.proc.pid, signal.SIGCONT)
        await e.put(b"k", b"NEW" * 1000)  # replaces k everywhere
        await e.flush(timeout=10)
        for i in range(100, 170):  # k leaves the primary: a get reads it from Redis
            await e.put(b"g%d" % i, bytes(size))
        await e.flush(timeout=30)
        # the late write may have landed over NEW (the server lost it): then k is a MISS
        assert await e.get(b"k") in (b"NEW" * 1000, None)
