"""LateWriteGuard by hand: which copies of a key whose write was cut short a tier never reads."""

from __future__ import annotations

import logging

import pytest

from aiotier.tiers._net import late_writes as _late_writes
from aiotier.tiers._net.late_writes import LateWriteGuard
from aiotier.tiers.framing import checksum


def guard() -> LateWriteGuard:
    return LateWriteGuard("test tier", logging.getLogger("test"))


def read(g: LateWriteGuard, found: dict[bytes, bytes | None]) -> list[int | Exception]:
    """What a read that found ``found`` (None: absent) reports once screened."""
    keys = list(found)
    bufs = [memoryview(bytearray(v or b"")) for v in found.values()]
    outcomes: list[int | Exception] = [-1 if v is None else len(v) for v in found.values()]
    g.screen(keys, bufs, outcomes)
    return outcomes


def test_keys_never_cut_short_are_read_as_found() -> None:
    g = guard()
    g.written(b"k", b"x")  # nothing doubted: nothing kept
    g.removed(b"k")
    assert not g
    assert read(g, {b"k": b"anything", b"a": None}) == [8, -1]


def test_a_cut_short_write_is_the_newest_tried_until_a_later_one_is_acknowledged() -> None:
    g = guard()
    g.cut_short([(b"k", b"old")])
    assert read(g, {b"k": b"old"}) == [3]  # nothing newer was acknowledged: it may be right
    g.written(b"k", b"new")
    assert read(g, {b"k": b"new"}) == [3]
    assert read(g, {b"k": b"old"}) == [-1]  # landed after "new": never read
    assert read(g, {b"k": b"other"}) == [5]  # another engine's write: served


def test_a_remove_or_a_clear_makes_the_writes_cut_short_before_it_late() -> None:
    g = guard()
    g.cut_short([(b"a", b"A"), (b"b", b"B")])
    g.removed(b"a")
    assert read(g, {b"a": b"A", b"b": b"B"}) == [-1, 1]
    g.cleared(g.clear_started())
    assert read(g, {b"b": b"B"}) == [-1]


def test_a_write_acknowledged_while_a_clear_ran_stays_readable() -> None:
    g = guard()
    g.cut_short([(b"k", b"v1"), (b"j", b"x")])
    started = g.clear_started()
    g.written(b"k", b"v1")  # the same bytes again, acknowledged after the clear's delete
    g.cleared(started)
    assert read(g, {b"k": b"v1", b"j": b"x"}) == [2, -1]


def test_lookups_learn_which_checksums_are_refused() -> None:
    g = guard()
    g.cut_short([(b"k", b"old")])
    assert not g.refuses_any(b"k")  # nothing newer acknowledged yet
    g.written(b"k", b"new")
    assert g.refuses_any(b"k") and not g.refuses_any(b"other")
    assert g.refuses(b"k", checksum(b"old")) and not g.refuses(b"k", checksum(b"new"))


def test_the_same_bytes_written_again_are_read_again() -> None:
    g = guard()
    g.cut_short([(b"k", b"v1")])
    g.written(b"k", b"v2")
    g.cut_short([(b"k", b"v3")])  # may land: the newest tried
    assert read(g, {b"k": b"v1"}) == [-1] and read(g, {b"k": b"v3"}) == [2]
    g.written(b"k", b"v1")  # v1 acknowledged again: a copy of it is right
    assert read(g, {b"k": b"v1"}) == [2] and read(g, {b"k": b"v3"}) == [-1]
    g.cut_short([(b"k", b"v3")])  # tried again: the newest once more
    assert read(g, {b"k": b"v3"}) == [2]


def test_bytes_cut_short_then_acknowledged_are_late_once_a_later_write_is() -> None:
    g = guard()
    g.cut_short([(b"k", b"v1")])
    g.written(b"k", b"v1")  # a retry of the same bytes, acknowledged
    assert read(g, {b"k": b"v1"}) == [2]
    g.written(b"k", b"v2")  # the first attempt of v1 may land after this
    assert read(g, {b"k": b"v1"}) == [-1] and read(g, {b"k": b"v2"}) == [2]


def test_a_keys_refused_checksums_are_bounded_oldest_forgotten_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_late_writes, "MAX_PER_KEY", 2)
    g = guard()
    for v in (b"1", b"2", b"3"):
        g.cut_short([(b"k", v)])
        g.written(b"k", b"acked")
    assert g.forgotten == 1
    assert read(g, {b"k": b"1"}) == [1]  # forgotten: trusted again
    assert read(g, {b"k": b"2"}) == [-1] and read(g, {b"k": b"3"}) == [-1]


def test_doubts_are_bounded_oldest_forgotten_first(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_late_writes, "MAX_DOUBTED", 3)
    g = guard()
    g.cut_short([(k, b"x") for k in (b"a", b"b", b"c")])
    g.cut_short([(b"a", b"y")])  # doubted again: now the most recent
    g.cut_short([(b"d", b"x"), (b"e", b"x")])
    assert len(g) == 3 and g.forgotten == 2
    for key in (b"a", b"b", b"c", b"d", b"e"):
        g.removed(key)
    kept = [k for k in (b"a", b"b", b"c", b"d", b"e") if read(g, {k: b"x"}) == [-1]]
    assert kept == [b"a", b"d", b"e"]
    assert "the oldest are trusted again" in caplog.text
