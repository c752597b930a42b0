"""Pins and request state: every pin a lookup, load, store or get takes is released, and a
request that finishes or races its own lookup holds nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from helpers import block, eventually, seeded, write_one

from aiotier import (
    BlockNotReadyError,
    LookupResult,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    TieringEngine,
)
from aiotier.testing import FaultyTier

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
R1, R2 = RequestContext("r1"), RequestContext("r2")



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

class _LateWriterTier(MemoryTier):
    """Reads slowly and, when cancelled, still writes its buffer a moment later (a thread)."""

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)
            bufs[0][:4] = b"LATE"
            raise
        return await super().read_many_into(keys, bufs)

async def test_slot_of_a_timed_out_promotion_is_not_reused_while_the_read_writes() -> None:
    tier = _LateWriterTier(1 << 20)
    await write_one(tier, b"k", b"kkkk")
    async with TieringEngine(PrimaryTier(1, 4), [tier], promotion_timeout=0.05) as e:
        assert await e.lookup("k") is RETRY
        assert await e.wait(["k"], timeout=5) == [MISS]
        assert not await e.put("x", b"xxxx")  # the only slot is still the read's
        await eventually(lambda: e.stats().pinned_blocks == 0)
        assert await e.put("x", b"xxxx")
        assert await e.get("x") == b"xxxx"

async def test_get_waiting_on_a_pending_store_survives_aclose() -> None:
    e = TieringEngine(PrimaryTier(2, 8))
    await e.open()
    assert e.prepare_store(["s"], R1) is not None
    getting = asyncio.ensure_future(e.get("s"))
    await asyncio.sleep(0)
    await e.aclose()
    assert await getting is None  # no RuntimeError from an unpin after close

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

async def test_same_key_prepared_twice_by_one_caller_after_a_delete() -> None:
    async with TieringEngine(PrimaryTier(4, 16)) as e:
        first = e.prepare_store(["k"])
        assert first is not None and first.keys_to_store == (b"k",)
        await e.delete("k")  # the key is gone: a second store of it starts afresh
        second = e.prepare_store(["k"])
        assert second is not None and second.keys_to_store == (b"k",)
        second.store_spec.buffers[0][:3] = b"two"
        e.complete_store(["k"], sizes=[3])
        e.complete_store(["k"], sizes=[3])
        e.end_step()
        assert e.stats().pinned_blocks == 0
