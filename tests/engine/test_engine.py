"""TieringEngine behaviour over MemoryTier and FaultyTier: the scheduler protocol and cache API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from helpers import aiotier_tasks, block, eventually, read_one, seeded, write_one

from aiotier import (
    BlockingEngine,
    BlockNotReadyError,
    BreakerPolicy,
    ConfigError,
    LookupResult,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    TieringEngine,
    TieringError,
)
from aiotier.testing import FaultyTier

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
R1, R2 = RequestContext("r1"), RequestContext("r2")




def counter(engine: TieringEngine, *key: str) -> int:
    return engine.stats().counters.get(tuple(key), 0)


async def test_put_then_lookup_hits_and_str_equals_bytes() -> None:
    async with TieringEngine(PrimaryTier(4, 64)) as e:
        assert await e.put("a", b"xyz")
        assert await e.lookup(b"a") is HIT
        assert await e.lookup("a", R1) is HIT
        assert await e.lookup("missing") is MISS
        assert await e.get(b"a") == b"xyz"
        spec = e.prepare_load(["a"], R1)
        assert bytes(spec.buffers[0]) == b"xyz" and spec.buffers[0].readonly
        e.complete_load(["a"], R1)


async def test_block_below_primary_is_promoted_then_hits() -> None:
    tier = FaultyTier(await seeded(4))
    async with TieringEngine(PrimaryTier(4, 64), [tier]) as e:
        assert await e.lookup("k1", R1) is RETRY
        assert await e.wait(["k1"]) == [HIT]
        assert await e.lookup("k1", R1) is HIT
        spec = e.prepare_load(["k1"], R1)
        assert bytes(spec.buffers[0]) == block(1)
        e.complete_load(["k1"], R1)
        assert tier.calls["read"] == 1
        assert counter(e, "promotions", "memory", "ok") == 1
        assert counter(e, "read_bytes", "memory") == 64
        assert counter(e, "lookups", "memory", "hit") == 1


async def test_concurrent_lookups_share_one_promotion() -> None:
    tier = FaultyTier(await seeded(2)).delay("read", 0.05)
    async with TieringEngine(PrimaryTier(4, 64), [tier]) as e:
        answers = await asyncio.gather(
            e.lookup("k0", R1), e.lookup("k0", R2), e.lookup("k0"), e.get("k0")
        )
        assert answers[:3] == [RETRY, RETRY, RETRY]
        assert answers[3] == block(0)
        assert await e.lookup("k0", R1) is HIT
        assert tier.calls["read"] == 1


async def test_exclude_tier_by_name_or_object() -> None:
    tier = await seeded(1)
    async with TieringEngine(PrimaryTier(4, 64), [tier]) as e:
        assert await e.lookup("k0", exclude_tier="memory") is MISS
        assert await e.lookup("k0", exclude_tier=tier) is MISS
        with pytest.raises(ValueError, match="'nope'"):
            await e.lookup("k0", exclude_tier="nope")
        assert await e.lookup("k0") is RETRY


async def test_failed_promotion_becomes_miss_and_backs_off() -> None:
    tier = FaultyTier(await seeded(2)).fail("read")
    async with TieringEngine(PrimaryTier(4, 64), [tier], backoff_seconds=30) as e:
        assert await e.lookup("k0", R1) is RETRY
        assert await e.wait(["k0"]) == [MISS]
        for _ in range(5):
            assert await e.lookup("k0", R1) is MISS
        assert tier.calls["read"] == 1  # backing off: no failing read per lookup
        assert counter(e, "promotions", "memory", "error") == 1
        assert counter(e, "tier_errors", "memory", "read") == 1
        assert e.stats().pinned_blocks == 0
        tier.heal()
        assert await e.put("k0", b"new")  # a put clears the back-off
        assert await e.get("k0") == b"new"


async def test_promotion_timeout_becomes_miss() -> None:
    tier = FaultyTier(await seeded(1)).hang("read")
    async with TieringEngine(PrimaryTier(4, 64), [tier], promotion_timeout=0.1) as e:
        assert await e.lookup("k0", R1) is RETRY
        assert await e.wait(["k0"], timeout=5) == [MISS]
        assert await e.lookup("k0", R1) is MISS
        assert counter(e, "promotions", "memory", "timeout") == 1
        await eventually(lambda: e.stats().pinned_blocks == 0)


class _SlowReadTier(MemoryTier):
    """A read that ends ``after`` seconds on; cancelled, it winds down for ``wind_down`` more."""

    def __init__(self, after: float, wind_down: float = 0.0) -> None:
        super().__init__(1 << 20)
        self.after, self.wind_down = after, wind_down
        self.log: list[str] = []

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        try:
            await asyncio.sleep(self.after)
        except asyncio.CancelledError:
            await asyncio.sleep(self.wind_down)
            self.log.append("wound down")
            raise
        return await super().read_many_into(keys, bufs)


async def test_a_read_that_ended_in_time_lands_after_the_loop_was_busy_past_its_timeout() -> None:
    tier = _SlowReadTier(after=0.05)
    await write_one(tier, b"k", b"kkkk")
    async with TieringEngine(PrimaryTier(2, 4), [tier], promotion_timeout=0.1) as e:
        assert await e.lookup("k") is RETRY
        await asyncio.sleep(0.01)  # the read is under way
        time.sleep(0.2)  # noqa: ASYNC251 - the loop busy past the read's end and its timeout
        assert await e.wait(["k"], timeout=5) == [HIT]
        assert counter(e, "promotions", "memory", "ok") == 1
        assert counter(e, "promotions", "memory", "timeout") == 0
        assert counter(e, "tier_errors", "memory", "read") == 0


async def test_aclose_during_a_read_counts_it_cancelled_and_lets_the_tier_wind_down() -> None:
    tier = _SlowReadTier(after=10, wind_down=0.3)
    await write_one(tier, b"k", b"kkkk")
    e = TieringEngine(
        PrimaryTier(2, 4), [tier], promotion_timeout=0.2, io_timeout=5.0,
        breaker=BreakerPolicy(failure_threshold=1),
    )  # fmt: skip
    await e.open()
    assert await e.lookup("k") is RETRY
    await asyncio.sleep(0.05)
    await e.aclose()  # the promotion's timeout passes while the tier winds down
    assert tier.log == ["wound down"]  # not cut short by a second cancel
    assert counter(e, "promotions", "memory", "cancelled") == 1
    assert counter(e, "promotions", "memory", "timeout") == 0
    assert counter(e, "tier_errors", "memory", "read") == 0
    assert e.health()["memory"].breaker == "closed"


class _SlowCloseTier(MemoryTier):
    closed = False

    async def aclose(self) -> None:
        await asyncio.sleep(0.2)
        self.closed = True


async def test_a_cancelled_aclose_still_closes_everything() -> None:
    tier = _SlowCloseTier(1 << 20)
    e = TieringEngine(PrimaryTier(2, 4), [tier], io_timeout=5.0)
    await e.open()
    assert await e.put("k", b"kkkk")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(e.aclose(), 0.05)  # the caller gives up while the tier closes
    await e.aclose()  # awaits the same close
    assert tier.closed
    assert not any(h.open for h in e.health().values())
    assert await read_one(tier, b"k", memoryview(bytearray(4))) == 4  # written down first
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("aiotier-")]


@pytest.mark.parametrize("fault", ["fail", "hang"])
async def test_tier_lookup_fault_is_a_counted_miss(fault: str) -> None:
    tier = FaultyTier(await seeded(1))
    getattr(tier, fault)("lookup")
    async with TieringEngine(PrimaryTier(4, 64), [tier], promotion_timeout=0.1) as e:
        assert await e.lookup("k0", R1) is MISS
        assert await e.lookup_prefix(["k0"], R1) == 0
        assert await e.get("k0") is None
        assert counter(e, "tier_errors", "memory", "lookup") == 3


async def test_promoted_block_is_pinned_for_its_request_until_loaded() -> None:
    tier = await seeded(2)
    async with TieringEngine(PrimaryTier(2, 64), [tier]) as e:
        assert await e.lookup("k0", R1) is RETRY
        await e.wait(["k0"])
        assert await e.put("x", b"x")  # the one free slot
        assert e.prepare_store(["y", "z"]) is None  # k0 is pinned for r1: only x can go
        out = e.prepare_store(["y"])
        assert out is not None and out.evicted_keys == (b"x",)
        assert b"k0" in e.core.table.index  # still resident for r1
        e.complete_store(["y"])
        e.prepare_load(["k0"], R1)
        e.complete_load(["k0"], R1)
        assert e.stats().pinned_blocks == 0


async def test_finished_request_releases_its_pins() -> None:
    tier = await seeded(2)
    async with TieringEngine(PrimaryTier(2, 64), [tier]) as e:
        assert await e.lookup_prefix(["k0", "k1"], R1) is None
        await e.wait(["k0", "k1"])
        e.prepare_load(["k0"], R1)
        assert e.stats().pinned_blocks == 2
        assert e.prepare_store(["z"]) is None
        e.end_step(finished_req_ids=["r1"])
        assert e.stats().pinned_blocks == 0
        assert e.prepare_store(["z"]) is not None


async def test_anonymous_promotion_pins_last_until_next_step() -> None:
    tier = await seeded(1)
    async with TieringEngine(PrimaryTier(1, 64), [tier]) as e:
        assert await e.lookup("k0") is RETRY
        await e.wait(["k0"])
        assert not await e.put("other", b"o")
        e.end_step()
        assert await e.put("other", b"o")


async def test_request_pins_expire_after_pin_steps() -> None:
    tier = await seeded(1)
    async with TieringEngine(PrimaryTier(1, 64), [tier], pin_steps=2) as e:
        assert await e.lookup("k0", R1) is RETRY
        await e.wait(["k0"])
        e.end_step()
        assert e.stats().pinned_blocks == 1
        e.end_step()
        assert e.stats().pinned_blocks == 0


async def test_prepare_store_none_changes_nothing_and_counts() -> None:
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        assert await e.put("a", b"a")
        e.prepare_load(["a"], R1)
        assert e.prepare_store(["b", "c"], R2) is None
        assert set(e.core.table.index) == {b"a"}
        assert counter(e, "allocation_failures", "store") == 1
        out = e.prepare_store(["b", "b", "a"], R2)
        assert out is not None and out.keys_to_store == (b"b",)
        out.store_spec.buffers[0][:3] = b"bbb"
        assert await e.lookup("b", R2) is RETRY
        e.complete_store(["b"], R2, sizes=[3])
        assert await e.get("b") == b"bbb"
        events = e.take_events()
        assert any(ev.keys == (b"b",) and not ev.removed for ev in events)
        assert e.take_events() == []


async def test_prepare_load_of_non_hit_pins_nothing() -> None:
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        assert await e.put("a", b"a")
        with pytest.raises(BlockNotReadyError, match="'b'"):
            e.prepare_load(["a", "b"], R1)
        assert e.stats().pinned_blocks == 0
        with pytest.raises(KeyError):
            e.prepare_load(["b"])


async def test_pending_store_is_retry_then_miss_after_timeout() -> None:
    async with TieringEngine(PrimaryTier(2, 64), promotion_timeout=0.05) as e:
        assert e.prepare_store(["s"], R1) is not None
        assert await e.lookup("s") is RETRY
        assert await e.wait(["s"], timeout=5) == [MISS]
        assert await e.lookup("s") is MISS
        e.complete_store(["s"], R1)
        assert await e.lookup("s") is HIT


async def test_wait_reads_a_memory_tier_promotion_at_once_and_only_once() -> None:
    """A caller waiting for a promotion from a tier that never suspends gets its bytes
    without a loop turn (nothing else runs in between), and the read queued for the loop
    does not run a second time."""
    tier = await seeded(8)
    async with TieringEngine(PrimaryTier(8, 64), [tier]) as e:
        keys = [f"k{i}" for i in range(8)]
        assert await e.lookup_prefix(keys) is None  # RETRY: eight promotions started
        ran_first: list[str] = []
        asyncio.get_running_loop().call_soon(ran_first.append, "another callback")
        assert await e.wait(keys) == [HIT] * 8
        assert ran_first == []
        for _ in range(3):  # the turns the queued read would have run in
            await asyncio.sleep(0)
        assert ran_first == ["another callback"]
        assert counter(e, "promotions", "memory", "ok") == 8
        assert counter(e, "read_bytes", "memory") == 8 * 64
        spec = e.prepare_load(keys)
        assert [bytes(b) for b in spec.buffers] == [block(i) for i in range(8)]
        e.complete_load(keys)


async def test_wait_times_out() -> None:
    tier = FaultyTier(await seeded(1)).delay("read", 1.0)
    async with TieringEngine(PrimaryTier(2, 64), [tier]) as e:
        assert await e.lookup("k0") is RETRY
        with pytest.raises(TimeoutError):
            await e.wait(["k0"], timeout=0.01)


async def test_write_back_demotes_and_get_finds_block_in_flight() -> None:
    tier = FaultyTier(MemoryTier(1 << 20)).delay("write", 0.2)
    async with TieringEngine(PrimaryTier(2, 64), [tier]) as e:
        for i in range(4):
            assert await e.put(f"k{i}", block(i))
        # k0 and k1 were evicted and are on their way down
        assert await e.get("k0") == block(0)
        # k1 is put back from its bytes in transit; that takes a slot (a block is evicted):
        # RETRY, then a HIT (tests/engine/test_readmission.py says why)
        assert await e.lookup("k1") is RETRY
        assert await e.lookup("k1") is HIT
        await e.flush()
        assert tier.inner.contains_hint(b"k0")
        assert counter(e, "evictions", "primary") >= 2


async def test_put_never_fails_because_of_slow_demotions() -> None:
    tier = FaultyTier(MemoryTier(1 << 20)).delay("write", 0.05)
    async with TieringEngine(PrimaryTier(2, 64), [tier]) as e:
        for i in range(20):
            assert await e.put(f"k{i}", block(i))
        for i in range(20):
            assert await e.get(f"k{i}") == block(i)


async def test_aclose_writes_down_primary_only_blocks(tmp_path: object) -> None:
    tier = MemoryTier(1 << 20)
    e = TieringEngine(PrimaryTier(4, 64), [tier])
    async with e:
        assert await e.put("a", b"a")
    assert tier.contains_hint(b"a")
    tier2 = MemoryTier(1 << 20)
    async with TieringEngine(PrimaryTier(4, 64), [tier2]) as e2:
        assert await e2.put("a", b"a")
        await e2.aclose(flush=False)
    assert not tier2.contains_hint(b"a")


async def test_put_replaces_everywhere() -> None:
    tier = await seeded(1)  # k0 holds block(0) below
    async with TieringEngine(PrimaryTier(1, 64), [tier]) as e:
        assert await e.put("k0", b"new")
        await e.flush()
        assert not tier.contains_hint(b"k0")
        assert await e.put("other", b"o")  # evicts k0 -> written down with the new bytes
        await e.flush()
        assert await e.get("k0") == b"new"


async def test_immutable_keys_keep_copies_below_and_skip_rewriting_them() -> None:
    """Content-addressed keys: a put of a key a tier holds neither removes that copy (another
    engine sharing the tier may read it) nor writes it back again on eviction."""
    tier = FaultyTier(await seeded(1))  # k0 holds block(0) below
    async with TieringEngine(PrimaryTier(1, 64), [tier], immutable_keys=True) as e:
        assert await e.put("k0", block(0))
        await e.flush()
        assert tier.contains_hint(b"k0")
        assert tier.calls["remove"] == 0
        assert await e.put("k1", block(1))  # evicts k0: already below, not written again
        await e.flush()
        assert tier.calls["write"] == 0
        assert await e.put("k2", block(2))  # evicts k1: not below yet, written down
        await e.flush()
        assert tier.calls["write"] == 1
        assert await e.get("k0") == block(0)
        assert await e.get("k1") == block(1)
        assert await e.delete("k0")  # an explicit delete still removes it everywhere
        await e.flush()
        assert not tier.contains_hint(b"k0")
    with pytest.raises(ConfigError, match="immutable_keys"):
        TieringEngine(PrimaryTier(1, 64), immutable_keys=1)  # type: ignore[arg-type]


async def test_put_over_a_loading_block_keeps_the_loader_view() -> None:
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        assert await e.put("a", b"old")
        spec = e.prepare_load(["a"], R1)
        assert await e.put("a", b"new")
        assert bytes(spec.buffers[0]) == b"old"
        assert await e.get("a") == b"new"
        e.complete_load(["a"], R1)
        assert e.stats().pinned_blocks == 0
        assert await e.put("b", b"b")


async def test_put_over_a_pending_store_keeps_the_storer_slot_until_it_completes() -> None:
    async with TieringEngine(PrimaryTier(3, 8)) as e:
        out = e.prepare_store(["k"], R1)
        assert out is not None
        assert await e.put("k", b"put")  # the put wins; the storer's slot stays reserved
        for i in range(4):  # churn the other two slots: the storer's is never handed out
            assert await e.put(f"x{i}", b"x%d" % i)
        index = e.core.table.index
        assert out.store_spec.block_ids[0] not in {index[b"x2"], index[b"x3"]}
        out.store_spec.buffers[0][:5] = b"store"  # the storer writes late: harms nobody
        assert [await e.get(f"x{i}") for i in (2, 3)] == [b"x2", b"x3"]
        e.complete_store(["k"], R1)
        assert await e.get("k") is None  # evicted by the churn (no tier below), never "store"
        assert e.stats().pinned_blocks == 0


async def test_delete_of_a_pending_store_frees_it_when_the_request_finishes() -> None:
    async with TieringEngine(PrimaryTier(1, 8)) as e:
        assert e.prepare_store(["k"], R1) is not None
        assert not await e.delete("k")  # a pending store is not a block yet
        assert await e.lookup("k") is MISS
        assert not await e.put("x", b"x")  # the storer still holds the only slot
        e.end_step(finished_req_ids=["r1"])
        assert await e.put("x", b"x")


async def test_delete_removes_from_every_tier() -> None:
    t1, t2 = await seeded(1, "m1"), await seeded(1, "m2")
    async with TieringEngine(PrimaryTier(2, 64), [t1, t2]) as e:
        assert await e.put("k0", b"p")
        assert await e.delete("k0")
        assert not t1.contains_hint(b"k0") and not t2.contains_hint(b"k0")
        assert await e.get("k0") is None
        assert not await e.delete("k0")


async def test_write_through_writes_every_tier() -> None:
    t1, t2 = MemoryTier(1 << 20, name="m1"), MemoryTier(1 << 20, name="m2")
    async with TieringEngine(PrimaryTier(2, 64), [t1, t2], write_policy="write_through") as e:
        assert await e.put("a", b"a")
        out = e.prepare_store(["b"])
        assert out is not None
        e.complete_store(["b"], sizes=[0])
        await e.flush()
        assert all(t.contains_hint(k) for t in (t1, t2) for k in (b"a", b"b"))


async def test_write_policy_none_drops_evicted_blocks() -> None:
    tier = MemoryTier(1 << 20)
    async with TieringEngine(PrimaryTier(1, 64), [tier], write_policy="none") as e:
        assert await e.put("a", b"a")
        assert await e.put("b", b"b")
        await e.flush()
        assert await e.get("a") is None
        assert tier.usage().blocks == 0


async def test_evictions_cascade_down_the_tiers() -> None:
    t1, t2 = MemoryTier(128, name="m1"), MemoryTier(1 << 20, name="m2")
    async with TieringEngine(PrimaryTier(1, 64), [t1, t2]) as e:
        for i in range(5):
            assert await e.put(f"k{i}", block(i))
        await e.flush()
        await e.flush()
        assert t1.usage().blocks == 2
        assert t2.usage().blocks == 2
        for i in range(5):
            assert await e.get(f"k{i}") == block(i)
        e.end_step()
        assert counter(e, "evictions", "m1") >= 2


async def test_lookup_prefix_counts_hits_and_starts_later_promotions() -> None:
    tier = await seeded(8)
    async with TieringEngine(PrimaryTier(8, 64), [tier]) as e:
        assert await e.put("p0", b"0")
        assert await e.put("p1", b"1")
        assert await e.lookup_prefix(["p0", "p1"], R1) == 2
        assert await e.lookup_prefix(["p0", "missing", "k0"], R1) == 1
        assert await e.lookup_prefix(["p0", "k0", "k1", "missing", "k2"], R1) is None
        assert await e.wait(["k0", "k1", "k2"]) == [HIT, HIT, MISS]
        assert await e.lookup_prefix(["p0", "k0", "k1", "missing"], R1) == 3
        assert await e.lookup_prefix([], R1) == 0


async def test_promotions_in_flight_are_bounded() -> None:
    tier = FaultyTier(await seeded(10)).delay("read", 0.05)
    async with TieringEngine(PrimaryTier(16, 64), [tier], max_inflight_promotions=4) as e:
        assert await e.lookup_prefix([f"k{i}" for i in range(10)], R1) is None
        assert e.stats().promotions_in_flight == 4
        assert counter(e, "allocation_failures", "promotion") == 6
        assert await e.wait([f"k{i}" for i in range(4)]) == [HIT] * 4


async def test_aclose_mid_promotion_leaks_nothing() -> None:
    tier = FaultyTier(await seeded(4)).hang("read")
    e = TieringEngine(PrimaryTier(4, 64), [tier], promotion_timeout=30)
    async with e:
        assert await e.lookup_prefix(["k0", "k1"], R1) is None
    assert not aiotier_tasks()
    assert e.stats().promotions_in_flight == 0
    with pytest.raises(TieringError, match="closed"):
        await e.lookup("k0")
    current = asyncio.current_task()
    assert {t for t in asyncio.all_tasks() if t is not current} == set()


@pytest.mark.parametrize(
    ("key", "exc", "match"),
    [(1, TypeError, "bytes or str"), (b"x" * 1025, ValueError, "1025 bytes"),
     (bytearray(b"a"), TypeError, "bytearray"), (None, TypeError, "NoneType"),
     (memoryview(b"a"), TypeError, "memoryview"),  # equal to, and hashing as, the stored b"a"
     (memoryview(bytearray(b"a")), TypeError, "memoryview")],  # hashing it raises ValueError
)  # fmt: skip
async def test_bad_keys_raise_and_change_nothing(key: object, exc: type, match: str) -> None:
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        assert await e.put("a", b"a")
        for call in (e.lookup(key), e.get(key), e.put(key, b"v"), e.delete(key),  # type: ignore[arg-type]
                     e.lookup_prefix(["a", key]), e.lookup_prefix([key]),  # type: ignore[list-item]
                     e.prefetch([key], timeout=0)):  # type: ignore[list-item]  # fmt: skip
            with pytest.raises(exc, match=match):
                await call
        with pytest.raises(exc, match=match):
            e.prepare_store(["b", key])  # type: ignore[list-item]
        with pytest.raises(exc, match=match):
            e.prepare_load([key])  # type: ignore[list-item]
        assert set(e.core.table.index) == {b"a"} and e.stats().pinned_blocks == 0


def test_a_memoryview_key_gets_the_same_error_from_a_blocking_engine() -> None:
    with BlockingEngine(PrimaryTier(2, 64)) as e:
        assert e.put("a", b"a")
        for call in (e.lookup, e.get):
            with pytest.raises(TypeError, match="memoryview"):
                call(memoryview(b"a"))  # type: ignore[operator]
        with pytest.raises(TypeError, match="memoryview"):
            e.lookup_prefix([memoryview(b"a")])  # type: ignore[list-item]
        assert e.lookup(b"a") is HIT


async def test_bad_values_and_calls_raise_clearly() -> None:
    async with TieringEngine(PrimaryTier(2, 8)) as e:
        with pytest.raises(ValueError, match="9 bytes, block_size is 8"):
            await e.put("a", b"x" * 9)
        with pytest.raises(TypeError, match="bytes-like"):
            await e.put("a", "text")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="did not prepare"):
            e.complete_store(["never"])
        with pytest.raises(ValueError, match="did not prepare_load"):
            e.complete_load(["never"], R1)
        out = e.prepare_store(["s"], R1)
        assert out is not None
        with pytest.raises(ValueError, match=r"not in 0\.\.8"):
            e.complete_store(["s"], R1, sizes=[9])
        with pytest.raises(TypeError, match="single str"):
            await e.lookup_prefix("abc")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="str request ids"):
            e.end_step(new_req_ids=[1])  # type: ignore[list-item]
        e.complete_store(["s"], R1, sizes=[8])  # the failed calls changed nothing
        assert await e.lookup("s") is HIT
        assert set(e.core.table.index) == {b"s"}


def test_bad_construction_is_rejected() -> None:
    with pytest.raises(ConfigError, match="num_blocks must be > 0"):
        PrimaryTier(0, 64)
    with pytest.raises(ConfigError, match="'mru'"):
        PrimaryTier(4, 64, policy="mru")
    with pytest.raises(ConfigError, match="write_policy"):
        TieringEngine(PrimaryTier(1, 8), write_policy="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="used twice"):
        TieringEngine(PrimaryTier(1, 8), [MemoryTier(8), MemoryTier(8)])
    with pytest.raises(ConfigError, match="promotion_timeout"):
        TieringEngine(PrimaryTier(1, 8), promotion_timeout=0)
    with pytest.raises(TypeError, match="PrimaryTier"):
        TieringEngine(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"sequence of tiers, e\.g\. \[MemoryTier\(\.\.\.\)\]"):
        TieringEngine(PrimaryTier(1, 8), MemoryTier(8))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="capacity_bytes"):
        MemoryTier("1G")  # type: ignore[arg-type]


async def test_calls_before_open_raise() -> None:
    e = TieringEngine(PrimaryTier(1, 8))
    with pytest.raises(TieringError, match="not open"):
        await e.put("a", b"a")


async def test_arc_engine_round_trips() -> None:
    tier = MemoryTier(1 << 20)
    async with TieringEngine(PrimaryTier(3, 64, policy="arc"), [tier]) as e:
        for i in range(10):
            assert await e.put(f"k{i}", block(i))
            assert await e.get(f"k{i // 2}") == block(i // 2)
        for i in range(10):
            assert await e.get(f"k{i}") == block(i)


async def test_a_tier_that_hangs_at_open_is_a_clear_error() -> None:
    tier = FaultyTier(MemoryTier(1 << 20)).hang("open")
    e = TieringEngine(PrimaryTier(1, 8), [tier], open_timeout=0.05)
    with pytest.raises(TieringError, match=r"did not open within 0\.05s"):
        await e.open()


async def test_a_wrong_request_type_is_refused_even_on_a_hit() -> None:
    async with TieringEngine(PrimaryTier(2, 8)) as e:
        assert await e.put("a", b"a")
        with pytest.raises(TypeError, match="RequestContext"):
            await e.lookup("a", "r1")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="RequestContext"):
            await e.lookup_prefix(["a"], "r1")  # type: ignore[arg-type]


def test_an_engine_used_from_another_event_loop_says_so() -> None:
    engine = TieringEngine(PrimaryTier(4, 64), [MemoryTier(1 << 16)])
    asyncio.run(engine.open())

    async def elsewhere() -> None:
        calls = (
            engine.lookup(b"k"), engine.lookup_prefix([b"k"]), engine.prefetch([b"k"], timeout=1),
            engine.get(b"k"), engine.put(b"k", b"v"), engine.delete(b"k"), engine.flush(),
            engine.wait([b"k"]), engine.clear(), engine.aclose(),
        )  # fmt: skip
        for call in calls:
            with pytest.raises(TieringError, match="belongs to the event loop that opened it"):
                await call

    asyncio.run(elsewhere())
