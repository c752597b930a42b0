"""TierSetup: the engine opens each tier with its block size and what its evictions hand over."""

from __future__ import annotations

import pytest
from helpers import DictTier

from aiotier import ConfigError, MemoryTier, PrimaryTier, TieringEngine, TierSetup
from aiotier.testing import FaultyTier


class Recording(MemoryTier):
    def __init__(self, calls: list[str], name: str) -> None:
        super().__init__(1 << 20, name=name)
        self.calls = calls

    async def open(self, setup: TierSetup | None = None) -> None:
        assert setup is not None
        self.calls.append(f"{self.name}:open block_size={setup.block_size} {setup.evictions}")
        await super().open(setup)


async def test_each_tier_opens_in_order_with_the_block_size_and_its_hand_over() -> None:
    calls: list[str] = []
    tiers = [Recording(calls, "a"), FaultyTier(Recording(calls, "b"))]
    async with TieringEngine(PrimaryTier(4, 4096), tiers):
        pass
    # a tier whose evictions are in memory anyway hands their bytes over even with nothing
    # below it; the others hand bytes over only to a tier below (write-back)
    assert calls == ["a:open block_size=4096 bytes", "b:open block_size=4096 bytes"]


async def test_under_write_through_a_tier_with_a_tier_below_reports_only_keys() -> None:
    setups: list[TierSetup | None] = []

    class Seen(DictTier):
        async def open(self, setup: TierSetup | None = None) -> None:
            setups.append(setup)

    tiers = [Seen("a"), Seen("b")]
    async with TieringEngine(PrimaryTier(4, 64), tiers, write_policy="write_through"):
        pass
    assert setups == [TierSetup(64, "keys"), TierSetup(64, "keys")]
    setups.clear()
    async with TieringEngine(PrimaryTier(4, 64), [Seen("a"), Seen("b")]):  # write-back
        pass
    assert setups == [TierSetup(64, "bytes"), TierSetup(64, "keys")]


async def test_a_tier_that_cannot_hold_the_blocks_fails_the_open_and_earlier_tiers_close() -> None:
    class Small(MemoryTier):
        async def open(self, setup: TierSetup | None = None) -> None:
            assert setup is not None
            raise ConfigError(f"blocks of {setup.block_size} bytes do not fit")

    closed: list[str] = []

    class First(MemoryTier):
        async def aclose(self) -> None:
            closed.append(self.name)

    engine = TieringEngine(PrimaryTier(4, 4096), [First(1 << 20, name="first"), Small(1 << 20)])
    with pytest.raises(ConfigError, match="4096"):
        await engine.open()
    assert closed == ["first"]
