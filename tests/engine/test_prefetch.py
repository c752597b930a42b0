"""Deadline-bounded prefetch: it starts the promotions a lookup_prefix would, waits at most its
timeout, and answers how many leading keys are loadable then; it never raises on the deadline."""

from __future__ import annotations

import time

import pytest
from helpers import block, remove_one, seeded
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import LookupResult, PrimaryTier, RequestContext, TieringEngine
from aiotier.testing import FaultyTier, MetricsProbe

R1 = RequestContext("r1")
HIT = LookupResult.HIT
PREFETCHES = "aiotier_prefetches_total"


@pytest.fixture
def probe() -> MetricsProbe:
    return MetricsProbe(InMemoryMetricReader())


async def test_prefetch_returns_as_soon_as_everything_landed(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    async with TieringEngine(PrimaryTier(8, 64), [await seeded(4)], meter_provider=provider) as e:
        started = time.monotonic()
        assert await e.prefetch(["k0", "k1", "k2", "k3"], R1, timeout=30) == 4
        assert time.monotonic() - started < 10  # not the deadline: the moment they landed
        spec = e.prepare_load(["k0", "k1", "k2", "k3"], R1)
        assert [bytes(b) for b in spec.buffers] == [block(i) for i in range(4)]
        e.complete_load(["k0", "k1", "k2", "k3"], R1)
        assert await e.prefetch(["k0", "k1"], timeout=0) == 2  # already there
        e.end_step(finished_req_ids=["r1"])
        assert probe.value(PREFETCHES, outcome="complete") == 2
    provider.shutdown()


async def test_prefetch_past_its_deadline_keeps_the_partial_prefix(probe: MetricsProbe) -> None:
    provider = MeterProvider(metric_readers=[probe.reader])
    fast, slow = await seeded(2, name="fast"), FaultyTier(await seeded(4, name="slow"))
    await remove_one(slow.inner, b"k0")
    await remove_one(slow.inner, b"k1")
    slow.hang("read")
    async with TieringEngine(
        PrimaryTier(8, 64), [fast, slow], meter_provider=provider, promotion_timeout=30
    ) as e:
        assert await e.prefetch(["k0", "k1", "k2", "k3"], R1, timeout=0.1) == 2
        assert e.stats().promotions_in_flight == 2  # k2, k3 are still on their way
        assert await e.lookup_prefix(["k0", "k1", "k2", "k3"], R1) is None  # no second read
        slow.heal()
        assert await e.wait(["k0", "k1", "k2", "k3"]) == [HIT] * 4
        assert slow.calls["read"] == 2
        assert await e.prefetch(["x", "k0"], timeout=0.1) == 0  # x is in no tier
        e.end_step(finished_req_ids=["r1"])
        assert probe.value(PREFETCHES, outcome="partial") == 1
        assert probe.value(PREFETCHES, outcome="none") == 1
    provider.shutdown()


async def test_an_anonymous_prefetch_pins_what_it_promoted_until_the_next_step() -> None:
    async with TieringEngine(PrimaryTier(2, 64), [await seeded(2)]) as e:
        assert await e.prefetch(["k0", "k1"], timeout=5) == 2
        assert e.stats().pinned_blocks == 2
        e.end_step()
        assert e.stats().pinned_blocks == 0


async def test_prefetch_refuses_bad_arguments() -> None:
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        with pytest.raises(TypeError, match="timeout"):
            await e.prefetch(["k"], timeout="soon")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout"):
            await e.prefetch(["k"], timeout=-1)
        with pytest.raises(TypeError, match="single str"):
            await e.prefetch("k", timeout=1)
