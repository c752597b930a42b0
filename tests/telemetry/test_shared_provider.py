"""Several engines on one MeterProvider: each engine's gauges and tier counters are reported,
a label set they share is combined, and an engine stops reporting once it closes or is gone."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from helpers import write_one
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import BreakerPolicy, LookupResult, MemoryTier, PrimaryTier, TieringEngine
from aiotier.testing import FaultyTier


def observed(reader: InMemoryMetricReader, name: str) -> dict[tuple[str, ...], float]:
    """``name``'s points of one collection, by their attribute values."""
    data = reader.get_metrics_data()
    out: dict[tuple[str, ...], float] = {}
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    for p in m.data.data_points:
                        out[tuple(str(v) for v in p.attributes.values())] = p.value
    return out


@pytest.fixture
def exported() -> Iterator[tuple[InMemoryMetricReader, MeterProvider]]:
    """A provider with an in-memory reader, shut down after the test."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield reader, provider
    provider.shutdown()


def on(provider: MeterProvider, tier: MemoryTier, blocks: int = 4) -> TieringEngine:
    return TieringEngine(PrimaryTier(blocks, 8), [tier], meter_provider=provider)


class CountingTier(MemoryTier):
    def counters(self) -> dict[str, int]:
        return {"asked": 3}


async def test_every_engine_on_a_provider_reports_its_gauges_until_it_closes(
    exported: tuple[InMemoryMetricReader, MeterProvider],
) -> None:
    reader, provider = exported
    one = on(provider, CountingTier(1000, name="one"))
    two = on(provider, CountingTier(1000, name="two"))
    async with one, two:
        assert await one.put("a", b"aaa")
        assert await two.put("b", b"bbbbb")
        usage = observed(reader, "aiotier.tier_usage")
        assert usage == {("primary",): 3 + 5, ("one",): 0, ("two",): 0}  # the shared name adds up
        events = observed(reader, "aiotier.tier_events")
        assert events == {("one", "asked"): 3, ("two", "asked"): 3}
        await one.aclose()
        assert observed(reader, "aiotier.tier_usage") == {("primary",): 5, ("two",): 0}
        # a counter never goes down: the closed engine's last counts stay in it
        assert observed(reader, "aiotier.tier_events") == {("one", "asked"): 3, ("two", "asked"): 3}


async def test_a_counter_two_engines_share_keeps_the_counts_of_one_that_closes(
    exported: tuple[InMemoryMetricReader, MeterProvider],
) -> None:
    reader, provider = exported
    first = on(provider, CountingTier(1000, name="shared"))
    second = on(provider, CountingTier(1000, name="shared"))
    async with first:
        async with second:
            assert observed(reader, "aiotier.tier_events") == {("shared", "asked"): 3 + 3}
        assert observed(reader, "aiotier.tier_events") == {("shared", "asked"): 3 + 3}
    assert observed(reader, "aiotier.tier_events") == {("shared", "asked"): 3 + 3}


async def test_a_breaker_state_two_engines_report_is_the_worst(
    exported: tuple[InMemoryMetricReader, MeterProvider],
) -> None:
    reader, provider = exported
    broken = FaultyTier(MemoryTier(1000), name="shared").fail("lookup")
    healthy = MemoryTier(1000, name="shared")
    opens = BreakerPolicy(failure_threshold=1)
    async with (  # the healthy one first: its state alone must not win
        TieringEngine(PrimaryTier(2, 8), [healthy], meter_provider=provider, breaker=opens) as b,
        TieringEngine(PrimaryTier(2, 8), [broken], meter_provider=provider, breaker=opens) as a,
    ):
        await a.lookup("k")  # the lookup fails: a's circuit opens
        await b.lookup("k")
        assert a.health()["shared"].breaker == "open"
        assert b.health()["shared"].breaker == "closed"
        assert observed(reader, "aiotier.tier_breaker_state") == {("shared",): 2}  # open


async def test_an_engine_dropped_without_closing_stops_reporting_when_collected(
    exported: tuple[InMemoryMetricReader, MeterProvider],
) -> None:
    reader, provider = exported
    kept = on(provider, MemoryTier(1000, name="kept"))
    dropped = on(provider, MemoryTier(1000, name="dropped"))
    assert set(observed(reader, "aiotier.tier_usage")) == {("primary",), ("kept",), ("dropped",)}
    del dropped  # never opened, never closed
    gc.collect()
    assert set(observed(reader, "aiotier.tier_usage")) == {("primary",), ("kept",)}
    assert kept.stats().tiers["kept"].blocks == 0


async def test_engine_counters_are_totals_read_at_collection_and_outlive_their_engine(
    exported: tuple[InMemoryMetricReader, MeterProvider],
) -> None:
    """Counters are exported as the engines' totals as of their last step boundary, summed over
    the engines of a provider; an engine that goes away, closed or not, leaves its counts."""
    reader, provider = exported
    closed = on(provider, MemoryTier(1000, name="a"))
    dropped = on(provider, MemoryTier(1000, name="b"))
    await closed.open()
    await dropped.open()
    for engine in (closed, dropped):
        assert await engine.lookup(b"absent") is LookupResult.MISS
        assert await engine.lookup(b"absent") is LookupResult.MISS
    assert observed(reader, "aiotier.lookups") == {}  # nothing before the step boundary
    closed.end_step()
    assert observed(reader, "aiotier.lookups") == {("primary", "miss"): 2, ("a", "miss"): 2}
    dropped.end_step()
    both = {("primary", "miss"): 4, ("a", "miss"): 2, ("b", "miss"): 2}
    assert observed(reader, "aiotier.lookups") == both
    assert await dropped.lookup(b"absent") is LookupResult.MISS
    dropped.end_step()  # counted, not collected before the engine goes
    await closed.aclose()
    await dropped.aclose(flush=False)
    del dropped
    gc.collect()
    assert observed(reader, "aiotier.lookups") == {
        ("primary", "miss"): 5, ("a", "miss"): 2, ("b", "miss"): 3,
    }  # fmt: skip


async def test_a_step_boundary_makes_no_sdk_call_for_counters() -> None:
    """The per-step export costs one ``record`` per histogram sample and nothing per counter."""
    from aiotier_bench.counting import CountingMeterProvider

    sdk = MeterProvider(metric_readers=[InMemoryMetricReader()])
    counting = CountingMeterProvider(sdk)
    try:
        tier = MemoryTier(1000)
        await write_one(tier, b"k", b"v")
        async with TieringEngine(PrimaryTier(4, 8), [tier], meter_provider=counting) as engine:
            counting.reset()
            assert await engine.lookup(b"k") is LookupResult.RETRY
            await engine.wait([b"k"])
            assert await engine.lookup(b"absent") is LookupResult.MISS
            engine.end_step()
            # two sync delays (anonymous lookups that asked the tier), one async delay, one
            # promotion read: the lookups, promotion and bytes counters cost no call
            assert dict(counting.calls) == {
                "aiotier.lookup_sync_delay": 2,
                "aiotier.lookup_async_delay": 1,
                "aiotier.promotion_duration": 1,
            }
    finally:
        sdk.shutdown()


_GLOBAL_SET_LATE = """
import asyncio
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from aiotier import MemoryTier, PrimaryTier, TieringEngine

async def main():
    one = TieringEngine(PrimaryTier(2, 8), [MemoryTier(100, name="one")])  # the global provider
    two = TieringEngine(PrimaryTier(2, 8), [MemoryTier(100, name="two")])
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)  # set after those two
    three = TieringEngine(PrimaryTier(2, 8), [MemoryTier(100, name="three")])  # global: set
    four = TieringEngine(PrimaryTier(2, 8), [MemoryTier(100, name="four")], meter_provider=provider)
    async with one, two, three, four:
        tiers = set()
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == "aiotier.tier_usage":
                        tiers |= {p.attributes["tier"] for p in m.data.data_points}
        print(sorted(tiers))

asyncio.run(main())
"""


def test_engines_on_the_global_provider_before_and_after_it_is_set_are_all_reported() -> None:
    # a process of its own: the global provider can be set once
    out = subprocess.run(
        [sys.executable, "-c", _GLOBAL_SET_LATE], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "['four', 'one', 'primary', 'three', 'two']"


async def test_samples_exported_at_a_step_boundary_carry_no_exemplar_of_the_current_span(
    exported: tuple[InMemoryMetricReader, MeterProvider],
) -> None:
    """The step boundary is the scheduler's span, not the request's: no exemplar points at it."""
    from opentelemetry.sdk.trace import TracerProvider

    reader, provider = exported
    tracer = TracerProvider().get_tracer("test")
    tier = MemoryTier(1000)
    await write_one(tier, b"k", b"v")
    async with on(provider, tier) as engine:
        assert await engine.lookup(b"k") is LookupResult.RETRY
        await engine.wait([b"k"])
        with tracer.start_as_current_span("scheduler step"):  # sampled: the default sampler
            engine.end_step()
    data = reader.get_metrics_data()
    assert data is not None
    points = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "aiotier.lookup_sync_delay"
        for p in m.data.data_points
    ]
    assert [p.count for p in points] == [1]
    assert [list(p.exemplars) for p in points] == [[]]


async def test_a_collection_while_an_engine_closes_still_sees_its_counts(
    exported: tuple[InMemoryMetricReader, MeterProvider],
) -> None:
    """Closing hands an engine's counts over to the retired ones at once: a scrape in between
    (here from the tier's ``counters()``, read at the close) sees no dip in a shared series."""
    reader, provider = exported
    seen: list[dict[tuple[str, ...], float]] = []

    class ScrapedAtClose(MemoryTier):
        closing = False

        def counters(self) -> dict[str, int]:
            if self.closing:
                self.closing = False
                scrape = lambda: seen.append(observed(reader, "aiotier.lookups"))  # noqa: E731
                t = threading.Thread(target=scrape)
                t.start()
                t.join(10)
            return {}

    tier = ScrapedAtClose(1000, name="a")
    a, b = on(provider, tier), on(provider, MemoryTier(1000, name="b"))
    async with b:
        await a.open()
        for engine in (a, a, a, b, b):
            assert await engine.lookup(b"x") is LookupResult.MISS
        a.end_step()
        b.end_step()
        totals = {("primary", "miss"): 5, ("a", "miss"): 3, ("b", "miss"): 2}
        assert observed(reader, "aiotier.lookups") == totals
        tier.closing = True
        await a.aclose()
        assert seen == [totals]
        assert observed(reader, "aiotier.lookups") == totals


_COLLECTED_WHILE_CREATED = """
import threading
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics._internal import measurement_consumer
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from aiotier import MemoryTier, PrimaryTier, TieringEngine

consumer = measurement_consumer.SynchronousMeasurementConsumer
register = consumer.register_asynchronous_instrument
reader = InMemoryMetricReader()
provider = MeterProvider(metric_readers=[reader])
collections = []

def register_then_collect(self, instrument):
    register(self, instrument)
    if not collections:  # a scrape arrives right after the first aiotier instrument
        t = threading.Thread(target=reader.get_metrics_data, daemon=True)
        collections.append(t)
        t.start()
        t.join(5)

consumer.register_asynchronous_instrument = register_then_collect
TieringEngine(PrimaryTier(4, 8), [MemoryTier(1000)], meter_provider=provider)
print("collected" if collections and not collections[0].is_alive() else "still collecting")
"""


def test_creating_an_engine_while_metrics_are_collected_does_not_deadlock() -> None:
    """Instruments are created outside the observers' lock: a collection holds the SDK's lock
    while it runs the callbacks, which take the observers' lock (in a subprocess: the failure
    this guards against is a hang)."""
    out = subprocess.run(
        [sys.executable, "-c", _COLLECTED_WHILE_CREATED], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "collected"
