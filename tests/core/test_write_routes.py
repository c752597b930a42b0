"""Where copies go under a write policy per tier (no event loop)."""

from __future__ import annotations

import pytest

from aiotier._core.write_routes import WriteRoutes
from aiotier._core.writeback import WriteAcks


def test_one_policy_for_every_tier_keeps_the_chain_of_the_engine_wide_string() -> None:
    back = WriteRoutes.of("write_back", 3)
    assert back.from_primary == 0 and back.below == (1, 2, None) and back.through == ()
    through = WriteRoutes.of("write_through", 3)
    assert through.from_primary is None and through.below == (None,) * 3
    assert through.through == (0, 1, 2)
    none = WriteRoutes.of("none", 2)
    assert none.from_primary is None and none.below == (None, None) and none.through == ()


def test_a_write_through_tier_gets_no_evictions_from_above_and_a_none_tier_is_skipped() -> None:
    # memory (write_back) over ssd (write_through) over redis (write_back)
    r = WriteRoutes(["write_back", "write_through", "write_back"])
    assert r.from_primary == 0 and r.through == (1,)
    assert r.below == (None, 2, None)  # memory's evictions: the ssd has them already
    # a read-only tier in the middle: the primary feeds the tier below it
    r = WriteRoutes(["none", "write_back"])
    assert r.from_primary == 1 and r.below == (None, None)


def test_the_write_down_at_close_goes_to_the_first_persistent_write_back_tier() -> None:
    persistent = [False, True, True]
    assert WriteRoutes(["write_back"] * 3).write_down_to(persistent) == 1
    assert WriteRoutes(["write_back", "write_through", "write_back"]).write_down_to(
        persistent
    ) is None  # the ssd holds every block already
    assert WriteRoutes(["write_back", "none", "write_back"]).write_down_to(persistent) == 2
    assert WriteRoutes(["write_back"]).write_down_to([False]) == 0  # no persistent tier
    assert WriteRoutes(["none"]).write_down_to([True]) is None


def test_bad_policies_are_named() -> None:
    with pytest.raises(ValueError, match="'write_sometimes'"):
        WriteRoutes(["write_back", "write_sometimes"])
    with pytest.raises(ValueError, match="2 write policies for 3 tiers"):
        WriteRoutes.of(["write_back", "none"], 3)


def test_acks_settle_once_every_write_has_its_outcome() -> None:
    acks = WriteAcks()
    first, second = acks.expect(), acks.expect()
    settled: list[str] = []
    acks.when_settled(lambda: settled.append("all"))
    first(True)
    assert settled == []
    second(False)  # a failed write has its outcome too
    assert settled == ["all"] and acks.pending == 0
    done = WriteAcks()
    done.when_settled(lambda: settled.append("none out"))  # nothing out: at once
    assert settled == ["all", "none out"]
