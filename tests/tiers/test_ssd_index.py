"""SSDIndex by hand: plans and completions as plain transitions, no threads, no files."""

from __future__ import annotations

import random

import pytest

from aiotier.tiers._ssd.index import DiskSlot, SSDIndex, WritePlan

FREE, WRITING, LIVE, RETIRING = DiskSlot


def landed(index: SSDIndex, key: bytes, length: int = 10) -> WritePlan:
    """Plan a write of ``key`` and land it (what a successful write op reports)."""
    plan = index.plan_write(key, length)
    assert plan is not None
    assert index.write_landed(plan) == -1
    return plan


def fresh(slots: int) -> SSDIndex:
    index = SSDIndex(slots)
    index.loaded()
    return index


def test_a_new_index_hands_out_slots_in_order_with_increasing_sequence_numbers() -> None:
    index = fresh(3)
    plans = [index.plan_write(b"k%d" % i, 5) for i in range(3)]
    assert [(p.slot, p.seq, p.dirty, p.victim) for p in plans if p] == [
        (0, 1, False, None),
        (1, 2, False, None),
        (2, 3, False, None),
    ]
    assert [DiskSlot(s) for s in index.state] == [WRITING] * 3
    assert len(index) == 0  # nothing readable before a write lands
    assert index.pin(b"k0") == -1


def test_a_write_is_readable_only_once_it_landed() -> None:
    index = fresh(2)
    plan = index.plan_write(b"k", 7)
    assert plan is not None and b"k" not in index
    assert index.write_landed(plan) == -1
    assert b"k" in index
    slot = index.pin(b"k")
    assert (slot, index.seq[slot], index.length[slot]) == (plan.slot, plan.seq, 7)
    assert index.holds[slot] == 1
    index.read_ended(slot)
    assert index.holds[slot] == 0


def test_a_rewrite_goes_to_another_slot_and_the_old_one_is_freed_after_clearing() -> None:
    index = fresh(3)
    first = landed(index, b"k")
    assert not first.replaces
    plan = index.plan_write(b"k", 20)
    assert plan is not None and plan.slot != first.slot and plan.replaces
    # while the new copy is written, reads still get the old one
    assert index.pin(b"k") == first.slot
    old = index.write_landed(plan)
    assert old == first.slot
    assert DiskSlot(index.state[old]) is RETIRING  # held by the read and the clearing
    assert index.lru[b"k"] == plan.slot
    index.cleared(old, ok=True)
    assert DiskSlot(index.state[old]) is RETIRING  # the read still holds it
    index.read_ended(old)
    assert DiskSlot(index.state[old]) is FREE
    assert old in index.free and not index.dirty[old]


def test_eviction_takes_the_least_recent_block_no_read_holds() -> None:
    index = fresh(3)
    for k in (b"a", b"b", b"c"):
        landed(index, k)
    held = index.pin(b"a")  # a is being read
    index.read_ended(index.pin(b"b"))
    index.read_ended(index.pin(b"c"))
    assert list(index.lru) == [b"a", b"b", b"c"]  # a is the least recent...
    plan = index.plan_write(b"d", 1)
    assert plan is not None and plan.victim is not None
    assert plan.victim.key == b"b"  # ...but held, so b goes
    assert (plan.slot, plan.dirty) == (plan.victim.slot, True)  # b's header is still there
    assert list(index.lru) == [b"a", b"c"]
    index.read_ended(held)


def test_every_slot_busy_means_no_plan_and_nothing_changed() -> None:
    index = fresh(2)
    landed(index, b"a")
    held = index.pin(b"a")
    assert index.plan_write(b"b", 1) is not None  # the free slot, now being written
    assert index.plan_write(b"c", 1) is None
    assert list(index.lru) == [b"a"]
    index.read_ended(held)
    plan = index.plan_write(b"c", 1)
    assert plan is not None and plan.victim is not None and plan.victim.key == b"a"


def test_a_keys_own_copy_is_evicted_for_its_rewrite_only_when_nothing_else_can_go() -> None:
    index = fresh(2)
    landed(index, b"a")
    landed(index, b"b")
    index.read_ended(index.pin(b"b"))
    plan = index.plan_write(b"a", 3)  # a is the least recent, but it is being replaced
    assert plan is not None and plan.victim is not None and plan.victim.key == b"b"
    assert b"a" in index  # its copy stays readable meanwhile
    one = fresh(1)
    landed(one, b"a")
    plan = one.plan_write(b"a", 3)  # a one-slot tier: the only room is the old copy's
    assert plan is not None and plan.victim is None and plan.dirty
    assert b"a" not in one
    assert one.write_landed(plan) == -1 and one.lru[b"a"] == plan.slot


def test_a_copy_whose_key_is_being_rewritten_goes_last_and_is_never_handed_down() -> None:
    index = fresh(3)
    for k in (b"k", b"a", b"b"):
        landed(index, k)
    rewrite = index.plan_write(b"k", 5)  # k is the least recent; a goes for it
    assert rewrite is not None and rewrite.victim is not None and rewrite.victim.key == b"a"
    plan = index.plan_write(b"x", 5)  # k's copy is older than its write under way: b goes
    assert plan is not None and plan.victim is not None and plan.victim.key == b"b"
    last = index.plan_write(b"y", 5)  # only k's old copy is left: taken, not a victim
    assert last is not None and last.victim is None and b"k" not in index
    assert index.write_landed(rewrite) == -1 and index.lru[b"k"] == rewrite.slot
    again = index.plan_write(b"z", 5)  # k's new copy, landed, is an ordinary victim
    assert again is not None and again.victim is not None and again.victim.key == b"k"


def test_a_failed_write_drops_the_older_copy_and_clears_both_slots() -> None:
    index = fresh(3)
    first = landed(index, b"k")
    plan = index.plan_write(b"k", 5)
    assert plan is not None
    assert index.write_failed(plan) == [plan.slot, first.slot]
    assert b"k" not in index  # no older bytes once a newer write was accepted
    assert {DiskSlot(index.state[s]) for s in (plan.slot, first.slot)} == {RETIRING}
    index.cleared(plan.slot, ok=False)  # that clearing failed: the slot may still verify
    index.cleared(first.slot, ok=True)
    assert index.dirty[plan.slot] == 1 and index.dirty[first.slot] == 0
    again = index.plan_write(b"x", 1)
    assert again is not None
    assert again.dirty == bool(index.dirty[again.slot])


def test_remove_retires_the_slot_until_its_reads_end_and_it_is_cleared() -> None:
    index = fresh(2)
    plan = landed(index, b"k")
    slot = index.pin(b"k")
    assert index.plan_remove(b"k") == slot
    assert index.plan_remove(b"k") == -1
    assert b"k" not in index
    index.cleared(slot, ok=True)
    assert DiskSlot(index.state[slot]) is RETIRING
    assert index.plan_write(b"x", 1).slot != plan.slot  # type: ignore[union-attr]
    index.read_ended(slot)
    assert DiskSlot(index.state[slot]) is FREE


def test_a_failed_read_drops_the_block_only_if_it_is_still_the_one_read() -> None:
    index = fresh(3)
    first = landed(index, b"k")
    slot = index.pin(b"k")
    newer = index.plan_write(b"k", 5)
    assert newer is not None
    index.write_landed(newer)  # replaced while the read was under way
    assert index.read_failed(b"k", slot, first.seq) == -1
    assert index.lru[b"k"] == newer.slot
    index.read_ended(slot)
    s = index.pin(b"k")
    assert index.read_failed(b"k", s, newer.seq) == s
    assert b"k" not in index
    index.read_ended(s)
    index.cleared(s, ok=True)
    assert DiskSlot(index.state[s]) is FREE


def test_loading_rebuilds_order_free_slots_and_the_next_sequence_number() -> None:
    index = SSDIndex(5)
    index.load_many([b"old", b"new"], [3, 1], [40, 7], [1, 2])
    index.load(b"newest", 4, 9, 3)
    index.loaded(dirty={0, 4})
    assert list(index.lru) == [b"old", b"new", b"newest"]
    assert index.next_seq == 41
    assert sorted(index.free) == [0, 2] and index.free[-1] == 0  # lowest slot first
    assert index.dirty[0] == 1 and index.dirty[4] == 0  # slot 4 is live, not dirty
    assert list(index.entries()) == [(b"old", 3, 40, 1), (b"new", 1, 7, 2), (b"newest", 4, 9, 3)]
    assert index.dirty_free() == [0]


def _check(index: SSDIndex) -> None:
    """The invariants every transition keeps."""
    live = set(index.lru.values())
    assert len(live) == len(index.lru)  # no slot holds two keys
    for s in range(index.slots):
        state = DiskSlot(index.state[s])
        assert (state is LIVE) == (s in live)
        assert (state is FREE) == (s in index.free)
        if state is FREE:
            assert index.holds[s] == 0
    assert len(set(index.free)) == len(index.free)


@pytest.mark.parametrize("seed", range(20))
def test_random_transitions_never_hand_a_held_slot_to_a_write(seed: int) -> None:
    """A model run: reads, writes, removes, failures and clearings in random order."""
    rng = random.Random(seed)
    index = fresh(6)
    reads: list[tuple[bytes, int, int]] = []  # key, slot, seq of reads under way
    writes: list[WritePlan] = []
    clearing: list[int] = []
    busy: set[bytes] = set()  # keys with a write or remove under way (the tier's turns)
    keys = [b"k%d" % i for i in range(10)]
    for _ in range(400):
        op = rng.random()
        key = rng.choice(keys)
        if op < 0.25:
            slot = index.pin(key)
            if slot >= 0:
                reads.append((key, slot, index.seq[slot]))
        elif op < 0.45 and key not in busy:
            plan = index.plan_write(key, rng.randrange(100))
            if plan is not None:
                held = {s for _k, s, _q in reads}
                assert plan.slot not in held, "a write got a slot a read holds"
                if plan.victim is not None:
                    assert plan.victim.key not in busy, "a copy being replaced was handed down"
                assert plan.slot not in clearing
                writes.append(plan)
                busy.add(key)
        elif op < 0.6 and writes:
            plan = writes.pop(rng.randrange(len(writes)))
            busy.discard(plan.key)
            if rng.random() < 0.9:
                old = index.write_landed(plan)
                if old >= 0:
                    clearing.append(old)
            else:
                clearing.extend(index.write_failed(plan))
        elif op < 0.7 and key not in busy:
            slot = index.plan_remove(key)
            if slot >= 0:
                clearing.append(slot)
        elif op < 0.85 and reads:
            key, slot, seq = reads.pop(rng.randrange(len(reads)))
            if rng.random() < 0.1:
                s = index.read_failed(key, slot, seq)
                if s >= 0:
                    clearing.append(s)
            index.read_ended(slot)
        elif clearing:
            index.cleared(clearing.pop(rng.randrange(len(clearing))), rng.random() < 0.9)
        _check(index)


def test_reads_ended_lets_each_read_go_and_frees_a_retired_slot_after_its_last() -> None:
    index = fresh(3)
    first = landed(index, b"k")
    other = landed(index, b"j")
    held = index.pin_many([b"k", b"j", b"k", b"absent"])
    assert held == [first.slot, other.slot, first.slot, -1]
    plan = index.plan_write(b"k", 20)  # a rewrite retires the old slot once it is cleared
    assert plan is not None
    assert index.write_landed(plan) == first.slot
    index.cleared(first.slot, ok=True)
    index.reads_ended([first.slot, other.slot])
    assert DiskSlot(index.state[first.slot]) is RETIRING  # the batch's second read holds it
    assert index.holds[other.slot] == 0
    index.reads_ended([first.slot])
    assert DiskSlot(index.state[first.slot]) is FREE and first.slot in index.free
