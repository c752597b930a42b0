"""ByteBudgetLRU: exact eviction order and byte accounting, with no tier around it."""

from __future__ import annotations

import pytest

from aiotier.tiers.memory import ByteBudgetLRU


def state(b: ByteBudgetLRU) -> tuple[list[bytes], int]:
    """Keys from least to most recent, and the bytes used."""
    return list(b), b.used


def test_admit_evicts_least_recent_first_until_the_new_entry_fits() -> None:
    b = ByteBudgetLRU(10)
    assert b.admit(b"a", 3) == []
    assert b.admit(b"b", 3) == []
    assert b.admit(b"c", 3) == []
    assert b.admit(b"d", 5) == [b"a", b"b"]  # 9 + 5 > 10: two go, oldest first
    assert state(b) == ([b"c", b"d"], 8)


def test_touch_moves_an_entry_to_most_recent() -> None:
    b = ByteBudgetLRU(9)
    for k in (b"a", b"b", b"c"):
        b.admit(k, 3)
    b.touch(b"a")
    b.touch(b"missing")  # ignored
    assert list(b) == [b"b", b"c", b"a"]
    assert b.admit(b"d", 3) == [b"b"]
    assert b.admit(b"e", 6) == [b"c", b"a"]
    assert state(b) == ([b"d", b"e"], 9)


def test_admitting_an_existing_key_replaces_it_as_most_recent() -> None:
    b = ByteBudgetLRU(10)
    b.admit(b"a", 4)
    b.admit(b"b", 4)
    # a's old 4 bytes are released before anything is evicted: b stays.
    assert b.admit(b"a", 6) == []
    assert state(b) == ([b"b", b"a"], 10)
    assert b.admit(b"b", 7) == [b"a"]
    assert state(b) == ([b"b"], 7)


def test_an_entry_larger_than_the_budget_changes_nothing() -> None:
    b = ByteBudgetLRU(10)
    b.admit(b"a", 4)
    with pytest.raises(ValueError, match="11-byte entry cannot fit a 10-byte budget"):
        b.admit(b"a", 11)
    with pytest.raises(ValueError, match="cannot fit"):
        b.admit(b"b", 11)
    assert state(b) == ([b"a"], 4)


def test_eviction_stops_as_soon_as_the_entry_fits() -> None:
    b = ByteBudgetLRU(10)
    b.admit(b"a", 1)
    b.admit(b"z", 2)
    b.admit(b"empty", 0)
    # An entry of the whole budget: everything that takes room goes, oldest first; the empty
    # entry, reached only once the new one fits, stays.
    assert b.admit(b"c", 10) == [b"a", b"z"]
    assert state(b) == ([b"empty", b"c"], 10)


def test_discard_returns_the_size_and_frees_it() -> None:
    b = ByteBudgetLRU(10)
    b.admit(b"a", 4)
    assert b.discard(b"a") == 4
    assert b.discard(b"a") is None
    assert state(b) == ([], 0)


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True, "10"])
def test_capacity_must_be_a_positive_int(capacity: object) -> None:
    with pytest.raises(ValueError, match="positive int"):
        ByteBudgetLRU(capacity)  # type: ignore[arg-type]
