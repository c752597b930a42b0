"""Real exports: a Prometheus scrape over HTTP on 127.0.0.1 and an OTLP/HTTP protobuf sink."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from collections.abc import Sequence

import pytest
from helpers import write_one
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from prometheus_client.parser import text_string_to_metric_families

from aiotier import LookupResult, MemoryTier, PrimaryTier, RequestContext, TieringEngine
from aiotier.telemetry import METRICS, start_otlp_exporter, start_prometheus_server
from aiotier.testing import FaultyTier
from aiotier.tiers.base import BlockMeta


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CountedMemoryTier(MemoryTier):
    """A memory tier that counts the lookups it answers (as remote tiers count requests)."""

    asked = 0

    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        self.asked += len(keys)
        return await super().lookup_many(keys)

    def counters(self) -> dict[str, int]:
        return {"asked": self.asked}


async def tiers() -> list[MemoryTier | FaultyTier]:
    tier = CountedMemoryTier(1 << 20)
    await write_one(tier, b"below", b"x")
    return [tier, FaultyTier(MemoryTier(1 << 20), name="broken").fail("lookup")]


async def drive(engine: TieringEngine) -> None:
    """One step that touches every metric."""
    r = RequestContext("r")
    assert await engine.lookup("nowhere", r) is LookupResult.MISS  # a tier error below
    # a block past its expiry, in a tier that expires blocks: dropped there (an expiration)
    await engine.tiers[0].write_many([(b"expired", b"x")], [BlockMeta(expires_at=1.0)])
    assert await engine.lookup("expired", r) is LookupResult.MISS
    assert await engine.lookup("below", r) is LookupResult.RETRY
    await engine.wait(["below"])
    assert await engine.put("a", b"a")
    assert await engine.put("b", b"b")  # evicts: write-back to the memory tier
    assert engine.prepare_store(["c", "d", "e"]) is None
    assert await engine.prefetch(["a"], timeout=0) == 1
    await engine.flush()
    engine.end_step(new_req_ids=["r"])


async def test_prometheus_scrape_shows_the_spec_names() -> None:
    port = free_port()
    provider = start_prometheus_server(port=port)
    try:
        async with TieringEngine(
            PrimaryTier(2, 8), await tiers(), meter_provider=provider, max_pending_write_bytes=1
        ) as e:
            await drive(e)
            for k in ("w", "x", "y", "z"):  # evictions past the 1-byte backlog bound are shed
                assert await e.put(k, b"v")
            e.end_step()
            body = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
                .read()
                .decode()
            )
    finally:
        provider.shutdown()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    samples = {s.name for f in families.values() for s in f.samples}
    for m in METRICS:
        if m.kind == "histogram":
            assert f"{m.prometheus}_bucket" in samples, m.prometheus
        else:
            assert m.prometheus in samples, m.prometheus
    buckets = sorted(
        float(s.labels["le"])
        for s in families["aiotier_lookup_sync_delay_seconds"].samples
        if s.name.endswith("_bucket")
    )
    assert buckets[:-1] == [1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0]
    asked = [
        s.value
        for s in families["aiotier_tier_events"].samples
        if s.labels.get("tier") == "memory" and s.labels.get("event") == "asked"
    ]
    assert asked == [3.0]  # "nowhere", "expired" and "below"
    hits = [
        s.value
        for s in families["aiotier_lookups"].samples
        if s.labels.get("tier") == "memory" and s.labels.get("result") == "hit"
    ]
    assert hits == [1.0]
    dropped = {
        (s.labels["tier"], s.labels["reason"]): s.value
        for s in families["aiotier_demotions_dropped"].samples
        if s.name == "aiotier_demotions_dropped_total"
    }
    assert set(dropped) == {("memory", "backlog")}  # exact counts: tests/engine/test_health.py
    assert dropped["memory", "backlog"] >= 1
    breakers = {
        s.labels["tier"]: s.value for s in families["aiotier_tier_breaker_state"].samples
    }
    assert breakers == {"memory": 0.0, "broken": 0.0}  # one failed lookup: still closed
    with pytest.raises(urllib.error.URLError):  # the server stopped with its provider
        await asyncio.to_thread(
            urllib.request.urlopen, f"http://127.0.0.1:{port}/metrics", timeout=2
        )


async def test_otlp_export_reaches_a_local_sink(otlp_sink: tuple[str, list[bytes]]) -> None:
    url, received = otlp_sink
    provider = start_otlp_exporter(url, interval_seconds=3600)
    async with TieringEngine(PrimaryTier(2, 8), await tiers(), meter_provider=provider) as e:
        await drive(e)
        await asyncio.to_thread(provider.force_flush)  # gauges: read while the engine is open
    await asyncio.to_thread(provider.shutdown)
    assert received
    names = set()
    for body in received:
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                names.update(m.name for m in sm.metrics)
    assert {"aiotier.lookup_sync_delay", "aiotier.lookups", "aiotier.tier_usage"} <= names


def test_grafana_dashboard_uses_only_spec_metric_names() -> None:
    import json
    import re
    from pathlib import Path

    doc = json.loads((Path(__file__).parents[2] / "docs" / "grafana-dashboard.json").read_text())
    names = {m.prometheus for m in METRICS}
    used = set()
    for panel in doc["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"aiotier_[a-z_]+", target["expr"]):
                used.add(name.removesuffix("_bucket"))
    assert used <= names, used - names
    assert names <= used, names - used  # every metric has a panel


def test_a_metrics_port_in_use_is_an_error_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            start_prometheus_server(port=port)
