"""``TieringEngine.clear_primary`` and what any clear does to loads and stores handed out before
it: they are cancelled, their slots stay pinned until they complete, their request ends or
``release_cleared``; a completion prefers what was handed out after the clear."""

from __future__ import annotations

import pytest
from helpers import block, read_one, seeded

from aiotier import LookupResult, MemoryTier, PrimaryTier, RequestContext, TieringEngine

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
R1, R2 = RequestContext("r1"), RequestContext("r2")


async def test_the_secondary_tiers_keep_their_blocks() -> None:
    below = await seeded(2)
    async with TieringEngine(PrimaryTier(2, 64), [below]) as e:
        assert await e.put("p", block(9))
        e.clear_primary()
        assert e.stats().tiers["primary"].blocks == 0
        assert below.usage().blocks == 2
        assert await e.get("k1") == block(1)  # promoted again from below
        assert await e.get("p") is None  # only the primary held it (write-back)
        assert [(ev.keys, ev.removed) for ev in e.take_events()] == [
            ((b"p",), False), ((b"p",), True),  # stored; dropped by the clear
        ]  # fmt: skip


async def test_queued_writes_still_reach_the_tier() -> None:
    below = MemoryTier(1 << 20)
    async with TieringEngine(PrimaryTier(1, 64), [below]) as e:
        assert await e.put("a", block(1))
        assert await e.put("b", block(2))  # evicts a: its write-back is queued
        e.clear_primary()
        await e.flush(timeout=5)
        buf = bytearray(64)
        assert await read_one(below, b"a", memoryview(buf)) == 64 and bytes(buf) == block(1)


@pytest.mark.parametrize("clear", ["primary", "all"])
async def test_a_store_prepared_again_after_a_clear_completes(clear: str) -> None:
    """A scheduler that drops its jobs at a reset prepares the key again and completes only
    the new store: that one must become loadable (it stayed pending, then answered MISS)."""
    async with TieringEngine(PrimaryTier(4, 64), [MemoryTier(1 << 20)]) as e:
        first = e.prepare_store(["k"], R1)
        assert first is not None
        await (e.clear() if clear == "all" else _sync(e.clear_primary))
        again = e.prepare_store(["k"], R1)
        assert again is not None and again.keys_to_store == (b"k",)
        again.store_spec.buffers[0][:64] = block(3)
        e.complete_store(["k"], R1, sizes=[64])
        assert await e.lookup("k", R1) is HIT
        assert e.stats().pinned_blocks == 1  # the first store's slot: it may still be written
        e.release_cleared()
        assert e.stats().pinned_blocks == 0
        spec = e.prepare_load(["k"], R1)
        assert bytes(spec.buffers[0]) == block(3)
        e.complete_load(["k"], R1)


async def test_a_cancelled_store_completes_to_nothing_and_lets_its_slot_go() -> None:
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        out = e.prepare_store(["k"], R1)
        assert out is not None
        e.clear_primary()
        out.store_spec.buffers[0][:64] = block(1)  # the storer's write lands nowhere visible
        e.complete_store(["k"], R1, sizes=[64])
        assert await e.lookup("k", R1) is MISS
        assert e.stats().pinned_blocks == 0
        with pytest.raises(ValueError, match="did not prepare"):
            e.complete_store(["k"], R1)


async def test_release_cleared_lets_go_of_loads_and_stores_never_completed() -> None:
    async with TieringEngine(PrimaryTier(4, 64)) as e:
        assert await e.put("a", block(1))
        e.prepare_load(["a"], R1)
        assert e.prepare_store(["b", "c"], R2) is not None
        e.clear_primary()
        assert e.stats().pinned_blocks == 3  # reads and writes may still be in flight
        e.release_cleared()
        assert e.stats().pinned_blocks == 0
        out = e.prepare_store(["w", "x", "y", "z"], R1)  # every slot is free again
        assert out is not None and len(out.keys_to_store) == 4
        e.complete_store(["w", "x", "y", "z"], R1)
        e.end_step(finished_req_ids=["r1", "r2"])
        assert e.stats().pinned_blocks == 0


async def test_a_finished_request_lets_go_of_what_a_clear_cancelled() -> None:
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        assert await e.put("a", block(1))
        e.prepare_load(["a"], R1)
        assert e.prepare_store(["b"], R1) is not None
        e.clear_primary()
        e.end_step(finished_req_ids=["r1"])
        assert e.stats().pinned_blocks == 0


async def test_a_load_after_the_clear_completes_before_the_cancelled_one() -> None:
    async with TieringEngine(PrimaryTier(4, 64)) as e:
        assert await e.put("a", block(1))
        e.prepare_load(["a"], R1)
        e.clear_primary()
        assert await e.put("a", block(2))
        spec = e.prepare_load(["a"], R1)
        assert bytes(spec.buffers[0]) == block(2)
        e.complete_load(["a"], R1)  # the new load's pin goes; the cancelled one stays
        assert e.stats().pinned_blocks == 1
        with pytest.raises(ValueError, match="released"):  # and its view with it
            bytes(spec.buffers[0])
        e.complete_load(["a"], R1)  # now the cancelled one
        assert e.stats().pinned_blocks == 0


async def _sync(fn: object) -> None:
    fn()  # type: ignore[operator]
