"""Review findings: races across awaits, pins, stale bytes, write-back queue, metrics.

Tests marked xfail(strict=True) expose engine bugs still open (the reason names it). Unmarked
tests pin down tricky behaviour that holds; most began as xfail findings and stay as regression
tests for the fixes (42d4d3b, 4faed5d, b2d3e0a).
"""

from __future__ import annotations

import array
import asyncio
import contextlib

import pytest
from helpers import aiotier_tasks, eventually
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import (
    BlockNotReadyError,
    LookupResult,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    TieringEngine,
)
from aiotier.testing import FaultyTier, MetricsProbe

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
R1, R2 = RequestContext("r1"), RequestContext("r2")


def block(i: int, size: int = 64) -> bytes:
    return bytes([i % 256]) * size


async def seeded(n: int, name: str = "memory", capacity: int = 1 << 20) -> MemoryTier:
    tier = MemoryTier(capacity, name=name)
    for i in range(n):
        await tier.write(b"k%d" % i, block(i))
    return tier


# ----------------------------------------------------------------------------- get() and pins


async def test_concurrent_gets_leave_no_pin() -> None:
    tier = FaultyTier(await seeded(1)).delay("lookup", 0.02)
    async with TieringEngine(PrimaryTier(1, 64), [tier]) as e:
        a, b = await asyncio.gather(e.get("k0"), e.get("k0"))
        assert a == b == block(0)
        # SPEC 4: get() holds its pin only while copying; a server with no scheduler never
        # calls end_step, so a leftover anonymous pin would hold the slot forever
        assert e.stats().pinned_blocks == 0
        assert await e.put("x", b"x")


async def test_get_of_block_below_holds_no_pin() -> None:
    tier = FaultyTier(await seeded(1)).delay("read", 0.02)
    async with TieringEngine(PrimaryTier(1, 64), [tier]) as e:
        a, b = await asyncio.gather(e.get("k0"), e.get("k0"))
        assert a == b == block(0)
        assert e.stats().pinned_blocks == 0
        assert tier.calls["read"] == 1


async def test_get_survives_eviction_of_its_promoted_block() -> None:
    tier = FaultyTier(await seeded(1)).delay("read", 0.02)
    async with TieringEngine(PrimaryTier(1, 64), [tier]) as e:

        async def evict_when_ready() -> None:
            for _ in range(100_000):  # poll every loop iteration, bounded
                if e.core.table.ready_slot(b"k0") is not None:
                    break
                await asyncio.sleep(0)
            # before 42d4d3b k0 was unpinned here and this evicted it: get() answered None
            await e.put("x", b"x")

        got, _ = await asyncio.gather(e.get("k0"), evict_when_ready())
        assert got == block(0)


async def test_re_prepared_store_after_a_put_leaks_no_pin() -> None:
    async with TieringEngine(PrimaryTier(3, 8)) as e:
        assert e.prepare_store(["k"], R1) is not None
        assert await e.put("k", b"put")  # replaces the pending store (its slot: an orphan)
        assert await e.delete("k")
        out = e.prepare_store(["k"], R1)  # the same request prepares the key again
        assert out is not None and out.keys_to_store == (b"k",)
        e.complete_store(["k"], R1, sizes=[0])
        e.end_step(finished_req_ids=["r1"])
        assert e.stats().pinned_blocks == 0
        for i in range(3):  # every slot can be used again
            assert await e.put(f"x{i}", b"x")


async def test_get_with_a_request_leaves_no_request_state() -> None:
    async with TieringEngine(PrimaryTier(2, 8)) as e:
        assert await e.put("a", b"a")
        for i in range(100):
            assert await e.get("a", RequestContext(f"r{i}")) == b"a"
            assert await e.get("missing", RequestContext(f"m{i}")) is None
        e.end_step()
        assert len(e.core.requests) == 0


async def test_request_finished_during_its_lookup_keeps_no_pin() -> None:
    tier = FaultyTier(await seeded(1)).delay("lookup", 0.05)
    async with TieringEngine(PrimaryTier(2, 64), [tier], pin_steps=1000) as e:
        looking = asyncio.ensure_future(e.lookup("k0", R1))
        await asyncio.sleep(0.01)  # inside the tier's lookup
        e.end_step(finished_req_ids=["r1"])
        assert await looking is RETRY
        assert await e.wait(["k0"]) == [HIT]
        e.end_step(finished_req_ids=["r1"])
        assert e.stats().pinned_blocks == 0  # SPEC 6: a request that finishes releases its pins


async def test_sync_delay_of_a_lookup_spanning_end_step_is_observed(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = FaultyTier(MemoryTier(1 << 20)).delay("lookup", 0.05)
    async with TieringEngine(PrimaryTier(2, 64), [tier], meter_provider=provider) as e:
        looking = asyncio.ensure_future(e.lookup("nope", R1))
        await asyncio.sleep(0.01)
        e.end_step(new_req_ids=["r1"])
        assert await looking is MISS
        e.end_step(finished_req_ids=["r1"])
        assert probe.count("aiotier_lookup_sync_delay_seconds") == 1
    provider.shutdown()


async def test_promotion_superseded_before_its_read_counts_cancelled(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = FaultyTier(await seeded(1)).delay("read", 0.05)  # the put's remove lands first
    async with TieringEngine(PrimaryTier(4, 64), [tier], meter_provider=provider) as e:
        assert await e.lookup("k0", R1) is RETRY
        assert await e.put("k0", b"new")
        await eventually(lambda: not aiotier_tasks("promote"))
        e.end_step(finished_req_ids=["r1"])
        assert probe.value("aiotier_promotions_total", tier="memory", outcome="error") == 0
        assert probe.value("aiotier_promotions_total", tier="memory", outcome="cancelled") == 1
    provider.shutdown()


async def test_async_delay_starts_at_the_retry_not_before_the_tier_lookup(
    probe: MetricsProbe,
) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = FaultyTier(await seeded(1)).delay("lookup", 0.2)
    async with TieringEngine(PrimaryTier(2, 64), [tier], meter_provider=provider) as e:
        assert await e.lookup("k0", R1) is RETRY  # the deferral starts here
        e.end_step(new_req_ids=["r1"])  # ... and is observed here, at once
        assert probe.sum("aiotier_lookup_sync_delay_seconds") >= 0.2
        assert probe.count("aiotier_lookup_async_delay_seconds") == 1
        assert probe.sum("aiotier_lookup_async_delay_seconds") < 0.1
    provider.shutdown()


# ----------------------------------------------------------------------------- events


async def test_delete_of_a_block_below_emits_a_removed_event() -> None:
    tier = await seeded(1)
    async with TieringEngine(PrimaryTier(2, 64), [tier]) as e:
        assert await e.delete("k0")
        events = e.take_events()
        assert any(ev.removed and ev.keys == (b"k0",) and ev.tier == "memory" for ev in events)


async def test_eviction_by_the_last_tier_emits_a_removed_event() -> None:
    tier = MemoryTier(64)  # one block
    async with TieringEngine(PrimaryTier(1, 64), [tier]) as e:
        assert await e.put("a", block(1))
        assert await e.put("b", block(2))  # a is written down
        assert await e.put("c", block(3))  # b is written down, evicting a from the tier
        await e.flush()
        events = e.take_events()
        assert any(b"a" in ev.keys and ev.tier == "memory" and not ev.removed for ev in events)
        assert any(b"a" in ev.keys and ev.tier == "memory" and ev.removed for ev in events)


# ----------------------------------------------------------------------------- bad input


async def test_prepare_store_with_bad_req_changes_nothing() -> None:
    async with TieringEngine(PrimaryTier(2, 8)) as e:
        assert await e.put("old", b"o")
        with pytest.raises(TypeError, match="RequestContext"):
            e.prepare_store(["a", "b"], "r1")  # type: ignore[arg-type]
        assert set(e.core.table.index) == {b"old"}
        assert e.stats().pinned_blocks == 0


async def test_lookup_hit_with_bad_req_raises() -> None:
    async with TieringEngine(PrimaryTier(2, 8)) as e:
        assert await e.put("a", b"a")
        with pytest.raises(TypeError, match="RequestContext"):
            await e.lookup(b"a", "r1")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="RequestContext"):
            await e.lookup_prefix([b"a"], "r1")  # type: ignore[arg-type]


async def test_put_of_a_wide_memoryview_stores_its_bytes_or_changes_nothing() -> None:
    wide = memoryview(array.array("I", [1, 2]))  # 8 bytes, 2 items
    async with TieringEngine(PrimaryTier(1, 16)) as e:
        assert await e.put("old", b"o" * 16)
        try:
            stored = await e.put("k", wide)
        except (TypeError, ValueError):
            stored = False
            assert set(e.core.table.index) == {b"old"}  # a clear error, nothing changed
        got = await e.get("k")
        assert got == (wide.tobytes() if stored else None)


async def test_lookup_prefix_of_an_iterator_answers_or_refuses() -> None:
    async with TieringEngine(PrimaryTier(4, 8)) as e:
        assert await e.put("a", b"a")
        assert await e.put("b", b"b")
        try:
            n = await e.lookup_prefix(iter(["a", "b", "c"]))  # type: ignore[arg-type]
        except TypeError:
            return
        assert n == 2


async def test_completing_for_an_unknown_request_changes_nothing() -> None:
    ghost = RequestContext("ghost")
    async with TieringEngine(PrimaryTier(2, 8)) as e:
        assert await e.put("a", b"a")
        with pytest.raises(ValueError, match="did not prepare_load"):
            e.complete_load(["a"], ghost)
        with pytest.raises(ValueError, match="did not prepare"):
            e.complete_store(["a"], ghost)
        assert "ghost" not in e.core.requests


# ----------------------------------------------------------------------------- write-back queue


async def test_aclose_keeps_a_put_whose_old_copy_is_being_removed() -> None:
    inner = await seeded(1)  # k0 = block(0) below
    tier = FaultyTier(inner).delay("remove", 0.02)
    e = TieringEngine(PrimaryTier(2, 64), [tier])
    async with e:
        assert await e.put("k0", b"new")  # queues REMOVE(k0) for the tier
    # aclose writes down blocks that live only in the primary: k0 must survive the close
    assert inner._data.get(b"k0") == b"new"


async def test_put_over_a_queued_demotion_leaves_no_old_bytes_below() -> None:
    inner = MemoryTier(1 << 20)
    tier = FaultyTier(inner).delay("write", 0.02)
    e = TieringEngine(PrimaryTier(1, 64), [tier])
    async with e:
        assert await e.put("k", b"v1")
        assert await e.put("x", b"x")  # evicts k: WRITE(k, v1) queued
        assert await e.put("k", b"v2")  # replaces k everywhere
        await e.flush()
        assert inner._data.get(b"k") != b"v1"  # SPEC: no tier ever returns the older bytes
    assert inner._data.get(b"k") == b"v2"
    async with TieringEngine(PrimaryTier(1, 64), [inner]) as e2:
        assert await e2.get("k") == b"v2"


async def test_delete_during_cascade_handover_does_not_resurrect() -> None:
    m1 = MemoryTier(64, name="m1")  # room for one block
    m2 = MemoryTier(1 << 20, name="m2")
    await m1.write(b"k", b"old")
    async with TieringEngine(PrimaryTier(1, 64), [m1, m2]) as e:
        assert await e.put("x", block(1))
        assert await e.put("y", block(2))  # evicts x: WRITE(x) to m1 will push k down to m2
        await e.delete("k")
        await e.flush()
        await e.flush()
        assert await e.get("k") is None
        assert not m2.contains_hint(b"k")


async def test_put_during_cascade_handover_leaves_no_old_bytes_below() -> None:
    m1 = FaultyTier(MemoryTier(64, name="m1"))  # room for one block
    m2 = MemoryTier(1 << 20, name="m2")
    await m1.inner.write(b"k", b"old")
    async with TieringEngine(PrimaryTier(1, 64), [m1, m2]) as e:
        assert await e.put("x", block(1))
        assert await e.put("k", b"new")  # evicts x: WRITE(x) to m1 will push k(old) down
        await e.flush()
        await e.flush()
        m1.fail("write")  # the new copy cannot be written down: lost, and counted
        assert await e.put("z", block(3))  # evicts k (new)
        await e.flush()
        assert await e.get("k") != b"old"  # SPEC: no tier ever returns the older bytes


async def test_block_on_its_way_down_between_secondary_tiers_is_found() -> None:
    m1 = FaultyTier(MemoryTier(64, name="m1")).delay("write", 0.05)  # one block
    m2 = MemoryTier(1 << 20, name="m2")
    await m1.inner.write(b"k", b"kept")
    async with TieringEngine(PrimaryTier(1, 64), [m1, m2]) as e:
        assert await e.put("x", block(1))
        assert await e.put("y", block(2))  # WRITE(x) queued
        assert await e.put("z", block(3))  # WRITE(y) queued: one batch [x, y]
        await eventually(lambda: m1.calls["write"] >= 2)  # x written (k evicted), y pending
        assert await e.get("k") == b"kept"  # SPEC 4: on its way down, never None


async def test_get_whose_promotion_pushes_the_block_down_still_returns_it() -> None:
    m1 = FaultyTier(MemoryTier(64, name="m1")).delay("read", 0.05)  # one block
    m2 = MemoryTier(1 << 20, name="m2")
    await m1.inner.write(b"k", b"kept")
    async with TieringEngine(PrimaryTier(1, 64), [m1, m2]) as e:
        assert await e.put("x", block(1))  # dirty: its eviction is written to m1
        # the promotion of k evicts x; x's write-back evicts k from m1, handed to m2
        assert await e.get("k") == b"kept"


async def test_stale_copy_is_not_handed_down_and_served() -> None:
    m1 = FaultyTier(MemoryTier(64, name="m1"))  # one 64-byte block
    m2 = MemoryTier(1 << 20, name="m2")
    await m1.inner.write(b"k", b"old")
    async with TieringEngine(PrimaryTier(2, 64), [m1, m2]) as e:
        m1.fail("remove")
        assert await e.put("k", b"new")  # its REMOVE from m1 fails: old stays there (stale)
        await e.flush()
        m1.heal()
        assert await e.put("x", block(1))
        assert await e.get("k") == b"new"  # k most recent
        assert await e.put("y", block(2))  # evicts x: its write to m1 pushes "old" down to m2
        await e.flush()
        await e.flush()
        assert await e.put("z", block(3))  # evicts k: "new" is written to m1
        await e.flush()
        await e.flush()
        assert await e.delete("y") and await e.delete("z")  # room to promote, no write-back
        m1.fail("lookup")  # m1 answers MISS (a counted tier error) ...
        assert await e.get("k") in (b"new", None)  # ... and m2 must not serve the older bytes


async def test_write_through_older_copy_not_served_while_newer_write_queued() -> None:
    m1 = FaultyTier(MemoryTier(1 << 20, name="m1"))
    m2 = FaultyTier(MemoryTier(1 << 20, name="m2"))
    async with TieringEngine(PrimaryTier(1, 64), [m1, m2], write_policy="write_through") as e:
        assert await e.put("k", b"v1")
        await e.flush()
        m1.fail("write")
        m2.delay("write", 0.3)
        assert await e.put("k", b"v2")  # m1's write fails (stale there), m2's is slow
        assert await e.put("x", b"x")  # evicts k: write_through keeps no copy of its own
        await eventually(lambda: b"k" not in e.core.coherence.demoting)  # m1's write failed
        assert await e.get("k") in (b"v2", None)  # never the older v1 from m2


class _LateWriterTier(MemoryTier):
    """Reads slowly and, when cancelled, still writes its buffer a moment later (a thread)."""

    async def read_into(self, key: bytes, buf: memoryview) -> int:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)
            buf[:4] = b"LATE"
            raise
        return await super().read_into(key, buf)


async def test_slot_of_a_timed_out_promotion_is_not_reused_while_the_read_writes() -> None:
    tier = _LateWriterTier(1 << 20)
    await tier.write(b"k", b"kkkk")
    async with TieringEngine(PrimaryTier(1, 4), [tier], promotion_timeout=0.05) as e:
        assert await e.lookup("k") is RETRY
        assert await e.wait(["k"], timeout=5) == [MISS]
        assert not await e.put("x", b"xxxx")  # the only slot is still the read's
        await eventually(lambda: e.stats().pinned_blocks == 0)
        assert await e.put("x", b"xxxx")
        assert await e.get("x") == b"xxxx"


async def test_get_retry_observes_one_deferral(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    m1 = FaultyTier(MemoryTier(64, name="m1")).delay("read", 0.05)  # one block
    m2 = MemoryTier(1 << 20, name="m2")
    await m1.inner.write(b"k", b"kept")
    async with TieringEngine(PrimaryTier(1, 64), [m1, m2], meter_provider=provider) as e:
        assert await e.put("x", block(1))
        assert await e.get("k") == b"kept"  # promoted from m2 on its second attempt
        e.end_step()
        assert probe.count("aiotier_lookup_async_delay_seconds") == 1
        assert probe.count("aiotier_lookup_sync_delay_seconds") == 1
    provider.shutdown()


async def test_write_through_dropped_write_leaves_no_older_copy_readable() -> None:
    tier = FaultyTier(MemoryTier(1 << 20))
    async with TieringEngine(
        PrimaryTier(1, 64), [tier], write_policy="write_through", max_pending_write_bytes=64
    ) as e:
        assert await e.put("k", block(1))
        await e.flush()  # the tier holds block(1)
        tier.hang("write")
        assert await e.put("a", block(2))  # its write hangs, holding the 64-byte budget
        await eventually(lambda: tier.calls["write"] >= 2)
        assert await e.put("k", block(3))  # its write is dropped (over the bound), counted
        assert await e.put("x", b"x")  # evicts k
        tier.heal()
        await e.flush()
        assert await e.get("k") != block(1)  # SPEC: no tier ever returns the older bytes


async def test_overlapping_lookup_prefixes_share_promotions_and_release_pins() -> None:
    tier = FaultyTier(await seeded(4)).delay("lookup", 0.02).delay("read", 0.02)
    async with TieringEngine(PrimaryTier(8, 64), [tier]) as e:
        a, b = await asyncio.gather(
            e.lookup_prefix(["k0", "k1", "k2"], R1), e.lookup_prefix(["k1", "k2", "k3"], R2)
        )
        assert a is None and b is None
        assert await e.wait(["k0", "k1", "k2", "k3"]) == [HIT] * 4
        assert tier.calls["read"] == 4  # one read per key, never a second promotion
        assert await e.lookup_prefix(["k0", "k1", "k2"], R1) == 3
        spec = e.prepare_load(["k0", "k1", "k2"], R1)
        assert [bytes(v) for v in spec.buffers] == [block(0), block(1), block(2)]
        e.complete_load(["k0", "k1", "k2"], R1)
        e.end_step(finished_req_ids=["r1"])
        assert e.stats().pinned_blocks == 3  # r2's RETRY pins on k1..k3
        e.end_step(finished_req_ids=["r2"])
        assert e.stats().pinned_blocks == 0


async def test_get_read_around_finds_a_block_that_moved_down() -> None:
    m1 = FaultyTier(MemoryTier(64, name="m1")).delay("read", 0.05)  # one block
    m2 = MemoryTier(1 << 20, name="m2")
    m3 = FaultyTier(MemoryTier(1 << 20, name="m3")).hang("read")
    await m1.inner.write(b"k", b"kept")
    await m3.inner.write(b"h", b"hung")
    tiers = [m1, m2, m3]
    async with TieringEngine(PrimaryTier(2, 64), tiers, max_inflight_promotions=1) as e:
        assert await e.lookup("h") is RETRY  # its read hangs: the promotion budget is spent
        assert await e.put("x", block(1))
        getting = asyncio.ensure_future(e.get("k"))  # no budget: reads k around the primary
        await eventually(lambda: m1.calls["read"] >= 1)
        assert await e.put("y", block(2))  # evicts x: its write to m1 pushes k down to m2
        assert await getting == b"kept"


# ----------------------------------------------------------------------------- lookup races


async def test_put_while_lookup_awaits_tier_is_not_undone_by_promotion() -> None:
    inner = await seeded(1)  # k0 = block(0) below
    tier = FaultyTier(inner).delay("lookup", 0.05).delay("remove", 0.3)
    async with TieringEngine(PrimaryTier(1, 64), [tier]) as e:
        looking = asyncio.ensure_future(e.lookup("k0"))
        await asyncio.sleep(0.01)  # the lookup is inside the tier's lookup
        assert await e.put("k0", b"new")  # queues REMOVE(k0) below
        assert await e.put("x", b"x")  # evicts k0 (new): on its way down
        await looking
        await e.wait(["k0"])
        assert await e.get("k0") == b"new"


async def test_delete_while_lookup_awaits_tier_sticks() -> None:
    inner = await seeded(1)
    tier = FaultyTier(inner).delay("lookup", 0.05).delay("remove", 0.2)
    async with TieringEngine(PrimaryTier(2, 64), [tier]) as e:
        looking = asyncio.ensure_future(e.lookup("k0"))
        await asyncio.sleep(0.01)
        await e.delete("k0")
        await looking
        await e.wait(["k0"])
        assert await e.lookup("k0") is MISS
        assert await e.get("k0") is None


async def test_flush_timeout_loses_no_queued_operation() -> None:
    inner = MemoryTier(1 << 20)
    tier = FaultyTier(inner).hang("write")
    async with TieringEngine(PrimaryTier(1, 64), [tier], io_timeout=1) as e:
        assert await e.put("a", b"a")
        assert await e.put("b", b"b")  # evicts a: WRITE(a) hangs in the writer
        await eventually(lambda: tier.calls["write"] == 1)
        assert await e.put("c", b"c")  # evicts b: WRITE(b) queued behind it
        with contextlib.suppress(TimeoutError):  # raising is fine; dropping work is not
            await e.flush(timeout=0.05)
        tier.heal()
        await e.flush(timeout=5)
        assert inner.contains_hint(b"a") and inner.contains_hint(b"b")


async def test_flush_timeout_does_not_hide_a_key_forever() -> None:
    inner = MemoryTier(1 << 20)
    tier = FaultyTier(inner).hang("write")
    async with TieringEngine(PrimaryTier(1, 64), [tier], io_timeout=1) as e:
        assert await e.put("a", b"a")
        assert await e.put("b", b"b")  # WRITE(a) hangs
        await eventually(lambda: tier.calls["write"] == 1)
        deleting = asyncio.ensure_future(e.delete("k"))  # REMOVE(k) queued behind it
        await asyncio.sleep(0)
        with contextlib.suppress(TimeoutError):
            await e.flush(timeout=0.05)
        tier.heal()
        await deleting
        await e.flush(timeout=5)
        await inner.write(b"k", b"kv")  # e.g. another engine sharing the tier wrote it
        assert await e.get("k") == b"kv"


# ----------------------------------------------------------------------------- metrics


@pytest.fixture
def probe() -> MetricsProbe:
    return MetricsProbe(InMemoryMetricReader())


async def test_superseded_promotion_is_counted_once(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    # the read completes (into the now orphaned slot) before the put's REMOVE reaches the tier
    tier = FaultyTier(await seeded(1)).delay("read", 0.05).delay("remove", 0.3)
    async with TieringEngine(PrimaryTier(4, 64), [tier], meter_provider=provider) as e:
        assert await e.lookup("k0", R1) is RETRY
        assert await e.put("k0", b"new")  # replaces the promoting block
        await eventually(lambda: not aiotier_tasks("promote"))
        e.end_step(finished_req_ids=["r1"])
        assert probe.value("aiotier_promotions_total", tier="memory") == 1
    provider.shutdown()


async def test_sync_delay_only_when_a_tier_was_consulted(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    async with TieringEngine(PrimaryTier(4, 64), meter_provider=provider) as e:
        assert await e.lookup("missing", R1) is MISS
        assert await e.lookup_prefix(["missing"], R2) == 0
        e.end_step(new_req_ids=["r1", "r2"])
        assert probe.count("aiotier_lookup_sync_delay_seconds") == 0
    provider.shutdown()


async def test_promotion_outcomes_and_lookup_counts(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = FaultyTier(await seeded(3)).delay("read", 0.01)
    async with TieringEngine(PrimaryTier(4, 64), [tier], meter_provider=provider) as e:
        assert await e.lookup_prefix(["k0", "k1", "nope", "k2"], R1) is None
        assert await e.lookup("k0", R2) is RETRY  # joins, no second promotion
        assert await e.wait(["k0", "k1", "k2"]) == [HIT, HIT, MISS]
        e.end_step(new_req_ids=["r1", "r2"])
        assert probe.value("aiotier_promotions_total", tier="memory", outcome="ok") == 2
        assert probe.value("aiotier_lookups_total", tier="primary", result="miss") == 4
        assert probe.value("aiotier_lookups_total", tier="primary", result="retry") == 1
        assert probe.value("aiotier_lookups_total", tier="memory", result="hit") == 3
        assert probe.value("aiotier_lookups_total", tier="memory", result="miss") == 1
        assert probe.value("aiotier_read_bytes_total", tier="memory") == 128
        assert probe.count("aiotier_lookup_async_delay_seconds") == 2
    provider.shutdown()


# ---------------------------------------------------------------------- failed tier mutations


async def test_failed_remove_after_put_never_serves_older_bytes() -> None:
    inner = await seeded(1)  # k0 = block(0) below
    tier = FaultyTier(inner).fail("remove")
    async with TieringEngine(PrimaryTier(1, 64), [tier], write_policy="none") as e:
        assert await e.put("k0", b"new")
        await e.flush()
        assert await e.put("x", b"x")  # k0 (new) is evicted and dropped by policy
        assert await e.get("k0") != block(0)  # SPEC: no tier ever returns the older bytes


async def test_failed_write_through_never_serves_older_bytes() -> None:
    inner = MemoryTier(1 << 20)
    tier = FaultyTier(inner)
    async with TieringEngine(PrimaryTier(1, 64), [tier], write_policy="write_through") as e:
        assert await e.put("k", b"old")
        await e.flush()
        tier.fail("write")
        assert await e.put("k", b"new")
        await e.flush()
        assert await e.put("x", b"x")  # evicts k (new)
        assert await e.get("k") != b"old"


async def test_put_between_tier_eviction_and_handover_is_not_undone() -> None:
    m1 = FaultyTier(MemoryTier(64, name="m1")).delay("write", 0.05)  # one block
    m2 = MemoryTier(1 << 20, name="m2")
    await m1.inner.write(b"k", b"old")
    async with TieringEngine(PrimaryTier(1, 64), [m1, m2]) as e:
        assert await e.put("x", block(1))
        assert await e.put("y", block(2))  # WRITE(x) queued
        assert await e.put("z", block(3))  # WRITE(y) queued: one batch [x, y]
        await eventually(lambda: m1.calls["write"] >= 2)  # x written (k evicted), y pending
        assert await e.put("k", b"new")
        assert await e.put("w", block(4))  # evicts k (new): on its way down to m1
        await eventually(lambda: m1.calls["write"] >= 3)  # batch [x, y] done and handed over
        assert await e.get("k") == b"new"


async def test_get_waiting_on_a_pending_store_survives_aclose() -> None:
    e = TieringEngine(PrimaryTier(2, 8))
    await e.open()
    assert e.prepare_store(["s"], R1) is not None
    getting = asyncio.ensure_future(e.get("s"))
    await asyncio.sleep(0)
    await e.aclose()
    assert await getting is None  # no RuntimeError from an unpin after close


async def test_promotion_cancelled_by_aclose_is_counted(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = await seeded(1)
    e = TieringEngine(PrimaryTier(2, 64), [tier], meter_provider=provider)
    await e.open()
    assert await e.lookup("k0", R1) is RETRY  # the promotion task is created, not yet run
    await e.aclose()
    assert probe.value("aiotier_promotions_total", tier="memory", outcome="cancelled") == 1
    provider.shutdown()


async def test_lookup_prefix_hits_are_loadable_when_it_returns() -> None:
    tier = FaultyTier(MemoryTier(1 << 20)).delay("lookup", 0.05)
    async with TieringEngine(PrimaryTier(2, 64), [tier], write_policy="none") as e:
        assert await e.put("a", b"a")
        scanning = asyncio.ensure_future(e.lookup_prefix(["a", "nope"], R1))
        await asyncio.sleep(0.01)  # the scan is inside the tier's lookup
        assert await e.put("b", b"b")
        assert await e.put("c", b"c")  # evicts a
        n = await scanning
        assert n is not None
        try:
            e.prepare_load(["a", "nope"][:n], R1)  # HIT: "in the primary, ready to load now"
        except BlockNotReadyError:
            pytest.fail(f"lookup_prefix answered {n} but the block was gone")
        e.complete_load(["a", "nope"][:n], R1)


class _HintFaultTier(MemoryTier):
    """A tier whose cheap membership hint fails (say, a remote index that went away)."""

    def contains_hint(self, key: bytes) -> bool | None:
        raise ConnectionError("index unavailable")


async def test_put_does_not_raise_for_a_tier_hint_fault() -> None:
    tier = _HintFaultTier(1 << 20)
    async with TieringEngine(PrimaryTier(2, 64), [tier]) as e:
        assert await e.put("k", b"v")
        assert await e.get("k") == b"v"
