"""``get_or_load``: single flight over the tiers and the loader, errors and cancellation shared
the way a cache user expects, and a service with no scheduler sees its metrics move."""

from __future__ import annotations

import asyncio

import pytest
from helpers import aiotier_tasks, eventually
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import MemoryTier, PrimaryTier, TieringEngine, TieringError
from aiotier.testing import FaultyTier


class CountingLoader:
    """An async loader that counts its calls and can be held until released."""

    def __init__(self, value: bytes = b"computed", *, fail: Exception | None = None) -> None:
        self.value, self.fail = value, fail
        self.calls = 0
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self) -> bytes:
        self.calls += 1
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return self.value


async def test_a_thousand_concurrent_misses_call_the_loader_once_and_store_its_value() -> None:
    tier = FaultyTier(MemoryTier(1 << 20))
    loader = CountingLoader(b"v" * 100)
    loader.release.clear()
    async with TieringEngine(PrimaryTier(8, 128), [tier]) as e:
        callers = [asyncio.ensure_future(e.get_or_load("k", loader)) for _ in range(1000)]
        await eventually(lambda: loader.calls == 1, what="the loader called")
        loader.release.set()
        results = await asyncio.gather(*callers)
        assert results == [b"v" * 100] * 1000
        assert loader.calls == 1
        assert tier.calls["lookup"] == 1  # one look below the primary for them all
        assert await e.get("k") == b"v" * 100  # stored as by put
        assert await e.get_or_load("k", loader) == b"v" * 100
        assert loader.calls == 1


async def test_a_key_found_in_any_tier_is_not_loaded() -> None:
    async with TieringEngine(PrimaryTier(2, 16), [MemoryTier(1 << 20)]) as e:
        for i in range(4):  # the first two go down to the memory tier
            assert await e.put(f"k{i}", b"stored%d" % i)
        await e.flush()
        loader = CountingLoader()
        assert await e.get_or_load("k0", loader) == b"stored0"
        assert await e.get_or_load("k3", loader) == b"stored3"
        assert loader.calls == 0


async def test_a_loader_error_reaches_every_waiter_stores_nothing_and_is_retried() -> None:
    failing = CountingLoader(fail=ConnectionError("backend down"))
    failing.release.clear()
    async with TieringEngine(PrimaryTier(4, 64)) as e:
        callers = [asyncio.ensure_future(e.get_or_load("k", failing)) for _ in range(50)]
        await eventually(lambda: failing.calls == 1)
        failing.release.set()
        outcomes = await asyncio.gather(*callers, return_exceptions=True)
        assert all(isinstance(o, ConnectionError) for o in outcomes)
        assert failing.calls == 1
        assert await e.get("k") is None
        working = CountingLoader(b"second try")
        assert await e.get_or_load("k", working) == b"second try"
        assert working.calls == 1


async def test_a_cancelled_waiter_does_not_cancel_the_load_for_the_others() -> None:
    loader = CountingLoader(b"value")
    loader.release.clear()
    async with TieringEngine(PrimaryTier(4, 64)) as e:
        first = asyncio.ensure_future(e.get_or_load("k", loader))
        others = [asyncio.ensure_future(e.get_or_load("k", loader)) for _ in range(5)]
        await eventually(lambda: loader.calls == 1)
        first.cancel()
        others[0].cancel()
        loader.release.set()
        assert await asyncio.gather(*others[1:]) == [b"value"] * 4
        assert first.cancelled() and others[0].cancelled()
        assert await e.get("k") == b"value"
        assert loader.calls == 1


async def test_every_waiter_cancelled_still_stores_the_value() -> None:
    loader = CountingLoader(b"value")
    loader.release.clear()
    async with TieringEngine(PrimaryTier(4, 64)) as e:
        waiter = asyncio.ensure_future(e.get_or_load("k", loader))
        await eventually(lambda: loader.calls == 1)
        waiter.cancel()
        loader.release.set()
        await eventually(lambda: not aiotier_tasks("load"), what="the flight ended")
        assert await e.get("k") == b"value"


async def test_bad_loaders_and_values_are_refused_with_errors_naming_them() -> None:
    def not_async() -> bytes:
        return b"x"

    async def gives_str() -> str:
        return "text"

    async def too_big() -> bytes:
        return b"x" * (3 * 64 + 1)  # more than num_blocks - 1 blocks

    async with TieringEngine(PrimaryTier(4, 64)) as e:
        with pytest.raises(TypeError, match="async callable"):
            await e.get_or_load("k", b"not callable")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be an async callable"):
            await e.get_or_load("k", not_async)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="returned str, not bytes-like"):
            await e.get_or_load("k", gives_str)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="takes values up to 192 bytes"):
            await e.get_or_load("k", too_big)
        assert await e.get("k") is None
        assert e.stats().pinned_blocks == 0


async def test_closing_ends_loads_in_flight_with_an_error_and_leaves_no_task() -> None:
    loader = CountingLoader()
    loader.release.clear()
    e = TieringEngine(PrimaryTier(4, 64))
    await e.open()
    waiter = asyncio.ensure_future(e.get_or_load("k", loader))
    await eventually(lambda: loader.calls == 1)
    await e.aclose()
    with pytest.raises(TieringError, match="closed during get_or_load"):
        await waiter
    assert not aiotier_tasks()
    with pytest.raises(TieringError, match="closed"):
        await e.get_or_load("k", loader)


async def test_metrics_move_for_a_service_that_never_calls_end_step() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        async with TieringEngine(PrimaryTier(4, 64), meter_provider=provider) as e:
            await e.get_or_load("k", CountingLoader())
            await e.get_or_load("k", CountingLoader())

            def primary_lookups() -> dict[str, float]:
                data = reader.get_metrics_data()
                out: dict[str, float] = {}
                for rm in data.resource_metrics if data is not None else ():
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            if m.name == "aiotier.lookups":
                                for p in m.data.data_points:
                                    if p.attributes.get("tier") == "primary":
                                        out[str(p.attributes.get("result"))] = p.value
                return out

            await eventually(lambda: primary_lookups() == {"hit": 1, "miss": 1}, what="export")
    finally:
        provider.shutdown()
