"""Write batches of one tier applied at once share no key: a batch ends before an op whose key
is in a batch being applied, so two writes (or a write and a remove) of a key are never in
flight together and land in the order they were queued. Driven by hand, no event loop."""

from __future__ import annotations

from aiotier import PrimaryTier
from aiotier._core.engine_core import EngineCore
from aiotier._core.writeback import OpKind, WriteOp, remove, write


def core_with(notified: list[int] | None = None) -> EngineCore:
    primary = PrimaryTier(4, 8)
    return EngineCore(
        primary.arena,
        primary.table,
        tier_names=["disk"],
        hints=[lambda k: None],
        notify=(notified.append if notified is not None else lambda ti: None),
    )


def keys(batch: list[WriteOp]) -> list[tuple[str, bytes]]:
    return [(op.kind.value, op.key) for op in batch]


def test_a_batch_ends_before_a_key_that_is_in_flight_and_takes_it_once_that_batch_ended() -> None:
    writes = core_with().writes
    for k in (b"a", b"b"):
        assert writes.push(0, write(k, b"1"))
    first = writes.next_batch(0)
    assert keys(first) == [("write", b"a"), ("write", b"b")]
    for k in (b"c", b"a", b"d"):
        assert writes.push(0, write(k, b"2"))
    second = writes.next_batch(0)
    assert keys(second) == [("write", b"c")]  # a's newer write waits for its older one
    assert writes.next_batch(0) == []  # its head is a key in flight
    writes.writes_applied(0, first, [None, None])
    writes.finished(0, first)
    assert keys(writes.next_batch(0)) == [("write", b"a"), ("write", b"d")]


def test_a_remove_waits_for_the_write_of_its_key_in_flight() -> None:
    writes = core_with().writes
    assert writes.push(0, write(b"a", b"1"))
    first = writes.next_batch(0)
    assert writes.push(0, remove(b"a"))
    assert writes.next_batch(0) == []
    writes.finished(0, first)
    assert keys(writes.next_batch(0)) == [("remove", b"a")]


def test_dropping_the_queue_keeps_the_keys_of_a_batch_in_flight_in_flight() -> None:
    writes = core_with().writes
    assert writes.push(0, write(b"a", b"1"))
    first = writes.next_batch(0)
    assert writes.push(0, write(b"a", b"2"))
    assert writes.drop_all(failed=False) == 1
    assert writes.push(0, write(b"a", b"3"))
    assert writes.next_batch(0) == []  # the first write of a is still being applied
    writes.finished(0, first)
    (op,) = writes.next_batch(0)
    assert op.kind is OpKind.WRITE and op.data == b"3"


def test_writers_are_notified_when_the_queue_was_empty() -> None:
    notified: list[int] = []
    writes = core_with(notified).writes
    assert writes.push(0, write(b"a", b"1"))
    assert writes.push(0, write(b"b", b"1"))  # a writer is on its way: no second call
    assert notified == [0]
    writes.finished(0, writes.next_batch(0))
    assert writes.push(0, write(b"c", b"1"))
    assert notified == [0, 0]
