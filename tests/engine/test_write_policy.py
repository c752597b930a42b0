"""A write policy per tier: write-through tiers hold a value when ``put`` returns, write-back
tiers get what the tier above them evicts, ``none`` tiers are only read; and what survives a
``kill -9`` (an SSD written through with ``fsync=True`` keeps every acknowledged put)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis.asyncio as redis_asyncio
from helpers import block, eventually, lookup_one

from aiotier import (
    BlockingEngine,
    ConfigError,
    LookupResult,
    MemoryTier,
    PrimaryTier,
    SSDTier,
    TieringEngine,
)
from aiotier.config import config_from_env, engine_from_config
from aiotier.testing import FaultyTier
from aiotier.tiers import RedisTier

HIT, MISS = LookupResult.HIT, LookupResult.MISS
REPO = Path(__file__).resolve().parents[2]


def counter(e: TieringEngine, *key: str) -> int:
    return e.stats().counters.get(key, 0)


async def test_a_write_through_tier_holds_the_value_when_put_returns() -> None:
    memory, lower = MemoryTier(1 << 20, name="memory"), MemoryTier(1 << 20, name="lower")
    policy = {"lower": "write_through"}  # memory stays write-back
    async with TieringEngine(PrimaryTier(2, 64), [memory, lower], write_policy=policy) as e:
        assert e.options.write_policy == policy
        assert await e.put("k", block(1))
        assert await lookup_one(lower, b"k") is HIT  # no flush: put waited for it
        assert await lookup_one(memory, b"k") is MISS  # write-back: only what is evicted
        assert await e.put("a", block(2)) and await e.put("b", block(3))  # evicts k
        await e.flush()
        assert await lookup_one(memory, b"k") is HIT  # the primary's eviction went down
        assert counter(e, "write_bytes", "lower") == 3 * 64  # k, a, b once each: no cascade
        assert counter(e, "write_bytes", "memory") == 64


async def test_memory_evictions_do_not_cascade_into_a_write_through_tier() -> None:
    memory = MemoryTier(64, name="memory")  # one block
    ssd_like = MemoryTier(1 << 20, name="durable")
    policy = {"durable": "write_through"}
    async with TieringEngine(PrimaryTier(1, 64), [memory, ssd_like], write_policy=policy) as e:
        for i in range(4):  # each put evicts the one before from the primary, then the memory
            assert await e.put(f"k{i}", block(i))
        await e.flush()
        assert counter(e, "write_bytes", "durable") == 4 * 64  # written through, once each
        assert memory.usage().evictions == 2  # k0 and k1 went out of it (k2 is there)
        assert [await e.get(f"k{i}") for i in range(4)] == [block(i) for i in range(4)]


async def test_a_none_tier_is_read_but_never_written() -> None:
    shared = MemoryTier(1 << 20, name="shared")
    await shared.write_many([(b"warm", b"filled by a job")])
    local = MemoryTier(1 << 20, name="local")
    policy = {"shared": "none"}
    async with TieringEngine(PrimaryTier(1, 64), [shared, local], write_policy=policy) as e:
        assert await e.get("warm") == b"filled by a job"
        assert await e.put("k", block(1)) and await e.put("x", block(2))  # evicts k
        await e.flush()
        assert await lookup_one(local, b"k") is HIT  # the primary feeds the tier below
        assert counter(e, "write_bytes", "shared") == 0


async def test_a_put_a_write_through_tier_did_not_take_is_counted_and_not_raised() -> None:
    tier = FaultyTier(MemoryTier(1 << 20, name="durable"))
    async with TieringEngine(
        PrimaryTier(4, 64), [tier], write_policy={"durable": "write_through"}
    ) as e:
        tier.fail("write")
        assert await e.put("k", block(1))  # stored in the primary (the SPEC's True) ...
        assert counter(e, "tier_errors", "durable", "write") == 1  # ... counted when it returns
        assert await lookup_one(tier, b"k") is MISS
        assert await e.get("k") == block(1)
        tier.heal()
        assert await e.put("k", block(2)) is True
        assert await lookup_one(tier, b"k") is HIT


async def test_get_or_load_returns_once_the_write_through_tier_holds_the_value() -> None:
    tier = FaultyTier(MemoryTier(1 << 20, name="durable")).delay("write", 0.05)
    calls = 0

    async def load() -> bytes:
        nonlocal calls
        calls += 1
        return b"computed"

    async with TieringEngine(PrimaryTier(4, 64), [tier], write_policy="write_through") as e:
        values = await asyncio.gather(*(e.get_or_load("k", load) for _ in range(20)))
        assert values == [b"computed"] * 20 and calls == 1
        assert await lookup_one(tier, b"k") is HIT


async def test_a_value_over_several_blocks_is_written_through_whole() -> None:
    tier = MemoryTier(1 << 20, name="durable")
    value = os.urandom(64 * 5 + 7)
    async with TieringEngine(PrimaryTier(16, 64), [tier], write_policy="write_through") as e:
        assert await e.put("big", value)
        assert tier.usage().blocks == 7  # six pieces and the block naming them
    async with TieringEngine(PrimaryTier(16, 64), [tier]) as again:
        assert await again.get("big") == value


def test_blocking_put_waits_for_the_write_through_tier() -> None:
    tier = FaultyTier(MemoryTier(1 << 20, name="durable")).delay("write", 0.05)
    with BlockingEngine(PrimaryTier(4, 64), [tier], write_policy="write_through") as e:
        assert e.put("k", block(1))
        assert e.portal.call(lookup_one, tier, b"k") is HIT


async def test_blocking_put_refuses_a_running_loop_when_it_would_wait() -> None:
    blocking = await asyncio.to_thread(
        BlockingEngine, PrimaryTier(4, 64), [MemoryTier(1 << 20)], write_policy="write_through"
    )
    try:
        with pytest.raises(RuntimeError, match="put"):
            blocking.put("k", b"v")
        assert await asyncio.to_thread(blocking.get, "k") is None  # nothing was stored
    finally:
        await asyncio.to_thread(blocking.close)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"nope": "write_through"}, "write_policy names tier 'nope'; the secondary tiers are"),
        ({"primary": "write_through"}, "write_policy names the primary 'primary'"),
        ({"memory": "write_sometimes"}, r"write_policy\['memory'\] must be one of"),
        ("write_sometimes", "write_policy must be one of write_back, write_through, none"),
    ],
)
def test_bad_write_policies_are_named(policy: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TieringEngine(PrimaryTier(4, 64), [MemoryTier(1 << 20)], write_policy=policy)  # type: ignore[arg-type]


def test_write_policy_per_tier_from_a_config_file_and_the_environment(tmp_path: Path) -> None:
    tiers = [{"type": "memory", "capacity_bytes": 1 << 20}, {"type": "ssd", "path": str(tmp_path),
             "capacity_bytes": 1 << 20}]  # fmt: skip
    config = {
        "primary": {"num_blocks": 4, "block_size": 64},
        "tiers": tiers,
        "engine": {"write_policy": {"ssd": "write_through"}},
    }
    assert engine_from_config(config).options.write_policy == {"ssd": "write_through"}
    env = config_from_env({"AIOTIER_ENGINE_WRITE_POLICY": "ssd=write_through, memory=none"})
    config["engine"] = env["engine"]
    e = engine_from_config(config)
    assert e.options.write_policy == {"ssd": "write_through", "memory": "none"}
    config["engine"] = {"write_policy": "write_through"}
    assert engine_from_config(config).options.write_policy == "write_through"
    config["engine"] = {"write_policy": {"ssd": "sometimes"}}
    with pytest.raises(ConfigError, match=r"engine\.write_policy\.ssd: expected one of"):
        engine_from_config(config)


@pytest.mark.redis
async def test_a_put_is_in_redis_when_it_returns_with_write_through_there(redis_url: str) -> None:
    redis_tier = RedisTier(redis_url, name="redis")
    tiers = [MemoryTier(1 << 20, name="memory"), redis_tier]
    client = redis_asyncio.Redis.from_url(redis_url)
    try:
        async with TieringEngine(
            PrimaryTier(8, 4096), tiers, write_policy={"redis": "write_through"}
        ) as e:
            for i in range(50):
                assert await e.put(f"shared-{i}", block(i, 4096))
                assert await client.exists(redis_tier.redis_key(f"shared-{i}".encode())) == 1
        # a fleet's other engine finds every value there, though this one never evicted them
        async with TieringEngine(PrimaryTier(8, 4096), [RedisTier(redis_url)]) as other:
            assert await other.get("shared-49") == block(49, 4096)
    finally:
        await client.aclose()


# ------------------------------------------------------------------------- kill -9

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from aiotier import MemoryTier, PrimaryTier, SSDTier, TieringEngine

    async def main() -> None:
        path, policy = sys.argv[1], sys.argv[2]
        tiers = [MemoryTier(1 << 20, name="memory"), SSDTier(path, 4 << 20, fsync=True)]
        write_policy = {"ssd": "write_through"} if policy == "through" else "write_back"
        async with TieringEngine(PrimaryTier(16, 4096), tiers, write_policy=write_policy) as e:
            i = 0
            while True:
                ok = await e.put(b"item-%d" % i, (b"%08d" % i) * 512)
                sys.stdout.write(("acked %d\\n" if ok else "refused %d\\n") % i)
                sys.stdout.flush()
                i += 1

    asyncio.run(main())
    """
)
ACKED = 101


def _put_then_kill(path: Path, policy: str) -> list[int]:
    """Run the child until ``ACKED`` puts were acknowledged, SIGKILL it; the acknowledged ones."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    acked: list[int] = []
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), policy], stdout=subprocess.PIPE, text=True, env=env
    ) as child:
        try:
            assert child.stdout is not None
            for line in child.stdout:
                word, i = line.split()
                assert word == "acked", f"put {i} was not stored"
                acked.append(int(i))
                if len(acked) == ACKED:
                    break
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
    assert len(acked) == ACKED, "the child ended before it acknowledged enough puts"
    return acked


async def _kept_after_restart(path: Path, acked: list[int]) -> int:
    tiers = [MemoryTier(1 << 20, name="memory"), SSDTier(path, 4 << 20, fsync=True)]
    async with TieringEngine(PrimaryTier(16, 4096), tiers) as e:
        assert tiers[1].usage().started == "crash"
        kept = 0
        for i in acked:
            got = await e.get(b"item-%d" % i)
            assert got in (None, (b"%08d" % i) * 512), f"item-{i} came back with other bytes"
            kept += got is not None
        return kept


async def test_kill_9_loses_no_acknowledged_put_on_a_write_through_ssd(tmp_path: Path) -> None:
    acked = await asyncio.to_thread(_put_then_kill, tmp_path / "through", "through")
    assert await _kept_after_restart(tmp_path / "through", acked) == ACKED


async def test_kill_9_loses_what_write_back_kept_above_the_ssd(tmp_path: Path) -> None:
    """The control: with the default write-back and a memory tier above the SSD, the recent
    puts live in memory only (the memory tier holds them all), so a kill loses them."""
    acked = await asyncio.to_thread(_put_then_kill, tmp_path / "back", "back")
    assert await _kept_after_restart(tmp_path / "back", acked) == 0


async def test_put_waits_for_a_slow_write_through_tier_within_twice_io_timeout() -> None:
    tier = FaultyTier(MemoryTier(1 << 20, name="slow")).hang("write")
    async with TieringEngine(
        PrimaryTier(4, 64), [tier], write_policy="write_through", io_timeout=0.1
    ) as e:
        assert await e.put("k", block(1))  # returns once the write timed out
        await eventually(lambda: counter(e, "tier_errors", "slow", "write") == 1)
        assert await e.get("k") == block(1)
