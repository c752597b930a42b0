"""What survives a restart: the primary's blocks go to the first persistent tier at close."""

from __future__ import annotations

from pathlib import Path

from aiotier import MemoryTier, PrimaryTier, SSDTier, TieringEngine


async def test_hot_set_survives_a_restart_below_a_memory_tier(tmp_path: Path) -> None:
    async with TieringEngine(
        PrimaryTier(4, 64), [MemoryTier(1 << 20), SSDTier(tmp_path, 1 << 20)]
    ) as e:
        for i in range(4):
            assert await e.put(f"hot{i}", b"h%d" % i)
    # a new process: the memory tier is empty, the SSD directory is not
    async with TieringEngine(
        PrimaryTier(4, 64), [MemoryTier(1 << 20), SSDTier(tmp_path, 1 << 20)]
    ) as e:
        for i in range(4):
            assert await e.get(f"hot{i}") == b"h%d" % i


async def test_flush_false_leaves_the_disk_alone(tmp_path: Path) -> None:
    async with TieringEngine(PrimaryTier(4, 64), [SSDTier(tmp_path, 1 << 20)]) as e:
        assert await e.put("a", b"a")
        await e.aclose(flush=False)
    async with TieringEngine(PrimaryTier(4, 64), [SSDTier(tmp_path, 1 << 20)]) as e:
        assert await e.get("a") is None


async def test_blocks_promoted_from_disk_are_not_rewritten_at_close(tmp_path: Path) -> None:
    async with TieringEngine(PrimaryTier(4, 64), [SSDTier(tmp_path, 1 << 20)]) as e:
        assert await e.put("a", b"a")
    async with TieringEngine(PrimaryTier(4, 64), [SSDTier(tmp_path, 1 << 20)]) as e:
        assert await e.get("a") == b"a"
        await e.aclose()
        assert e.stats().counters.get(("write_bytes", "ssd"), 0) == 0
