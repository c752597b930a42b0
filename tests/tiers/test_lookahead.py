"""The object tier's look-ahead store, with no event loop: the byte budget, one hand-out per
body, expiry, no body that predates a change of its object made through the tier, and a memory
of changes bounded by the fetches in flight."""

from __future__ import annotations

import pytest

from aiotier.tiers.objectstore.lookahead import LookAhead


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def fetched(la: LookAhead, name: str, body: bytes, size: int = 10) -> bool:
    """A fetch that begins and ends with nothing changing meanwhile."""
    mark = la.begin()
    try:
        return la.keep(name, body, "e", size, mark)
    finally:
        la.end(mark)


def test_held_bytes_never_exceed_the_budget_and_the_oldest_make_room(clock: Clock) -> None:
    la = LookAhead(250, ttl=5.0, clock=clock)
    assert la.room(100) == 2
    for name in ("a", "b", "c"):
        assert fetched(la, name, name.encode(), 100)
        assert la.held_bytes <= 250
    assert (len(la), la.held_bytes) == (2, 200)
    assert la.take("a") is None  # the oldest made room for "c"
    assert la.take("b") == (b"b", "e")
    assert la.room(100) == 1
    assert not fetched(la, "big", b"", 251)  # alone over the budget


def test_a_body_is_handed_out_once_and_not_after_its_ttl(clock: Clock) -> None:
    la = LookAhead(1000, ttl=5.0, clock=clock)
    fetched(la, "a", b"A")
    fetched(la, "b", b"B")
    assert la.take("a") == (b"A", "e")
    assert la.take("a") is None
    clock.now = 5.0
    assert la.take("b") is None  # expired
    assert la.held_bytes == 0


def test_expired_bodies_give_their_room_back(clock: Clock) -> None:
    la = LookAhead(100, ttl=1.0, clock=clock)
    fetched(la, "a", b"A", 100)
    assert la.room(100) == 0
    clock.now = 1.5
    assert la.room(100) == 1
    assert (len(la), la.held_bytes) == (0, 0)


def test_a_change_drops_the_body_and_refuses_one_fetched_across_it(clock: Clock) -> None:
    la = LookAhead(1000, ttl=5.0, clock=clock)
    fetched(la, "a", b"old")
    la.changed("a")
    assert la.take("a") is None

    mark = la.begin()  # a fetch of "a" starts ...
    la.changed("a")  # ... the tier writes "a" meanwhile ...
    assert not la.keep("a", b"old", "e", 10, mark)  # ... so what the fetch got is not kept
    assert la.keep("b", b"B", "e", 10, mark)  # another name is
    la.end(mark)

    outer = la.begin()  # (another fetch in flight throughout)
    la.changed("c")
    mark = la.begin()  # a fetch that starts after the change keeps its body
    assert la.keep("c", b"new", "e", 10, mark)
    assert not la.keep("c", b"old", "e", 10, outer)  # one begun before it does not
    la.end(mark)
    la.end(outer)
    assert la.take("c") == (b"new", "e")  # the refused one left the newer body alone


def test_changes_are_remembered_only_while_an_older_fetch_is_in_flight(clock: Clock) -> None:
    la = LookAhead(1000, ttl=5.0, clock=clock)
    first = la.begin()
    for i in range(100):
        la.changed(f"n{i}")
    second = la.begin()  # overlapping fetches: there is always one in flight
    la.changed("late")
    la.end(first)  # nothing in flight is older than the changes before `second` began
    assert la.remembered_changes == 1
    assert not la.keep("late", b"old", "e", 10, second)
    la.end(second)
    assert la.remembered_changes == 0
    la.changed("x")  # with nothing in flight, nothing needs remembering
    assert la.remembered_changes == 0


def test_a_clear_refuses_bodies_fetched_before_it(clock: Clock) -> None:
    la = LookAhead(1000, ttl=5.0, clock=clock)
    fetched(la, "a", b"A")
    mark = la.begin()  # a fetch starts, then every object is deleted
    la.clear()
    assert la.take("a") is None
    assert not la.keep("b", b"old", "e", 10, mark)
    la.end(mark)
    assert fetched(la, "b", b"new")


def test_a_disabled_look_ahead_has_no_room(clock: Clock) -> None:
    la = LookAhead(0, ttl=5.0, clock=clock)
    assert not la.enabled
    assert la.room(1) == 0
