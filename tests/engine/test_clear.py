"""``TieringEngine.clear``: once it returns, no block stored before it is found anywhere; a tier
that cannot clear is refused before anything changes, one whose clear fails is not read again
until a clear succeeds; loads handed out, stores pending, promotions and writes in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from helpers import DictTier, block, eventually, seeded, write_one

from aiotier import (
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
R1 = RequestContext("r1")


async def test_nothing_stored_before_a_clear_is_found_after_it() -> None:
    m1, m2 = MemoryTier(64 * 3, name="m1"), await seeded(4, name="m2")
    async with TieringEngine(PrimaryTier(2, 64), [m1, m2]) as e:
        for i in range(6):
            assert await e.put(f"p{i}", block(i))
        await e.flush()
        assert e.stats().tiers["m1"].blocks == 3
        e.take_events()

        await e.clear()
        keys = [f"p{i}" for i in range(6)] + [f"k{i}" for i in range(4)]
        assert [await e.get(k) for k in keys] == [None] * 10
        assert await e.lookup_prefix(keys) == 0
        assert {t: u.blocks for t, u in e.stats().tiers.items()} == {
            "primary": 0, "m1": 0, "m2": 0,
        }  # fmt: skip
        (event,) = e.take_events()
        assert (set(event.keys), event.tier, event.removed) == ({b"p4", b"p5"}, "primary", True)

        # the engine goes on: new blocks are stored, demoted and promoted as before
        for i in range(4):
            assert await e.put(f"n{i}", block(10 + i))
        await e.flush()
        assert m1.contains_hint(b"n0") and m1.contains_hint(b"n1")
        assert await e.get("n0") == block(10)  # promoted from m1


class NoClear(DictTier):
    """A user's tier without ``clear``."""

    def __init__(self) -> None:
        super().__init__("noclear")


async def test_a_tier_that_cannot_clear_is_refused_before_anything_changes() -> None:
    tier = NoClear()
    assert not tier.capabilities.clearable and not FaultyTier(tier).capabilities.clearable
    assert MemoryTier(1).capabilities.clearable and FaultyTier(MemoryTier(1)).capabilities.clearable
    async with TieringEngine(PrimaryTier(1, 64), [MemoryTier(1 << 20), tier]) as e:
        assert await e.put("a", block(1))
        with pytest.raises(ConfigError, match="'noclear' cannot be cleared"):
            await e.clear()
        assert await e.get("a") == block(1)


async def test_a_tier_whose_clear_failed_is_not_read_until_a_clear_succeeds() -> None:
    inner = await seeded(2)
    tier = FaultyTier(inner).fail("clear")
    async with TieringEngine(PrimaryTier(2, 64), [tier]) as e:
        with pytest.raises(TieringError, match=r"'memory' \(ConnectionError: injected clear"):
            await e.clear()
        reads = tier.calls["read"] + tier.calls["lookup"]
        assert await e.get("k0") is None  # still there below, and never served
        assert await e.lookup("k1", R1) is MISS
        assert tier.calls["read"] + tier.calls["lookup"] == reads
        assert e.stats().tiers["memory"].blocks == 2

        tier.heal()
        await e.clear()
        assert e.stats().tiers["memory"].blocks == 0
        assert await e.put("x", block(7))
        assert await e.put("y", block(8))
        assert await e.put("z", block(9))  # evicts x to the tier
        await e.flush()
        assert await e.get("x") == block(7)  # read from the tier again
        assert tier.calls["read"] > 0


async def test_a_load_handed_out_keeps_its_bytes_and_a_pending_store_stays_invisible() -> None:
    async with TieringEngine(PrimaryTier(4, 64), [MemoryTier(1 << 20)]) as e:
        assert await e.put("loaded", block(1))
        spec = e.prepare_load(["loaded"], R1)
        out = e.prepare_store(["stored"], R1)
        assert out is not None
        await e.clear()
        assert bytes(spec.buffers[0]) == block(1)  # the loader's slot is not reused
        assert e.stats().pinned_blocks == 2  # the load's slot and the pending store's
        e.complete_load(["loaded"], R1)
        out.store_spec.buffers[0][:64] = block(2)
        e.complete_store(["stored"], R1, sizes=[64])
        assert await e.get("loaded") is None and await e.get("stored") is None
        assert e.stats().pinned_blocks == 0


class CopiesThenWaits(MemoryTier):
    """A tier whose reads copy the bytes at once and return only when released: the bytes are
    in the arena slot before the clear, the read finishes after it."""

    def __init__(self) -> None:
        super().__init__(1 << 20)
        self.copied = asyncio.Event()
        self.release = asyncio.Event()

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        out = await super().read_many_into(keys, bufs)
        self.copied.set()
        await self.release.wait()
        return out


async def test_a_promotion_in_flight_at_a_clear_lands_nothing() -> None:
    tier = CopiesThenWaits()
    await write_one(tier, b"k0", block(0))
    async with TieringEngine(PrimaryTier(4, 64), [tier]) as e:
        assert await e.lookup("k0", R1) is RETRY
        await asyncio.wait_for(tier.copied.wait(), 5)  # the bytes are in the slot already
        clearing = asyncio.create_task(e.clear())
        await asyncio.sleep(0)  # the primary forgets the promotion ...
        tier.release.set()  # ... before its read finishes
        await clearing
        assert await e.wait(["k0"], timeout=5) == [MISS]
        assert await e.get("k0") is None
        await eventually(lambda: e.stats().promotions_in_flight == 0, what="the read stopped")
        assert e.stats().pinned_blocks == 0 and await e.get("k0") is None


async def test_writes_in_flight_finish_before_the_tier_clears_and_new_ones_after() -> None:
    inner = MemoryTier(1 << 20)
    tier = FaultyTier(inner).delay("write", 0.1)
    async with TieringEngine(PrimaryTier(1, 64), [tier]) as e:
        assert await e.put("old", block(1))
        assert await e.put("x", block(2))  # evicts old: its write starts and takes 0.1 s
        await eventually(lambda: tier.calls["write"] > 0, what="the write started")
        clearing = asyncio.create_task(e.clear())
        await asyncio.sleep(0)  # the clear begins: the primary is emptied, the writers pause
        assert await e.put("new", block(3))  # stored during the clear (evicts x, dropped)
        assert await e.put("y", block(4))  # evicts new: written once the tier has cleared
        await clearing
        await e.flush()
        assert inner.contains_hint(b"old") is False
        assert inner.contains_hint(b"x") is False
        assert inner.contains_hint(b"new") is True
        assert await e.get("new") == block(3)


async def test_clear_needs_an_open_engine() -> None:
    e = TieringEngine(PrimaryTier(1, 64), [MemoryTier(1 << 20)])
    with pytest.raises(TieringError, match="not open"):
        await e.clear()
    async with e:
        pass
    with pytest.raises(TieringError, match="closed"):
        await e.clear()


async def test_two_clears_at_once_both_hold() -> None:
    inner = await seeded(2)
    tier = FaultyTier(inner).delay("clear", 0.1)
    async with TieringEngine(PrimaryTier(1, 64), [tier]) as e:
        first = asyncio.create_task(e.clear())
        await asyncio.sleep(0.05)
        assert await e.put("between", block(1))
        assert await e.put("x", block(2))  # evicts "between": queued, then dropped by ...
        second = asyncio.create_task(e.clear())  # ... this clear, which clears the tier again
        await first
        assert not second.done()
        # the first clear is done, the second is not: the tier is still neither read nor
        # written, and the primary's blocks stay in the primary
        calls = dict(tier.calls)
        assert await e.get("k1") is None
        assert await e.put("y", block(3))  # evicts x: its write waits for the second clear
        await asyncio.sleep(0.02)
        assert dict(tier.calls) == calls
        await second
        assert await e.get("k0") is None and await e.get("between") is None
        # both finished: the tier is read again
        assert await e.put("a", block(3))
        assert await e.put("b", block(4))  # evicts a to the tier
        await e.flush()
        assert await e.get("a") == block(3)
        assert inner.contains_hint(b"a") is True


async def test_a_clear_that_cannot_pause_the_writers_leaves_every_tier_unread() -> None:
    inner = await seeded(1)
    tier = FaultyTier(inner).hang("write")
    async with TieringEngine(PrimaryTier(1, 64), [tier], io_timeout=30.0) as e:
        assert await e.put("a", block(1))
        assert await e.put("b", block(2))  # evicts a: its write hangs
        await eventually(lambda: tier.calls["write"] > 0, what="the write started")
        with pytest.raises(TieringError, match=r"did not finish within 0\.1s"):
            await e.clear(timeout=0.1)
        assert await e.get("k0") is None and tier.calls["read"] == 0  # not read: not cleared
        tier.heal()  # the hung write returns
        await e.clear()
        assert inner.contains_hint(b"k0") is False
        assert inner.contains_hint(b"a") is False  # the write that hung landed, then went
        assert await e.put("c", block(3))
        assert await e.put("d", block(4))  # evicts c to the tier
        await e.flush()
        assert await e.get("c") == block(3)  # read from the tier again


async def test_a_write_in_flight_at_a_clear_hands_nothing_down() -> None:
    """A demotion write to the first tier finishes during the clear and that tier evicts an old
    block meanwhile: the old block is not handed to the tier below, nor served."""
    t0 = FaultyTier(MemoryTier(128, name="m0"))
    t1 = MemoryTier(1 << 20, name="m1")
    async with TieringEngine(PrimaryTier(1, 64), [t0, t1]) as e:
        for i in range(3):  # x0 and x1 go down to m0, which has room for two
            assert await e.put(f"x{i}", block(i))
        await e.flush()
        t0.delay("write", 0.1)
        writes = t0.calls["write"]
        assert await e.put("x3", block(3))  # x2's write to m0 evicts x0 there: handed over
        await eventually(lambda: t0.calls["write"] > writes, what="the slow write started")
        await e.clear()
        assert await e.get("x0") is None
        await e.flush()
        assert t1.usage().blocks == 0
