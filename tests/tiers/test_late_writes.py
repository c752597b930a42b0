"""LateWriteGuard by hand: which copy of a key whose write was cut short a tier may read."""

from __future__ import annotations

import logging

import pytest

from aiotier.tiers import _late_writes
from aiotier.tiers._late_writes import LateWriteGuard


def guard() -> LateWriteGuard:
    return LateWriteGuard("test tier", logging.getLogger("test"))


def screened(g: LateWriteGuard, found: dict[bytes, bytes | None]) -> tuple[list[int], list[bytes]]:
    """Outcomes and late keys of a read that found ``found`` (None: absent)."""
    keys = list(found)
    bufs = [memoryview(bytearray(v or b"")) for v in found.values()]
    outcomes: list[int | Exception] = [-1 if v is None else len(v) for v in found.values()]
    late = g.screen(keys, bufs, outcomes)
    return [o for o in outcomes if isinstance(o, int)], late


def test_keys_never_cut_short_are_read_as_found() -> None:
    g = guard()
    g.written(b"k", b"x")  # nothing doubted: nothing kept
    assert not g and not g.trusts_none(b"k")
    assert screened(g, {b"k": b"anything", b"a": None}) == ([8, -1], [])


def test_after_a_cut_short_write_no_copy_is_read_until_one_is_acknowledged() -> None:
    g = guard()
    g.cut_short([b"k"])
    assert g.trusts_none(b"k")
    assert screened(g, {b"k": b"old"}) == ([-1], [b"k"])
    g.written(b"k", b"new")
    assert not g.trusts_none(b"k")
    assert screened(g, {b"k": b"new"}) == ([3], [])
    assert screened(g, {b"k": b"old"}) == ([-1], [b"k"])  # landed after "new"
    assert g.trusts_none(b"k")  # and deleted by the tier: no copy is right now


def test_a_remove_or_a_clear_means_any_copy_found_is_late() -> None:
    g = guard()
    g.cut_short([b"a", b"b"])
    g.written(b"a", b"A")
    g.written(b"b", b"B")
    g.removed(b"a")
    assert screened(g, {b"a": b"A", b"b": b"B"}) == ([-1, 1], [b"a"])
    g.cleared()
    assert screened(g, {b"b": b"B"}) == ([-1], [b"b"])


def test_doubts_are_bounded_oldest_forgotten_first(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_late_writes, "MAX_DOUBTED", 3)
    g = guard()
    g.cut_short([b"a", b"b", b"c"])
    g.cut_short([b"a"])  # doubted again: now the newest
    g.cut_short([b"d", b"e"])
    assert len(g) == 3 and g.forgotten == 2
    assert [k for k in (b"a", b"b", b"c", b"d", b"e") if g.trusts_none(k)] == [b"a", b"d", b"e"]
    assert "the oldest are trusted again" in caplog.text
