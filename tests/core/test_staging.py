"""Staging buffers: blocks evicted under write-back are copied into buffers the engine reuses,
and a buffer is reused only once nothing can see it any more. Driven by hand, no event loop."""

from __future__ import annotations

from aiotier import PrimaryTier
from aiotier._core.engine_core import EngineCore
from aiotier._core.staging import StagingBuffers


def test_a_released_buffer_is_the_next_one_copied_into() -> None:
    pool = StagingBuffers(8, max_free=1)
    first = pool.copy(memoryview(b"abc"))
    assert first == b"abc" and first.nbytes == 3
    pool.release(first)
    assert len(pool) == 1
    second = pool.copy(memoryview(b"12345678"))
    assert second.obj is first.obj and second == b"12345678"
    assert len(pool) == 0


def test_the_free_list_keeps_at_most_max_free_buffers() -> None:
    pool = StagingBuffers(4, max_free=2)
    views = [pool.copy(memoryview(b"x")) for _ in range(5)]
    for v in views:
        pool.release(v)
    assert len(pool) == 2


def core_with(num_blocks: int = 1, *, stage: bool = True) -> EngineCore:
    primary = PrimaryTier(num_blocks, 8)
    return EngineCore(
        primary.arena,
        primary.table,
        tier_names=["disk"],
        hints=[lambda k: False],  # the tier holds nothing: a put queues no remove
        max_pending_write_bytes=64,
        stage_demotions=stage,
    )


def test_a_demotion_written_gives_its_buffer_back() -> None:
    core = core_with()
    assert core.values.put(b"a", b"aaaa") and core.values.put(b"b", b"bbbb")  # evicts a
    (op,) = core.writes.next_batch(0)
    assert isinstance(op.data, memoryview) and op.data == b"aaaa"
    core.writes.writes_applied(0, [op], [None])
    core.writes.finished(0, [op])
    assert core.staging is not None and len(core.staging) == 1
    assert core.values.put(b"c", b"cccc")  # evicts b into the very buffer a used
    (op2,) = core.writes.next_batch(0)
    assert op2.data is not None and op2.data == b"bbbb"
    assert isinstance(op2.data, memoryview) and op2.data.obj is op.data.obj
    assert len(core.staging) == 0


def test_a_buffer_the_tier_may_still_hold_is_never_reused() -> None:
    core = core_with()
    assert core.values.put(b"a", b"aaaa") and core.values.put(b"b", b"bbbb")
    (op,) = core.writes.next_batch(0)
    core.writes.writes_applied(0, [op], [TimeoutError()])
    core.writes.finished(0, [op], released=False)  # the call timed out on a thread
    assert core.staging is not None and len(core.staging) == 0
    assert core.values.put(b"c", b"cccc")
    (op2,) = core.writes.next_batch(0)
    assert isinstance(op.data, memoryview) and isinstance(op2.data, memoryview)
    assert op2.data.obj is not op.data.obj and op.data == b"aaaa"


def test_bytes_on_their_way_down_leave_the_engine_as_a_copy() -> None:
    core = core_with()
    assert core.values.put(b"a", b"aaaa") and core.values.put(b"b", b"bbbb")
    (op,) = core.writes.next_batch(0)
    got = core.coherence.down_copy(b"a")
    assert type(got) is bytes and got == b"aaaa"
    core.writes.writes_applied(0, [op], [None])
    core.writes.finished(0, [op])
    assert core.values.put(b"c", b"cccc")  # the buffer now holds b's bytes
    assert got == b"aaaa"


def test_a_buffer_still_served_from_memory_is_not_reused() -> None:
    core = core_with(num_blocks=2)
    put = core.values.put
    assert put(b"a", b"aaaa") and put(b"b", b"bbbb") and put(b"c", b"cccc")
    (op,) = core.writes.next_batch(0)  # a's write to the tier...
    core.coherence.write_queued(0, b"a")  # ...while another write of a is still queued
    core.writes.writes_applied(0, [op], [None])
    core.writes.finished(0, [op])
    assert core.coherence.in_transit[b"a"] is op.data  # still served from memory
    assert core.staging is not None and len(core.staging) == 0


def test_a_first_tier_that_keeps_its_bytes_gets_bytes_of_their_own() -> None:
    core = core_with(stage=False)
    assert core.staging is None
    assert core.values.put(b"a", b"aaaa") and core.values.put(b"b", b"bbbb")
    (op,) = core.writes.next_batch(0)
    assert type(op.data) is bytes and op.data == b"aaaa"


def test_a_step_boundary_lets_half_the_buffers_the_step_did_not_use_go() -> None:
    pool = StagingBuffers(4, max_free=16)
    views = [pool.copy(memoryview(b"x")) for _ in range(9)]
    for v in views:
        pool.release(v)
    pool.trim()  # nine copies this step: all nine kept
    assert len(pool) == 9
    pool.release(pool.copy(memoryview(b"y")))
    pool.trim()  # one copy this step: 8 beyond it, half of them go
    assert len(pool) == 5
    for expected in (2, 1, 0, 0):  # idle steps: the memory goes back
        pool.trim()
        assert len(pool) == expected


def test_end_step_trims_the_engine_s_staging_buffers() -> None:
    core = core_with()
    assert core.values.put(b"a", b"aaaa") and core.values.put(b"b", b"bbbb")
    (op,) = core.writes.next_batch(0)
    core.writes.writes_applied(0, [op], [None])
    core.writes.finished(0, [op])
    assert core.staging is not None and len(core.staging) == 1
    core.end_step((), ())  # the step copied one block: its buffer stays
    assert len(core.staging) == 1
    core.end_step((), ())  # nothing copied since: let go
    assert len(core.staging) == 0


def test_buffers_released_together_fill_the_free_list_up_to_max_free() -> None:
    pool = StagingBuffers(4, max_free=2)
    views = [pool.copy(memoryview(b"x")) for _ in range(3)]
    pool.release_many(views)
    assert len(pool) == 2
    assert pool.copy(memoryview(b"y")).obj is views[1].obj  # the last one kept comes first
    pool.release_many([memoryview(b"not ours")])  # a view of anything else is not kept
    assert len(pool) == 1
