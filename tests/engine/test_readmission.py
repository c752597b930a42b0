"""A block on its way down is put back into the primary by a lookup; when that evicts another
block, the lookup answers RETRY, not HIT: a scheduler that looks keys up one by one (vLLM's)
may have been told the evicted block was a HIT a moment before, and loads only all-HIT
prefixes."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import LookupResult, MemoryTier, PrimaryTier, RequestContext, TieringEngine
from aiotier.testing import FaultyTier, MetricsProbe

HIT, RETRY = LookupResult.HIT, LookupResult.RETRY


async def test_a_readmission_that_evicts_answers_retry_and_the_earlier_hit_stays_loadable() -> None:
    tier = FaultyTier(MemoryTier(1 << 20)).delay("write", 30.0)  # demotions stay in transit
    req = RequestContext("r")
    async with TieringEngine(PrimaryTier(2, 16), [tier]) as e:
        for k in ("a", "b", "c"):  # a goes down (slowly): b and c fill the primary
            assert await e.put(k, k.encode())
        assert await e.lookup("c", req) is HIT
        # a comes back from the bytes in transit, evicting b (the least recently used)
        assert await e.lookup("a", req) is RETRY
        assert await e.lookup("a", req) is HIT  # a second look: loadable now
        assert await e.lookup("c", req) is HIT
        spec = e.prepare_load(["a", "c"], req)  # what a per-key scan saw as HIT is loadable
        assert [bytes(b) for b in spec.buffers] == [b"a", b"c"]
        e.complete_load(["a", "c"], req)
        tier.heal()



async def test_an_anonymous_retry_of_a_readmission_is_observed_once_as_a_deferral() -> None:
    """Found by the faults model: the RETRY of a key put back from the bytes in transit has
    nothing in flight to settle, and its deferral was never observed."""
    tier = FaultyTier(MemoryTier(1 << 20)).delay("write", 30.0)  # demotions stay in transit
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    async with TieringEngine(PrimaryTier(2, 16), [tier], meter_provider=provider) as e:
        for k in ("a", "b", "c"):
            assert await e.put(k, k.encode())
        assert await e.lookup("a") is RETRY  # anonymous: its own request
        e.end_step()
        assert MetricsProbe(reader).count("aiotier_lookup_async_delay_seconds") == 1
        tier.heal()
