"""Admission per tier through the engine: which blocks enter the primary through prepare_store,
which are written into a secondary tier, what counts as a sighting, and the exact counts."""

from __future__ import annotations

import pytest
from helpers import eventually, write_one
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import (
    AdmitAfter,
    AdmitAll,
    AdmitTinyLFU,
    ConfigError,
    LookupResult,
    MemoryTier,
    PrimaryTier,
    TieringEngine,
)
from aiotier.testing import MetricsProbe

ADMISSIONS = "aiotier_admissions_total"


def counter(e: TieringEngine, *key: str) -> int:
    return e.stats().counters.get(tuple(key), 0)


async def test_the_primary_admits_a_store_only_after_enough_sightings() -> None:
    async with TieringEngine(PrimaryTier(2, 16), admission={"primary": AdmitAfter(2)}) as e:
        assert await e.put("old", b"o")
        out = e.prepare_store(["k"])  # the first sighting of k
        assert out is not None and out.keys_to_store == () and out.evicted_keys == ()
        assert counter(e, "admissions", "primary", "rejected") == 1
        assert await e.lookup("k") is LookupResult.MISS  # the second sighting
        out = e.prepare_store(["k"])  # the third: admitted
        assert out is not None and out.keys_to_store == (b"k",)
        e.complete_store(["k"])
        assert counter(e, "admissions", "primary", "admitted") == 1
        assert await e.put("fresh", b"f")  # an explicit put is always stored
        assert await e.get("fresh") == b"f"


async def test_lookup_prefix_sights_each_key_up_to_where_the_prefix_stops() -> None:
    async with TieringEngine(PrimaryTier(4, 16), admission={"primary": AdmitAfter(2)}) as e:
        assert await e.put("a", b"a")
        assert await e.lookup_prefix(["a", "b", "c"]) == 1  # sights a and b, not c
        out = e.prepare_store(["b", "c"])
        assert out is not None and out.keys_to_store == (b"b",)


async def test_tinylfu_keeps_a_frequent_block_from_a_one_off_store() -> None:
    policy = AdmitTinyLFU()
    async with TieringEngine(PrimaryTier(1, 16), admission={"primary": policy}) as e:
        assert await e.put("hot", b"h")
        for _ in range(3):
            assert await e.get("hot") == b"h"  # seen often
        out = e.prepare_store(["once"])
        assert out is not None and out.keys_to_store == ()  # it would evict "hot"
        for _ in range(4):
            await e.lookup("popular")
        out = e.prepare_store(["popular"])  # seen more often than "hot" now
        assert out is not None and out.keys_to_store == (b"popular",)
        assert out.evicted_keys == (b"hot",)


async def test_a_secondary_tier_is_written_only_what_it_admits() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    probe = MetricsProbe(reader)
    below = MemoryTier(1 << 20)
    async with TieringEngine(
        PrimaryTier(1, 16), [below], admission={"memory": AdmitAfter(2)}, meter_provider=provider
    ) as e:
        assert await e.get("twice") is None  # a sighting (a put is none: it always stores)
        assert await e.lookup("twice") is LookupResult.MISS  # another
        assert await e.put("twice", b"t")
        assert await e.put("once", b"o")  # evicts "twice" (seen twice: written below)
        assert await e.put("other", b"x")  # evicts "once" (seen never: dropped)
        await e.flush()
        assert below.contains_hint(b"twice") and not below.contains_hint(b"once")
        assert await e.get("once") is None
        e.end_step()
        assert probe.value(ADMISSIONS, tier="memory", decision="admitted") == 1
        assert probe.value(ADMISSIONS, tier="memory", decision="rejected") == 1
    provider.shutdown()


async def test_a_write_kept_out_leaves_no_older_copy_to_serve() -> None:
    below = MemoryTier(1 << 20)
    await write_one(below, b"k", b"old")
    async with TieringEngine(
        PrimaryTier(1, 16),
        [below],
        write_policy="write_through",
        admission={"memory": AdmitAfter(3)},
    ) as e:
        assert await e.put("k", b"new")  # not admitted below: the old copy there must go
        await eventually(lambda: not below.contains_hint(b"k"))
        assert await e.put("x", b"x")  # k leaves the primary
        assert await e.get("k") is None  # never b"old"


async def test_admit_all_counts_every_block_in() -> None:
    async with TieringEngine(PrimaryTier(4, 16), [MemoryTier(1 << 20)]) as e:
        assert e.options.admission == {}
        out = e.prepare_store(["a", "b"])
        assert out is not None
        e.complete_store(["a", "b"])
        assert counter(e, "admissions", "primary", "admitted") == 2
        assert "sightings" not in repr(AdmitAll())


def test_admission_names_a_tier_the_engine_has() -> None:
    with pytest.raises(ConfigError, match="'ssd'"):
        TieringEngine(PrimaryTier(4, 16), admission={"ssd": AdmitAll()})
    with pytest.raises(TypeError, match="AdmissionPolicy"):
        TieringEngine(PrimaryTier(4, 16), admission={"primary": "after:2"})  # type: ignore[dict-item]
