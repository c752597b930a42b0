"""SecondaryTier.configure_block_size: the engine tells each tier its block size before open()."""

from __future__ import annotations

import pytest

from aiotier import ConfigError, MemoryTier, PrimaryTier, TieringEngine
from aiotier.testing import FaultyTier


class Recording(MemoryTier):
    def __init__(self, calls: list[str], name: str) -> None:
        super().__init__(1 << 20, name=name)
        self.calls = calls

    def configure_block_size(self, block_size: int) -> None:
        self.calls.append(f"{self.name}:block_size={block_size}")

    async def open(self) -> None:
        self.calls.append(f"{self.name}:open")


async def test_each_tier_learns_the_block_size_just_before_it_opens() -> None:
    calls: list[str] = []
    tiers = [Recording(calls, "a"), FaultyTier(Recording(calls, "b"))]
    async with TieringEngine(PrimaryTier(4, 4096), tiers):
        pass
    assert calls == ["a:block_size=4096", "a:open", "b:block_size=4096", "b:open"]


async def test_a_tier_that_cannot_hold_the_blocks_fails_the_open_and_earlier_tiers_close() -> None:
    class Small(MemoryTier):
        def configure_block_size(self, block_size: int) -> None:
            raise ConfigError(f"blocks of {block_size} bytes do not fit")

    closed: list[str] = []

    class First(MemoryTier):
        async def aclose(self) -> None:
            closed.append(self.name)

    engine = TieringEngine(PrimaryTier(4, 4096), [First(1 << 20, name="first"), Small(1 << 20)])
    with pytest.raises(ConfigError, match="4096"):
        await engine.open()
    assert closed == ["first"]


async def test_tiers_written_without_the_hook_need_nothing() -> None:
    tier = MemoryTier(1 << 20)
    tier.configure_block_size(4096)  # the default does nothing
    async with TieringEngine(PrimaryTier(4, 4096), [tier]) as engine:
        assert await engine.put(b"k", b"v")
