"""Engines over a real SeaweedFS: a restart reads what an old engine wrote, corruption is a
counted MISS, and a server killed mid-load costs MISSes and failed writes, never an exception or
wrong bytes, and is used again once it is back."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import obstore
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from seaweedfs_fixtures import (
    ACCESS_KEY,
    BUCKET,
    SECRET_KEY,
    S3Endpoint,
    start_seaweed,
    use_credentials,
)

from aiotier import LookupResult, ObjectStoreTier, PrimaryTier, RequestContext, TieringEngine
from aiotier.testing import MetricsProbe
from aiotier.tiers.framing import encode_frame
from aiotier_bench.servers import SeaweedFS

pytestmark = pytest.mark.s3

HIT, MISS = LookupResult.HIT, LookupResult.MISS
BLOCK = 4096


def block(i: int, size: int = BLOCK) -> bytes:
    return i.to_bytes(4, "little") * (size // 4)


@pytest.fixture
def probe() -> MetricsProbe:
    return MetricsProbe(InMemoryMetricReader())


def engine_on(
    s3: S3Endpoint, probe: MetricsProbe | None = None, *, slots: int = 32, **kwargs: object
) -> TieringEngine:
    tier = ObjectStoreTier(s3.bucket, endpoint_url=s3.url, prefix=s3.prefix)
    provider = MeterProvider(metric_readers=[probe.reader]) if probe is not None else None
    return TieringEngine(
        PrimaryTier(slots, BLOCK),
        [tier],
        meter_provider=provider,
        **kwargs,  # type: ignore[arg-type]
    )


async def objects_under(store: object, prefix: str) -> int:
    n = 0
    async for chunk in obstore.list(store, prefix=prefix):  # type: ignore[call-overload]
        n += len(chunk)
    return n


async def test_a_new_engine_reads_what_an_old_one_wrote(
    s3: S3Endpoint, probe: MetricsProbe
) -> None:
    keys = [f"blk-{i}".encode() for i in range(8)]
    async with engine_on(s3) as old:  # write-back: aclose writes the primary down
        for i, k in enumerate(keys):
            assert await old.put(k, block(i))
    assert await objects_under(s3.store(), s3.prefix) == 8

    async with engine_on(s3, probe) as new:
        req = RequestContext("r1")
        assert await new.lookup_prefix(keys, req) is None
        assert await new.wait(keys, timeout=10) == [HIT] * 8
        spec = new.prepare_load(keys, req)
        assert [bytes(v) for v in spec.buffers] == [block(i) for i in range(8)]
        new.complete_load(keys, req)
        new.end_step(finished_req_ids=["r1"])
        assert probe.value("aiotier_lookups_total", tier="object", result="hit") == 8
        assert probe.value("aiotier_promotions_total", tier="object", outcome="ok") == 8
        assert probe.value("aiotier_read_bytes_total", tier="object") == 8 * BLOCK
        assert probe.value("aiotier_tier_errors_total", tier="object") == 0


async def test_an_object_overwritten_through_the_plain_client_is_a_counted_miss(
    s3: S3Endpoint, probe: MetricsProbe
) -> None:
    async with engine_on(s3) as old:
        assert await old.put(b"victim", block(7))
    tier = ObjectStoreTier(s3.bucket, endpoint_url=s3.url, prefix=s3.prefix)
    name = tier.object_name(b"victim")
    flipped = bytearray(encode_frame(b"victim", block(7)))
    flipped[-100] ^= 1
    await obstore.put_async(s3.store(), name, bytes(flipped))  # type: ignore[arg-type]

    async with engine_on(s3, probe) as e:
        assert await e.get(b"victim") is None
        assert await e.lookup(b"victim") is MISS  # backed off, then known by its ETag
        e.end_step()
        assert probe.value("aiotier_promotions_total", tier="object", outcome="error") == 1
        assert probe.value("aiotier_tier_errors_total", tier="object", op="read") == 1
        assert probe.value("aiotier_lookups_total", tier="object", result="hit") == 1
        (object_tier,) = e.tiers
        assert isinstance(object_tier, ObjectStoreTier)
        assert object_tier.corrupted == 1
        events = "aiotier_tier_events_total"
        assert probe.value(events, tier="object", event="corrupted") == 1
        assert probe.value(events, tier="object", event="requests") == object_tier.requests > 0


@pytest.mark.parametrize(("lookahead_bytes", "requests"), [(64 << 20, 64), (0, 128)])
async def test_a_scheduler_promotes_64_blocks_of_256_kib(
    s3: S3Endpoint, lookahead_bytes: int, requests: int
) -> None:
    """One GET per block with the look-ahead (the default), a HEAD and a GET without."""
    size = 256 << 10
    tier = ObjectStoreTier(s3.bucket, endpoint_url=s3.url, prefix=s3.prefix)
    keys = [f"p{i}".encode() for i in range(64)]
    await tier.open()
    assert await tier.write_many([(k, block(i, size)) for i, k in enumerate(keys)]) == [None] * 64
    await tier.aclose()
    fresh = ObjectStoreTier(
        s3.bucket, endpoint_url=s3.url, prefix=s3.prefix, lookahead_bytes=lookahead_bytes
    )
    # every slot may hold a promotion: the test stores nothing it would need room for
    async with TieringEngine(PrimaryTier(64, size), [fresh], max_promotion_share=1.0) as e:
        assert await e.lookup_prefix(keys) is None
        assert await e.wait(keys, timeout=30) == [HIT] * 64
        assert await e.lookup_prefix(keys) == 64
        got = [await e.get(k) for k in keys]
        assert got == [block(i, size) for i in range(64)]
    assert fresh.max_inflight <= fresh.max_concurrency
    assert fresh.requests == requests


# -- the server killed mid-load -------------------------------------------------------------------


@pytest.fixture(scope="module")
def private_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """A server of this module's own, to kill and restart."""
    server = start_seaweed(tmp_path_factory.mktemp("seaweedfs-kill"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
async def killable(
    private_server: SeaweedFS, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[SeaweedFS]:
    use_credentials(monkeypatch, ACCESS_KEY, SECRET_KEY)
    await asyncio.to_thread(private_server.start)  # returns at once when it is running
    yield private_server
    await asyncio.to_thread(private_server.start)


async def until(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout}s")
        await asyncio.sleep(0.02)


async def test_server_killed_mid_load_and_restarted(
    killable: SeaweedFS, probe: MetricsProbe
) -> None:
    """Readers and writers keep going while the server dies and comes back: no exception, no
    wrong bytes; lookups MISS and writes fail (counted) while it is down; afterwards the tier
    serves every block written before the crash again, by itself."""
    prefix = f"kill-{time.monotonic_ns()}/"
    tier = ObjectStoreTier(
        BUCKET, endpoint_url=killable.url, prefix=prefix, timeout=1.0, probe_interval=0.1
    )
    provider = MeterProvider(metric_readers=[probe.reader])
    engine = TieringEngine(
        PrimaryTier(4, BLOCK),  # far fewer slots than keys: most gets read the tier
        [tier],
        write_policy="write_through",
        meter_provider=provider,
        promotion_timeout=2.0,
        backoff_seconds=0.1,
    )
    keys = [f"k{i}".encode() for i in range(32)]
    rng = random.Random(7)
    wrong: list[tuple[bytes, bytes | None]] = []
    outcomes = {"bytes": 0, "none": 0}

    stop = asyncio.Event()

    async def load(most: int) -> None:
        for _ in range(most):  # bounded, in case the test fails before it sets stop
            if stop.is_set():
                return
            i = rng.randrange(len(keys))
            data = await engine.get(keys[i])
            if data is None:
                outcomes["none"] += 1
            elif data != block(i):
                wrong.append((keys[i], data))
            else:
                outcomes["bytes"] += 1
            if rng.random() < 0.2:
                await engine.put(f"new-{rng.randrange(1 << 30)}".encode(), block(0))

    async def crash_and_recover() -> None:
        await until(lambda: outcomes["bytes"] > 20, 20, "no reads before the crash")
        await asyncio.to_thread(killable.kill)  # the server's calls block: off the loop
        await until(lambda: not tier.available, 10, "the circuit did not open")
        down_at = outcomes["none"]
        await until(lambda: outcomes["none"] > down_at + 10, 10, "no MISS while down")
        await asyncio.to_thread(killable.start)
        await until(lambda: tier.available, 20, "the tier did not come back")
        up_at = outcomes["bytes"]
        await until(lambda: outcomes["bytes"] > up_at + 20, 20, "no reads after the restart")

    async with engine:
        for i, k in enumerate(keys):
            assert await engine.put(k, block(i))
        await engine.flush(timeout=20)
        assert await objects_under(killable.store(), prefix) == len(keys)

        loaders = [asyncio.create_task(load(50_000)) for _ in range(4)]
        try:
            await crash_and_recover()
        finally:
            stop.set()
            done = await asyncio.gather(*loaders, return_exceptions=True)
        assert done == [None] * 4  # no loader raised
        # Every block written before the crash is served again, exactly.
        for i, k in enumerate(keys):
            deadline = time.monotonic() + 10
            data = await engine.get(k)
            while data is None and time.monotonic() < deadline:  # a key may still back off
                await asyncio.sleep(0.05)
                data = await engine.get(k)
            assert data == block(i)
        engine.end_step()

    assert wrong == []
    assert tier.errors > 0
    assert probe.value("aiotier_tier_errors_total", tier="object") > 0
    assert probe.value("aiotier_tier_errors_total", tier="object", op="write") > 0
    provider.shutdown()


async def test_demo_runs_over_an_object_tier(s3: S3Endpoint, tmp_path: Path) -> None:
    """``aiotier demo --s3 URL`` as a user runs it: credentials from the environment."""
    report = tmp_path / "demo.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiotier", "demo", "--steps", "20", "--requests", "80",
        "--ssd-dir", str(tmp_path / "ssd"), "--json", str(report),
        "--s3", f"{s3.url}/{s3.bucket}/{s3.prefix}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()
    data = json.loads(report.read_text())
    assert set(data["tiers"]) == {"primary", "memory", "ssd", "object"}
    assert data["tiers"]["object"]["lookups"] > 0
    assert b"object" in out
