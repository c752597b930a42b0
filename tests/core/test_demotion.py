"""A put's way down, driven by hand (no event loop): the victim it evicts queued for the tier
the primary feeds, in eviction order, with exact counts; the removes it queues where a tier
may hold an older copy of its key; an admission policy or the byte bound still deciding when
there is one."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from aiotier import AdmitAfter, PrimaryTier
from aiotier._core.engine_core import EngineCore
from aiotier._core.writeback import WriteOp


def core_with(
    hint: Callable[[bytes], bool | None] = lambda k: False,
    *,
    num_blocks: int = 1,
    tiers: int = 1,
    max_bytes: int = 1 << 20,
    admission: AdmitAfter | None = None,
) -> EngineCore:
    primary = PrimaryTier(num_blocks, 8)
    return EngineCore(
        primary.arena,
        primary.table,
        tier_names=[f"t{i}" for i in range(tiers)],
        hints=[hint] * tiers,
        max_pending_write_bytes=max_bytes,
        tier_admission=[admission] * tiers,
    )


def ops(core: EngineCore, ti: int = 0) -> list[tuple[str, bytes, bytes | None]]:
    batch: list[WriteOp] = core.writes.next_batch(ti)
    return [(op.kind.value, op.key, None if op.data is None else bytes(op.data)) for op in batch]


def test_each_put_evicting_a_block_queues_its_bytes_down_in_eviction_order() -> None:
    core = core_with(num_blocks=2)
    for i in range(6):
        assert core.values.put(b"k%d" % i, b"v%d" % i)
    assert ops(core) == [("write", b"k%d" % i, b"v%d" % i) for i in range(4)]
    counts = core.stats.counts
    assert counts[("evictions", "primary")] == 4
    assert counts[("admissions", "t0", "admitted")] == 4
    assert core.writes.queued_bytes == 8
    # served from memory until written, each the victim's own bytes
    assert {k: bytes(v) for k, v in core.coherence.in_transit.items()} == {
        b"k%d" % i: b"v%d" % i for i in range(4)
    }
    evicted = [ev.keys for ev in core.events if ev.removed]
    assert evicted == [(b"k%d" % i,) for i in range(4)]


def test_a_demotion_an_admission_policy_keeps_out_is_not_queued_and_its_buffer_is_reused() -> (
    None
):
    core = core_with(admission=AdmitAfter(2))  # a key's first write is kept out
    assert core.values.put(b"a", b"aaaa") and core.values.put(b"b", b"bbbb")  # evicts a
    assert ops(core) == []
    assert core.stats.counts[("admissions", "t0", "rejected")] == 1
    assert b"a" not in core.coherence.in_transit
    assert core.staging is not None and len(core.staging) == 1  # its buffer back at once


def test_a_demotion_past_the_byte_bound_is_dropped_counted_and_its_buffer_reused() -> None:
    core = core_with(max_bytes=6)
    for k in (b"a", b"b", b"c"):  # evicts a (4 bytes, queued) then b (past 6 bytes: dropped)
        assert core.values.put(k, k * 4)
    assert ops(core) == [("write", b"a", b"aaaa")]
    assert core.stats.counts[("demotions_dropped", "t0", "backlog")] == 1
    assert b"b" not in core.coherence.in_transit
    assert core.coherence.is_stale(0, b"b")  # never read there until written or removed
    assert core.staging is not None and len(core.staging) == 1


@pytest.mark.parametrize(
    ("hint", "removed"),
    [
        (lambda k: False, False),  # the tier says it has no copy: nothing to remove
        (lambda k: True, True),
        (lambda k: None, True),  # cannot tell: removed to be safe
    ],
)
def test_a_put_removes_older_copies_only_where_a_tier_may_hold_one(
    hint: Callable[[bytes], bool | None], removed: bool
) -> None:
    core = core_with(hint, num_blocks=4, tiers=2)
    assert core.values.put(b"k", b"new")
    expected = [("remove", b"k", None)] if removed else []
    assert ops(core, 0) == expected and ops(core, 1) == expected


def test_a_put_removes_the_copy_of_a_key_still_being_written_whatever_the_tier_says() -> None:
    core = core_with(num_blocks=1)
    assert core.values.put(b"k", b"old") and core.values.put(b"x", b"xxx")  # k goes down
    (written,) = core.writes.next_batch(0)  # k's write being applied
    assert core.values.put(b"k", b"new")  # evicts x, then removes k's copy below
    assert ops(core) == [("write", b"x", b"xxx")]  # the tier's other batch
    assert ops(core) == []  # the remove of k waits for k's write in flight
    core.writes.writes_applied(0, [written], [None])
    core.writes.finished(0, [written])
    assert ops(core) == [("remove", b"k", None)]


def test_a_hint_that_raises_is_counted_and_the_key_removed() -> None:
    def broken(k: bytes) -> bool:
        raise RuntimeError("index gone")

    core = core_with(broken, num_blocks=4)
    assert core.values.put(b"k", b"new")
    assert ops(core) == [("remove", b"k", None)]
    assert core.stats.counts[("tier_errors", "t0", "hint")] == 1


def test_a_tier_being_cleared_gets_a_remove_of_every_key_put() -> None:
    core = core_with(num_blocks=4)
    core.coherence.clearing(0)
    assert core.values.put(b"k", b"new")
    assert ops(core) == [("remove", b"k", None)]
