"""vLLM 0.33.0's tiering manager test sequences, replayed against ``AiotierOffloadingManager``.

Rewritten from vLLM's ``tests/v1/kv_offload/tiering/test_tiering_offloading.py`` as released
in vLLM 0.33.0 (Apache-2.0; the sdist on PyPI): a 5-block primary over a secondary tier, with
vLLM's expected answers (``HIT_PENDING`` for the lookup that starts a promotion, PR #51840),
reset semantics (the secondary tier kept, promotions held until ``on_reset_flushed``, stores in
flight dropped), per-request tier filters (PR #48123), load sources and config info. vLLM's
secondary tiers are mocks whose jobs finish at the next step; here the tier is a real
``MemoryTier`` whose reads take 0.2 s (``FaultyTier``), so a promotion is in flight when the
next lookup comes and ``engine.wait`` stands for vLLM's "two more steps". Each test runs with
aiotier's stand-ins and, where vLLM imports, with vLLM's own types.

Left out: sequences that drive vLLM's job bookkeeping by hand (``_register_job``,
``_process_finished_jobs``), request-level cascades and mocks of secondary-tier methods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from vllm_subjects import Subject, make_subject

from aiotier import MemoryTier, SSDTier
from aiotier.integrations.vllm import CONFIG_INFO_KEYS, OffloadKey, make_offload_key
from aiotier.testing import FaultyTier


def to_keys(ints: Iterable[int]) -> list[OffloadKey]:
    return [make_offload_key(str(i).encode(), 0) for i in ints]


def seeded(keys: Iterable[bytes], tier: Any) -> Any:
    """``tier`` holding ``keys`` (each block is its key), filled before any engine loop."""

    async def fill() -> None:
        await tier.open()
        await tier.write_many([(k, k) for k in keys])

    asyncio.run(fill())
    return tier


@pytest.fixture(params=["aiotier", "aiotier+vllm"])
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def below() -> FaultyTier:
    """The secondary tier: blocks 0-2 below, reads that take 0.2 s."""
    return FaultyTier(seeded(to_keys(range(3)), MemoryTier(1 << 20))).delay("read", 0.2)


@pytest.fixture
def tiering(flavor: str, below: FaultyTier) -> Iterator[Subject]:
    s = make_subject(flavor, num_chunks=5, enable_events=True, secondary=[below])
    yield s
    m = s.manager
    m.on_reset_flushed()
    m.on_schedule_end(s.types.ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
    m.engine.wait(to_keys(range(10)), timeout=5)
    assert m.engine.stats().pinned_blocks == 0
    s.close()


def count_hits(s: Subject, keys: list[OffloadKey], ctx: Any = None) -> int | None:
    """vLLM's test helper: leading HITs, None at a HIT_PENDING or RETRY."""
    count = 0
    for key in keys:
        result = s.manager.lookup(key, ctx or s.ctx("test"))
        if result in (s.LR.HIT_PENDING, s.LR.RETRY):
            return None
        if result is not s.LR.HIT:
            break
        count += 1
    return count


def needs_reset_fence(s: Subject) -> None:
    if not s.v033:
        pytest.skip("vLLM 0.32 has no on_reset_flushed: nothing is held after a reset")


def end_step(s: Subject) -> None:
    s.manager.on_schedule_end(s.types.ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
    list(s.manager.take_events())


def test_lookup_from_primary(tiering: Subject) -> None:
    s, chunks = tiering, to_keys(range(10, 13))
    ctx = s.ctx("test")
    s.manager.on_new_request(ctx)
    s.manager.prepare_store(chunks, ctx)
    s.manager.complete_store(chunks, ctx, success=True)
    assert count_hits(s, chunks) == 3
    s.manager.on_request_finished(ctx)


def test_promotion_from_secondary(tiering: Subject) -> None:
    s, m, chunks = tiering, tiering.manager, to_keys(range(3))
    ctx = s.ctx("test")
    m.on_new_request(ctx)
    for chunk in chunks:
        assert m.lookup(chunk, ctx) is s.LR.HIT_PENDING  # promotion initiated
    assert count_hits(s, chunks) is None
    m.engine.wait(chunks, timeout=5)
    end_step(s)
    assert count_hits(s, chunks) == 3
    # the request that caused the promotion keeps the tier it came from (memory: host)
    assert all(m.get_load_source(c, ctx) == s.types.CacheHitSource.HOST for c in chunks)
    later = s.ctx("later")
    m.on_new_request(later)
    assert all(m.lookup(c, later) is s.LR.HIT for c in chunks)
    assert all(m.get_load_source(c, later) == "host" for c in chunks)
    spec = m.prepare_load(chunks, ctx)
    assert [bytes(b) for b in spec.buffers] == chunks  # the bytes the tier held
    m.complete_load(chunks, ctx)
    for c in (ctx, later):
        m.on_request_finished(c)
    reduced = m.get_stats().reduce()
    assert reduced["vllm:kv_offload_tiering_read_bytes:('1:memory',)"] == sum(map(len, chunks))


def test_promotion_from_an_ssd_is_a_disk_hit(flavor: str, tmp_path: Any) -> None:
    ssd = seeded(to_keys([7]), SSDTier(tmp_path, capacity_bytes=1 << 20, block_size=16))
    asyncio.run(ssd.aclose())
    s = make_subject(flavor, num_chunks=5, secondary=[SSDTier(tmp_path, capacity_bytes=1 << 20)])
    try:
        ctx = s.ctx("r")
        assert s.manager.lookup(to_keys([7])[0], ctx) is s.LR.HIT_PENDING
        s.manager.engine.wait(to_keys([7]), timeout=5)
        assert s.manager.lookup(to_keys([7])[0], ctx) is s.LR.HIT
        assert s.manager.get_load_source(to_keys([7])[0], ctx) == s.types.CacheHitSource.DISK
        s.manager.on_request_finished(ctx)
    finally:
        s.close()


def test_partial_lookup(tiering: Subject) -> None:
    s, chunks = tiering, to_keys(range(10, 15))
    ctx = s.ctx("test")
    s.manager.prepare_store(chunks[:3], ctx)
    s.manager.complete_store(chunks[:3], ctx, success=True)
    assert count_hits(s, chunks) == 3
    s.manager.on_request_finished(ctx)


def test_eviction_in_primary_tier(tiering: Subject) -> None:
    s, m, chunks = tiering, tiering.manager, to_keys(range(10, 15))
    ctx = s.ctx("test")
    result = m.prepare_store(chunks, ctx)
    assert result is not None and len(result.keys_to_store) == 5
    m.complete_store(chunks, ctx, success=True)
    end_step(s)
    result = m.prepare_store(to_keys(range(15, 17)), ctx)
    assert result is not None
    assert len(result.evicted_keys) == 2 and len(result.keys_to_store) == 2
    m.complete_store(to_keys(range(15, 17)), ctx)
    m.on_request_finished(ctx)


def test_touch_makes_the_head_most_recent(tiering: Subject) -> None:
    s, m, chunks = tiering, tiering.manager, to_keys(range(10, 15))
    ctx = s.ctx("test")
    m.prepare_store(chunks, ctx)
    m.complete_store(chunks, ctx, success=True)
    m.touch(chunks[:3], ctx)  # vLLM's ranks: chunks[2] < chunks[1] < chunks[0]
    out = m.prepare_store(to_keys(range(20, 25)), s.ctx("evict"))
    assert out is not None and out.evicted_keys == [*chunks[3:], chunks[2], chunks[1], chunks[0]]
    m.complete_store(to_keys(range(20, 25)), s.ctx("evict"))
    m.on_request_finished(ctx)


def test_request_order_survives_late_completion(tiering: Subject) -> None:
    s, m, chunks = tiering, tiering.manager, to_keys(range(10, 15))
    ctx = s.ctx("test")
    assert m.prepare_store(chunks, ctx) is not None
    m.complete_store(chunks, ctx, success=True)
    m.on_request_finished(ctx)
    end_step(s)
    end_step(s)
    evict = s.ctx("evict")
    out = m.prepare_store(to_keys([20]), evict)
    assert out is not None and out.evicted_keys == [chunks[-1]]
    m.complete_store(to_keys([20]), evict)


def test_held_promotions_keep_primary_hits(tiering: Subject) -> None:
    s, m = tiering, tiering.manager
    needs_reset_fence(s)
    ctx = s.ctx("test")
    stored = to_keys([10])
    m.prepare_store(stored, ctx)
    m.complete_store(stored, ctx, success=True)
    m.reset_cache()
    m.prepare_store(stored, ctx)
    m.complete_store(stored, ctx, success=True)
    assert m.lookup(stored[0], ctx) is s.LR.HIT
    assert m.lookup(to_keys([1])[0], ctx) is s.LR.MISS  # below only: held


def test_reset_holds_promotions_until_flushed(tiering: Subject) -> None:
    s, m, chunk = tiering, tiering.manager, to_keys([0])[0]
    needs_reset_fence(s)
    ctx = s.ctx("test")
    m.reset_cache()
    assert m.lookup(chunk, ctx) is s.LR.MISS
    assert count_hits(s, [chunk], ctx) == 0
    assert m.count_hits([chunk], ctx) == 0
    m.on_reset_flushed()
    assert m.lookup(chunk, ctx) is s.LR.HIT_PENDING  # the secondary tier kept it
    m.engine.wait([chunk], timeout=5)
    assert m.lookup(chunk, ctx) is s.LR.HIT
    m.on_request_finished(ctx)


def test_lookup_shared_chunk_no_duplicate_promotion(tiering: Subject, below: FaultyTier) -> None:
    s, m, shared = tiering, tiering.manager, to_keys([0])[0]
    ctx_a, ctx_b = s.ctx("req_a"), s.ctx("req_b")
    assert m.lookup(shared, ctx_a) is s.LR.HIT_PENDING
    assert m.lookup(shared, ctx_b) is s.LR.HIT_PENDING
    m.engine.wait([shared], timeout=5)
    assert below.calls["read"] == 1  # promoted once
    assert m.engine.stats().counters[("promotions", below.name, "ok")] == 1
    for c in (ctx_a, ctx_b):
        m.on_request_finished(c)


def test_reset_cache_finalizes_a_finished_request_with_stores_in_flight(tiering: Subject) -> None:
    """vLLM never completes a job prepared before a reset: the reset must let go of a finished
    request whose stores were in flight (aiotier held its finish back for them)."""
    s, m = tiering, tiering.manager
    ctx = s.ctx("req_reset_finalize")
    m.on_new_request(ctx)
    assert m.prepare_store(to_keys([10, 11]), ctx) is not None
    m.on_request_finished(ctx)
    assert not m.has_pending_work()  # held back for its stores
    m.reset_cache()
    assert m.has_pending_work()
    end_step(s)
    assert not m.has_pending_work()
    assert m.engine.stats().pinned_blocks == 0
    # the whole primary is free again: five new blocks fit
    out = m.prepare_store(to_keys(range(20, 25)), s.ctx("next"))
    assert out is not None and len(out.keys_to_store) == 5
    m.complete_store(to_keys(range(20, 25)), s.ctx("next"))


def test_reset_cache_clears_pending_primary_stores_for_active_request(tiering: Subject) -> None:
    """A running request re-offloads from its first chunk after a reset: the store prepared
    again completes to HIT (not pending until its deadline, then MISS), and the slot the
    dropped store held goes at ``on_reset_flushed``."""
    s, m = tiering, tiering.manager
    ctx = s.ctx("req_reset_resume")
    k3, k4 = to_keys([13, 14])
    assert m.prepare_store([k3], ctx) is not None
    m.reset_cache()
    assert m.prepare_store([k3, k4], ctx) is not None
    m.complete_store([k3, k4], ctx, success=True)
    assert m.lookup(k3, ctx) is s.LR.HIT
    assert m.lookup(k4, ctx) is s.LR.HIT
    # the dropped store's slot: until the fence (vLLM 0.33), at once under vLLM 0.32
    assert m.engine.stats().pinned_blocks == (1 if s.v033 else 0)
    m.on_reset_flushed()
    assert m.engine.stats().pinned_blocks == 0
    m.on_request_finished(ctx)
    end_step(s)


def test_a_load_in_flight_at_a_reset_keeps_its_slot_until_the_fence(tiering: Subject) -> None:
    s, m = tiering, tiering.manager
    needs_reset_fence(s)
    ctx, k = s.ctx("reader"), to_keys([10])
    m.prepare_store(k, ctx)
    m.complete_store(k, ctx)
    spec = m.prepare_load(k, ctx)
    m.reset_cache()
    assert m.lookup(k[0], ctx) is s.LR.MISS
    out = m.prepare_store(to_keys(range(20, 25)), s.ctx("w"))  # four free slots, not five
    assert out is None or spec.block_ids[0] not in out.store_spec.block_ids
    m.on_reset_flushed()
    assert m.engine.stats().pinned_blocks == 0
    m.on_request_finished(ctx)


def test_the_reset_announces_nothing_and_keeps_the_secondary_tier(
    tiering: Subject, below: FaultyTier
) -> None:
    s, m = tiering, tiering.manager
    ctx = s.ctx("test")
    m.prepare_store(to_keys([10]), ctx)
    m.complete_store(to_keys([10]), ctx)
    before = list(m.take_events())
    assert [e.removed for e in before] == [False]
    m.reset_cache()
    assert list(m.take_events()) == []
    assert below.inner.usage().blocks == 3  # not cleared
    m.on_request_finished(ctx)


@pytest.mark.parametrize(
    "matchers",
    [("STORAGE",), ()],
    ids=["non_matching_medium", "empty_no_load"],
)
def test_tier_filter_skips_filtered_secondary(
    tiering: Subject, below: FaultyTier, matchers: tuple[str, ...]
) -> None:
    s, m = tiering, tiering.manager
    t = s.types
    chunks = [to_keys([10])[0], to_keys([1])[0]]  # one in the primary, one only below
    m.prepare_store(chunks[:1], s.ctx("test"))
    m.complete_store(chunks[:1], s.ctx("test"), success=True)
    tier_filter = t.TierFilter(matchers=tuple(t.TierMatcher(medium=t.Medium[n]) for n in matchers))
    ctx = s.ctx("r1", load_tier_filter=tier_filter)
    assert m.lookup(chunks[0], ctx) is s.LR.HIT
    assert m.lookup(chunks[1], ctx) is s.LR.MISS
    assert m.count_hits(chunks, ctx) == 1
    assert below.calls["lookup"] == below.calls["read"] == 0
    m.on_request_finished(s.ctx("test"))


@pytest.mark.parametrize("matchers", [None, ("CPU",), ("any",)], ids=["all", "cpu", "any"])
def test_tier_filter_allows_matching_secondary(
    tiering: Subject, below: FaultyTier, matchers: tuple[str, ...] | None
) -> None:
    s, m, t = tiering, tiering.manager, tiering.types
    if matchers is None:
        tier_filter = t.TierFilter.ALL
    else:
        tier_filter = t.TierFilter(
            matchers=tuple(t.TierMatcher(medium=t.Medium[n]) if n != "any" else t.TierMatcher()
                           for n in matchers)
        )  # fmt: skip
    ctx = s.ctx("r2", load_tier_filter=tier_filter)
    assert m.lookup(to_keys([0])[0], ctx) is s.LR.HIT_PENDING
    m.engine.wait(to_keys([0]), timeout=5)
    m.on_request_finished(ctx)


def test_works_without_secondary_tiers(flavor: str) -> None:
    s = make_subject(flavor, num_chunks=5)
    try:
        ctx, chunks = s.ctx("test"), to_keys(range(3))
        s.manager.on_new_request(ctx)
        assert s.manager.prepare_store(chunks, ctx) is not None
        s.manager.complete_store(chunks, ctx, success=True)
        assert count_hits(s, chunks) == 3
        s.manager.reset_cache()  # nothing to hold: no tier to promote from
        assert count_hits(s, chunks) == 0
        s.manager.on_request_finished(ctx)
    finally:
        s.close()


def test_config_info_reports_one_series_for_each_tier(tiering: Subject) -> None:
    info = tiering.manager.config_info()
    assert [series["tier"] for series in info] == ["0:primary", "1:memory"]
    assert info[0] == {
        "tier": "0:primary", "kind": "primary", "num_blocks": 5, "block_size": 16,
        "capacity_bytes": 80, "policy": "lru",
    }  # fmt: skip
    assert info[1] == {"tier": "1:memory", "kind": "FaultyTier", "capacity_bytes": 1 << 20}
    assert all(set(series) <= set(CONFIG_INFO_KEYS) for series in info)


def test_get_stats_reports_tier_figures_since_the_last_call(tiering: Subject) -> None:
    s, m = tiering, tiering.manager
    ctx = s.ctx("test")
    for k in to_keys([0, 9]):
        m.lookup(k, ctx)  # 0: found below (promoted), 9: nowhere
    m.engine.wait(to_keys([0]), timeout=5)
    assert m.lookup(to_keys([0])[0], ctx) is s.LR.HIT
    stats = m.get_stats()
    assert type(stats).__name__ == "OffloadingConnectorStats"  # vLLM's, with vLLM's types
    reduced = stats.reduce()
    primary, memory = "('0:primary',)", "('1:memory',)"
    assert reduced[f"vllm:kv_offload_tiering_chunk_hits:{primary}"] == 1
    assert reduced[f"vllm:kv_offload_tiering_chunk_queries:{primary}"] == 3  # 0 and 9 missed
    assert reduced[f"vllm:kv_offload_tiering_chunk_hits:{memory}"] == 1
    assert reduced[f"vllm:kv_offload_tiering_chunk_queries:{memory}"] == 2
    assert reduced[f"vllm:kv_offload_tiering_active_promotion_jobs:{memory}"] == 0
    again = m.get_stats().reduce()
    assert f"vllm:kv_offload_tiering_chunk_queries:{memory}" not in again
    m.on_request_finished(ctx)
