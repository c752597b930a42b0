"""Eviction policies, without an event loop: exact LRU order, atomic evict, ARC adaptation, LFUDA's
counts and aging, and invariants every policy keeps under random use."""

from __future__ import annotations

import copy
import heapq
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiotier._core.admission import FrequencySketch
from aiotier._core.eviction import make_policy
from aiotier._core.lfuda import HISTORY, WINDOW, LFUDAPolicy
from aiotier._core.policy import ARCPolicy, EvictionPolicy, LRUPolicy
from aiotier.errors import ConfigError


class SlotCache:
    """A tiny cache of ``capacity`` slots driven by a policy, to replay reference strings."""

    def __init__(self, policy: EvictionPolicy, capacity: int) -> None:
        self.policy = policy
        self.slot_of: dict[str, int] = {}
        self.free = list(range(capacity))
        self.hits = 0

    def access(self, key: str) -> None:
        slot = self.slot_of.get(key)
        if slot is not None:
            self.hits += 1
            self.policy.touch(slot)
            return
        if not self.free:
            (victim,) = self.policy.evict(1, lambda s: True) or ()
            self.free.append(victim)
            del self.slot_of[next(k for k, s in self.slot_of.items() if s == victim)]
        slot = self.free.pop()
        self.slot_of[key] = slot
        self.policy.insert(slot, key.encode())


def test_lru_evicts_least_recently_used_first() -> None:
    lru = LRUPolicy(4)
    for s in range(4):
        lru.insert(s, b"k%d" % s)
    lru.touch(0)
    lru.touch(2)
    assert lru.order() == [1, 3, 0, 2]
    assert lru.evict(2, lambda s: True) == [1, 3]
    assert lru.order() == [0, 2]


def test_lru_recycle_moves_the_least_recent_run_to_the_most_recent_end() -> None:
    lru = LRUPolicy(5)
    for s in range(5):
        lru.insert(s, b"k%d" % s)
    assert lru.recycle([b"a", b"b"], lambda s: True) == [0, 1]
    assert lru.order() == [2, 3, 4, 0, 1]
    lru.touch(0)  # each link of the moved run, both ways, is right
    lru.touch(3)
    assert lru.order() == [2, 4, 1, 0, 3]
    assert lru.recycle([b"c"] * 5, lambda s: True) == [2, 4, 1, 0, 3]  # the whole list
    assert lru.order() == [2, 4, 1, 0, 3]
    assert lru.recycle([b"d", b"e"], lambda s: s != 4) == [2, 1]  # a pinned one: one by one
    assert lru.order() == [4, 0, 3, 2, 1]


def test_lru_skips_unevictable_slots() -> None:
    lru = LRUPolicy(3)
    for s in range(3):
        lru.insert(s, b"")
    assert lru.evict(1, lambda s: s != 0) == [1]
    assert lru.order() == [0, 2]


@pytest.mark.parametrize("cls", [LRUPolicy, ARCPolicy, LFUDAPolicy])
def test_evict_is_atomic_when_not_enough_victims(cls: type[EvictionPolicy]) -> None:
    policy = cls(4)  # type: ignore[call-arg]
    for s in range(4):
        policy.insert(s, b"k%d" % s)
    before = policy.order()
    assert policy.evict(3, lambda s: s in (1, 2)) is None
    assert policy.order() == before
    assert sorted(policy.evict(2, lambda s: s in (1, 2)) or []) == [1, 2]


def test_lru_remove_and_reinsert() -> None:
    lru = LRUPolicy(3)
    for s in range(3):
        lru.insert(s, b"")
    lru.remove(1)
    lru.remove(1)  # idempotent
    lru.insert(1, b"")
    assert lru.order() == [0, 2, 1]


def test_arc_promotes_reused_blocks_to_frequency_list() -> None:
    arc = ARCPolicy(4)
    for s in range(4):
        arc.insert(s, b"k%d" % s)
    arc.touch(0)  # seen twice: T2
    # T1 (seen once) is above its target p=0, so eviction takes from T1 first
    assert arc.evict(3, lambda s: True) == [1, 2, 3]
    assert arc.order() == [0]


def test_arc_adapts_p_on_ghost_hits() -> None:
    arc = ARCPolicy(4)
    for s in range(4):
        arc.insert(s, b"k%d" % s)
    assert arc.evict(1, lambda s: True) == [0]  # k0 -> ghost list B1
    arc.insert(0, b"k0")  # a B1 ghost hit: recency was undervalued, p grows
    assert arc.p == 1.0
    arc.touch(1)
    arc.touch(2)  # k1, k2 -> T2
    victims = arc.evict(2, lambda s: True)
    assert victims is not None
    # one victim from T1 (over target), then T2's LRU once T1 reached p
    arc.insert(victims[-1], b"k1" if victims[-1] == 1 else b"k2")
    assert arc.p < 1.0  # a B2 ghost hit moves p back towards frequency


@pytest.mark.parametrize("cls", [ARCPolicy, LFUDAPolicy])
def test_frequency_resists_a_scan_that_flushes_lru(cls: type[EvictionPolicy]) -> None:
    """A hot loop of 6 keys plus a one-off scan of 10 a round: ARC and LFUDA keep the hot set,
    LRU loses it."""
    trace: list[str] = []
    for round_ in range(30):
        trace += [f"hot{i}" for i in range(6)] * 2
        trace += [f"scan{round_}-{i}" for i in range(10)]
    lru = SlotCache(LRUPolicy(8), 8)
    other = SlotCache(cls(8), 8)  # type: ignore[call-arg]
    for key in trace:
        lru.access(key)
        other.access(key)
    assert other.hits > lru.hits * 1.2, (other.hits, lru.hits)


def test_make_policy_rejects_unknown_names() -> None:
    with pytest.raises(ConfigError, match="'fifo'; expected one of 'lru', 'arc', 'lfuda'"):
        make_policy("fifo", 4)
    assert isinstance(make_policy("lfuda", 4), LFUDAPolicy)


def test_lfuda_evicts_the_least_used_first_and_least_recent_among_equals() -> None:
    lfu = LFUDAPolicy(64)  # a wide sketch: four keys share no counter
    for s in range(4):
        lfu.insert(s, b"k%d" % s)
    lfu.touch(0)
    lfu.touch(0)
    lfu.touch(2)
    lfu.refresh(1)  # a store completing: most recent among equals, not a further use
    assert lfu.order() == [3, 1, 2, 0]
    assert lfu.candidates(2, lambda s: s != 3) == [1, 2]
    assert lfu.evict(2, lambda s: s != 3) == [1, 2]
    assert lfu.age == 2  # the last victim's priority: 0 + two uses of k2
    assert lfu.order() == [3, 0]


def test_lfuda_keeps_a_key_s_count_after_eviction() -> None:
    lfu = LFUDAPolicy(64)
    lfu.insert(0, b"old")
    lfu.touch(0)
    lfu.touch(0)
    assert lfu.evict(1, lambda s: True) == [0]
    assert lfu.age == 3
    lfu.insert(0, b"new")
    lfu.insert(1, b"old")  # comes back with its three uses: 3 + 4
    assert lfu.order() == [0, 1]


def test_lfuda_ages_out_an_old_burst() -> None:
    """A block used ten times long ago goes once enough newer blocks have been evicted past it;
    under LFU without aging it would stay for ever."""
    lfu = SlotCache(LFUDAPolicy(64), 4)
    for _ in range(10):
        lfu.access("burst")
    evicted_at = None
    for i in range(200):
        lfu.access(f"new{i}")
        lfu.access(f"new{i}")  # each newcomer is used twice: priority age + 2
        if "burst" not in lfu.slot_of:
            evicted_at = i
            break
    assert evicted_at is not None and evicted_at > 3, evicted_at


OPS = st.lists(
    st.tuples(st.sampled_from(["insert", "insert_many", "touch", "touch_many", "refresh",
                               "refresh_many", "remove", "evict", "peek"]),
              st.integers(0, 7), st.integers(1, 4), st.frozensets(st.integers(0, 7))),
    max_size=120,
)  # fmt: skip


def unpinned(pinned: frozenset[int]) -> Callable[[int], bool]:
    return lambda s: s not in pinned


@pytest.mark.parametrize("name", ["lru", "arc", "lfuda"])
@given(ops=OPS)
def test_policies_hold_exactly_their_resident_slots_and_never_evict_a_pinned_one(
    name: str, ops: list[tuple[str, int, int, frozenset[int]]]
) -> None:
    """Random inserts, uses, removals and evictions with random pinned slots: the policy's order
    is always the resident set; evict returns n distinct unpinned residents (what candidates
    named) or None with nothing changed; insert_many, touch_many and refresh_many order as an
    insert, a touch or a refresh of each slot does."""
    policy = make_policy(name, 8)
    resident: set[int] = set()
    for op, slot, n, pinned in ops:
        evictable = unpinned(pinned)
        if op == "insert" and slot not in resident:
            policy.insert(slot, b"k%d" % slot)
            resident.add(slot)
        elif op == "touch" and slot in resident:
            policy.touch(slot)
        elif op == "refresh" and slot in resident:
            policy.refresh(slot)
        elif op == "insert_many":
            fresh = sorted(pinned - resident)
            twin = copy.deepcopy(policy)
            for s in fresh:
                twin.insert(s, b"k%d" % s)
            policy.insert_many(fresh, [b"k%d" % s for s in fresh])
            resident.update(fresh)
            assert policy.order() == twin.order()
        elif op in ("refresh_many", "touch_many"):
            twin = copy.deepcopy(policy)
            one = op.removesuffix("_many")
            for s in sorted(pinned):  # resident or not: a slot it does not hold is ignored
                getattr(twin, one)(s)
            getattr(policy, op)(sorted(pinned))
            assert policy.order() == twin.order()
        elif op == "remove":
            policy.remove(slot)
            resident.discard(slot)
        elif op == "peek":
            named = policy.candidates(n, evictable)
            assert len(named) == min(n, len(resident - pinned))
            assert set(named) <= resident - pinned
        elif op == "evict":
            before = policy.order()
            named = policy.candidates(n, evictable)
            victims = policy.evict(n, evictable)
            if len(resident - pinned) < n:
                assert victims is None and policy.order() == before
            else:
                assert victims == named and len(set(victims)) == n
                assert not set(victims) & pinned and set(victims) <= resident
                resident -= set(victims)
        assert sorted(policy.order()) == sorted(resident)


def test_lfuda_finds_the_lowest_priority_across_a_wide_gap() -> None:
    """A pinned block keeps its low priority while the age climbs far past it; once unpinned
    it is the next victim."""
    lfu = LFUDAPolicy(64)
    lfu.insert(0, b"old")  # priority 1
    lfu.insert(1, b"hot")
    for _ in range(40):
        lfu.touch(1)  # priority 41
    assert lfu.evict(1, lambda s: s != 0) == [1]
    assert lfu.age == 41
    lfu.insert(1, b"new")  # priority 42
    assert lfu.order() == [0, 1]
    assert lfu.evict(1, lambda s: True) == [0]


class HeapLFUDA:
    """LFUDA as a heap of ``(priority, tick, slot)`` with lazy deletion: the reference the
    bucketed policy must match victim for victim (ties to the least recently stamped)."""

    def __init__(self, num_blocks: int) -> None:
        self.sketch = FrequencySketch(HISTORY * num_blocks, window=WINDOW)
        self.age = self.ticks = 0
        self.heap: list[tuple[int, int, int]] = []
        self.key: dict[int, bytes] = {}
        self.count: dict[int, int] = {}
        self.tick: dict[int, int] = {}

    def stamp(self, slot: int, count: int) -> None:
        self.ticks += 1
        self.tick[slot], self.count[slot] = self.ticks, count
        heapq.heappush(self.heap, (self.age + count, self.ticks, slot))

    def insert(self, slot: int, key: bytes) -> None:
        self.key[slot] = key
        self.stamp(slot, self.sketch.increment(key))

    def touch(self, slot: int) -> None:
        if slot in self.key:
            self.stamp(slot, self.sketch.increment(self.key[slot]))

    def refresh(self, slot: int) -> None:
        if slot in self.key:
            self.stamp(slot, self.count[slot])

    def remove(self, slot: int) -> None:
        for d in (self.key, self.count, self.tick):
            d.pop(slot, None)

    def live(self) -> list[tuple[int, int, int]]:
        return sorted(e for e in self.heap if self.tick.get(e[2]) == e[1])

    def candidates(self, n: int, evictable: Callable[[int], bool]) -> list[int]:
        return [s for _, _, s in self.live() if evictable(s)][:n]

    def evict(self, n: int, evictable: Callable[[int], bool]) -> list[int] | None:
        chosen = [e for e in self.live() if evictable(e[2])][:n]
        if len(chosen) < n:
            return None
        if chosen:
            self.age = max(self.age, chosen[-1][0])
        for _, _, s in chosen:
            self.remove(s)
        return [s for _, _, s in chosen]

    def order(self) -> list[int]:
        return [s for _, _, s in self.live()]


@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["insert", "insert_many", "touch", "touch_many", "refresh",
                                   "refresh_many", "remove", "evict", "peek"]),
                  st.lists(st.integers(0, 11), max_size=5), st.integers(0, 5),
                  st.frozensets(st.integers(0, 11), max_size=4)),
        max_size=150,
    )
)  # fmt: skip
def test_lfuda_evicts_exactly_as_a_heap_of_priority_and_recency(
    ops: list[tuple[str, list[int], int, frozenset[int]]],
) -> None:
    """Victims, candidates, order and age match the heap-based reference under random use:
    slots inserted again while resident, batches of one count or several, refreshes after the
    age moved, batches used again whole, in part or with a slot twice, pinned slots skipped, with
    few keys (counts grow) over 12 slots."""
    lfu, ref = LFUDAPolicy(12), HeapLFUDA(12)
    for op, slots, n, pinned in ops:
        evictable = unpinned(pinned)
        keys = [b"k%d" % (s % 5) for s in slots]
        if op == "insert" and slots:
            lfu.insert(slots[0], keys[0])
            ref.insert(slots[0], keys[0])
        elif op == "insert_many":
            lfu.insert_many(slots, keys)
            for s, k in zip(slots, keys, strict=True):
                ref.insert(s, k)
        elif op in ("touch", "refresh", "remove") and slots:
            getattr(lfu, op)(slots[0])
            getattr(ref, op)(slots[0])
        elif op in ("refresh_many", "touch_many"):
            getattr(lfu, op)(slots)
            for s in slots:
                getattr(ref, op.removesuffix("_many"))(s)
        elif op == "peek":
            assert lfu.candidates(n, evictable) == ref.candidates(n, evictable)
        elif op == "evict":
            assert lfu.evict(n, evictable) == ref.evict(n, evictable)
        assert lfu.order() == ref.order()
        assert lfu.age == ref.age


class BatchEvictable:
    """An ``Evictable`` with the optional batch answers (``all``, ``among``) the block table
    gives, over a set of pinned slots."""

    def __init__(self, pinned: frozenset[int]) -> None:
        self.pinned = pinned

    def __call__(self, slot: int) -> bool:
        return slot not in self.pinned

    def all(self, slots: list[int]) -> bool:
        return self.pinned.isdisjoint(slots)

    def among(self, slots: list[int]) -> list[int]:
        return [s for s in slots if s not in self.pinned]


@pytest.mark.parametrize("name", ["lru", "arc", "lfuda"])
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["insert_many", "touch", "touch_many", "refresh_many", "remove",
                                   "evict", "recycle"]),
                  st.lists(st.integers(0, 15), max_size=8), st.integers(1, 9),
                  st.frozensets(st.integers(0, 15), max_size=6)),
        max_size=80,
    )
)  # fmt: skip
def test_policies_choose_the_same_victims_with_batch_evictable_answers(
    name: str, ops: list[tuple[str, list[int], int, frozenset[int]]]
) -> None:
    """An evictable that answers for a run of slots at once (as the block table's does) gives
    the victims, in the order, that asking slot by slot gives: pinned slots in the middle of a
    batch, batches stored and refreshed together, runs partly evicted. A policy's own
    ``recycle`` (a full arena's allocation) evicts and reinserts as ``evict`` then
    ``insert_many`` do."""
    batched, plain = make_policy(name, 16), make_policy(name, 16)
    resident: set[int] = set()
    for op, slots, n, pinned in ops:
        if op == "insert_many":
            fresh = list(dict.fromkeys(s for s in slots if s not in resident))
            keys = [b"k%d" % (s % 6) for s in fresh]  # few keys: counts differ within a batch
            batched.insert_many(fresh, keys)
            plain.insert_many(fresh, keys)
            resident.update(fresh)
        elif op == "touch" and slots:
            batched.touch(slots[0])
            plain.touch(slots[0])
        elif op in ("refresh_many", "touch_many"):
            getattr(batched, op)(slots)
            getattr(plain, op)(slots)
        elif op == "remove" and slots:
            batched.remove(slots[0])
            plain.remove(slots[0])
            resident.discard(slots[0])
        elif op == "evict":
            assert batched.candidates(n, BatchEvictable(pinned)) == plain.candidates(
                n, unpinned(pinned)
            )
            victims = batched.evict(n, BatchEvictable(pinned))
            assert victims == plain.evict(n, unpinned(pinned))
            resident -= set(victims or ())
        elif op == "recycle":
            keys = [b"r%d" % (i % 6) for i in range(n)]
            victims = batched.recycle(keys, BatchEvictable(pinned))
            assert victims == EvictionPolicy.recycle(plain, keys, unpinned(pinned))
        assert batched.order() == plain.order()
