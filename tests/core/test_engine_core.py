"""The engine's state machine, driven by hand with no event loop: each test performs the I/O the
core asks for (or pretends a tier answered) and checks the state it lands in."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from aiotier import LookupResult, PrimaryTier
from aiotier._core.engine_core import EngineCore
from aiotier._core.inflight import PromotionBatch
from aiotier._core.metrics import METRICS
from aiotier._core.promotion import Outcome
from aiotier._core.writeback import OpKind

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Harness:
    """An ``EngineCore`` over one primary and tiers whose contents are plain sets of keys."""

    def __init__(
        self,
        num_blocks: int = 4,
        *,
        tiers: Sequence[str] = ("memory",),
        write_policy: str = "write_back",
        max_pending_write_bytes: int = 1 << 20,
    ) -> None:
        self.clock = Clock()
        self.held: list[set[bytes]] = [set() for _ in tiers]
        self.notified: list[int] = []
        primary = PrimaryTier(num_blocks, 8)
        self.core = EngineCore(
            primary.arena,
            primary.table,
            tier_names=tiers,
            hints=[held.__contains__ for held in self.held],
            write_policy=write_policy,
            promotion_timeout=5.0,
            backoff_seconds=1.0,
            max_pending_write_bytes=max_pending_write_bytes,
            notify=self.notified.append,
            clock=self.clock,
        )

    def lookup(
        self, keys: list[bytes], answers: list[LookupResult], req_id: str | None = None
    ) -> tuple[list[LookupResult], list[PromotionBatch]]:
        """A lookup whose first tier answers ``answers`` for the keys it is asked about."""
        promotions = self.core.promotions
        rs = None if req_id is None else self.core.requests.open(req_id)
        scan = promotions.begin(keys, rs)
        asked = promotions.ask(scan, 0)
        if asked:
            promotions.answered(scan, 0, answers[: len(asked)])
        batches = promotions.finish(scan, elapsed=0.001)
        return scan.results, batches

    def count(self, *key: str) -> int:
        return self.core.stats.peek_counts()[key]


def test_a_promotion_reserves_its_slot_at_once_and_lands_as_a_hit() -> None:
    h = Harness()
    results, (batch,) = h.lookup([b"k"], [HIT])
    assert results == [RETRY]
    assert h.core.answers.in_flight(b"k") is not None
    again, more = h.lookup([b"k"], [HIT])  # a second lookup sees it in flight
    assert again == [RETRY] and more == []
    h.core.arena.slot_views(batch.slots)[0][:3] = b"abc"
    assert h.core.promotions.completed([batch], Outcome.OK, [3]) == []
    assert h.core.answers.settled([b"k"]) == [HIT]
    assert h.core.values.copy_ready(b"k") == b"abc"
    assert h.count("promotions", "memory", "ok") == 1
    assert h.count("read_bytes", "memory") == 3


def test_a_failed_promotion_becomes_a_miss_and_frees_its_slot() -> None:
    h = Harness()
    _, (batch,) = h.lookup([b"k"], [HIT])
    assert h.core.table.pinned() == 1  # the read's pin (and the anonymous RETRY pin)
    h.core.promotions.completed([batch], Outcome.ERROR)
    assert h.core.answers.settled([b"k"]) == [MISS]
    assert b"k" not in h.core.table.index
    assert h.core.table.pinned() == 0 and len(h.core.table.free) == 4
    assert h.count("promotions", "memory", "error") == 1
    assert h.count("tier_errors", "memory", "read") == 1
    # it backs off: the tier is not asked about the key again for backoff_seconds
    scan = h.core.promotions.begin([b"k"], None)
    assert h.core.promotions.ask(scan, 0) == []
    h.clock.t += 1.0
    assert h.core.promotions.ask(h.core.promotions.begin([b"k"], None), 0) == [b"k"]


def test_a_timed_out_read_keeps_its_slot_until_it_stops() -> None:
    h = Harness(num_blocks=1)
    _, (batch,) = h.lookup([b"k"], [HIT])
    held = h.core.promotions.completed([batch], Outcome.TIMEOUT, read_stopped=False)
    assert held == batch.slots
    assert h.core.answers.settled([b"k"]) == [MISS]
    assert not h.core.values.put(b"x", b"x")  # the only slot is still the read's
    h.core.promotions.release_read_pins(held)
    assert h.core.values.put(b"x", b"x")
    assert h.count("promotions", "memory", "timeout") == 1


def test_a_put_supersedes_a_block_on_its_way_down() -> None:
    h = Harness(num_blocks=1)
    core = h.core
    assert core.values.put(b"a", b"old")
    assert core.values.put(b"b", b"b")  # evicts a: its bytes go down, served from memory meanwhile
    assert core.coherence.in_transit[b"a"] == b"old"
    assert core.values.put(b"a", b"new")  # evicts b, replaces a everywhere
    assert b"a" not in core.coherence.in_transit
    assert not core.coherence.may_read(0, b"a")  # a remove of the older copy is queued
    writes = core.writes.next_batch(0)
    assert [(op.kind, op.key, op.data) for op in writes] == [
        (OpKind.WRITE, b"a", b"old"),
        (OpKind.WRITE, b"b", b"b"),
    ]
    core.writes.writes_applied(0, writes, [None, None])
    core.writes.finished(0, writes)
    h.held[0].update((b"a", b"b"))
    assert b"b" not in core.coherence.in_transit  # landed: the tier has it now
    assert not core.coherence.may_read(0, b"a")  # still: the remove comes after the write
    (remove,) = core.writes.next_batch(0)
    assert (remove.kind, remove.key) == (OpKind.REMOVE, b"a")
    core.writes.removes_applied(0, [remove], [True])
    core.writes.finished(0, [remove])
    assert core.coherence.may_read(0, b"a") and core.values.copy_ready(b"a") == b"new"
    assert core.writes.idle()


def test_a_demotion_past_the_byte_bound_is_dropped_and_the_tier_never_read_for_it() -> None:
    h = Harness(num_blocks=1, max_pending_write_bytes=4)
    assert h.core.values.put(b"a", b"12345")
    assert h.core.values.put(b"b", b"x")  # a's 5 bytes do not fit the 4-byte bound
    assert b"a" not in h.core.coherence.in_transit
    # shed load, not a fault: counted as a dropped demotion, never as a tier error
    assert h.count("demotions_dropped", "memory", "backlog") == 1
    assert h.count("tier_errors", "memory", "write") == 0
    assert not h.core.coherence.may_read(0, b"a")  # the tier may hold an older copy of a


def test_a_pending_store_answers_retry_until_its_deadline_then_miss() -> None:
    h = Harness()
    out = h.core.prepare_store([b"s"], "r1")
    assert out is not None and out.keys_to_store == (b"s",)
    results, _ = h.lookup([b"s"], [])
    assert results == [RETRY]
    woken: list[str] = []
    h.core.inflight.add_waiter(b"s", lambda: woken.append("s"))
    h.clock.t += 5.0
    assert h.core.answers.in_flight(b"s") is None  # the RETRY window ran out: settled now
    assert woken == ["s"]
    assert h.lookup([b"s"], [])[0] == [MISS]
    h.core.complete_store([b"s"], "r1")  # completing late still makes it loadable
    assert h.core.answers.settled([b"s"]) == [HIT]


def test_a_finished_request_releases_every_pin_it_held() -> None:
    h = Harness()
    _, (batch,) = h.lookup([b"k1", b"k2"], [HIT, HIT], req_id="r1")
    h.core.promotions.completed([batch], Outcome.OK, [1, 1])
    assert h.core.table.pinned() == 2  # r1's RETRY pins keep the promoted blocks
    h.core.prepare_load([b"k1"], "r1")
    h.core.prepare_store([b"s"], "r1")
    h.core.end_step(new=(), finished=("r1",))
    assert h.core.table.pinned() == 0
    assert b"s" not in h.core.table.index  # its store was aborted
    assert "r1" not in h.core.requests


def test_retry_pins_of_a_failed_promotion_go_at_once() -> None:
    h = Harness()
    _, (batch,) = h.lookup([b"k"], [HIT], req_id="r1")
    h.lookup([b"k"], [HIT], req_id="r2")  # r2 joins the promotion in flight
    h.core.promotions.completed([batch], Outcome.ERROR)
    assert h.core.table.pinned() == 0  # neither r1 nor r2 keeps the failed slot


def test_an_anonymous_deferral_is_observed_once_when_its_last_key_settles() -> None:
    h = Harness()
    _, (batch,) = h.lookup([b"k1", b"k2"], [HIT, HIT])
    h.clock.t += 0.25
    h.core.promotions.completed([batch], Outcome.OK, [1, 1])
    assert h.core.stats.samples[("async_delay",)] == [pytest.approx(0.25)]


def test_an_anonymous_deferral_over_its_own_batch_and_a_joined_key_waits_for_both() -> None:
    h = Harness()
    _, (first,) = h.lookup([b"a"], [HIT], req_id="r1")  # someone else's promotion of a
    results, (own,) = h.lookup([b"a", b"b", b"c"], [HIT, HIT])  # joins a, starts b and c
    assert results == [RETRY, RETRY, RETRY] and own.keys == [b"b", b"c"]
    h.clock.t += 0.25
    h.core.promotions.completed([own], Outcome.OK, [1, 1])
    assert ("async_delay",) not in h.core.stats.samples  # a is still on its way
    h.clock.t += 0.5
    h.core.promotions.completed([first], Outcome.OK, [1])
    assert h.core.stats.samples[("async_delay",)] == [pytest.approx(0.75)]


def test_an_anonymous_deferral_ends_when_a_put_supersedes_the_key_it_waits_for() -> None:
    h = Harness()
    _, (batch,) = h.lookup([b"k"], [HIT])
    h.clock.t += 0.01
    assert h.core.values.put(b"k", b"new")  # k answers HIT from now on
    h.clock.t += 4.99
    h.core.promotions.completed([batch], Outcome.TIMEOUT, read_stopped=False)  # the moot read
    assert h.core.stats.samples[("async_delay",)] == [pytest.approx(0.01)]  # once, at the put


def test_the_promotion_share_counts_reads_in_flight_and_landed_blocks_retry_pins_hold() -> None:
    h = Harness(num_blocks=8)
    share = h.core.pins.share
    _, (batch,) = h.lookup([b"a", b"b"], [HIT, HIT], req_id="r1")
    h.lookup([b"a"], [HIT], req_id="r2")  # a second RETRY pin on a
    assert len(share) == 2  # two reads in flight, whatever pins they carry
    h.core.promotions.completed([batch], Outcome.OK, [1, 1])
    assert len(share) == 2  # landed, not loaded: the RETRY pins hold both
    h.core.prepare_load([b"a", b"b"], "r1")
    h.core.complete_load([b"a", b"b"], "r1")  # r1 loaded both: its RETRY pins go
    assert len(share) == 1  # r2 still holds a
    h.core.end_step(new=(), finished=("r2",))
    assert len(share) == 0 and h.core.table.pinned() == 0


def test_anonymous_holds_count_once_in_the_share_and_go_with_their_block() -> None:
    h = Harness(num_blocks=8)
    share, table = h.core.pins.share, h.core.table
    _, (batch,) = h.lookup([b"a", b"b", b"c"], [HIT, HIT, HIT])  # anonymous: held to the step
    h.lookup([b"a"], [HIT], req_id="r1")  # a request joins a: RETRY-pinned twice
    h.lookup([b"a", b"b"], [HIT, HIT])  # anonymous again: no second hold
    assert len(share) == 3 and table.pinned() == 3
    h.core.promotions.completed([batch], Outcome.OK, [1, 1, 1])
    assert len(share) == 3  # landed, not loaded: held
    h.core.end_step(new=("r1",), finished=())
    assert len(share) == 1 and table.pinned() == 1  # the holds went; r1 still pins a
    h.core.end_step(new=(), finished=("r1",))
    assert len(share) == 0 and table.pinned() == 0
    # a failed read drops the anonymous hold at once: the slot goes back to the free list
    _, (batch,) = h.lookup([b"d"], [HIT])
    h.core.promotions.completed([batch], Outcome.ERROR)
    assert len(share) == 0 and table.pinned() == 0 and b"d" not in table.index
    # a deleted block's hold goes with it: its slot is free at once, not at the step boundary
    _, (batch,) = h.lookup([b"e"], [HIT])
    h.core.promotions.completed([batch], Outcome.OK, [1])
    free = len(table.free)
    assert len(share) == 1 and table.pinned() == 1
    h.core.delete(b"e", [lambda _: None])
    assert len(share) == 0 and table.pinned() == 0 and len(table.free) == free + 1


def test_a_request_is_observed_at_the_step_that_admits_it() -> None:
    h = Harness()
    _, (batch,) = h.lookup([b"k"], [HIT], req_id="r1")
    h.core.promotions.completed([batch], Outcome.OK, [1])
    h.clock.t += 0.5
    h.core.end_step(new=("r1",), finished=())
    assert h.core.stats.samples[("sync_delay",)] == [pytest.approx(0.001)]
    assert h.core.stats.samples[("async_delay",)] == [pytest.approx(0.5)]


def test_every_counter_the_core_bumps_is_a_metric_with_its_labels() -> None:
    h = Harness(num_blocks=1)
    _, (batch,) = h.lookup([b"k"], [HIT])
    h.core.promotions.completed([batch], Outcome.ERROR)
    h.core.values.put(b"a", b"a")
    h.core.values.put(b"b", b"b")
    h.core.prepare_store([b"c", b"d"], None)
    labels = {m.key: len(m.labels) for m in METRICS}
    snap = h.core.take_step()
    keys = list(snap.counts) + list(snap.samples)
    assert keys
    for key in keys:
        assert key[0] in labels and len(key) - 1 == labels[key[0]], key


def test_a_clear_forgets_every_block_and_reads_no_tier_until_it_cleared() -> None:
    h = Harness(num_blocks=2, tiers=("memory", "ssd"))
    core = h.core
    assert core.values.put(b"a", b"a")
    assert core.values.put(b"b", b"b")
    assert core.values.put(b"c", b"c")  # evicts a: a write of it is queued for the first tier
    spec = core.prepare_load([b"b"], "r1")  # b's slot is the loader's until complete_load
    assert core.writes.queued_bytes == 1
    core.take_events()

    core.clear()
    assert core.table.index == {}
    assert core.values.copy_ready(b"a") is None and core.coherence.in_transit == {}
    (event,) = core.take_events()
    assert (set(event.keys), event.tier, event.removed) == ({b"b", b"c"}, "primary", True)
    assert len(core.writes) == 0 and core.writes.queued_bytes == 0
    assert h.count("tier_errors", "memory", "write") == 0  # dropped, not failed
    assert not core.coherence.may_read(0, b"x") and not core.coherence.may_read(1, b"x")
    assert core.table.pinned() == 1  # the load's slot stays until it completes
    assert bytes(spec.buffers[0]) == b"b"
    core.complete_load([b"b"], "r1")
    assert core.table.pinned() == 0 and len(core.table.free) == 2

    core.coherence.cleared(0, ok=True)
    core.coherence.cleared(1, ok=False)  # a failed clear: the tier may hold anything old
    assert core.coherence.may_read(0, b"x")
    assert not core.coherence.may_read(1, b"x")
    assert core.coherence.unread_tiers() == [1]


def test_a_store_pending_at_a_clear_is_not_made_visible() -> None:
    h = Harness()
    core = h.core
    out = core.prepare_store([b"k"], "r1")
    assert out is not None
    core.clear()
    core.complete_store([b"k"], "r1", success=True, sizes=[1])
    assert core.answers.settled([b"k"]) == [MISS]
    assert core.table.pinned() == 0 and len(core.table.free) == 4


def test_a_tier_is_read_again_only_once_every_clear_under_way_finished() -> None:
    coherence = Harness().core.coherence
    coherence.clearing(0)
    coherence.clearing(0)  # two clears at once
    coherence.cleared(0, ok=True)
    assert not coherence.may_read(0, b"k")  # the second one has not cleared it yet
    coherence.cleared(0, ok=False)
    assert not coherence.may_read(0, b"k")  # and it failed: anything old may be there
    coherence.clearing(0)
    coherence.cleared(0, ok=True)
    assert coherence.may_read(0, b"k") and coherence.unread_tiers() == []
