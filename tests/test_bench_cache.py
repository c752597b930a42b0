"""The ``cache`` bench case runs and reports what it says (figures are not asserted: timing is
the bench's job; loader calls are counts, so they are)."""

from __future__ import annotations

from aiotier_bench import cache


async def test_the_stampede_case_counts_one_loader_call_for_aiotier_and_reports_the_peers() -> None:
    (case,) = await cache.run(True, ("cache_stampede",))
    doc = case.to_json()
    assert doc["aiotier"] == 1
    calls = doc["loader_calls"]
    assert calls["aiotier"] == 1
    assert calls["aiocache cached"] > 1  # no single flight there: the reason the case exists
    assert set(calls) == {
        "aiotier", "aiocache cached", "aiocache cached_stampede", "cashews get_or_set",
        "cashews cache(lock=True)",
    }  # fmt: skip


async def test_the_hit_case_reports_its_floor_and_both_peers() -> None:
    (case,) = await cache.run(True, ("cache_hit",))
    doc = case.to_json()
    assert doc["aiotier"] > 0 and doc["floor"]["value"] > 0
    assert doc["aiocache_us"] > 0 and doc["cashews_us"] > 0
    assert doc["peer"]["value"] == min(doc["aiocache_us"], doc["cashews_us"])


async def test_the_large_value_case_reads_the_value_it_put() -> None:
    (case,) = await cache.run(True, ("cache_large_value",))
    doc = case.to_json()
    assert doc["params"] == {"value_bytes": 1 << 20, "block_size": 65536, "pieces": 16}
    assert doc["aiotier"] > 0 and doc["put_us"] > 0


async def test_the_ttl_case_reports_hits_with_and_without_ttl() -> None:
    (case,) = await cache.run(True, ("cache_ttl",))
    doc = case.to_json()
    assert doc["aiotier"] > 0 and doc["floor"]["value"] > 0 and doc["ratio_to_floor"] > 0
    assert doc["get_us"] > 0 and doc["get_ttl_us"] > 0 and doc["get_ttl_ratio"] > 0


async def test_the_write_through_case_puts_through_an_ssd_and_a_memory_tier() -> None:
    (case,) = await cache.run(True, ("cache_write_through",))
    doc = case.to_json()
    assert doc["params"]["tier"] == "ssd" and doc["aiotier"] > 0
    assert doc["floor"]["value"] > 0 and doc["memory_tier_write_through_us"] > 0
