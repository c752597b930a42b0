"""Removed events for blocks that leave a tier, and bad input refused with nothing changed.
"""

from __future__ import annotations

import array

import pytest
from helpers import block, seeded

from aiotier import (
    LookupResult,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    TieringEngine,
)

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
R1, R2 = RequestContext("r1"), RequestContext("r2")



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
