"""Eviction policies through the engine: the scheduler path (``prepare_store``/``complete_store``,
``lookup``, ``touch``) and the cache path (``put``, ``get``) drive ARC the same way: a stored block
is used once (T1), a hit or a touch is a further use (T2)."""

from __future__ import annotations

import pytest

from aiotier import LookupResult, PrimaryTier, TieringEngine


def scan_polluted_trace() -> list[str]:
    """A hot loop of 6 keys, twice per round, then a one-off scan of 10 keys."""
    trace: list[str] = []
    for round_ in range(30):
        trace += [f"hot{i}" for i in range(6)] * 2
        trace += [f"scan{round_}-{i}" for i in range(10)]
    return trace


async def hits_through_put_and_get(policy: str) -> int:
    hits = 0
    async with TieringEngine(PrimaryTier(8, 16, policy=policy)) as e:
        for key in scan_polluted_trace():
            if await e.get(key) is not None:
                hits += 1
            else:
                assert await e.put(key, b"v")
    return hits


async def hits_through_the_scheduler(policy: str) -> int:
    hits = 0
    async with TieringEngine(PrimaryTier(8, 16, policy=policy)) as e:
        for key in scan_polluted_trace():
            if await e.lookup(key) is LookupResult.HIT:
                hits += 1
                e.prepare_load([key])
                e.complete_load([key])
                e.touch([key])
            else:
                out = e.prepare_store([key])
                assert out is not None
                e.complete_store([key])
            e.end_step()
    return hits


async def test_arc_is_the_same_through_the_scheduler_and_the_cache_api() -> None:
    arc = await hits_through_the_scheduler("arc")
    assert arc == await hits_through_put_and_get("arc")
    lru = await hits_through_the_scheduler("lru")
    assert lru == await hits_through_put_and_get("lru")
    assert arc > lru * 1.2, (arc, lru)  # the scan does not flush ARC's hot set


async def store(e: TieringEngine, key: str) -> tuple[bytes, ...]:
    out = e.prepare_store([key])
    assert out is not None
    e.complete_store([key])
    return out.evicted_keys


@pytest.mark.parametrize("path", ["scheduler", "cache"])
async def test_a_touched_block_outlives_a_scan_under_arc(path: str) -> None:
    """T1 holds blocks stored once; a touch moves one to T2, which a scan does not reach."""
    async with TieringEngine(PrimaryTier(3, 16, policy="arc")) as e:
        evicted: list[bytes] = []
        for key in ("a", "b"):
            if path == "scheduler":
                await store(e, key)
            else:
                await e.put(key, b"v")
        if path == "scheduler":
            e.touch(["a"])
        else:
            assert await e.get("a") == b"v"
        e.take_events()
        for key in ("c", "d", "e"):  # a scan of three new blocks
            if path == "scheduler":
                evicted += await store(e, key)
            else:
                assert await e.put(key, b"v")
                evicted += [k for ev in e.take_events() if ev.removed for k in ev.keys]
        assert evicted == [b"b", b"c"]  # the blocks seen once go, oldest first
        assert await e.lookup("a") is LookupResult.HIT


async def test_a_ghost_hit_makes_arc_favour_recency() -> None:
    """A block evicted from T1 and stored again comes back into T2 and raises T1's target, so
    the next eviction takes the least recent block of T2."""
    async with TieringEngine(PrimaryTier(3, 16, policy="arc")) as e:
        for key in ("a", "b", "c"):
            await store(e, key)
        e.touch(["a"])  # T1: b c, T2: a
        assert await store(e, "d") == (b"b",)  # T1 is over its target 0: its oldest goes
        assert await store(e, "b") == (b"c",)  # b was a ghost of T1: it returns into T2
        assert await store(e, "x") == (b"a",)  # T1 (d) is at its new target: T2's oldest goes


async def test_lfuda_is_the_same_through_the_scheduler_and_the_cache_api() -> None:
    """A hit looked up, loaded and touched is one use, as a ``get`` is: the counts agree."""
    lfuda = await hits_through_the_scheduler("lfuda")
    assert lfuda == await hits_through_put_and_get("lfuda")
    assert lfuda > await hits_through_the_scheduler("lru") * 1.2  # the scan does not flush it
