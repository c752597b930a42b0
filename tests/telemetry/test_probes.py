"""``/healthz`` and ``/readyz`` beside ``/metrics``: real HTTP requests on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import FakeClock
from opentelemetry.sdk.metrics import MeterProvider

from aiotier import BreakerPolicy, MemoryTier, PrimaryTier, TieringEngine
from aiotier.telemetry import start_prometheus_server
from aiotier.testing import FaultyTier


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers["Content-Type"], err.read().decode()


async def get(port: int, path: str) -> tuple[int, Any]:
    """Status and body (parsed when JSON) of ``GET path``, off the event loop."""
    status, ctype, body = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}{path}")
    return status, json.loads(body) if ctype == "application/json" else body


@pytest.fixture
def served() -> Iterator[tuple[int, MeterProvider]]:
    """A provider serving on a free port, started outside the event loop as at start-up."""
    port = free_port()
    provider = start_prometheus_server(port=port)
    yield port, provider
    provider.shutdown()


async def test_healthz_and_readyz_follow_the_engine_and_its_tiers(
    served: tuple[int, MeterProvider],
) -> None:
    port, provider = served
    assert await get(port, "/healthz") == (200, {"status": "ok"})
    status, doc = await get(port, "/readyz")
    assert status == 503 and doc["ready"] is False and doc["engines"] == []
    assert "no open engine" in doc["reason"]

    clock = FakeClock(0.0)
    flaky = FaultyTier(MemoryTier(1 << 20, name="flaky"))
    engine = TieringEngine(
        PrimaryTier(4, 64),
        [MemoryTier(1 << 20), flaky],
        meter_provider=provider,
        breaker=BreakerPolicy(failure_threshold=2, cooldown=30.0, clock=clock),
    )
    status, doc = await get(port, "/readyz")  # created, not open yet
    assert status == 503
    assert doc["engines"][0]["tiers"]["memory"]["open"] is False

    async with engine:
        status, doc = await get(port, "/readyz")
        assert status == 200 and doc["ready"] is True
        (report,) = doc["engines"]
        assert list(report["tiers"]) == ["primary", "memory", "flaky"]
        assert report["tiers"]["flaky"] == {
            "ready": True, "open": True, "breaker": "closed", "available": None,
            "failures": 0, "open_for_seconds": 0.0,
        }  # fmt: skip

        flaky.fail("lookup")
        for k in ("a", "b"):
            await engine.lookup(k)  # the memory tier misses, flaky fails: open
        clock.now = 2.5
        status, doc = await get(port, "/readyz")
        assert status == 503 and doc["ready"] is False
        tiers = doc["engines"][0]["tiers"]
        assert tiers["memory"]["ready"] is True
        assert tiers["flaky"] == {
            "ready": False, "open": True, "breaker": "open", "available": None,
            "failures": 2, "open_for_seconds": 2.5,
        }  # fmt: skip
        # a probe that must not fail with a tier the whole fleet shares leaves it out
        status, doc = await get(port, "/readyz?exclude=flaky")
        assert status == 200 and doc["excluded"] == ["flaky"]
        assert doc["engines"][0]["tiers"]["flaky"]["ready"] is False  # still reported
        # the metrics are still served, with the breaker's state
        status, body = await get(port, "/metrics")
        assert status == 200
        assert 'aiotier_tier_breaker_state{otel_scope_name="aiotier"' in body
        line = next(
            ln for ln in body.splitlines()
            if ln.startswith("aiotier_tier_breaker_state{") and 'tier="flaky"' in ln
        )  # fmt: skip
        assert line.endswith(" 2.0")
        assert await get(port, "/healthz") == (200, {"status": "ok"})

    status, doc = await get(port, "/readyz")  # closed: no longer reported
    assert status == 503 and doc["engines"] == []


async def test_readyz_reports_every_engine_of_the_provider_and_forgets_dropped_ones(
    served: tuple[int, MeterProvider],
) -> None:
    port, provider = served
    async with (
        TieringEngine(PrimaryTier(2, 8), [MemoryTier(1 << 20)], meter_provider=provider),
        TieringEngine(PrimaryTier(2, 8), meter_provider=provider),
    ):
        status, doc = await get(port, "/readyz")
        assert status == 200
        assert [list(e["tiers"]) for e in doc["engines"]] == [["primary", "memory"], ["primary"]]
    never_opened = TieringEngine(PrimaryTier(2, 8), meter_provider=provider)
    assert (await get(port, "/readyz"))[0] == 503
    del never_opened
    gc.collect()
    status, doc = await get(port, "/readyz")
    assert doc["engines"] == []  # held weakly: a dropped engine is not reported forever


def test_the_probes_are_served_on_loopback_only_and_stop_with_the_provider() -> None:
    port = free_port()
    provider = start_prometheus_server(port=port)
    try:
        server = provider._server  # type: ignore[attr-defined]
        assert server.server_address[0] == "127.0.0.1"
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    finally:
        provider.shutdown()
    with pytest.raises(urllib.error.URLError):
        _get(f"http://127.0.0.1:{port}/healthz")
