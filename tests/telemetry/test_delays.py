"""The per-request delay rules of SPEC section 5, with exact counts, on a private provider."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from helpers import write_one
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import LookupResult, MemoryTier, PrimaryTier, RequestContext, TieringEngine
from aiotier.telemetry import ALLOCATION_SIZE_BUCKETS, ASYNC_DELAY_BUCKETS, SYNC_DELAY_BUCKETS
from aiotier.testing import FaultyTier, MetricsProbe

SYNC = "aiotier_lookup_sync_delay_seconds"
ASYNC = "aiotier_lookup_async_delay_seconds"
R1, R2 = RequestContext("r1"), RequestContext("r2")


@pytest.fixture
def probe() -> MetricsProbe:
    return MetricsProbe(InMemoryMetricReader())


@pytest.fixture
async def engine(probe: MetricsProbe) -> AsyncIterator[TieringEngine]:
    tier = FaultyTier(MemoryTier(1 << 20)).delay("read", 0.02)
    for i in range(8):
        await write_one(tier, b"k%d" % i, b"v%d" % i)
    provider = MeterProvider(metric_readers=[probe.reader])
    async with TieringEngine(PrimaryTier(8, 16), [tier], meter_provider=provider) as e:
        yield e
    provider.shutdown()


async def test_nothing_is_observed_before_the_step_boundary(
    engine: TieringEngine, probe: MetricsProbe
) -> None:
    assert await engine.lookup("k0", R1) is LookupResult.RETRY
    await engine.wait(["k0"])
    assert probe.count(SYNC) == 0
    assert probe.count(ASYNC) == 0
    assert probe.value("aiotier_lookups_total") == 0


async def test_request_admitted_after_promotion(engine: TieringEngine, probe: MetricsProbe) -> None:
    assert await engine.lookup_prefix(["k0", "k1"], R1) is None
    await engine.wait(["k0", "k1"])
    assert await engine.lookup_prefix(["k0", "k1"], R1) == 2  # primary only: adds no sync delay
    engine.end_step(new_req_ids=["r1"])
    assert probe.count(SYNC) == 1
    assert probe.count(ASYNC) == 1
    assert probe.sum(ASYNC) >= 0.02 - 0.002  # the tier's read delay (uvloop: +-1 ms ticks)
    assert 0 < probe.sum(SYNC) < probe.sum(ASYNC)
    engine.end_step(new_req_ids=["r1"])
    engine.end_step(finished_req_ids=["r1"])
    assert (probe.count(SYNC), probe.count(ASYNC)) == (1, 1)  # each interval exactly once


async def test_sync_delay_accumulates_over_lookups(
    engine: TieringEngine, probe: MetricsProbe
) -> None:
    assert await engine.lookup("missing-a", R1) is LookupResult.MISS
    first = engine.core.requests.get("r1").sync_delay
    assert await engine.lookup("missing-b", R1) is LookupResult.MISS
    total = engine.core.requests.get("r1").sync_delay
    assert total > first > 0
    engine.end_step(new_req_ids=["r1"])
    assert probe.count(SYNC) == 1
    assert probe.sum(SYNC) == pytest.approx(total)
    assert probe.count(ASYNC) == 0


async def test_finished_while_deferred(engine: TieringEngine, probe: MetricsProbe) -> None:
    assert await engine.lookup("k2", R1) is LookupResult.RETRY
    engine.end_step(finished_req_ids=["r1"])
    assert probe.count(SYNC) == 1
    assert probe.count(ASYNC) == 1
    engine.end_step(new_req_ids=["r1"], finished_req_ids=["r1"])
    assert (probe.count(SYNC), probe.count(ASYNC)) == (1, 1)


async def test_finished_without_deferral(engine: TieringEngine, probe: MetricsProbe) -> None:
    assert await engine.lookup("missing", R1) is LookupResult.MISS
    engine.end_step(finished_req_ids=["r1"])
    assert (probe.count(SYNC), probe.count(ASYNC)) == (1, 0)


async def test_primary_only_hits_observe_nothing(
    engine: TieringEngine, probe: MetricsProbe
) -> None:
    assert await engine.put("p", b"p")
    assert await engine.lookup("p", R1) is LookupResult.HIT
    assert await engine.lookup_prefix(["p"], R1) == 1
    engine.end_step(new_req_ids=["r1"])
    assert (probe.count(SYNC), probe.count(ASYNC)) == (0, 0)
    assert probe.value("aiotier_lookups_total", tier="primary", result="hit") == 2


async def test_two_requests_sharing_a_promotion_each_observe_their_deferral(
    engine: TieringEngine, probe: MetricsProbe
) -> None:
    assert await engine.lookup("k3", R1) is LookupResult.RETRY
    assert await engine.lookup("k3", R2) is LookupResult.RETRY  # no tier consulted: no sync
    await engine.wait(["k3"])
    engine.end_step(new_req_ids=["r1", "r2"])
    assert probe.count(ASYNC) == 2
    assert probe.count(SYNC) == 1
    assert probe.value("aiotier_promotions_total", tier="memory", outcome="ok") == 1


async def test_anonymous_calls_are_their_own_requests(
    engine: TieringEngine, probe: MetricsProbe
) -> None:
    assert await engine.lookup("k4") is LookupResult.RETRY
    assert await engine.lookup("missing") is LookupResult.MISS
    await engine.wait(["k4"])
    engine.end_step()
    assert probe.count(SYNC) == 2
    assert probe.count(ASYNC) == 1
    assert await engine.get("k5") == b"v5"
    engine.end_step()
    assert probe.count(SYNC) == 3
    assert probe.count(ASYNC) == 2


async def test_counters_and_buckets(engine: TieringEngine, probe: MetricsProbe) -> None:
    assert await engine.lookup("k6", R1) is LookupResult.RETRY
    await engine.wait(["k6"])
    assert engine.prepare_store(["a", "b", "c"], R1) is not None
    engine.complete_store(["a", "b", "c"], R1, sizes=[1, 2, 3])
    engine.prepare_load(["a"], R2)
    full = engine.prepare_store([f"x{i}" for i in range(20)], R1)
    assert full is None
    engine.end_step(new_req_ids=["r1"])
    assert probe.value("aiotier_lookups_total", tier="primary", result="miss") == 1
    assert probe.value("aiotier_lookups_total", tier="memory", result="hit") == 1
    assert probe.value("aiotier_allocation_failures_total", phase="store") == 1
    assert probe.count("aiotier_allocation_size_blocks") == 2
    assert probe.sum("aiotier_allocation_size_blocks") == 23
    assert probe.value("aiotier_read_bytes_total", tier="memory") == 2
    assert probe.count("aiotier_promotion_duration_seconds", tier="memory") == 1
    assert probe.buckets(SYNC) == SYNC_DELAY_BUCKETS
    assert probe.buckets(ASYNC) == ASYNC_DELAY_BUCKETS
    assert probe.buckets("aiotier_allocation_size_blocks") == ALLOCATION_SIZE_BUCKETS
    assert probe.value("aiotier_tier_usage_bytes", tier="memory") > 0
    assert probe.value("aiotier_tier_usage_bytes", tier="primary") == 2 + 6


async def test_tier_errors_and_evictions_are_counted(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = FaultyTier(MemoryTier(1 << 20)).fail("lookup")
    async with TieringEngine(PrimaryTier(1, 8), [tier], meter_provider=provider) as e:
        assert await e.lookup("x") is LookupResult.MISS
        assert await e.put("a", b"a")
        assert await e.put("b", b"b")
        await e.flush()
        e.end_step()
    assert probe.value("aiotier_tier_errors_total", tier="memory", op="lookup") == 1
    assert probe.value("aiotier_evictions_total", tier="primary") == 1
    assert probe.value("aiotier_write_bytes_total", tier="memory") == 2  # a, then b at close
    provider.shutdown()
