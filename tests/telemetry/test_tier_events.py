"""``aiotier_tier_events_total``: each tier's own counters, read when metrics are collected."""

from __future__ import annotations

from collections.abc import Sequence

from helpers import write_one
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import MemoryTier, PrimaryTier, TieringEngine
from aiotier.testing import FaultyTier, MetricsProbe

EVENTS = "aiotier_tier_events_total"


class CountingTier(MemoryTier):
    """A memory tier that counts its own reads, as a remote tier counts its requests."""

    def __init__(self, name: str) -> None:
        super().__init__(1 << 20, name=name)
        self.reads = 0

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        self.reads += len(keys)
        return await super().read_many_into(keys, bufs)

    def counters(self) -> dict[str, int]:
        return {"reads": self.reads, "never": 0}


class BrokenCounters(MemoryTier):
    def counters(self) -> dict[str, int]:
        raise RuntimeError("the counters are broken")


async def test_each_tiers_counters_are_exported_when_collected() -> None:
    """(A tier whose counters() raises is left out; the other tier's still appear.)"""
    probe = MetricsProbe(InMemoryMetricReader())
    provider = MeterProvider(metric_readers=[probe.reader])
    counting = CountingTier("counting")
    broken = BrokenCounters(1 << 20, name="broken")
    await write_one(counting, b"k", b"v")
    async with TieringEngine(
        PrimaryTier(4, 16), [FaultyTier(counting), broken], meter_provider=provider
    ) as e:
        assert await e.get("k") == b"v"
        assert probe.value(EVENTS, tier="counting", event="reads") == 1
        assert probe.value(EVENTS, tier="counting", event="never") == 0
        assert await e.get("absent") is None
        assert probe.value(EVENTS, tier="counting", event="reads") == counting.reads
    provider.shutdown()
