"""The multi-worker recipe of docs/web-cache.md: each worker claims the first SSD directory of a
fixed set that no other open tier holds, so a restarted worker finds its warm cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiotier import MemoryTier, PrimaryTier, SSDTier, TieringEngine, TierUnavailableError


async def open_engine(base: str, workers: int) -> tuple[TieringEngine, int]:
    for i in range(workers):
        engine = TieringEngine(
            PrimaryTier(4, 4096),
            [MemoryTier(1 << 20), SSDTier(f"{base}/worker-{i}", 1 << 20)],
        )
        try:
            await engine.open()
            return engine, i
        except TierUnavailableError:
            continue  # another worker holds this directory
    raise RuntimeError(f"more workers than the {workers} SSD directories under {base}")


async def test_workers_claim_distinct_directories_and_a_restart_reclaims_a_free_one(
    tmp_path: Path,
) -> None:
    first, i = await open_engine(str(tmp_path), 2)
    second, j = await open_engine(str(tmp_path), 2)
    assert (i, j) == (0, 1)
    with pytest.raises(RuntimeError, match="more workers than the 2"):
        await open_engine(str(tmp_path), 2)
    assert await first.put("warm", b"kept")
    await first.aclose()  # written down to worker-0's SSD
    again, k = await open_engine(str(tmp_path), 2)
    assert k == 0
    assert await again.get("warm") == b"kept"
    await again.aclose()
    await second.aclose()
