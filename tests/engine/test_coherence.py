"""No tier ever serves older bytes: puts, deletes and failed tier mutations against demotions,
hand-overs between tiers, write-through and lookups suspended in a tier.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from helpers import block, eventually, seeded, write_one

from aiotier import (
    LookupResult,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    SSDTier,
    TieringEngine,
)
from aiotier.testing import FaultyTier

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
R1, R2 = RequestContext("r1"), RequestContext("r2")



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
    await write_one(m1, b"k", b"old")
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
    await write_one(m1.inner, b"k", b"old")
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
    await write_one(m1.inner, b"k", b"kept")
    async with TieringEngine(PrimaryTier(1, 64), [m1, m2]) as e:
        assert await e.put("x", block(1))
        assert await e.put("y", block(2))  # WRITE(x) queued
        assert await e.put("z", block(3))  # WRITE(y) queued: one batch [x, y]
        await eventually(lambda: m1.calls["write"] >= 2)  # x written (k evicted), y pending
        assert await e.get("k") == b"kept"  # SPEC 4: on its way down, never None

async def test_get_whose_promotion_pushes_the_block_down_still_returns_it() -> None:
    m1 = FaultyTier(MemoryTier(64, name="m1")).delay("read", 0.05)  # one block
    m2 = MemoryTier(1 << 20, name="m2")
    await write_one(m1.inner, b"k", b"kept")
    async with TieringEngine(PrimaryTier(1, 64), [m1, m2]) as e:
        assert await e.put("x", block(1))  # dirty: its eviction is written to m1
        # the promotion of k evicts x; x's write-back evicts k from m1, handed to m2
        assert await e.get("k") == b"kept"

async def test_stale_copy_is_not_handed_down_and_served() -> None:
    m1 = FaultyTier(MemoryTier(64, name="m1"))  # one 64-byte block
    m2 = MemoryTier(1 << 20, name="m2")
    await write_one(m1.inner, b"k", b"old")
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
        # m1's write fails (stale there), m2's is slow: the put waits for both
        putting = asyncio.ensure_future(e.put("k", b"v2"))
        await eventually(lambda: m2.calls["write"] >= 2)
        # evicts k: write_through keeps no copy of its own
        putting_x = asyncio.ensure_future(e.put("x", b"x"))
        await eventually(lambda: b"k" not in e.core.coherence.in_transit)  # m1's write failed
        assert await e.get("k") in (b"v2", None)  # never the older v1 from m2
        assert await putting and await putting_x  # stored in the primary: True

async def test_write_through_dropped_write_leaves_no_older_copy_readable() -> None:
    tier = FaultyTier(MemoryTier(1 << 20))
    async with TieringEngine(
        PrimaryTier(1, 64), [tier], write_policy="write_through", max_pending_write_bytes=64
    ) as e:
        assert await e.put("k", block(1))
        await e.flush()  # the tier holds block(1)
        tier.hang("write")
        # its write hangs, holding the 64-byte budget
        putting = asyncio.ensure_future(e.put("a", block(2)))
        await eventually(lambda: tier.calls["write"] >= 2)
        assert await e.put("k", block(3))  # its write is dropped (over the bound), counted
        assert await e.put("x", b"x")  # evicts k; its write is dropped too
        tier.heal()
        await e.flush()
        assert await e.get("k") != block(1)  # SPEC: no tier ever returns the older bytes
        assert await putting

async def test_get_read_around_finds_a_block_that_moved_down() -> None:
    m1 = FaultyTier(MemoryTier(64, name="m1")).delay("read", 0.05)  # one block
    m2 = MemoryTier(1 << 20, name="m2")
    m3 = FaultyTier(MemoryTier(1 << 20, name="m3")).hang("read")
    await write_one(m1.inner, b"k", b"kept")
    await write_one(m3.inner, b"h", b"hung")
    tiers = [m1, m2, m3]
    async with TieringEngine(PrimaryTier(2, 64), tiers, max_inflight_promotions=1) as e:
        assert await e.lookup("h") is RETRY  # its read hangs: the promotion budget is spent
        assert await e.put("x", block(1))
        getting = asyncio.ensure_future(e.get("k"))  # no budget: reads k around the primary
        await eventually(lambda: m1.calls["read"] >= 1)
        assert await e.put("y", block(2))  # evicts x: its write to m1 pushes k down to m2
        assert await getting == b"kept"

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
        await write_one(inner, b"k", b"kv")  # e.g. another engine sharing the tier wrote it
        assert await e.get("k") == b"kv"

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
    await write_one(m1.inner, b"k", b"old")
    async with TieringEngine(PrimaryTier(1, 64), [m1, m2]) as e:
        assert await e.put("x", block(1))
        assert await e.put("y", block(2))  # WRITE(x) queued
        assert await e.put("z", block(3))  # WRITE(y) queued: one batch [x, y]
        await eventually(lambda: m1.calls["write"] >= 2)  # x written (k evicted), y pending
        assert await e.put("k", b"new")
        assert await e.put("w", block(4))  # evicts k (new): on its way down to m1
        await eventually(lambda: m1.calls["write"] >= 3)  # batch [x, y] done and handed over
        assert await e.get("k") == b"new"

class _HintFaultTier(MemoryTier):
    """A tier whose cheap membership hint fails (say, a remote index that went away)."""

    def contains_hint(self, key: bytes) -> bool | None:
        raise ConnectionError("index unavailable")

async def test_put_does_not_raise_for_a_tier_hint_fault() -> None:
    tier = _HintFaultTier(1 << 20)
    async with TieringEngine(PrimaryTier(2, 64), [tier]) as e:
        assert await e.put("k", b"v")
        assert await e.get("k") == b"v"

async def test_delete_whose_tier_remove_fails_never_serves_the_deleted_bytes() -> None:
    tier = FaultyTier(MemoryTier(1 << 20))
    await write_one(tier, b"k", b"old")  # written below by this or another engine
    async with TieringEngine(PrimaryTier(2, 16), [tier], backoff_seconds=0.01) as e:
        tier.fail("remove")
        await e.delete("k")
        assert tier.calls["remove"] == 1
        tier.heal()
        assert await e.get("k") is None

async def test_put_whose_tier_remove_fails_never_serves_older_bytes() -> None:
    tier = FaultyTier(MemoryTier(1 << 20))
    await write_one(tier, b"k", b"old")
    async with TieringEngine(PrimaryTier(1, 16), [tier], write_policy="none") as e:
        tier.fail("remove")
        assert await e.put("k", b"new")
        await e.flush()
        assert tier.calls["remove"] == 1
        tier.heal()
        assert await e.put("other", b"x")  # evicts k (dropped by policy)
        assert await e.get("k") in (b"new", None)

async def test_write_through_put_whose_write_fails_never_serves_older_bytes() -> None:
    tier = FaultyTier(MemoryTier(1 << 20))
    async with TieringEngine(PrimaryTier(1, 16), [tier], write_policy="write_through") as e:
        assert await e.put("k", b"old")
        await e.flush()
        tier.disk_full()
        assert await e.put("k", b"new")
        await e.flush()
        tier.heal()
        assert await e.put("other", b"x")  # evicts k: write_through drops it (already below?)
        await e.flush()
        assert await e.get("k") in (b"new", None)

async def test_a_deleted_key_stays_deleted_across_a_restart_after_a_failed_remove(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ssd"
    async with TieringEngine(PrimaryTier(4, 16), [SSDTier(root, 1 << 20)]) as e:
        assert await e.put("k", b"old")  # written down to the SSD at close
    tier = FaultyTier(SSDTier(root, 1 << 20))
    async with TieringEngine(PrimaryTier(4, 16), [tier]) as e:
        tier.fail("remove")
        await e.delete("k")
        assert tier.calls["remove"] == 1
        assert await e.get("k") is None
        tier.heal()  # the tier works again before the engine closes
    async with TieringEngine(PrimaryTier(4, 16), [SSDTier(root, 1 << 20)]) as e:
        assert await e.get("k") is None  # b"old" today


async def test_a_get_during_a_pending_store_does_not_bring_back_older_bytes() -> None:
    """The older bytes on their way down must not be re-admitted over a pending store of the
    same key (found by the fault model: the store was then lost, the older bytes served)."""
    below = FaultyTier(MemoryTier(1 << 20)).delay("write", 0.2)
    async with TieringEngine(PrimaryTier(1, 16), [below]) as e:
        assert await e.put("k", b"old")
        assert await e.put("x", b"x")  # k goes down; its write is slow
        out = e.prepare_store(["k"])
        assert out is not None and out.keys_to_store == (b"k",)
        getting = asyncio.ensure_future(e.get("k"))
        await asyncio.sleep(0)  # the get meets the pending store
        out.store_spec.buffers[0][:3] = b"new"
        e.complete_store(["k"], sizes=[3])
        assert await getting == b"new"
        assert await e.get("k") == b"new"
