"""LastWrites, with no event loop: of several writes of one key in a batch only the last is
carried out, and every position reports the outcome of its key's last write."""

from __future__ import annotations

import pytest
from helpers import DictTier

from aiotier.tiers._batches import LastWrites


def test_the_last_write_of_each_key_is_kept_in_batch_order() -> None:
    batch = LastWrites([b"a", b"b", b"a", b"c", b"b"])
    assert batch.kept == [2, 3, 4]
    items = [(b"a", 1), (b"b", 2), (b"a", 3), (b"c", 4), (b"b", 5)]
    assert list(batch.pick(items)) == [(b"a", 3), (b"c", 4), (b"b", 5)]


def test_every_earlier_write_reports_the_outcome_of_the_last() -> None:
    batch = LastWrites([b"a", b"b", b"a", b"c", b"b"])
    failed = OSError("the last write of b failed")
    assert batch.spread([None, None, failed]) == [None, failed, None, None, failed]


def test_a_batch_without_repeats_is_passed_through() -> None:
    items = [(b"a", 1), (b"b", 2)]
    batch = LastWrites([k for k, _ in items])
    assert batch.kept == [0, 1]
    assert batch.pick(items) is items
    assert batch.spread(["x", "y"]) == ["x", "y"]
    assert LastWrites([]).spread([]) == []


def test_a_key_of_none_stands_alone_and_reports_its_own_outcome() -> None:
    batch = LastWrites([None, b"a", None, b"a"])
    assert batch.kept == [0, 2, 3]
    bad0, bad2 = TypeError("key 0"), TypeError("key 2")
    assert batch.spread([bad0, bad2, None]) == [bad0, None, bad2, None]


def test_keys_are_compared_by_equality() -> None:
    batch = LastWrites(["obj/1", "obj/2", "obj/" + "1"])  # object names, as a store sends them
    assert batch.kept == [1, 2]
    assert batch.spread(["two", "one"]) == ["one", "two", "one"]


def test_outcomes_must_match_the_kept_writes() -> None:
    batch = LastWrites([b"a", b"a"])
    with pytest.raises(ValueError, match="2 outcomes for 1 kept writes"):
        batch.spread([None, None])


class _RefusingTier(DictTier):
    """A user-written tier (the default ``write_many``) that refuses bytes starting with "bad"."""

    async def write(self, key: bytes, data: bytes | memoryview) -> None:
        if bytes(data).startswith(b"bad"):
            raise OSError(f"refused {key!r}")
        await super().write(key, data)


async def test_the_default_write_many_keeps_the_rule() -> None:
    tier = _RefusingTier("user")
    assert await tier.write_many([(b"k", b"old"), (b"j", b"1"), (b"k", b"new")]) == [None] * 3
    assert tier.data == {b"k": b"new", b"j": b"1"}
    out = await tier.write_many([(b"m", b"fine"), (b"m", b"bad bytes")])
    assert [type(o) for o in out] == [OSError, OSError] and out[0] is out[1]
    assert b"m" not in tier.data  # the earlier write was not carried out either
