"""RedisTier against a real redis-server: framing, batching, namespaces, TTL, losing the server."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as redis_asyncio
from helpers import check_written_views_may_be_reused, lookup_one, read_one, remove_one, write_one
from redis.asyncio.connection import AbstractConnection
from redis_fixtures import HoldingRelay, RedisServer, RedisServerFactory

from aiotier._types import LookupResult
from aiotier.errors import BlockCorruptedError, ConfigError, TieringError, TierUnavailableError
from aiotier.tiers import RedisTier
from aiotier.tiers.framing import encode_header

pytestmark = pytest.mark.redis


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[redis_asyncio.Redis]:
    """A plain redis-py client on the same server, to look behind the tier's back."""
    client = redis_asyncio.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def tier(redis_url: str) -> AsyncIterator[RedisTier]:
    t = RedisTier(redis_url, timeout=2.0)
    await t.open()
    try:
        yield t
    finally:
        await t.aclose()


def buf(n: int = 1 << 20) -> memoryview:
    return memoryview(bytearray(n))


async def poll_until(cond: Callable[[], Awaitable[bool]], deadline_s: float = 10.0) -> None:
    """Await ``cond`` until it holds, failing after ``deadline_s`` (never a fixed sleep)."""
    deadline = time.monotonic() + deadline_s
    while not await cond():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {deadline_s}s")
        await asyncio.sleep(0.02)


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 4096, 256 * 1024, 1 << 20])
async def test_write_then_read_returns_the_same_bytes(tier: RedisTier, size: int) -> None:
    data = os.urandom(size)
    await write_one(tier, b"block-1", data)
    assert await lookup_one(tier, b"block-1") is LookupResult.HIT
    b = buf()
    assert await read_one(tier, b"block-1", b) == size
    assert bytes(b[:size]) == data


async def test_a_written_view_s_buffer_may_be_reused_at_once(tier: RedisTier) -> None:
    await check_written_views_may_be_reused(tier)


async def test_absent_key_is_miss_and_minus_one(tier: RedisTier) -> None:
    assert await lookup_one(tier, b"nope") is LookupResult.MISS
    assert await read_one(tier, b"nope", buf(16)) == -1
    assert await remove_one(tier, b"nope") is False


async def test_write_replaces_and_remove_deletes(tier: RedisTier) -> None:
    await write_one(tier, b"k", b"old")
    await write_one(tier, b"k", memoryview(b"newer"))
    b = buf(16)
    assert await read_one(tier, b"k", b) == 5
    assert bytes(b[:5]) == b"newer"
    assert await remove_one(tier, b"k") is True
    assert await lookup_one(tier, b"k") is LookupResult.MISS


async def test_buffer_too_small_is_value_error(tier: RedisTier) -> None:
    await write_one(tier, b"k", b"x" * 100)
    with pytest.raises(ValueError, match="100 bytes"):
        await read_one(tier, b"k", buf(99))


async def test_batched_forms_round_trip(tier: RedisTier) -> None:
    items = [(f"key-{i}".encode(), os.urandom(1000 + i)) for i in range(64)]
    assert await tier.write_many(items) == [None] * 64
    keys = [k for k, _ in items] + [b"absent"]
    assert await tier.lookup_many(keys) == [LookupResult.HIT] * 64 + [LookupResult.MISS]
    bufs = [buf(4096) for _ in keys]
    results = await tier.read_many_into(keys, bufs)
    assert results[-1] == -1
    for (_k, data), n, b in zip(items, results[:-1], bufs[:-1], strict=True):
        assert n == len(data)
        assert bytes(b[: len(data)]) == data
    assert await tier.lookup_many([]) == []
    assert await tier.read_many_into([], []) == []
    assert await tier.write_many([]) == []


async def test_keys_are_namespace_and_hash(tier: RedisTier, raw: redis_asyncio.Redis) -> None:
    long_key = b"\x00\xff" * 512  # 1024 arbitrary bytes
    await write_one(tier, long_key, b"v")
    stored = await raw.keys("*")
    assert stored == [tier.redis_key(long_key)]
    assert stored[0].startswith(b"aiotier:")
    assert len(stored[0]) == len(b"aiotier:") + 32


async def test_redis_key_names_are_pinned(redis_url: str, raw: redis_asyncio.Redis) -> None:
    """Blocks written by earlier versions stay readable: ``namespace:`` + BLAKE2b-128 in hex."""
    tier = RedisTier(redis_url, namespace="fleet-a")
    await tier.open()
    try:
        await write_one(tier, b"abc", b"v")
        assert await raw.keys("*") == [b"fleet-a:cf4ab791c62b8d2b2109c90275287816"]
        assert tier.redis_key(b"") == b"fleet-a:cae66941d9efbd404e4d88758ea67670"
    finally:
        await tier.aclose()


async def test_usage_tracks_what_this_tier_wrote(tier: RedisTier) -> None:
    assert tier.usage().blocks == 0
    await write_one(tier, b"a", b"1" * 10)
    await tier.write_many([(b"b", b"2" * 20), (b"a", b"1" * 30)])
    u = tier.usage()
    assert u.blocks == 2
    assert u.capacity_bytes is None
    await remove_one(tier, b"a")
    assert tier.usage().blocks == 1
    assert tier.usage().bytes_used > 20


# -- namespaces ----------------------------------------------------------------------------------


async def test_namespaces_do_not_mix(redis_url: str) -> None:
    a = RedisTier(redis_url, namespace="model-a")
    b = RedisTier(redis_url, namespace="model-b")
    await a.open()
    await b.open()
    try:
        await write_one(a, b"shared-key", b"from a")
        assert await lookup_one(b, b"shared-key") is LookupResult.MISS
        assert await b.lookup_many([b"shared-key"]) == [LookupResult.MISS]
        assert await read_one(b, b"shared-key", buf(64)) == -1
        await write_one(b, b"shared-key", b"from b")
        out = buf(64)
        assert await read_one(a, b"shared-key", out) == 6
        assert bytes(out[:6]) == b"from a"
    finally:
        await a.aclose()
        await b.aclose()


async def test_two_tiers_same_namespace_share_blocks(redis_url: str) -> None:
    a = RedisTier(redis_url, namespace="fleet")
    b = RedisTier(redis_url, namespace="fleet")
    await a.open()
    await b.open()
    try:
        await a.write_many([(b"k1", b"one"), (b"k2", b"two")])
        bufs = [buf(8), buf(8)]
        assert await b.read_many_into([b"k1", b"k2"], bufs) == [3, 3]
        assert bytes(bufs[1][:3]) == b"two"
    finally:
        await a.aclose()
        await b.aclose()


# -- foreign, truncated and corrupted values -----------------------------------------------------


def good_frame(key: bytes, payload: bytes) -> bytes:
    return encode_header(key, payload) + payload


def _bad_value_cases() -> dict[str, bytes]:
    payload = os.urandom(5000)
    frame = good_frame(b"victim", payload)
    flipped = bytearray(frame)
    flipped[-100] ^= 0xFF
    return {
        "foreign text": b"hello, I am someone else's value",
        "pickle": pickle.dumps({"evil": True}),
        "empty": b"",
        "truncated header": frame[:10],
        "truncated key": frame[:26],
        "truncated payload": frame[:-1],
        "extra bytes": frame + b"x",
        "flipped payload byte": bytes(flipped),
        "frame of another key": good_frame(b"other", payload),
    }


@pytest.mark.parametrize(
    "case",
    [
        "foreign text",
        "pickle",
        "empty",
        "truncated header",
        "truncated key",
        "truncated payload",
        "extra bytes",
        "flipped payload byte",
        "frame of another key",
    ],
)
async def test_bad_values_are_corruption_and_are_dropped(
    tier: RedisTier, raw: redis_asyncio.Redis, case: str
) -> None:
    value = _bad_value_cases()[case]
    rkey = tier.redis_key(b"victim")
    await raw.set(rkey, value)
    b = buf(8192)
    b[:] = b"\xaa" * len(b)
    with pytest.raises(BlockCorruptedError):
        await read_one(tier, b"victim", b)
    if case != "flipped payload byte":  # a payload lands before its checksum is known
        assert bytes(b) == b"\xaa" * len(b), "no byte of a bad frame reaches the caller's buffer"
    assert await raw.exists(rkey) == 0, "a value that failed verification is dropped"

    # The batched read reports it in place and leaves its neighbours alone.
    await raw.set(rkey, value)
    await write_one(tier, b"good", b"fine")
    bufs = [buf(8192), buf(8192)]
    results = await tier.read_many_into([b"victim", b"good"], bufs)
    assert isinstance(results[0], BlockCorruptedError)
    assert results[1] == 4
    assert await raw.exists(rkey) == 0


# -- TTL -----------------------------------------------------------------------------------------


async def test_ttl_expires_blocks(redis_url: str, raw: redis_asyncio.Redis) -> None:
    t = RedisTier(redis_url, ttl=0.3)
    await t.open()
    try:
        await write_one(t, b"single", b"1")
        await t.write_many([(b"batch", b"2")])
        for key in (b"single", b"batch"):
            pttl = await raw.pttl(t.redis_key(key))
            assert 0 < pttl <= 300
        assert await t.lookup_many([b"single", b"batch"]) == [LookupResult.HIT] * 2

        async def gone() -> bool:
            return await t.lookup_many([b"single", b"batch"]) == [LookupResult.MISS] * 2

        await poll_until(gone, 10.0)
        assert await read_one(t, b"single", buf(8)) == -1
    finally:
        await t.aclose()


async def test_no_ttl_means_no_expiry(tier: RedisTier, raw: redis_asyncio.Redis) -> None:
    await write_one(tier, b"k", b"v")
    assert await raw.pttl(tier.redis_key(b"k")) == -1


# -- one round trip per batch --------------------------------------------------------------------


async def _commandstats(raw: redis_asyncio.Redis) -> dict[str, int]:
    info = await raw.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the packets redis-py writes (one per command, one per pipeline): round trips."""
    counter: list[int] = []
    original = AbstractConnection.send_packed_command

    async def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        counter.append(1)
        await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return counter


async def test_64_key_lookup_many_is_one_round_trip(
    tier: RedisTier, raw: redis_asyncio.Redis, sends: list[int]
) -> None:
    keys = [f"prefix-{i}".encode() for i in range(64)]
    await tier.write_many([(k, b"v") for k in keys[:32]])
    await tier.lookup_many(keys)  # loads the script once on this fresh server
    before = await _commandstats(raw)
    sends.clear()
    result = await tier.lookup_many(keys)
    round_trips = len(sends)
    after = await _commandstats(raw)
    assert result == [LookupResult.HIT] * 32 + [LookupResult.MISS] * 32
    assert round_trips == 1
    assert after.get("evalsha", 0) - before.get("evalsha", 0) == 1


async def test_of_two_writes_of_a_key_in_a_batch_only_the_last_is_sent(
    tier: RedisTier, raw: redis_asyncio.Redis
) -> None:
    before = await _commandstats(raw)
    assert await tier.write_many([(b"k", b"old"), (b"j", b"1"), (b"k", b"new")]) == [None] * 3
    after = await _commandstats(raw)
    assert after.get("set", 0) - before.get("set", 0) == 2
    b = buf(64)
    assert await read_one(tier, b"k", b) == 3 and bytes(b[:3]) == b"new"
    assert tier.usage().blocks == 2


async def test_remove_many_is_one_round_trip(
    tier: RedisTier, raw: redis_asyncio.Redis, sends: list[int]
) -> None:
    keys = [f"gone-{i}".encode() for i in range(64)]
    await tier.write_many([(k, b"v") for k in keys[:40]])
    sends.clear()
    answers = await tier.remove_many(keys)
    assert len(sends) == 1
    assert answers == [True] * 40 + [False] * 24
    assert await raw.dbsize() == 0
    assert tier.usage().blocks == 0


@pytest.mark.parametrize("fast_reads", [True, False])
async def test_64_key_read_many_is_one_round_trip(
    redis_url: str, raw: redis_asyncio.Redis, sends: list[int], fast_reads: bool
) -> None:
    """One MGET through the zero-copy reader; else one pipeline of bounded GETRANGEs."""
    tier = RedisTier(redis_url, fast_reads=fast_reads)
    await tier.open()
    try:
        keys = [f"prefix-{i}".encode() for i in range(64)]
        await tier.write_many([(k, b"v" * 1000) for k in keys])
        before = await _commandstats(raw)
        sends.clear()
        results = await tier.read_many_into(keys, [buf(1000) for _ in keys])
        redis_py_round_trips = len(sends)
        after = await _commandstats(raw)
    finally:
        await tier.aclose()
    assert results == [1000] * 64
    mgets, ranges = (after.get(c, 0) - before.get(c, 0) for c in ("mget", "getrange"))
    assert (mgets, ranges) == ((1, 0) if fast_reads else (0, 64))
    assert after.get("get", 0) == before.get("get", 0)
    # The fast reader has its own connections; without it, redis-py sends one packet.
    assert redis_py_round_trips == (0 if fast_reads else 1)


async def test_large_batch_is_split_over_read_streams(
    redis_url: str, raw: redis_asyncio.Redis
) -> None:
    tier = RedisTier(redis_url, read_streams=4)
    await tier.open()
    try:
        items = [(f"big-{i}".encode(), os.urandom(256 * 1024)) for i in range(64)]
        await tier.write_many(items)
        arena = memoryview(bytearray(64 * 256 * 1024))
        views = [arena[i * 256 * 1024 : (i + 1) * 256 * 1024] for i in range(64)]
        before = await _commandstats(raw)
        results = await tier.read_many_into([k for k, _ in items], views)
        after = await _commandstats(raw)
        assert results == [256 * 1024] * 64
        assert all(bytes(v) == d for v, (_k, d) in zip(views, items, strict=True))
        assert after["mget"] - before.get("mget", 0) == 4  # 16 MiB: four MGETs at once
    finally:
        await tier.aclose()


@pytest.mark.parametrize("fast_reads", [True, False])
async def test_batched_read_reports_each_key_in_place(
    redis_url: str, raw: redis_asyncio.Redis, fast_reads: bool
) -> None:
    tier = RedisTier(redis_url, fast_reads=fast_reads)
    await tier.open()
    try:
        big = os.urandom(300_000)
        await tier.write_many([(b"good", b"fine"), (b"big", big), (b"after", b"still fine")])
        bad = bytearray(good_frame(b"flip", b"x" * 70_000))
        bad[-5] ^= 1
        await raw.set(tier.redis_key(b"flip"), bytes(bad))
        await raw.set(tier.redis_key(b"alien"), b"$5\r\nhello\r\n*2\r\n")  # RESP-looking junk
        keys = [b"good", b"absent", b"flip", b"big", b"alien", b"after"]
        bufs = [buf(100_000) for _ in keys]
        results = await tier.read_many_into(keys, bufs)
        assert results[0] == 4
        assert results[1] == -1
        assert isinstance(results[2], BlockCorruptedError)
        assert isinstance(results[3], ValueError)
        assert not isinstance(results[3], BlockCorruptedError)
        assert isinstance(results[4], BlockCorruptedError)
        assert results[5] == 10
        assert bytes(bufs[5][:10]) == b"still fine"
        assert await raw.exists(tier.redis_key(b"flip"), tier.redis_key(b"alien")) == 0
        assert await raw.exists(tier.redis_key(b"big")) == 1  # too big for the buffer: kept
        # The connection is still in step: the next batch reads correctly.
        out = buf(16)
        assert await tier.read_many_into([b"good"], [out]) == [4]
        assert bytes(out[:4]) == b"fine"
    finally:
        await tier.aclose()


async def test_both_read_paths_report_the_same_outcomes(
    redis_url: str, raw: redis_asyncio.Redis
) -> None:
    """redis-py's reply and the zero-copy reader go through one post-processing step."""
    fast, slow = RedisTier(redis_url), RedisTier(redis_url, fast_reads=False)
    await fast.open()
    await slow.open()
    try:
        keys = [b"good", b"absent", b"flip", b"big", b"alien", b"short"]

        async def damage() -> None:
            await fast.write_many([(b"good", b"fine"), (b"big", os.urandom(300_000))])
            bad = bytearray(good_frame(b"flip", b"x" * 70_000))
            bad[-5] ^= 1
            await raw.set(fast.redis_key(b"flip"), bytes(bad))
            await raw.set(fast.redis_key(b"alien"), good_frame(b"someone-else", b"x"))
            await raw.set(fast.redis_key(b"short"), b"ATBK")

        seen = []
        for tier in (fast, slow):
            await damage()
            results = await tier.read_many_into(keys, [buf(100_000) for _ in keys])
            seen.append([r if isinstance(r, int) else (type(r), str(r)) for r in results])
            dropped = [tier.redis_key(k) for k in (b"flip", b"alien", b"short")]
            assert await raw.exists(*dropped) == 0
        assert seen[0] == seen[1]
        assert seen[0][:2] == [4, -1]
        assert seen[0][3] == (
            ValueError,
            "redis tier 'redis': block b'big' is 300000 bytes, buffer holds 100000",
        )
        assert seen[0][5] == (
            BlockCorruptedError,
            "redis tier 'redis': frame of 4 bytes is shorter than a header",
        )
        assert seen[0][4] == (
            BlockCorruptedError,
            "redis tier 'redis': frame holds a key of 12 bytes, not b'alien'",
        )
    finally:
        await fast.aclose()
        await slow.aclose()


async def test_64_key_write_many_is_one_pipeline(tier: RedisTier, sends: list[int]) -> None:
    sends.clear()
    assert await tier.write_many([(f"k{i}".encode(), b"v") for i in range(64)]) == [None] * 64
    assert len(sends) == 1


async def test_lookup_falls_back_to_pipelined_exists_without_scripting(
    redis_server_factory: RedisServerFactory, sends: list[int]
) -> None:
    server = redis_server_factory(None, "--rename-command", "EVALSHA", "")
    t = RedisTier(server.url)
    await t.open()
    try:
        await write_one(t, b"a", b"1")
        assert await t.lookup_many([b"a", b"b"]) == [LookupResult.HIT, LookupResult.MISS]
        sends.clear()
        assert (
            await t.lookup_many([b"a", b"b", b"c"]) == [LookupResult.HIT] + [LookupResult.MISS] * 2
        )
        assert len(sends) == 1  # pipelined: still one round trip
    finally:
        await t.aclose()


# -- losing the server ---------------------------------------------------------------------------


async def _fast_fail(coro: Awaitable[Any], within: float) -> BaseException:
    t0 = time.monotonic()
    try:
        await coro
    except Exception as exc:
        elapsed = time.monotonic() - t0
        assert elapsed < within, f"took {elapsed:.3f}s, bound {within}s"
        return exc
    pytest.fail("expected the call to fail")


async def test_killed_server_fails_fast_opens_circuit_and_reconnects(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory()
    t = RedisTier(server.url, timeout=0.5, failure_threshold=3, probe_interval=0.05)
    await t.open()
    try:
        await write_one(t, b"k", b"before")
        assert await lookup_one(t, b"k") is LookupResult.HIT

        server.kill()
        for _ in range(3):  # each call answers within the timeout, with an exception
            exc = await _fast_fail(lookup_one(t, b"k"), within=0.5 + 0.25)
            assert isinstance(exc, TierUnavailableError)
        assert not t.available, "three consecutive failures open the circuit"
        # While open, calls do not touch the network at all.
        exc = await _fast_fail(read_one(t, b"k", buf(16)), within=0.05)
        assert isinstance(exc, TierUnavailableError)
        assert "circuit open" in str(exc)
        results = await t.read_many_into([b"k", b"j"], [buf(16), buf(16)])
        assert all(isinstance(r, TierUnavailableError) for r in results)
        assert all(isinstance(r, TierUnavailableError) for r in await t.write_many([(b"x", b"")]))
        with pytest.raises(TierUnavailableError):
            await t.lookup_many([b"k"])
        assert t.errors >= 5

        server.start()  # same port, empty server

        async def back() -> bool:
            return t.available

        await poll_until(back, 10.0)
        assert await lookup_one(t, b"k") is LookupResult.MISS  # nothing was persisted
        await write_one(t, b"k", b"after")
        out = buf(16)
        assert await read_one(t, b"k", out) == 5
        assert bytes(out[:5]) == b"after"
        assert await t.lookup_many([b"k"]) == [LookupResult.HIT]  # script reloaded by itself
    finally:
        await t.aclose()


async def test_frozen_server_times_out_and_stale_replies_never_leak(
    redis_server_factory: RedisServerFactory,
) -> None:
    """SIGSTOP: connections stay open but nothing answers, so only the timeout can save us."""
    server = redis_server_factory()
    t = RedisTier(server.url, timeout=0.3, failure_threshold=2, probe_interval=0.05)
    await t.open()
    assert server.proc is not None
    pid = server.proc.pid
    try:
        await t.write_many([(b"a", b"value-a"), (b"b", b"value-b")])
        os.kill(pid, signal.SIGSTOP)
        late = buf(16)
        try:
            t0 = time.monotonic()
            results = await t.read_many_into([b"a", b"b"], [late, late[8:]])
            assert time.monotonic() - t0 < 0.3 + 0.25
            assert all(isinstance(r, TierUnavailableError) for r in results)
            exc = await _fast_fail(read_one(t, b"a", buf(16)), within=0.3 + 0.25)
            assert isinstance(exc, TierUnavailableError)
            assert "timed out" in str(exc)
            assert not t.available
        finally:
            os.kill(pid, signal.SIGCONT)

        async def back() -> bool:
            return t.available

        await poll_until(back, 10.0)
        # The replies to the timed-out reads arrive late; they must not answer later calls,
        # nor land in the buffer of the read that gave up.
        for key, expected in ((b"b", b"value-b"), (b"a", b"value-a")):
            out = buf(16)
            n = await read_one(t, key, out)
            assert bytes(out[:n]) == expected
        outs = [buf(16), buf(16)]
        assert await t.read_many_into([b"b", b"a"], outs) == [7, 7]
        assert bytes(outs[0][:7]) == b"value-b"
        assert bytes(late) == bytes(16)
    finally:
        await t.aclose()


@pytest.mark.parametrize("fast_reads", [True, False])
async def test_a_write_cut_short_that_lands_late_is_never_read(
    redis_server_factory: RedisServerFactory, fast_reads: bool
) -> None:
    """A write the timeout cut short may still be carried out when the server resumes, after
    later writes or removes of the key: that copy is never read, any other is."""
    server = redis_server_factory()
    assert server.proc is not None
    t = RedisTier(server.url, timeout=0.3, failure_threshold=100, fast_reads=fast_reads)
    other = RedisTier(server.url)
    raw = redis_asyncio.Redis.from_url(server.url)
    await t.open()
    await other.open()
    try:
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            errors = await t.write_many([(b"k", b"OLD"), (b"r", b"OLD")])
            assert all(isinstance(e, TierUnavailableError) for e in errors)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        rkeys = [t.redis_key(b"k"), t.redis_key(b"r")]

        async def landed_late() -> bool:
            return bool(await raw.exists(*rkeys) == 2)

        await poll_until(landed_late)
        old_k, old_r = await raw.mget(rkeys)
        out = buf(16)
        # nothing newer was acknowledged: they are the newest bytes tried
        assert await t.read_many_into([b"k", b"r"], [out, buf(16)]) == [3, 3]
        await write_one(t, b"k", b"NEW")
        assert await remove_one(t, b"r")
        # the late writes land again, now after the newer write and the remove
        await raw.mset(dict(zip(rkeys, (old_k, old_r), strict=True)))
        assert await t.read_many_into([b"k", b"r"], [out, buf(16)]) == [-1, -1]
        assert await read_one(t, b"k", out) == -1
        assert await read_one(other, b"k", out) == 3  # other engines do not know
        await write_one(other, b"k", b"THEIRS")  # another engine's copy is served
        assert await read_one(t, b"k", out) == 6 and bytes(out[:6]) == b"THEIRS"
        await write_one(t, b"k", b"NEWER")
        assert await t.read_many_into([b"k"], [out]) == [5] and bytes(out[:5]) == b"NEWER"
    finally:
        await raw.aclose()
        await other.aclose()
        await t.aclose()


@pytest.mark.parametrize("single", [True, False], ids=["write", "write_many"])
async def test_a_write_redis_py_sent_again_whose_first_attempt_lands_late_is_never_read(
    redis_server: RedisServer, single: bool
) -> None:
    """redis-py sends a command again after a reset connection: the tier sees it acknowledged,
    while the first attempt may still reach the server, after a later write."""
    async with HoldingRelay(redis_server.port, match=b"OLD") as relay:
        t = RedisTier(relay.url, namespace=f"relay-{single}", timeout=5, failure_threshold=100)
        await t.open()
        try:
            relay.armed = True
            if single:
                await write_one(t, b"k", b"OLD")  # attempt 1 kept back and reset; attempt 2 lands
            else:
                assert await t.write_many([(b"k", b"OLD")]) == [None]
            assert not relay.armed and relay.held
            await write_one(t, b"k", b"NEW")
            await relay.release()  # the first attempt lands now
            out = buf(16)
            assert await lookup_one(t, b"k") is LookupResult.MISS  # the header's checksum said so
            assert await t.lookup_many([b"k"]) == [LookupResult.MISS]
            assert await read_one(t, b"k", out) == -1
            assert await t.read_many_into([b"k"], [out]) == [-1]
        finally:
            await t.clear()
            await t.aclose()


async def test_open_with_server_down_does_not_raise_and_recovers(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory()
    server.kill()
    t = RedisTier(server.url, timeout=0.3, probe_interval=0.05)
    await t.open()
    try:
        assert not t.available
        with pytest.raises(TierUnavailableError):
            await lookup_one(t, b"k")
        server.start()

        async def back() -> bool:
            return t.available

        await poll_until(back, 10.0)
        await write_one(t, b"k", b"v")
        assert await lookup_one(t, b"k") is LookupResult.HIT
    finally:
        await t.aclose()


async def test_aclose_stops_the_probe_and_refuses_calls(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory()
    server.kill()
    t = RedisTier(server.url, timeout=0.2, probe_interval=0.05)
    await t.open()
    probe = t._guard.probe_task
    assert probe is not None
    await t.aclose()
    assert probe.done()
    with pytest.raises(TierUnavailableError, match="closed"):
        await lookup_one(t, b"k")


# -- URLs, credentials, protocol, TLS, cluster ---------------------------------------------------


async def test_password_in_url(redis_server_factory: RedisServerFactory) -> None:
    server = redis_server_factory(None, "--requirepass", "s3cret")
    good = RedisTier(f"redis://:s3cret@127.0.0.1:{server.port}/3")
    await good.open()
    try:
        await write_one(good, b"k", b"v")
        assert await lookup_one(good, b"k") is LookupResult.HIT
        assert await good.read_many_into([b"k"], [buf(4)]) == [1]  # fast reader: AUTH, SELECT
    finally:
        await good.aclose()
    admin = redis_asyncio.Redis.from_url(f"redis://:s3cret@127.0.0.1:{server.port}/3")
    try:
        assert await admin.dbsize() == 1  # written to db 3, as the URL says
    finally:
        await admin.aclose()
    bad = RedisTier(f"redis://:wrong@127.0.0.1:{server.port}/0")
    with pytest.raises(ConfigError, match="refused") as info:
        await bad.open()
    assert "wrong" not in str(info.value)


async def test_a_password_changed_under_a_running_tier_makes_reads_errors_not_a_raise(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory(None, "--requirepass", "one")
    tier = RedisTier(f"redis://:one@127.0.0.1:{server.port}/0", timeout=2)
    await tier.open()
    try:
        await write_one(tier, b"k", b"v")
        admin = redis_asyncio.Redis.from_url(f"redis://:one@127.0.0.1:{server.port}/0")
        try:
            await admin.config_set("requirepass", "two")  # the fast reader must log in again
        finally:
            await admin.aclose()
        (got,) = await tier.read_many_into([b"k"], [buf(4)])
        assert isinstance(got, Exception) and "WRONGPASS" in str(got)
    finally:
        await tier.aclose()


# The ACL that docs/operations.md recommends: keys of one namespace, only the commands used.
DOC_ACL = (
    "on >tier-pw ~fleet:* resetchannels -@all "
    "+get +mget +getrange +set +exists +del +scan +evalsha +script|load +ping +hello +auth"
)


async def test_acl_user_with_only_the_needed_commands(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory()
    admin = redis_asyncio.Redis.from_url(server.url)
    try:
        await admin.execute_command("ACL", "SETUSER", "aiotier", *DOC_ACL.split())
    finally:
        await admin.aclose()
    t = RedisTier(f"redis://aiotier:tier-pw@127.0.0.1:{server.port}/0", namespace="fleet")
    await t.open()
    try:
        await write_one(t, b"k", b"v")
        await t.write_many([(b"k2", b"v2")])
        assert await lookup_one(t, b"k") is LookupResult.HIT
        assert await t.lookup_many([b"k", b"k2", b"no"]) == [LookupResult.HIT] * 2 + [
            LookupResult.MISS
        ]
        assert await t.read_many_into([b"k", b"k2"], [buf(8), buf(8)]) == [1, 2]
        assert await remove_one(t, b"k") is True
        assert t._use_script, "the documented ACL allows the lookup script"
        await t.clear()
        assert await lookup_one(t, b"k2") is LookupResult.MISS
    finally:
        await t.aclose()
    async with HoldingRelay(server.port, match=b"late") as relay:
        # a key with a write cut short is looked up by its checksum, which GETRANGE reads
        r = RedisTier(f"redis://aiotier:tier-pw@127.0.0.1:{relay.port}/0", namespace="fleet")
        await r.open()
        try:
            relay.armed = True
            await write_one(r, b"k3", b"late")  # the first attempt kept back: doubted
            await write_one(r, b"k3", b"v3")
            assert await lookup_one(r, b"k3") is LookupResult.HIT
            await relay.release()
            assert await lookup_one(r, b"k3") is LookupResult.MISS
        finally:
            await r.aclose()
    other = RedisTier(f"redis://aiotier:tier-pw@127.0.0.1:{server.port}/0", namespace="x")
    await other.open()
    try:
        with pytest.raises(TieringError, match=r"(?i)no permissions|noperm"):
            await write_one(other, b"k", b"v")  # outside the user's key pattern
    finally:
        await other.aclose()


async def test_protocol_2_for_old_servers(redis_url: str) -> None:
    t = RedisTier(redis_url, protocol=2)
    await t.open()
    try:
        await t.write_many([(b"a", b"1"), (b"b", b"22")])
        assert await t.lookup_many([b"a", b"b", b"c"]) == [LookupResult.HIT] * 2 + [
            LookupResult.MISS
        ]
        assert await t.read_many_into([b"a", b"b"], [buf(4), buf(4)]) == [1, 2]
    finally:
        await t.aclose()


def _make_tls_files(tmp: Any) -> tuple[str, str, str] | None:
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        return None
    cert, key = str(tmp / "server.crt"), str(tmp / "server.key")
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key, cert


async def test_rediss_tls_url(redis_server_factory: RedisServerFactory, tmp_path: Any) -> None:
    files = _make_tls_files(tmp_path)
    if files is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key, ca = files
    from redis_fixtures import free_port

    tls_port = free_port()
    redis_server_factory(
        None,
        "--tls-port", str(tls_port), "--tls-cert-file", cert, "--tls-key-file", key,
        "--tls-ca-cert-file", ca, "--tls-auth-clients", "no",
    )  # fmt: skip
    t = RedisTier(f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={ca}")
    await t.open()
    try:
        await write_one(t, b"k", b"secret")
        out = buf(16)
        assert await read_one(t, b"k", out) == 6
        assert t.available
    finally:
        await t.aclose()


async def test_clear_deletes_the_namespaces_blocks_and_nothing_else(
    redis_url: str, raw: redis_asyncio.Redis
) -> None:
    # "?" in the namespace matches only itself: "clrX:" blocks are another fleet's
    t = RedisTier(redis_url, namespace="clr?", timeout=2.0)
    other = RedisTier(redis_url, namespace="clrX", timeout=2.0)
    await t.open()
    await other.open()
    try:
        keys = [f"c{i}".encode() for i in range(600)]  # more than one SCAN page
        assert await t.write_many([(k, k) for k in keys]) == [None] * 600
        assert await other.write_many([(b"o", b"o")]) == [None]
        await raw.set(b"clr?:not-a-block", b"x")
        await t.clear()
        assert await t.lookup_many(keys) == [LookupResult.MISS] * 600
        assert t.usage().blocks == 0
        assert await lookup_one(other, b"o") is LookupResult.HIT
        assert await raw.get(b"clr?:not-a-block") == b"x"
        await write_one(t, b"after", b"a")  # the tier goes on
        assert await lookup_one(t, b"after") is LookupResult.HIT
    finally:
        await raw.delete(b"clr?:not-a-block")
        await remove_one(other, b"o")
        await t.clear()
        await t.aclose()
        await other.aclose()


def cluster_command(port: int, *args: str) -> bytes:
    """One command to a cluster node over a plain socket (before any client can connect)."""
    import socket

    payload = f"*{len(args)}\r\n".encode() + b"".join(
        f"${len(a)}\r\n{a}\r\n".encode() for a in args
    )
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        return s.recv(65536)


def cluster_node(factory: RedisServerFactory, tmp_path: Any) -> tuple[RedisServer, int]:
    """A cluster-enabled server with no slots yet, and its bus port."""
    from redis_fixtures import free_port

    port, bus = free_port(), free_port()
    while port > 55535:  # redis refuses cluster ports whose default bus port would overflow
        port = free_port()
    server = factory(
        port,
        "--cluster-enabled", "yes",
        "--cluster-port", str(bus),
        "--cluster-config-file", str(tmp_path / f"nodes-{port}.conf"),
    )  # fmt: skip
    return server, bus


def until_cluster_ok(*ports: int) -> None:
    deadline = time.monotonic() + 10
    for port in ports:
        while b"cluster_state:ok" not in cluster_command(port, "CLUSTER", "INFO"):
            if time.monotonic() > deadline:
                pytest.fail(f"cluster node on port {port} never reached cluster_state:ok")
            time.sleep(0.05)


@pytest.fixture
def cluster_server(redis_server_factory: RedisServerFactory, tmp_path: Any) -> RedisServer:
    """A one-node Redis Cluster owning every slot (multi-key commands still need one slot)."""
    server, _ = cluster_node(redis_server_factory, tmp_path)
    assert cluster_command(server.port, "CLUSTER", "ADDSLOTSRANGE", "0", "16383").startswith(b"+OK")
    until_cluster_ok(server.port)
    return server


@pytest.fixture
def two_node_cluster(
    redis_server_factory: RedisServerFactory, tmp_path: Any
) -> tuple[RedisServer, RedisServer]:
    """Two primaries, half of the slots each."""
    (a, _), (b, bus_b) = (cluster_node(redis_server_factory, tmp_path) for _ in range(2))
    assert cluster_command(a.port, "CLUSTER", "ADDSLOTSRANGE", "0", "8191").startswith(b"+OK")
    assert cluster_command(b.port, "CLUSTER", "ADDSLOTSRANGE", "8192", "16383").startswith(b"+OK")
    meet = cluster_command(a.port, "CLUSTER", "MEET", "127.0.0.1", str(b.port), str(bus_b))
    assert meet.startswith(b"+OK"), meet
    until_cluster_ok(a.port, b.port)
    return a, b


async def test_cluster_mode_clear_scans_every_primary(
    two_node_cluster: tuple[RedisServer, RedisServer],
) -> None:
    a, b = two_node_cluster
    t = RedisTier(a.url.removesuffix("/0"), cluster=True, ttl=60)
    await t.open()
    try:
        keys = [f"cluster-clear-{i}".encode() for i in range(100)]
        assert await t.write_many([(k, k) for k in keys]) == [None] * 100
        sizes = [int(cluster_command(n.port, "DBSIZE")[1:].split()[0]) for n in (a, b)]
        assert all(sizes) and sum(sizes) == 100, sizes  # blocks on both primaries
        await t.clear()
        assert await t.lookup_many(keys) == [LookupResult.MISS] * 100
        assert [cluster_command(n.port, "DBSIZE") for n in (a, b)] == [b":0\r\n"] * 2
    finally:
        await t.aclose()


async def test_on_a_cluster_a_write_whose_answer_was_lost_that_lands_late_is_never_read(
    cluster_server: RedisServer,
) -> None:
    """The cluster pipeline reports a reset connection as one command's reply, after it was
    sent: the tier counts it cut short like any other."""
    async with HoldingRelay(cluster_server.port, match=b"OLD") as relay:
        # the node announces the relay's port: every connection of the client goes through it
        announce = ("CONFIG", "SET", "cluster-announce-port", str(relay.port))
        assert cluster_command(cluster_server.port, *announce).startswith(b"+OK")
        t = RedisTier(f"redis://127.0.0.1:{relay.port}", cluster=True, failure_threshold=100)
        await t.open()
        try:
            relay.armed = True
            (error,) = await t.write_many([(b"k", b"OLD")])
            assert isinstance(error, TierUnavailableError) and relay.held
            await write_one(t, b"k", b"NEW")
            await relay.release()  # the first attempt lands now, after NEW
            out = buf(16)
            assert await read_one(t, b"k", out) == -1
            assert await lookup_one(t, b"k") is LookupResult.MISS
        finally:
            await t.aclose()


async def test_cluster_mode_round_trips_across_slots(cluster_server: RedisServer) -> None:
    t = RedisTier(cluster_server.url.removesuffix("/0"), cluster=True, ttl=60)
    await t.open()
    try:
        keys = [f"cluster-{i}".encode() for i in range(64)]
        assert await t.write_many([(k, k * 3) for k in keys]) == [None] * 64
        assert await t.lookup_many([*keys, b"absent"]) == [LookupResult.HIT] * 64 + [
            LookupResult.MISS
        ]
        bufs = [buf(64) for _ in keys]
        assert await t.read_many_into(keys, bufs) == [len(k) * 3 for k in keys]
        assert bytes(bufs[7][: len(keys[7]) * 3]) == keys[7] * 3
        await write_one(t, b"single", b"one")
        assert await read_one(t, b"single", buf(8)) == 3
        assert await remove_one(t, b"single") is True
    finally:
        await t.aclose()


# -- configuration and the optional dependency ---------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"url": "localhost:6379"},
        {"url": "http://localhost:6379"},
        {"namespace": ""},
        {"ttl": 0},
        {"ttl": -1.0},
        {"protocol": 4},
        {"timeout": 0},
        {"failure_threshold": 0},
        {"probe_interval": 0},
    ],
)
def test_bad_configuration_is_config_error(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"url": "redis://127.0.0.1:1/0", **kwargs}
    with pytest.raises(ConfigError):
        RedisTier(**args)


def test_missing_redis_extra_names_the_extra() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['redis'] = None\n"
        "import aiotier.tiers as t\n"
        "try:\n"
        "    t.RedisTier('redis://127.0.0.1:6379/0')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert "aiotier[redis]" in out.stdout, out.stdout + out.stderr


async def test_server_without_hello_needs_protocol_2(
    redis_server_factory: RedisServerFactory,
) -> None:
    """What a Redis 5 looks like to redis-py 8: HELLO is an unknown command."""
    server = redis_server_factory(None, "--rename-command", "HELLO", "")
    resp3 = RedisTier(server.url, protocol=3)
    with pytest.raises(ConfigError, match="protocol=2"):
        await resp3.open()
    resp2 = RedisTier(server.url, protocol=2)
    await resp2.open()
    try:
        await write_one(resp2, b"k", b"v")
        assert await resp2.lookup_many([b"k"]) == [LookupResult.HIT]
        assert await resp2.read_many_into([b"k"], [buf(4)]) == [1]
    finally:
        await resp2.aclose()


async def test_no_call_blocks_the_event_loop(redis_url: str) -> None:
    from blockbuster import blockbuster_ctx

    t = RedisTier(redis_url)
    with blockbuster_ctx():
        await t.open()
        await write_one(t, b"k", os.urandom(100_000))
        await t.write_many([(f"b{i}".encode(), os.urandom(300_000)) for i in range(20)])
        assert await lookup_one(t, b"k") is LookupResult.HIT
        assert await t.lookup_many([b"k", b"b3", b"zz"]) == [LookupResult.HIT] * 2 + [
            LookupResult.MISS
        ]
        out = await t.read_many_into(
            [b"k", b"b19"], [memoryview(bytearray(400_000)) for _ in range(2)]
        )
        assert out == [100_000, 300_000]
        assert await read_one(t, b"b1", buf()) == 300_000
        assert await remove_one(t, b"k")
        await t.aclose()


async def test_unix_socket_url(redis_server_factory: RedisServerFactory, tmp_path: Any) -> None:
    sock = tmp_path / "redis.sock"
    redis_server_factory(None, "--unixsocket", str(sock), "--unixsocketperm", "700")
    t = RedisTier(f"unix://{sock}?db=2")
    await t.open()
    try:
        assert t._fast_target is not None  # batched reads use the fast reader here too
        items = [(f"u{i}".encode(), os.urandom(50_000)) for i in range(8)]
        assert await t.write_many(items) == [None] * 8
        bufs = [buf(50_000) for _ in items]
        assert await t.read_many_into([k for k, _ in items], bufs) == [50_000] * 8
        assert all(bytes(b) == d for b, (_k, d) in zip(bufs, items, strict=True))
    finally:
        await t.aclose()


async def test_fast_reader_connections_are_bounded(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiotier.tiers.redis import reader as _resp

    dialled: list[int] = []
    original = _resp.RespReaderPool._connect

    async def counting(self: _resp.RespReaderPool) -> Any:
        dialled.append(1)
        return await original(self)

    monkeypatch.setattr(_resp.RespReaderPool, "_connect", counting)
    t = RedisTier(redis_url, max_read_connections=2)
    await t.open()
    try:
        await t.write_many([(f"c{i}".encode(), b"v" * 100) for i in range(20)])
        results = await asyncio.gather(
            *(t.read_many_into([f"c{i}".encode()], [buf(100)]) for i in range(20))
        )
        assert results == [[100]] * 20
        assert len(dialled) == 2  # twenty concurrent reads shared two connections
    finally:
        await t.aclose()
