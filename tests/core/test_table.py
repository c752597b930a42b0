"""Block table, arena and byte budget: allocation, pins, orphans, exact accounting."""

from __future__ import annotations

import pytest

from aiotier._core.arena import Arena
from aiotier._core.policy import LRUPolicy
from aiotier._core.requests import RequestState
from aiotier._core.table import FREE, ORPHAN, PENDING, READY, BlockTable
from aiotier.errors import ConfigError


def table(n: int = 4) -> BlockTable:
    return BlockTable(n, LRUPolicy(n))


def ready(t: BlockTable, keys: list[bytes]) -> list[int]:
    got = t.allocate(keys, READY)
    assert got is not None
    return got[0]


def test_allocate_uses_free_slots_then_evicts_lru() -> None:
    t = table(3)
    ready(t, [b"a", b"b", b"c"])
    t.policy.touch(t.index[b"a"])
    got = t.allocate([b"d"], READY)
    assert got is not None
    slots, evicted = got
    assert list(evicted) == [(b"b", slots[0], False)]  # (key, slot, clean)
    assert t.index[b"d"] == slots[0] == evicted.slots[0]
    assert b"b" not in t.index


def test_allocate_is_all_or_nothing_and_respects_pins_and_protection() -> None:
    t = table(3)
    a, b, _c = ready(t, [b"a", b"b", b"c"])
    t.pin(a)
    before = (dict(t.index), t.policy.order())
    assert t.allocate([b"x", b"y"], READY, protected=[b]) is None
    assert (dict(t.index), t.policy.order()) == before
    got = t.allocate([b"x"], READY, protected=[b])
    assert got is not None
    assert list(got[1].keys) == [b"c"]


def test_pending_and_promoting_blocks_are_never_evicted() -> None:
    t = table(2)
    got = t.allocate([b"a", b"b"], PENDING)
    assert got is not None
    assert t.allocate([b"c"], READY) is None
    assert t.state[t.index[b"a"]] == PENDING


def test_detach_of_a_pinned_block_waits_for_the_last_unpin() -> None:
    t = table(2)
    (a,) = ready(t, [b"a"])
    t.pin(a)
    t.pin(a)
    t.detach(a)
    assert t.state[a] == ORPHAN and b"a" not in t.index
    t.unpin(a)
    assert t.state[a] == ORPHAN
    t.unpin(a)
    assert t.state[a] == FREE and a in t.free
    with pytest.raises(RuntimeError, match="unpinned more often"):
        t.unpin(a)


def test_a_step_hold_pins_a_slot_once_until_the_step_boundary_or_its_detach() -> None:
    t = table(4)
    a, b, c, _d = ready(t, [b"a", b"b", b"c", b"d"])
    t.hold_until_step([a, b, c])
    t.hold_until_step([a])  # held already: still one hold
    assert t.pinned() == 3 and t.step_holds == {a, b, c}
    got = t.allocate([b"x"], READY)
    assert got is not None and list(got[1].keys) == [b"d"]  # the held ones are not victims
    assert t.allocate([b"y", b"z"], READY) is None  # x is the only one left to evict
    t.pin(a)
    t.detach(a)  # the hold goes with the block (nothing to load by key): the pin keeps it
    assert t.state[a] == ORPHAN and a not in t.step_holds
    t.unpin(a)
    assert t.state[a] == FREE and a in t.free
    t.detach(b)  # held only: freed at once
    assert t.state[b] == FREE and b in t.free
    t.drop_step_hold(c)
    assert not t.step_holds and t.pinned() == 0
    t.hold_until_step([c])
    t.end_step_holds()
    assert t.pinned() == 0 and not t.step_holds


def test_arena_views_are_zero_copy_and_remember_lengths() -> None:
    arena = Arena(2, 8)
    arena.slot_view(1)[:3] = b"xyz"
    arena.set_length(1, 3)
    view = arena.data_view(1)
    assert view.readonly and bytes(view) == b"xyz"
    arena.write(0, b"hello")
    assert arena.read(0) == b"hello"
    assert arena.nbytes == 16


@pytest.mark.parametrize(("n", "size"), [(0, 8), (4, 0), (-1, 8)])
def test_arena_rejects_bad_sizes(n: int, size: int) -> None:
    with pytest.raises(ConfigError, match="must be > 0"):
        Arena(n, size)


def test_arena_rejects_non_int_sizes() -> None:
    with pytest.raises(TypeError, match="num_blocks must be an int"):
        Arena(2.5, 8)  # type: ignore[arg-type]


def test_request_state_delays_are_taken_once() -> None:
    rs = RequestState("r")
    assert rs.take_delays(1.0) == (None, None)
    rs.add_sync(0.25)
    rs.add_sync(0.5)
    rs.defer(10.0)
    rs.defer(11.0)  # only the first deferral arms it
    assert rs.take_delays(12.0) == (0.75, 2.0)
    assert rs.take_delays(13.0) == (None, None)
