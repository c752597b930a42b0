"""The promotion share: promoted blocks no request has loaded yet (in flight, or landed and held
by RETRY pins) never take more than ``max_promotion_share`` of the primary's slots."""

from __future__ import annotations

import pytest
from helpers import seeded

from aiotier import ConfigError, LookupResult, PrimaryTier, RequestContext, TieringEngine
from aiotier.testing import FaultyTier

R1, R2 = RequestContext("r1"), RequestContext("r2")
HIT = LookupResult.HIT
KEYS = [f"k{i}" for i in range(10)]


async def test_promotions_stuck_in_a_slow_tier_leave_room_for_stores() -> None:
    tier = FaultyTier(await seeded(10)).hang("read")
    async with TieringEngine(
        PrimaryTier(10, 64), [tier], max_promotion_share=0.5, promotion_timeout=30
    ) as e:
        assert await e.lookup_prefix(KEYS, R1) is None  # the first 5 start, the rest wait
        assert e.stats().promotions_in_flight == 5
        assert await e.lookup_prefix(KEYS[5:], R2) == 0  # no room: nothing more starts
        assert e.stats().promotions_in_flight == 5
        out = e.prepare_store([f"new{i}" for i in range(5)])  # (1 - 0.5) x 10 new blocks
        assert out is not None and len(out.keys_to_store) == 5


async def test_without_a_share_stuck_promotions_take_every_slot() -> None:
    tier = FaultyTier(await seeded(10)).hang("read")
    async with TieringEngine(
        PrimaryTier(10, 64), [tier], max_promotion_share=1.0, promotion_timeout=30
    ) as e:
        assert await e.lookup_prefix(KEYS, R1) is None
        assert e.stats().promotions_in_flight == 10
        assert e.prepare_store(["new"]) is None


async def test_landed_blocks_count_until_a_request_loads_them() -> None:
    async with TieringEngine(
        PrimaryTier(10, 64), [await seeded(10)], max_promotion_share=0.5
    ) as e:
        assert await e.lookup_prefix(KEYS[:5], R1) is None
        assert await e.wait(KEYS[:5]) == [HIT] * 5
        assert await e.lookup_prefix(KEYS[5:], R2) == 0  # r1 holds its 5 unloaded blocks
        e.prepare_load(KEYS[:5], R1)
        e.complete_load(KEYS[:5], R1)  # loaded: they no longer count
        assert await e.lookup_prefix(KEYS[5:], R2) is None
        assert await e.wait(KEYS[5:]) == [HIT] * 5
        e.end_step(finished_req_ids=["r1", "r2"])
        assert len(e.core.pins.share) == 0


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_the_share_is_a_fraction(share: float) -> None:
    with pytest.raises(ConfigError, match="max_promotion_share"):
        TieringEngine(PrimaryTier(4, 64), max_promotion_share=share)
