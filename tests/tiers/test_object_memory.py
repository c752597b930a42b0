"""What the object tier remembers of its objects, with no server: recent names expire and are
bounded, refusals hold for one ETag until a sound copy or a write, are bounded too, and usage
follows what the tier wrote and saw go."""

from __future__ import annotations

from aiotier.tiers.objectstore.memory import REFUSED_CAPACITY, ObjectMemory


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_recent_names_expire_and_the_oldest_make_room() -> None:
    clock = Clock()
    memory = ObjectMemory(2, 10.0, clock)
    for name in ("a", "b", "c"):
        memory.seen(name)
    assert [memory.fresh(n) for n in "abc"] == [False, True, True]
    clock.now = 10.0
    assert not memory.fresh("b")
    assert not ObjectMemory(0, 10.0, clock).fresh("a")  # capacity 0: nothing is remembered


def test_a_refusal_holds_for_its_etag_until_a_sound_copy_or_a_write() -> None:
    memory = ObjectMemory(8, 10.0, Clock())
    memory.written("a", 100)
    memory.refuse("a", "e1")
    assert memory.refused("a", "e1") and not memory.refused("a", "e2")
    assert not memory.fresh("a") and memory.written_objects == 0
    memory.verified("a")
    assert not memory.refused("a", "e1") and memory.fresh("a")
    memory.refuse("a", "e1")
    memory.written("a", 100)
    assert not memory.refused("a", "e1")


def test_refusals_are_bounded_the_oldest_forgotten_first() -> None:
    memory = ObjectMemory(8, 10.0, Clock())
    for i in range(REFUSED_CAPACITY + 1):
        memory.refuse(f"n{i}", "e")
    assert not memory.refused("n0", "e")
    assert memory.refused("n1", "e") and memory.refused(f"n{REFUSED_CAPACITY}", "e")


def test_usage_is_what_was_written_and_not_seen_gone() -> None:
    memory = ObjectMemory(8, 10.0, Clock())
    memory.written("a", 100)
    memory.written("b", 50)
    memory.written("a", 70)  # rewritten: its new size
    assert (memory.written_objects, memory.written_bytes) == (2, 120)
    memory.removing("b")  # a remove under way: no longer recent, still counted
    assert not memory.fresh("b") and memory.written_bytes == 120
    memory.gone("b")
    memory.gone("never-written")
    assert (memory.written_objects, memory.written_bytes) == (1, 70)
    memory.clear()
    assert (memory.written_objects, memory.written_bytes, memory.fresh("a")) == (0, 0, False)
