"""Exact metrics of promotions and deferrals: outcomes, lookup counts, and one sync and one async
delay per request however its calls race the step boundary, the tiers and ``aclose``.
"""

from __future__ import annotations

import asyncio

import pytest
from helpers import aiotier_tasks, block, eventually, seeded, write_one
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import (
    LookupResult,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    TieringEngine,
)
from aiotier.testing import FaultyTier, MetricsProbe

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
R1, R2 = RequestContext("r1"), RequestContext("r2")



@pytest.fixture
def probe() -> MetricsProbe:
    return MetricsProbe(InMemoryMetricReader())

async def test_sync_delay_of_a_lookup_spanning_end_step_is_observed(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = FaultyTier(MemoryTier(1 << 20)).delay("lookup", 0.05)
    async with TieringEngine(PrimaryTier(2, 64), [tier], meter_provider=provider) as e:
        looking = asyncio.ensure_future(e.lookup("nope", R1))
        await asyncio.sleep(0.01)
        e.end_step(new_req_ids=["r1"])
        assert await looking is MISS
        e.end_step(finished_req_ids=["r1"])
        assert probe.count("aiotier_lookup_sync_delay_seconds") == 1
    provider.shutdown()

async def test_promotion_superseded_before_its_read_counts_cancelled(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = FaultyTier(await seeded(1)).delay("read", 0.05)  # the put's remove lands first
    async with TieringEngine(PrimaryTier(4, 64), [tier], meter_provider=provider) as e:
        assert await e.lookup("k0", R1) is RETRY
        assert await e.put("k0", b"new")
        await eventually(lambda: not aiotier_tasks("promote"))
        e.end_step(finished_req_ids=["r1"])
        assert probe.value("aiotier_promotions_total", tier="memory", outcome="error") == 0
        assert probe.value("aiotier_promotions_total", tier="memory", outcome="cancelled") == 1
    provider.shutdown()

async def test_async_delay_starts_at_the_retry_not_before_the_tier_lookup(
    probe: MetricsProbe,
) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = FaultyTier(await seeded(1)).delay("lookup", 0.2)
    async with TieringEngine(PrimaryTier(2, 64), [tier], meter_provider=provider) as e:
        assert await e.lookup("k0", R1) is RETRY  # the deferral starts here
        e.end_step(new_req_ids=["r1"])  # ... and is observed here, at once
        # the tier's 0.2 s sleep: uvloop's timers tick in whole milliseconds and may end it
        # up to one early
        assert probe.sum("aiotier_lookup_sync_delay_seconds") >= 0.2 - 0.002
        assert probe.count("aiotier_lookup_async_delay_seconds") == 1
        assert probe.sum("aiotier_lookup_async_delay_seconds") < 0.1
    provider.shutdown()

async def test_get_retry_observes_one_deferral(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    m1 = FaultyTier(MemoryTier(64, name="m1")).delay("read", 0.05)  # one block
    m2 = MemoryTier(1 << 20, name="m2")
    await write_one(m1.inner, b"k", b"kept")
    async with TieringEngine(PrimaryTier(1, 64), [m1, m2], meter_provider=provider) as e:
        assert await e.put("x", block(1))
        assert await e.get("k") == b"kept"  # promoted from m2 on its second attempt
        e.end_step()
        assert probe.count("aiotier_lookup_async_delay_seconds") == 1
        assert probe.count("aiotier_lookup_sync_delay_seconds") == 1
    provider.shutdown()

async def test_superseded_promotion_is_counted_once(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    # the read completes (into the now orphaned slot) before the put's REMOVE reaches the tier
    tier = FaultyTier(await seeded(1)).delay("read", 0.05).delay("remove", 0.3)
    async with TieringEngine(PrimaryTier(4, 64), [tier], meter_provider=provider) as e:
        assert await e.lookup("k0", R1) is RETRY
        assert await e.put("k0", b"new")  # replaces the promoting block
        await eventually(lambda: not aiotier_tasks("promote"))
        e.end_step(finished_req_ids=["r1"])
        assert probe.value("aiotier_promotions_total", tier="memory") == 1
    provider.shutdown()

async def test_sync_delay_only_when_a_tier_was_consulted(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    async with TieringEngine(PrimaryTier(4, 64), meter_provider=provider) as e:
        assert await e.lookup("missing", R1) is MISS
        assert await e.lookup_prefix(["missing"], R2) == 0
        e.end_step(new_req_ids=["r1", "r2"])
        assert probe.count("aiotier_lookup_sync_delay_seconds") == 0
    provider.shutdown()

async def test_promotion_outcomes_and_lookup_counts(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = FaultyTier(await seeded(3)).delay("read", 0.01)
    async with TieringEngine(PrimaryTier(4, 64), [tier], meter_provider=provider) as e:
        assert await e.lookup_prefix(["k0", "k1", "nope", "k2"], R1) is None
        assert await e.lookup("k0", R2) is RETRY  # joins, no second promotion
        assert await e.wait(["k0", "k1", "k2"]) == [HIT, HIT, MISS]
        e.end_step(new_req_ids=["r1", "r2"])
        assert probe.value("aiotier_promotions_total", tier="memory", outcome="ok") == 2
        assert probe.value("aiotier_lookups_total", tier="primary", result="miss") == 4
        assert probe.value("aiotier_lookups_total", tier="primary", result="retry") == 1
        assert probe.value("aiotier_lookups_total", tier="memory", result="hit") == 3
        assert probe.value("aiotier_lookups_total", tier="memory", result="miss") == 1
        assert probe.value("aiotier_read_bytes_total", tier="memory") == 128
        assert probe.count("aiotier_lookup_async_delay_seconds") == 2
    provider.shutdown()

async def test_promotion_cancelled_by_aclose_is_counted(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = await seeded(1)
    e = TieringEngine(PrimaryTier(2, 64), [tier], meter_provider=provider)
    await e.open()
    assert await e.lookup("k0", R1) is RETRY  # the promotion is started, not yet run
    await e.aclose()
    assert probe.value("aiotier_promotions_total", tier="memory", outcome="cancelled") == 1
    provider.shutdown()

async def test_get_that_waits_twice_is_one_deferral(
    probe: MetricsProbe,
) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    metrics = probe
    upper = FaultyTier(MemoryTier(1 << 20), name="upper").fail("read")
    lower = MemoryTier(1 << 20, name="lower")
    await write_one(upper, b"k", b"v")
    await write_one(lower, b"k", b"v")
    async with TieringEngine(PrimaryTier(4, 16), [upper, lower], meter_provider=provider) as e:
        assert await e.get("k") == b"v"  # the upper read fails, the lower one lands
        e.end_step()
        assert metrics.count("aiotier_lookup_async_delay_seconds") == 1

async def test_request_admitted_while_its_lookup_waits_on_a_tier(
    probe: MetricsProbe,
) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    metrics = probe
    tier = FaultyTier(MemoryTier(1 << 20)).delay("lookup", 0.05)
    await write_one(tier, b"k", b"v")
    async with TieringEngine(PrimaryTier(4, 16), [tier], meter_provider=provider) as e:
        req = RequestContext("r")
        lookup = asyncio.ensure_future(e.lookup("k", req))
        await eventually(lambda: tier.calls["lookup"] == 1, what="the lookup reached the tier")
        e.end_step(new_req_ids=["r"])  # the scheduler admits r meanwhile
        assert await lookup is RETRY
        assert await e.wait(["k"]) == [HIT]
        e.end_step(new_req_ids=["r"])
        e.end_step(finished_req_ids=["r"])
        e.end_step()
        pinned = e.stats().pinned_blocks
        observed = metrics.count("aiotier_lookup_async_delay_seconds")
        assert (observed, pinned) == (1, 0)

async def test_a_memory_tier_read_runs_on_the_loop_with_no_task(probe: MetricsProbe) -> None:
    """A MemoryTier's reads never suspend: the engine reads it in a loop callback, with no
    task; until the loop runs it the keys are in flight (RETRY, one promotion each)."""
    provider = MeterProvider(metric_readers=[probe.reader])
    tier = await seeded(2)
    async with TieringEngine(PrimaryTier(4, 64), [tier], meter_provider=provider) as e:
        assert await e.lookup_prefix(["k0", "k1"], R1) is None
        assert not aiotier_tasks("promote")
        assert await e.lookup("k1", R1) is RETRY  # joins the promotion in flight
        assert await e.wait(["k0", "k1"]) == [HIT, HIT]
        e.end_step(new_req_ids=["r1"])
        assert probe.value("aiotier_promotions_total", tier="memory", outcome="ok") == 2
        assert probe.value("aiotier_read_bytes_total", tier="memory") == 128
    provider.shutdown()
