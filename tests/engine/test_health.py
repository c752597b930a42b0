"""The engine's circuit breaker per tier, ``engine.health()``, and shed demotions.

The breaker runs on an injected clock: no test waits for a cool-down to pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from helpers import DictTier, FakeClock, block, eventually, write_one
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import (
    BreakerPolicy,
    LookupResult,
    MemoryTier,
    PrimaryTier,
    TieringEngine,
)
from aiotier.testing import FaultyTier, MetricsProbe

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY


class RemoteTier(DictTier):
    """A user-written tier whose backend can go away: every call raises while ``down``."""

    def __init__(self) -> None:
        super().__init__("remote")
        self.down = False
        self.calls: Counter[str] = Counter()

    def _call(self, op: str) -> None:
        self.calls[op] += 1
        if self.down:
            raise ConnectionError(f"remote tier: {op}: connection refused")

    async def lookup(self, key: bytes) -> LookupResult:
        self._call("lookup")
        return await super().lookup(key)

    async def read_into(self, key: bytes, buf: memoryview) -> int:
        self._call("read")
        return await super().read_into(key, buf)

    async def write(self, key: bytes, data: bytes | memoryview) -> None:
        self._call("write")
        await super().write(key, data)

    async def remove(self, key: bytes) -> bool:
        self._call("remove")
        return await super().remove(key)


def remote_engine(
    provider: MeterProvider, *, num_blocks: int, threshold: int, cooldown: float
) -> tuple[TieringEngine, RemoteTier, FakeClock]:
    """An engine over one ``RemoteTier``, its breaker on a fake clock."""
    clock, tier = FakeClock(), RemoteTier()
    policy = BreakerPolicy(failure_threshold=threshold, cooldown=cooldown, clock=clock)
    engine = TieringEngine(
        PrimaryTier(num_blocks, 64), [tier], breaker=policy, meter_provider=provider
    )
    return engine, tier, clock


@pytest.fixture
def metrics() -> Iterator[tuple[MeterProvider, MetricsProbe]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, MetricsProbe(reader)
    provider.shutdown()


async def test_a_failing_tier_is_skipped_once_its_circuit_opens_then_probed_after_the_cooldown(
    metrics: tuple[MeterProvider, MetricsProbe],
) -> None:
    provider, probe = metrics
    engine, tier, clock = remote_engine(provider, num_blocks=4, threshold=3, cooldown=10.0)
    async with engine:
        assert engine.health()["remote"].ready
        tier.down = True
        for i in range(3):
            assert await engine.lookup(f"a{i}") is MISS
        assert tier.calls["lookup"] == 3
        health = engine.health()["remote"]
        assert (health.breaker, health.failures, health.ready) == ("open", 3, False)
        for i in range(5):  # skipped: counted exactly as the failures were
            assert await engine.lookup(f"b{i}") is MISS
        assert tier.calls["lookup"] == 3
        engine.end_step()
        assert probe.value("aiotier_tier_errors_total", tier="remote", op="lookup") == 8
        assert probe.value("aiotier_lookups_total", tier="remote", result="miss") == 8
        assert probe.value("aiotier_tier_breaker_state", tier="remote") == 2

        clock.now += 9.9
        assert await engine.lookup("c0") is MISS
        assert tier.calls["lookup"] == 3  # the cool-down has not passed
        clock.now += 0.1
        assert await engine.lookup("c1") is MISS  # the probe: still down
        assert tier.calls["lookup"] == 4
        assert engine.health()["remote"].breaker == "open"
        assert await engine.lookup("c2") is MISS  # another cool-down started
        assert tier.calls["lookup"] == 4

        tier.down = False
        tier.data[b"back"] = block(7)
        clock.now += 10.0
        assert await engine.lookup("back") is RETRY  # the probe went through and found it
        assert tier.calls["lookup"] == 5
        assert engine.health()["remote"].ready
        assert await engine.wait(["back"]) == [HIT]
        assert await engine.get("back") == block(7)
        engine.end_step()
        assert probe.value("aiotier_tier_breaker_state", tier="remote") == 0
        assert probe.value("aiotier_tier_errors_total", tier="remote") == 11


async def test_writes_are_not_attempted_while_the_circuit_is_open(
    metrics: tuple[MeterProvider, MetricsProbe],
) -> None:
    provider, probe = metrics
    engine, tier, clock = remote_engine(provider, num_blocks=1, threshold=2, cooldown=5.0)
    async with engine:
        tier.down = True
        assert await engine.lookup("x") is MISS
        assert await engine.lookup("y") is MISS  # the circuit opens
        for i in range(4):  # each put evicts the block before it: a write-back each
            assert await engine.put(f"k{i}", block(i))
        await engine.flush()
        assert tier.calls["write"] == 0
        engine.end_step()
        assert probe.value("aiotier_tier_errors_total", tier="remote", op="write") == 3
        tier.down = False
        clock.now += 5.0
        assert await engine.put("k4", block(4))  # its write-back of k3 is the probe
        await engine.flush()
        assert tier.calls["write"] == 1 and tier.data == {b"k3": block(3)}
        assert engine.health()["remote"].ready
        assert await engine.get("k0") is None  # lost while the tier was skipped, and counted
        assert await engine.get("k3") == block(3)


async def test_a_failed_promotion_read_counts_toward_the_circuit() -> None:
    """Calls fail *in a row* to open it: here a lookup that answers, then a read that fails."""
    clock = FakeClock()
    tier = FaultyTier(MemoryTier(1 << 20)).fail("read")
    for i in range(3):
        await write_one(tier.inner, b"k%d" % i, block(i))
    policy = BreakerPolicy(failure_threshold=1, cooldown=1.0, clock=clock)
    async with TieringEngine(PrimaryTier(4, 64), [tier], breaker=policy) as engine:
        assert await engine.lookup("k0") is RETRY
        assert await engine.wait(["k0"]) == [MISS]
        assert engine.health()["memory"].breaker == "open"
        assert await engine.lookup("k1") is MISS
        assert tier.calls["lookup"] == 1 and tier.calls["read"] == 1


async def test_corrupt_blocks_and_a_full_disk_do_not_open_the_circuit() -> None:
    """Failures about the data (a corrupt block, no room on the disk) say nothing about
    reaching the tier: its other blocks stay readable."""
    tier = FaultyTier(MemoryTier(1 << 20)).corrupt().disk_full()
    for i in range(8):
        await write_one(tier.inner, b"k%d" % i, block(i))
    policy = BreakerPolicy(failure_threshold=2, cooldown=60.0, clock=FakeClock())
    async with TieringEngine(PrimaryTier(1, 64), [tier], breaker=policy) as engine:
        for i in range(6):
            assert await engine.get(f"k{i}") is None  # corrupt: a MISS, never wrong bytes
            assert await engine.put(f"n{i}", block(i))  # its write-backs hit a full disk
        await engine.flush()
        assert tier.calls["read"] >= 6 and tier.calls["write"] >= 5
        assert engine.health()["memory"].ready
        tier.heal()
        assert await engine.get("k7") == block(7)


async def test_a_tier_that_says_it_is_back_is_probed_before_the_cooldown_ends() -> None:
    """A networked tier's own probe decides when it is back: no second timer on top."""

    class Guarded(RemoteTier):
        @property
        def available(self) -> bool | None:
            return not self.down

    tier = Guarded()
    policy = BreakerPolicy(failure_threshold=1, cooldown=3600.0, clock=FakeClock())
    async with TieringEngine(PrimaryTier(4, 64), [tier], breaker=policy) as engine:
        tier.down = True
        assert await engine.lookup("a") is MISS
        assert await engine.lookup("b") is MISS
        assert tier.calls["lookup"] == 1
        tier.down = False
        tier.data[b"c"] = block(3)
        assert await engine.get("c") == block(3)
        assert tier.calls["lookup"] == 2
        assert engine.health()["remote"].ready


async def test_without_a_breaker_policy_every_call_reaches_the_tier() -> None:
    tier = RemoteTier()
    tier.down = True
    async with TieringEngine(PrimaryTier(4, 64), [tier], breaker=None) as engine:
        for i in range(20):
            assert await engine.lookup(f"k{i}") is MISS
        assert tier.calls["lookup"] == 20
        assert engine.health()["remote"].breaker == "closed"


def test_breaker_must_be_a_policy() -> None:
    with pytest.raises(TypeError, match="BreakerPolicy"):
        TieringEngine(PrimaryTier(1, 64), breaker=3)  # type: ignore[arg-type]


async def test_health_follows_the_engine_and_the_tiers_own_word() -> None:
    class Watched(RemoteTier):
        up = True

        @property
        def available(self) -> bool | None:
            return self.up

    tier = Watched()
    engine = TieringEngine(PrimaryTier(2, 64), [tier, MemoryTier(1 << 20)])
    before = engine.health()
    assert list(before) == ["primary", "remote", "memory"]
    assert not any(h.ready for h in before.values())  # not open yet
    async with engine:
        health = engine.health()
        assert all(h.ready for h in health.values())
        assert health["memory"].available is None  # the memory tier does not say
        tier.up = False
        health = engine.health()
        assert not health["remote"].ready and health["remote"].breaker == "closed"
        assert health["remote"].as_dict() == {
            "ready": False, "open": True, "breaker": "closed", "available": False,
            "failures": 0, "open_for_seconds": 0.0,
        }  # fmt: skip
    assert not any(h.ready for h in engine.health().values())


async def test_demotions_past_the_backlog_are_counted_as_dropped_not_as_tier_errors(
    metrics: tuple[MeterProvider, MetricsProbe],
) -> None:
    provider, probe = metrics
    tier = FaultyTier(MemoryTier(1 << 20)).hang("write")
    async with TieringEngine(
        PrimaryTier(1, 64), [tier], max_pending_write_bytes=64, meter_provider=provider
    ) as engine:
        assert await engine.put("a", block(1))
        assert await engine.put("b", block(2))  # evicts a: its write-back hangs, filling the bound
        await eventually(lambda: tier.calls["write"] == 1)
        assert await engine.put("c", block(3))  # evicts b: over the bound, shed
        assert await engine.put("d", block(4))  # evicts c: shed
        tier.heal()
        await engine.flush()
        engine.end_step()
        assert probe.value("aiotier_demotions_dropped_total", tier="memory", reason="backlog") == 2
        assert probe.value("aiotier_tier_errors_total") == 0
        assert engine.health()["memory"].ready  # shedding is not a fault
        assert await engine.get("a") == block(1)
        assert await engine.get("b") is None
