"""Redis killed and restarted under a concurrent workload: callers never notice but as misses.

tests/tiers/test_redis_engine.py checks a kill between calls and one with reads in flight; this
test keeps 32 concurrent workers (get, lookup_prefix + wait + load, put) running against an
engine over a real ``redis-server`` while the server is SIGKILLed and restarted (empty, on the
same port), twice by default (``AIOTIER_TEST_REDIS_KILLS`` for more), then frozen with SIGSTOP for
1.5 s (a server that hangs rather than dies) and thawed. Asserted throughout:

- no exception reaches a caller;
- every call answers within its bound (promotion timeout twice, plus the tier's timeout, plus
  a margin), while the server is gone too;
- nothing wrong is returned: every block's bytes derive from its key, so any bytes that come
  back are checked whole;
- the tier comes back: after each restart it reports itself available again, and a block put
  afterwards reaches the server and is read by another engine.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter

import pytest
import redis.asyncio as redis_asyncio
from redis_fixtures import RedisServer, RedisServerFactory

from aiotier import LookupResult, PrimaryTier, RequestContext, TieringEngine
from aiotier.tiers import RedisTier

pytestmark = pytest.mark.redis

KILLS = int(os.environ.get("AIOTIER_TEST_REDIS_KILLS", "2"))
BLOCK = 4096
KEYS = 400
WORKERS = 32
TIER_TIMEOUT = 0.5
PROMOTION_TIMEOUT = 1.0
CALL_BOUND = 2 * PROMOTION_TIMEOUT + TIER_TIMEOUT + 1.5  # seconds, for any one call


def block(key: bytes) -> bytes:
    return (key + b"|") * (BLOCK // (len(key) + 1)) + b"#" * (BLOCK % (len(key) + 1))


def key_of(i: int) -> bytes:
    return b"loss-%d" % i


async def _in_redis(url: str, tier: RedisTier, keys: list[bytes], timeout: float = 10) -> None:
    client = redis_asyncio.Redis.from_url(url)
    try:
        deadline = time.monotonic() + timeout
        while await client.exists(*(tier.redis_key(k) for k in keys)) != len(keys):
            assert time.monotonic() < deadline, f"blocks did not reach redis within {timeout}s"
            await asyncio.sleep(0.02)
    finally:
        await client.aclose()


class Workload:
    def __init__(self, engine: TieringEngine) -> None:
        self.engine = engine
        self.counts: Counter[str] = Counter()
        self.slowest = 0.0
        self.stop = asyncio.Event()

    async def timed(self, what: str, coro: object) -> object:
        t0 = time.monotonic()
        result = await coro  # type: ignore[misc]
        took = time.monotonic() - t0
        self.slowest = max(self.slowest, took)
        assert took < CALL_BOUND, f"{what} took {took:.2f}s (bound {CALL_BOUND}s)"
        self.counts[what] += 1
        return result

    async def worker(self, w: int) -> None:
        rng = random.Random(w)
        e = self.engine
        n = 0
        while not self.stop.is_set():
            n += 1
            op = rng.random()
            if op < 0.4:
                k = key_of(rng.randrange(KEYS))
                got = await self.timed("get", e.get(k))
                if got is None:
                    self.counts["get_none"] += 1
                else:
                    assert got == block(k), f"wrong bytes for {k!r}"
            elif op < 0.8:
                start = rng.randrange(KEYS - 8)
                keys = [key_of(start + j) for j in range(rng.randint(1, 8))]
                req = RequestContext(f"w{w}-{n}")
                hits = await self.timed("lookup_prefix", e.lookup_prefix(keys, req))
                if hits is None:
                    settled = await self.timed("wait", e.wait(keys, timeout=CALL_BOUND))
                    hits = 0
                    for r in settled:
                        if r is not LookupResult.HIT:
                            break
                        hits += 1
                    # another request may have evicted one meanwhile: load what is still there
                    hits = await self.timed("lookup_prefix", e.lookup_prefix(keys[:hits], req))
                    hits = hits or 0
                if hits:
                    spec = e.prepare_load(keys[:hits], req)
                    for k, view in zip(keys, spec.buffers, strict=False):
                        assert view == block(k), f"wrong bytes loaded for {k!r}"
                    e.complete_load(keys[:hits], req)
                    self.counts["blocks_loaded"] += hits
                e.end_step(finished_req_ids=[req.req_id])
            else:
                k = key_of(rng.randrange(KEYS))
                if not await self.timed("put", e.put(k, block(k))):
                    self.counts["put_refused"] += 1  # every primary block pinned right now
            await asyncio.sleep(rng.uniform(0, 0.005))


async def _until_available(tier: RedisTier, timeout: float = 15.0) -> float:
    t0 = time.monotonic()
    while not tier.available:
        assert time.monotonic() - t0 < timeout, "the redis tier did not come back"
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def test_server_killed_and_restarted_under_load(
    redis_server_factory: RedisServerFactory,
) -> None:
    server: RedisServer = redis_server_factory()
    tier = RedisTier(server.url, timeout=TIER_TIMEOUT, failure_threshold=2, probe_interval=0.05)
    engine = TieringEngine(
        PrimaryTier(256, BLOCK),
        [tier],
        write_policy="write_through",
        promotion_timeout=PROMOTION_TIMEOUT,
    )
    t_start = time.monotonic()
    recoveries: list[float] = []
    async with engine:
        keys = [key_of(i) for i in range(KEYS)]
        for k in keys:
            assert await engine.put(k, block(k))
        await _in_redis(server.url, tier, keys)
        load = Workload(engine)
        workers = [asyncio.ensure_future(load.worker(w)) for w in range(WORKERS)]
        try:
            for _ in range(KILLS):
                await asyncio.sleep(0.5)  # the workload runs against a healthy server
                await asyncio.to_thread(server.kill)  # SIGKILL: connections die mid-call
                await asyncio.sleep(1.5)  # ... and against no server at all
                assert any(w.done() for w in workers) is False
                await asyncio.to_thread(server.start)  # same port, empty
                recoveries.append(await _until_available(tier))
            # a server that hangs (SIGSTOP) instead of dying: calls must end by the timeouts
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGSTOP)  # our own child, by its pid
            try:
                await asyncio.sleep(1.5)
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            recoveries.append(await _until_available(tier))
            await asyncio.sleep(0.5)
        finally:
            load.stop.set()
            await asyncio.gather(*workers)  # re-raises any worker's assertion or exception
        counters = engine.stats().counters
        errors = sum(v for k, v in counters.items() if k[:2] == ("tier_errors", "redis"))
        assert errors >= KILLS, counters

        # the tier is back: a block put now reaches the server and another engine reads it
        assert await engine.put(b"after", block(b"after"))
        await _in_redis(server.url, tier, [b"after"])
    async with TieringEngine(PrimaryTier(4, BLOCK), [RedisTier(server.url)]) as other:
        assert await other.get(b"after") == block(b"after")

    c = load.counts
    calls = sum(c[x] for x in ("get", "lookup_prefix", "wait", "put"))
    print(
        f"\nredis server loss: {KILLS} kills and a 1.5 s freeze under {WORKERS} workers in "
        f"{time.monotonic() - t_start:.1f}s; calls {calls} (get {c['get']}, None "
        f"{c['get_none']}, lookup_prefix {c['lookup_prefix']}, wait {c['wait']}, put {c['put']} "
        f"(refused {c['put_refused']}), blocks loaded {c['blocks_loaded']}); slowest call "
        f"{load.slowest:.2f}s (bound {CALL_BOUND}s); tier errors {errors}; back after "
        f"{', '.join(f'{r:.2f}s' for r in recoveries)}; exceptions 0, wrong bytes 0"
    )
