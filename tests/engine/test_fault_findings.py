"""Engine bugs the fault model (tests/property/test_faults_model.py) ran into, pinned minimally.

The first six are fixed (4faed5d, b2d3e0a) and stay as regression tests. A test still marked
``xfail(strict=True)`` fails today for the reason it gives and turns into an XPASS error the
moment the engine is fixed, so its marker must go then.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import eventually
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import (
    LookupResult,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    SSDTier,
    TieringEngine,
)
from aiotier.testing import FaultyTier, MetricsProbe

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY


@pytest.fixture
async def probe() -> AsyncIterator[tuple[MeterProvider, MetricsProbe]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, MetricsProbe(reader)
    provider.shutdown()


async def test_delete_whose_tier_remove_fails_never_serves_the_deleted_bytes() -> None:
    tier = FaultyTier(MemoryTier(1 << 20))
    await tier.write(b"k", b"old")  # written below by this or another engine
    async with TieringEngine(PrimaryTier(2, 16), [tier], backoff_seconds=0.01) as e:
        tier.fail("remove")
        await e.delete("k")
        assert tier.calls["remove"] == 1
        tier.heal()
        assert await e.get("k") is None


async def test_put_whose_tier_remove_fails_never_serves_older_bytes() -> None:
    tier = FaultyTier(MemoryTier(1 << 20))
    await tier.write(b"k", b"old")
    async with TieringEngine(PrimaryTier(1, 16), [tier], write_policy="none") as e:
        tier.fail("remove")
        assert await e.put("k", b"new")
        await e.flush()
        assert tier.calls["remove"] == 1
        tier.heal()
        assert await e.put("other", b"x")  # evicts k (dropped by policy)
        assert await e.get("k") in (b"new", None)


async def test_request_admitted_while_its_lookup_waits_on_a_tier(
    probe: tuple[MeterProvider, MetricsProbe],
) -> None:
    provider, metrics = probe
    tier = FaultyTier(MemoryTier(1 << 20)).delay("lookup", 0.05)
    await tier.write(b"k", b"v")
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


async def test_write_through_put_whose_write_fails_never_serves_older_bytes() -> None:
    tier = FaultyTier(MemoryTier(1 << 20))
    async with TieringEngine(PrimaryTier(1, 16), [tier], write_policy="write_through") as e:
        assert await e.put("k", b"old")
        await e.flush()
        tier.disk_full()
        assert await e.put("k", b"new")
        await e.flush()
        tier.heal()
        assert await e.put("other", b"x")  # evicts k: write_through drops it (already below?)
        await e.flush()
        assert await e.get("k") in (b"new", None)


async def test_same_key_prepared_twice_by_one_caller_after_a_delete() -> None:
    async with TieringEngine(PrimaryTier(4, 16)) as e:
        first = e.prepare_store(["k"])
        assert first is not None and first.keys_to_store == (b"k",)
        await e.delete("k")  # the key is gone: a second store of it starts afresh
        second = e.prepare_store(["k"])
        assert second is not None and second.keys_to_store == (b"k",)
        second.store_spec.buffers[0][:3] = b"two"
        e.complete_store(["k"], sizes=[3])
        e.complete_store(["k"], sizes=[3])
        e.end_step()
        assert e.stats().pinned_blocks == 0


async def test_get_that_waits_twice_is_one_deferral(
    probe: tuple[MeterProvider, MetricsProbe],
) -> None:
    provider, metrics = probe
    upper = FaultyTier(MemoryTier(1 << 20), name="upper").fail("read")
    lower = MemoryTier(1 << 20, name="lower")
    await upper.write(b"k", b"v")
    await lower.write(b"k", b"v")
    async with TieringEngine(PrimaryTier(4, 16), [upper, lower], meter_provider=provider) as e:
        assert await e.get("k") == b"v"  # the upper read fails, the lower one lands
        e.end_step()
        assert metrics.count("aiotier_lookup_async_delay_seconds") == 1


async def test_a_deleted_key_stays_deleted_across_a_restart_after_a_failed_remove(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ssd"
    async with TieringEngine(PrimaryTier(4, 16), [SSDTier(root, 1 << 20)]) as e:
        assert await e.put("k", b"old")  # written down to the SSD at close
    tier = FaultyTier(SSDTier(root, 1 << 20))
    async with TieringEngine(PrimaryTier(4, 16), [tier]) as e:
        tier.fail("remove")
        await e.delete("k")
        assert tier.calls["remove"] == 1
        assert await e.get("k") is None
        tier.heal()  # the tier works again before the engine closes
    async with TieringEngine(PrimaryTier(4, 16), [SSDTier(root, 1 << 20)]) as e:
        assert await e.get("k") is None  # b"old" today
