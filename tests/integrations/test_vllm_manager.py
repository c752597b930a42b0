"""vLLM's own manager test sequences, replayed through ``AiotierOffloadingManager``.

The sequences are rewritten from vLLM's tests (no vLLM import; keys are built the way those
tests build them, ``make_offload_key(str(i).encode(), 0)``):

- ``vllm-project/vllm`` ``tests/v1/kv_offload/cpu/test_manager.py`` at commit
  ``08404c27524cb1e6693730492a84c20e2bee615f``: ``test_cpu_manager``,
  ``test_already_stored_block_not_evicted_during_prepare_store``,
  ``test_prepare_load_preserves_key_order`` and ``TestARCPolicy``'s sequences. That commit's
  ``lookup`` answered ``True``/``False``/``None``; PR #46363 (June 2026) renamed those
  ``HIT``/``MISS``/``HIT_PENDING`` (a write in flight), which is what is asserted here.
- The same file as it stood after PR #45958 (July 2026): the allocation-size histogram on
  success and on eviction failure, read here from aiotier's ``aiotier_allocation_size_blocks`` and
  ``aiotier_allocation_failures_total{phase="store"}``. (The code index serves that version by
  content only; it names no commit for it.)
- ``tests/v1/kv_offload/tiering/test_tiering_offloading.py`` (structure as at commit
  ``01df2b36944ebe07b80e9f3735f9ed13f7e212cb``; answers and the three delay tests as added by
  PR #47679, July 2026): store and lookup from the primary, promotion from a secondary tier,
  partial lookup, eviction, one promotion for a block two requests look up, the sync and async
  lookup delays observed at the step end, and finishing a request with stores outstanding.

Where aiotier differs, the test says so: its slot ids are its own (an evicted block's slot is
reused first), promotions are asyncio tasks (``engine.wait`` replaces vLLM's "two more steps"),
and a finished request's delays are observed at the next ``on_schedule_end``, not at once.
Every test ends with no pinned block.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import BlockingEngine, BlockNotReadyError, MemoryTier, PrimaryTier
from aiotier.integrations.vllm import (
    AiotierOffloadingManager,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    PrepareStoreOutput,
    PrimaryLoadStoreSpec,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    VllmTypes,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from aiotier.testing import FaultyTier, MetricsProbe

HIT, MISS = LookupResult.HIT, LookupResult.MISS
HIT_PENDING, RETRY = LookupResult.HIT_PENDING, LookupResult.RETRY
_EMPTY_REQ_CTX = ReqContext(req_id="")
_CTX = ReqContext(req_id="test")
SYNC = "aiotier_lookup_sync_delay_seconds"
ASYNC = "aiotier_lookup_async_delay_seconds"


def to_key(i: int) -> OffloadKey:
    return make_offload_key(str(i).encode(), 0)


def to_keys(ints: Iterable[int]) -> list[OffloadKey]:
    return [to_key(i) for i in ints]


def ids(keys: Iterable[bytes]) -> list[int]:
    return [int(get_offload_block_hash(OffloadKey(k))) for k in keys]


def verify_store_output(
    out: PrepareStoreOutput | None, to_store: list[int], block_ids: list[int], evicted: list[int]
) -> PrepareStoreOutput:
    assert out is not None
    assert out.keys_to_store == to_keys(to_store)
    assert out.evicted_keys == to_keys(evicted)
    assert isinstance(out.store_spec, PrimaryLoadStoreSpec)
    assert list(out.store_spec.block_ids) == block_ids
    return out


def verify_events(
    events: Iterable[OffloadingEvent],
    expected_stores: tuple[set[int], ...] = (),
    expected_evictions: tuple[set[int], ...] = (),
) -> None:
    stores: list[set[int]] = []
    evictions: list[set[int]] = []
    for event in events:
        assert event.medium == "CPU"
        (evictions if event.removed else stores).append(set(ids(event.keys)))
    assert tuple(evictions) == expected_evictions
    assert tuple(stores) == expected_stores


def seeded_memory_tier(keys: Iterable[bytes], name: str = "memory") -> MemoryTier:
    """A memory tier holding ``keys`` (each block is its key), filled before any engine loop."""
    tier = MemoryTier(1 << 20, name=name)

    async def fill() -> None:
        for k in keys:
            await tier.write(k, k)

    asyncio.run(fill())
    return tier


@pytest.fixture
def probe() -> MetricsProbe:
    return MetricsProbe(InMemoryMetricReader())


def make_manager(
    num_blocks: int = 4,
    policy: str = "lru",
    secondary: Iterable[MemoryTier | FaultyTier] = (),
    probe: MetricsProbe | None = None,
    **kwargs: object,
) -> AiotierOffloadingManager:
    engine_kwargs: dict[str, object] = {}
    if probe is not None:
        engine_kwargs["meter_provider"] = MeterProvider(metric_readers=[probe.reader])
    return AiotierOffloadingManager.create(
        PrimaryTier(num_blocks, 16, policy=policy), tuple(secondary), **engine_kwargs, **kwargs
    )


@pytest.fixture
def manager() -> Iterator[AiotierOffloadingManager]:
    m = make_manager()
    yield m
    assert m.engine.stats().pinned_blocks == 0
    m.shutdown()


# -- tests/v1/kv_offload/cpu/test_manager.py ------------------------------------------------------


def test_cpu_manager(manager: AiotierOffloadingManager) -> None:
    """vLLM's ``test_cpu_manager`` (LRU, 4 blocks), step by step."""
    out = manager.prepare_store(to_keys([1, 2]), _EMPTY_REQ_CTX)
    verify_store_output(out, [1, 2], [0, 1], [])

    # lookup [1, 2] -> write in flight, not yet ready
    assert manager.lookup(to_key(1), _EMPTY_REQ_CTX) is HIT_PENDING
    assert manager.lookup(to_key(2), _EMPTY_REQ_CTX) is HIT_PENDING
    assert manager.take_events() == []

    manager.complete_store(to_keys([1, 2]), _EMPTY_REQ_CTX)
    verify_events(manager.take_events(), expected_stores=({1, 2},))
    assert manager.lookup(to_key(1), _EMPTY_REQ_CTX) is HIT
    assert manager.lookup(to_key(2), _EMPTY_REQ_CTX) is HIT
    assert manager.lookup(to_key(3), _EMPTY_REQ_CTX) is MISS

    # prepare store [2, 3, 4, 5] -> evicts [1]; aiotier reuses the evicted slot first
    # (vLLM's block ids are [2, 3, 0])
    out = manager.prepare_store(to_keys([2, 3, 4, 5]), _EMPTY_REQ_CTX)
    verify_store_output(out, [3, 4, 5], [0, 2, 3], [1])
    verify_events(manager.take_events(), expected_evictions=({1},))

    # no space: 2 is the only evictable block
    assert manager.prepare_store(to_keys([1, 6]), _EMPTY_REQ_CTX) is None

    # vLLM completes every key it prepared, 2 included (present before): 2 is left alone
    manager.complete_store(to_keys([2, 3, 4, 5]), _EMPTY_REQ_CTX)
    assert [manager.lookup(k, _EMPTY_REQ_CTX) for k in to_keys([1, 2, 3, 4, 5, 0])] == [
        MISS, HIT, HIT, HIT, HIT, MISS,
    ]  # fmt: skip

    spec = manager.prepare_load(to_keys([2, 3]), _EMPTY_REQ_CTX)
    assert isinstance(spec, PrimaryLoadStoreSpec)
    assert list(spec.block_ids) == [1, 0]  # vLLM: [1, 2] (3 went into slot 0 here)
    assert [bytes(b) for b in spec.buffers] == [b"\0" * 16, b"\0" * 16]

    # no space while [2, 3] are being loaded
    assert manager.prepare_store(to_keys([6, 7, 8]), _EMPTY_REQ_CTX) is None
    manager.complete_load(to_keys([2, 3]), _EMPTY_REQ_CTX)

    # prepare store [6, 7, 8] -> evicts [2, 3, 4] (oldest; a load does not refresh a block)
    out = manager.prepare_store(to_keys([6, 7, 8]), _EMPTY_REQ_CTX)
    verify_store_output(out, [6, 7, 8], [2, 0, 1], [2, 3, 4])  # vLLM: [3, 2, 1]
    manager.complete_store(to_keys([6, 7, 8]), _EMPTY_REQ_CTX)

    # touch [5, 6, 7]: 8 becomes the oldest
    manager.touch(to_keys([5, 6, 7]), _EMPTY_REQ_CTX)
    out = manager.prepare_store(to_keys([9]), _EMPTY_REQ_CTX)
    verify_store_output(out, [9], [1], [8])

    # complete store [7, 9] with failure: 7 (stored before) stays, 9 is freed
    manager.complete_store(to_keys([7, 9]), _EMPTY_REQ_CTX, success=False)
    assert manager.lookup(to_key(7), _EMPTY_REQ_CTX) is HIT
    assert manager.lookup(to_key(9), _EMPTY_REQ_CTX) is MISS

    verify_events(
        manager.take_events(),
        expected_stores=({3, 4, 5}, {6, 7, 8}),
        expected_evictions=({2, 3, 4}, {8}),
    )


@pytest.mark.parametrize("eviction_policy", ["lru", "arc"])
def test_already_stored_block_not_evicted_during_prepare_store(eviction_policy: str) -> None:
    m = make_manager(policy=eviction_policy)
    m.prepare_store(to_keys([1, 2]), _EMPTY_REQ_CTX)
    m.complete_store(to_keys([1, 2]), _EMPTY_REQ_CTX)
    m.touch(to_keys([1]), _EMPTY_REQ_CTX)  # 2 is now the least recently used

    # 2 is already stored: left out of keys_to_store, and not evicted either (1 is)
    out = m.prepare_store(to_keys([2, 3, 4, 5]), _EMPTY_REQ_CTX)
    verify_store_output(out, [3, 4, 5], [0, 2, 3], [1])
    m.complete_store(to_keys([2, 3, 4, 5]), _EMPTY_REQ_CTX)
    assert m.lookup(to_key(2), _EMPTY_REQ_CTX) is HIT
    assert m.engine.stats().pinned_blocks == 0
    m.shutdown()


def test_prepare_load_preserves_key_order(manager: AiotierOffloadingManager) -> None:
    """block_ids[i] belongs to keys[i], whatever the order of the keys."""
    a, b, c = to_keys([0, 1, 2])
    out = manager.prepare_store([a, b, c], _EMPTY_REQ_CTX)
    assert out is not None and isinstance(out.store_spec, PrimaryLoadStoreSpec)
    slot = dict(zip(out.keys_to_store, out.store_spec.block_ids, strict=True))
    for k, buf in zip(out.keys_to_store, out.store_spec.buffers, strict=True):
        buf[: len(k)] = k
    manager.complete_store([a, b, c], _EMPTY_REQ_CTX)

    for order in ([a, b, c], [b, c, a]):
        spec = manager.prepare_load(order, _EMPTY_REQ_CTX)
        assert isinstance(spec, PrimaryLoadStoreSpec)
        assert list(spec.block_ids) == [slot[k] for k in order]
        assert [bytes(v[: len(k)]) for k, v in zip(order, spec.buffers, strict=True)] == order
        manager.complete_load([a, b, c], _EMPTY_REQ_CTX)  # order irrelevant


class TestARCPolicy:
    """``TestARCPolicy``'s sequences through the manager (the ARC lists themselves are
    aiotier's internals: the sequences' observable answers are asserted instead)."""

    @pytest.fixture
    def arc(self) -> Iterator[AiotierOffloadingManager]:
        m = make_manager(policy="arc")
        yield m
        assert m.engine.stats().pinned_blocks == 0
        m.shutdown()

    def test_basic(self, arc: AiotierOffloadingManager) -> None:
        verify_store_output(arc.prepare_store(to_keys([1, 2]), _EMPTY_REQ_CTX), [1, 2], [0, 1], [])
        assert arc.lookup(to_key(1), _EMPTY_REQ_CTX) is HIT_PENDING
        assert arc.take_events() == []
        arc.complete_store(to_keys([1, 2]), _EMPTY_REQ_CTX)
        verify_events(arc.take_events(), expected_stores=({1, 2},))
        assert [arc.lookup(k, _EMPTY_REQ_CTX) for k in to_keys([1, 2, 3])] == [HIT, HIT, MISS]

    def test_eviction_with_load(self, arc: AiotierOffloadingManager) -> None:
        out = arc.prepare_store(to_keys([1, 2, 3, 4]), _EMPTY_REQ_CTX)
        verify_store_output(out, [1, 2, 3, 4], [0, 1, 2, 3], [])
        arc.complete_store(to_keys([1, 2, 3, 4]), _EMPTY_REQ_CTX)
        spec = arc.prepare_load(to_keys([2, 3]), _EMPTY_REQ_CTX)
        assert isinstance(spec, PrimaryLoadStoreSpec) and list(spec.block_ids) == [1, 2]
        # [2, 3] are being loaded: three new blocks cannot fit
        assert arc.prepare_store(to_keys([5, 6, 7]), _EMPTY_REQ_CTX) is None
        arc.complete_load(to_keys([2, 3]), _EMPTY_REQ_CTX)
        out = arc.prepare_store(to_keys([5, 6, 7]), _EMPTY_REQ_CTX)
        verify_store_output(out, [5, 6, 7], [2, 1, 0], [1, 2, 3])
        arc.complete_store(to_keys([5, 6, 7]), _EMPTY_REQ_CTX)

    def test_touch_ordering(self, arc: AiotierOffloadingManager) -> None:
        arc.prepare_store(to_keys([1, 2, 3, 4]), _EMPTY_REQ_CTX)
        arc.complete_store(to_keys([1, 2, 3, 4]), _EMPTY_REQ_CTX)
        arc.touch(to_keys([3, 4]), _EMPTY_REQ_CTX)
        arc.touch(to_keys([1, 3, 4]), _EMPTY_REQ_CTX)  # 2 alone is seen once
        out = arc.prepare_store(to_keys([5]), _EMPTY_REQ_CTX)
        verify_store_output(out, [5], [1], [2])  # reuses block 2's storage, as in vLLM
        arc.complete_store(to_keys([5]), _EMPTY_REQ_CTX)

    def test_failed_store(self, arc: AiotierOffloadingManager) -> None:
        arc.prepare_store(to_keys([1, 2, 3, 4]), _EMPTY_REQ_CTX)
        arc.complete_store(to_keys([1, 2, 3, 4]), _EMPTY_REQ_CTX)
        out = arc.prepare_store(to_keys([5]), _EMPTY_REQ_CTX)
        verify_store_output(out, [5], [0], [1])
        arc.complete_store(to_keys([5]), _EMPTY_REQ_CTX, success=False)
        assert arc.lookup(to_key(5), _EMPTY_REQ_CTX) is MISS
        assert arc.lookup(to_key(1), _EMPTY_REQ_CTX) is MISS  # the evicted block stays gone

    def test_full_scenario(self, arc: AiotierOffloadingManager) -> None:
        arc.prepare_store(to_keys([1, 2]), _EMPTY_REQ_CTX)
        arc.complete_store(to_keys([1, 2]), _EMPTY_REQ_CTX)
        out = arc.prepare_store(to_keys([3, 4, 5]), _EMPTY_REQ_CTX)
        verify_store_output(out, [3, 4, 5], [0, 2, 3], [1])
        arc.complete_store(to_keys([3, 4, 5]), _EMPTY_REQ_CTX)
        arc.touch(to_keys([2, 3]), _EMPTY_REQ_CTX)  # 2 and 3 are seen twice
        out = arc.prepare_store(to_keys([6]), _EMPTY_REQ_CTX)
        verify_store_output(out, [6], [2], [4])  # 4 is the oldest block seen once
        arc.complete_store(to_keys([6]), _EMPTY_REQ_CTX)
        assert arc.lookup(to_key(2), _EMPTY_REQ_CTX) is HIT
        assert arc.lookup(to_key(3), _EMPTY_REQ_CTX) is HIT
        verify_events(
            arc.take_events(),
            expected_stores=({1, 2}, {3, 4, 5}, {6}),
            expected_evictions=({1}, {4}),
        )


# -- PR #45958: allocation size and allocation failures -------------------------------------------

ALLOCATION_SIZE = "aiotier_allocation_size_blocks"
ALLOCATION_FAILURES = "aiotier_allocation_failures_total"


def test_allocation_size_histogram(probe: MetricsProbe) -> None:
    m = make_manager(probe=probe)
    m.prepare_store(to_keys([1, 2]), _EMPTY_REQ_CTX)
    m.complete_store(to_keys([1, 2]), _EMPTY_REQ_CTX)
    m.prepare_store(to_keys([1, 2, 3]), _EMPTY_REQ_CTX)  # one new block
    m.on_schedule_end(ScheduleEndContext(new_req_ids=()))
    assert (probe.count(ALLOCATION_SIZE), probe.sum(ALLOCATION_SIZE)) == (2, 3)
    assert probe.value(ALLOCATION_FAILURES) == 0
    m.complete_store(to_keys([1, 2, 3]), _EMPTY_REQ_CTX)
    assert m.engine.stats().pinned_blocks == 0
    m.shutdown()


def test_allocation_size_and_failure_on_eviction_failure(probe: MetricsProbe) -> None:
    m = make_manager(num_blocks=1, probe=probe)
    m.prepare_store(to_keys([1]), _EMPTY_REQ_CTX)
    assert m.prepare_store(to_keys([2]), _EMPTY_REQ_CTX) is None  # 1 is pinned by its store
    m.on_schedule_end(ScheduleEndContext(new_req_ids=()))
    assert (probe.count(ALLOCATION_SIZE), probe.sum(ALLOCATION_SIZE)) == (2, 2)
    assert probe.value(ALLOCATION_FAILURES, phase="store") == 1
    m.complete_store(to_keys([1]), _EMPTY_REQ_CTX)
    assert m.engine.stats().pinned_blocks == 0
    m.shutdown()


# -- tests/v1/kv_offload/tiering/test_tiering_offloading.py ---------------------------------------


class TestTieringOffloadingManager:
    """A 5-block primary over a memory tier (vLLM: two example secondary tiers) whose reads
    take 0.1 s, so a promotion is still in flight when the next lookup comes."""

    @pytest.fixture
    def below(self) -> FaultyTier:
        return FaultyTier(seeded_memory_tier(to_keys(range(3)))).delay("read", 0.1)

    @pytest.fixture
    def tiering(self, below: FaultyTier, probe: MetricsProbe) -> Iterator[AiotierOffloadingManager]:
        m = make_manager(num_blocks=5, secondary=[below], probe=probe)
        yield m
        m.on_schedule_end(ScheduleEndContext(new_req_ids=()))  # let finished requests go
        m.engine.wait(to_keys(range(10)), timeout=5)
        assert m.engine.stats().pinned_blocks == 0
        m.shutdown()

    def test_basic_store_and_lookup_from_primary(self, tiering: AiotierOffloadingManager) -> None:
        blocks = to_keys(range(10, 13))
        assert tiering.on_new_request(_CTX) == RequestOffloadingContext()
        out = tiering.prepare_store(blocks, _CTX)
        assert out is not None and len(out.keys_to_store) == 3
        tiering.complete_store(blocks, _CTX, success=True)
        assert tiering.count_hits(blocks, _CTX) == 3
        assert [tiering.lookup(k, _CTX) for k in blocks] == [HIT, HIT, HIT]

    def test_partial_lookup(self, tiering: AiotierOffloadingManager) -> None:
        blocks = to_keys(range(10, 15))
        tiering.prepare_store(blocks[:3], _CTX)
        tiering.complete_store(blocks[:3], _CTX, success=True)
        assert tiering.count_hits(blocks, _CTX) == 3

    def test_promotion_from_secondary(self, tiering: AiotierOffloadingManager) -> None:
        blocks = to_keys(range(3))
        # each lookup starts the promotion of its block
        assert [tiering.lookup(k, _CTX) for k in blocks] == [RETRY, RETRY, RETRY]
        assert tiering.count_hits(blocks, _CTX) is None  # still on their way
        assert [r.name for r in tiering.engine.wait(blocks, timeout=5)] == ["HIT"] * 3
        assert tiering.count_hits(blocks, _CTX) == 3
        spec = tiering.prepare_load(blocks, _CTX)
        assert isinstance(spec, PrimaryLoadStoreSpec)
        assert [bytes(b) for b in spec.buffers] == blocks  # the bytes the tier held
        tiering.complete_load(blocks, _CTX)
        tiering.on_request_finished(_CTX)

    def test_shared_block_is_promoted_once(
        self, tiering: AiotierOffloadingManager, below: FaultyTier
    ) -> None:
        """Two requests look up one block: the first starts its promotion (RETRY), the second
        finds it on its way into the primary (HIT_PENDING); the tier is read once."""
        shared = to_key(0)
        ctx_a, ctx_b = ReqContext(req_id="req_a"), ReqContext(req_id="req_b")
        assert tiering.lookup(shared, ctx_a) is RETRY
        assert tiering.lookup(shared, ctx_b) is HIT_PENDING
        tiering.engine.wait([shared], timeout=5)
        assert tiering.lookup(shared, ctx_a) is HIT
        assert tiering.lookup(shared, ctx_b) is HIT
        assert tiering.engine.stats().counters[("promotions", below.name, "ok")] == 1
        assert below.calls["read"] == 1
        tiering.on_request_finished(ctx_a)
        tiering.on_request_finished(ctx_b)

    def test_eviction_in_primary_tier(self, tiering: AiotierOffloadingManager) -> None:
        blocks = to_keys(range(10, 15))
        out = tiering.prepare_store(blocks, _CTX)
        assert out is not None and len(out.keys_to_store) == 5
        tiering.complete_store(blocks, _CTX, success=True)
        tiering.on_schedule_end(ScheduleEndContext(new_req_ids=()))
        out = tiering.prepare_store(to_keys(range(15, 17)), _CTX)
        verify_store_output(out, [15, 16], [1, 0], [10, 11])
        tiering.complete_store(to_keys(range(15, 17)), _CTX)
        # write-back: the evicted blocks went down to the memory tier, and come back up
        tiering.engine.flush()
        assert tiering.lookup(to_key(10), _CTX) is RETRY
        tiering.engine.wait([to_key(10)], timeout=5)
        assert tiering.lookup(to_key(10), _CTX) is HIT
        tiering.on_request_finished(_CTX)

    def test_lookup_reports_sync_delay_for_resolved_lookups(
        self, tiering: AiotierOffloadingManager, probe: MetricsProbe
    ) -> None:
        tiering.on_new_request(_CTX)
        for block in to_keys(range(20, 22)):  # no tier has them: misses after asking below
            assert tiering.lookup(block, _CTX) is MISS
        assert probe.count(SYNC) == 0  # nothing is observed before the step ends
        tiering.on_schedule_end(ScheduleEndContext(new_req_ids=[_CTX.req_id]))
        assert probe.count(SYNC) == 1  # one sample: the request's lookups summed
        assert probe.count(ASYNC) == 0
        tiering.on_request_finished(_CTX)

    def test_lookup_reports_async_delay_across_promotion(
        self, tiering: AiotierOffloadingManager, probe: MetricsProbe
    ) -> None:
        block = to_key(0)
        tiering.on_new_request(_CTX)
        assert tiering.lookup(block, _CTX) is RETRY
        tiering.on_schedule_end(ScheduleEndContext(new_req_ids=[_CTX.req_id]))
        assert (probe.count(SYNC), probe.count(ASYNC)) == (1, 1)
        tiering.engine.wait([block], timeout=5)
        tiering.on_schedule_end(ScheduleEndContext(new_req_ids=()))
        assert tiering.lookup(block, _CTX) is HIT
        tiering.on_schedule_end(ScheduleEndContext(new_req_ids=()))
        assert (probe.count(SYNC), probe.count(ASYNC)) == (1, 1)  # each interval once
        tiering.on_request_finished(_CTX)

    def test_lookup_reports_async_delay_on_request_finish(
        self, tiering: AiotierOffloadingManager, probe: MetricsProbe
    ) -> None:
        ctx = ReqContext(req_id="req_lookup_finish")
        block = to_key(0)
        tiering.on_new_request(ctx)
        assert tiering.lookup(block, ctx) is RETRY
        tiering.on_schedule_end(ScheduleEndContext(new_req_ids=()))
        assert (probe.count(SYNC), probe.count(ASYNC)) == (0, 0)
        # the request finishes before it is ever scheduled: vLLM observes at once, aiotier at
        # the next step end (has_pending_work keeps vLLM stepping until then)
        tiering.on_request_finished(ctx)
        assert tiering.has_pending_work()
        tiering.on_schedule_end(ScheduleEndContext(new_req_ids=()))
        assert not tiering.has_pending_work()
        assert (probe.count(SYNC), probe.count(ASYNC)) == (1, 1)

    def test_finish_waits_for_outstanding_stores(self, tiering: AiotierOffloadingManager) -> None:
        """vLLM may complete a store after the request finished; aiotier would abort a finished
        request's pending stores, so the finish is held back until the store completes."""
        ctx = ReqContext(req_id="req_delayed")
        blocks = to_keys(range(30, 32))
        tiering.on_new_request(ctx)
        out = tiering.prepare_store(blocks, ctx)
        assert out is not None
        tiering.on_request_finished(ctx)
        tiering.on_schedule_end(ScheduleEndContext(new_req_ids=()))
        assert not tiering.has_pending_work()  # held back, not queued
        assert tiering.engine.stats().pinned_blocks == 2  # still being written
        for k, buf in zip(out.keys_to_store, out.store_spec.buffers, strict=True):
            buf[: len(k)] = k
        tiering.complete_store(blocks, ctx, success=True)
        assert tiering.has_pending_work()
        tiering.on_schedule_end(ScheduleEndContext(new_req_ids=()))
        assert tiering.engine.stats().pinned_blocks == 0
        spec = tiering.prepare_load(blocks, _CTX)
        assert [bytes(b[:6]) for b in spec.buffers] == blocks
        tiering.complete_load(blocks, _CTX)

    def test_failed_store_finalizes_finished_request(
        self, tiering: AiotierOffloadingManager
    ) -> None:
        ctx = ReqContext(req_id="req_failed_store")
        blocks = to_keys(range(30, 32))
        tiering.prepare_store(blocks, ctx)
        tiering.on_request_finished(ctx)
        assert not tiering.has_pending_work()
        tiering.complete_store(blocks, ctx, success=False)
        assert tiering.has_pending_work()
        assert [tiering.lookup(k, _CTX) for k in blocks] == [MISS, MISS]

    def test_zero_store_request_finalizes_at_the_next_step(
        self, tiering: AiotierOffloadingManager
    ) -> None:
        ctx = ReqContext(req_id="req_zero_store")
        tiering.on_new_request(ctx)
        tiering.on_request_finished(ctx)
        assert tiering.has_pending_work()
        tiering.on_schedule_end(ScheduleEndContext(new_req_ids=()))
        assert not tiering.has_pending_work()


# -- the bridges between vLLM's contract and aiotier's --------------------------------------------


def test_keys_are_vllm_bytes(manager: AiotierOffloadingManager) -> None:
    key = make_offload_key(b"\x01" * 32, 3)
    assert get_offload_block_hash(key) == b"\x01" * 32 and get_offload_group_idx(key) == 3
    out = manager.prepare_store([bytearray(key)], _CTX)  # bytes-like keys are the same key
    assert out is not None and out.keys_to_store == [key]
    manager.complete_store([memoryview(key)], _CTX)
    assert manager.lookup(key, _CTX) is HIT
    with pytest.raises(TypeError, match="vLLM block keys are bytes"):
        manager.lookup(17, _CTX)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a single key"):
        manager.prepare_load(key, _CTX)
    with pytest.raises(TypeError, match="req_id"):
        manager.lookup(key, SimpleNamespace(id="x"))
    with pytest.raises(BlockNotReadyError):
        manager.prepare_load([key, to_key(99)], _CTX)  # nothing pinned
    manager.on_request_finished(_CTX)
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=()))


def test_complete_store_completes_only_what_the_request_allocated(
    manager: AiotierOffloadingManager,
) -> None:
    """Two requests store the same block: the second one's complete_store (vLLM passes every
    key it prepared) must not mark the first one's half-written block loadable."""
    ctx_a, ctx_b = ReqContext(req_id="a"), ReqContext(req_id="b")
    out_a = manager.prepare_store(to_keys([1]), ctx_a)
    out_b = manager.prepare_store(to_keys([1, 2]), ctx_b)
    assert out_a is not None and out_a.keys_to_store == to_keys([1])
    assert out_b is not None and out_b.keys_to_store == to_keys([2])
    manager.complete_store(to_keys([1, 2]), ctx_b)
    assert manager.lookup(to_key(1), ctx_b) is HIT_PENDING  # still a's, still being written
    assert manager.lookup(to_key(2), ctx_b) is HIT
    manager.complete_store(to_keys([1]), ctx_a)
    assert manager.lookup(to_key(1), ctx_b) is HIT
    for ctx in (ctx_a, ctx_b):
        manager.on_request_finished(ctx)
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=()))


def test_events_of_secondary_tiers_name_their_medium() -> None:
    m = make_manager(num_blocks=1, secondary=[MemoryTier(1 << 20)], media={"memory": "DRAM"})
    m.prepare_store(to_keys([1]), _CTX)
    m.complete_store(to_keys([1]), _CTX)
    m.prepare_store(to_keys([2]), _CTX)  # evicts 1, written back to the memory tier
    m.complete_store(to_keys([2]), _CTX)
    m.engine.flush()
    events = [(ids(e.keys), e.medium, e.removed) for e in m.take_events()]
    # the write below lands on the engine's loop, before or after the second store completes
    assert [e for e in events if e[1] == "CPU"] == [
        ([1], "CPU", False), ([1], "CPU", True), ([2], "CPU", False),
    ]  # fmt: skip
    assert [e for e in events if e[1] != "CPU"] == [([1], "DRAM", False)]
    m.on_request_finished(_CTX)
    m.on_schedule_end()
    assert m.engine.stats().pinned_blocks == 0
    m.shutdown()


def test_events_can_be_switched_off() -> None:
    m = make_manager(enable_events=False)
    m.prepare_store(to_keys([1]), _CTX)
    m.complete_store(to_keys([1]), _CTX)
    assert m.take_events() == []
    assert m.engine.take_events() == []  # drained all the same: nothing piles up
    m.shutdown()


def test_vllm_types_from_a_module() -> None:
    """With vLLM's classes (here a module-like stand-in of ``vllm.v1.kv_offload.base``), the
    manager answers with them: vLLM's scheduler compares enum members by identity."""

    class VLookupResult(Enum):
        MISS = 1
        HIT = 2
        HIT_PENDING = 3
        RETRY = 4

    class VMedium(Enum):
        CPU = "CPU"
        STORAGE = "STORAGE"

    class VLoadStoreSpec:
        pass

    @dataclass
    class VPrepareStoreOutput:
        keys_to_store: list[bytes]
        store_spec: VLoadStoreSpec
        evicted_keys: list[bytes]

    @dataclass
    class VOffloadingEvent:
        keys: list[bytes]
        medium: VMedium
        removed: bool

    @dataclass
    class VRequestOffloadingContext:
        policy: str = "block_level"

    base = SimpleNamespace(
        LookupResult=VLookupResult,
        Medium=VMedium,
        LoadStoreSpec=VLoadStoreSpec,
        PrepareStoreOutput=VPrepareStoreOutput,
        OffloadingEvent=VOffloadingEvent,
        RequestOffloadingContext=VRequestOffloadingContext,
    )
    below = seeded_memory_tier(to_keys([5]), name="ssd-ish")
    engine = BlockingEngine(PrimaryTier(1, 16), [below])
    m = AiotierOffloadingManager(engine, types=VllmTypes.from_module(base))
    assert m.on_new_request(_CTX) == VRequestOffloadingContext()
    out = m.prepare_store(to_keys([1]), _CTX)
    assert isinstance(out, VPrepareStoreOutput)
    assert isinstance(out.store_spec, VLoadStoreSpec)
    assert isinstance(out.store_spec, PrimaryLoadStoreSpec) and out.store_spec.medium() == "CPU"
    assert m.lookup(to_key(1), _CTX) is VLookupResult.HIT_PENDING
    m.complete_store(to_keys([1]), _CTX)
    assert m.lookup(to_key(1), _CTX) is VLookupResult.HIT
    assert m.lookup(to_key(5), _CTX) is VLookupResult.RETRY  # evicts 1 to promote 5
    engine.wait(to_keys([5]), timeout=5)
    engine.flush()
    events = m.take_events()
    assert all(isinstance(e, VOffloadingEvent) for e in events)
    assert {(e.medium, e.removed) for e in events} == {
        (VMedium.CPU, False), (VMedium.CPU, True), (VMedium.STORAGE, False),
    }  # fmt: skip
    m.on_request_finished(_CTX)
    m.on_schedule_end()
    assert engine.stats().pinned_blocks == 0
    m.shutdown()  # not the manager's engine: left open
    assert engine.lookup(to_key(5)).name == "HIT"
    engine.close()

    with pytest.raises(TypeError, match="PR #46363"):
        VllmTypes.from_module(SimpleNamespace(__name__="vllm.v1.kv_offload.abstract"))


def test_reset_cache_drops_every_block_from_every_tier() -> None:
    tier = seeded_memory_tier(to_keys([7, 8]))
    m = make_manager(secondary=[tier])
    try:
        out = m.prepare_store(to_keys([1, 2]), _EMPTY_REQ_CTX)
        assert out is not None
        m.complete_store(to_keys([1, 2]), _EMPTY_REQ_CTX)
        m.take_events()
        m.reset_cache()
        verify_events(m.take_events(), expected_evictions=({1, 2},))
        assert [m.lookup(k, _EMPTY_REQ_CTX) for k in to_keys([1, 2, 7, 8])] == [MISS] * 4
        assert tier.usage().blocks == 0
        # storing goes on as before
        out = m.prepare_store(to_keys([3]), _EMPTY_REQ_CTX)
        assert out is not None
        m.complete_store(to_keys([3]), _EMPTY_REQ_CTX)
        assert m.lookup(to_key(3), _EMPTY_REQ_CTX) is HIT
    finally:
        m.shutdown()


def test_what_aiotier_does_not_do(manager: AiotierOffloadingManager) -> None:
    assert manager.get_stats() is None
    assert not manager.has_pending_work()
    with pytest.raises(TypeError, match="BlockingEngine"):
        AiotierOffloadingManager(object())  # type: ignore[arg-type]


def test_many_scheduler_threads_over_a_slow_faulty_tier() -> None:
    """Requests on four threads at once, each the way vLLM's scheduler drives one: look up
    the prefix (deferring on RETRY/HIT_PENDING), load what hits, store the rest, finish. The
    tier below is slow and fails one read in five. Every loaded block holds its own bytes and
    nothing stays pinned."""
    keys = to_keys(range(24))
    tier = FaultyTier(seeded_memory_tier(keys[:12]), seed=7).delay("read", 0.002)
    tier.fail("read", probability=0.2)
    m = make_manager(num_blocks=16, secondary=[tier], backoff_seconds=0.01)
    errors: list[BaseException] = []
    races: list[str] = []

    def request(n: int) -> None:
        ctx = ReqContext(req_id=f"r{n}")
        prefix = keys[(n * 3) % 12 :][:10]
        m.on_new_request(ctx)
        for _ in range(50):
            try:
                serve(ctx, prefix)
                return
            except BlockNotReadyError:
                # another thread's store evicted a block between this thread's lookup and its
                # load (vLLM's single scheduler thread never interleaves them): look up again
                races.append(ctx.req_id)
        raise AssertionError(f"{ctx.req_id} never got its blocks loaded")

    def serve(ctx: ReqContext, prefix: list[OffloadKey]) -> None:
        for _ in range(200):
            answers = []
            for k in prefix:
                answers.append(m.lookup(k, ctx))
                if answers[-1] is MISS:
                    break
            if HIT_PENDING in answers or RETRY in answers:
                m.engine.wait(prefix, timeout=5)
                continue
            break
        else:
            raise AssertionError(f"{ctx.req_id}: its lookups never settled")
        hits = answers.index(MISS) if MISS in answers else len(answers)
        if hits:
            spec = m.prepare_load(prefix[:hits], ctx)
            loaded = zip(prefix[:hits], spec.buffers, strict=True)
            assert [bytes(b[: len(k)]) for k, b in loaded] == prefix[:hits]
            m.complete_load(prefix[:hits], ctx)
        out = m.prepare_store(prefix[hits:], ctx)
        if out is not None:
            for k, buf in zip(out.keys_to_store, out.store_spec.buffers, strict=True):
                buf[: len(k)] = k
            m.complete_store(prefix[hits:], ctx, success=True)
        m.on_request_finished(ctx)

    def run(n: int) -> None:
        try:
            for i in range(6):
                request(n + 4 * i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        m.on_schedule_end(ScheduleEndContext(new_req_ids=()))
        threads[0].join(0.005)
    for t in threads:
        t.join()
    assert errors == []
    counters = m.engine.stats().counters
    assert counters[("promotions", "memory", "ok")] >= 1  # blocks did come up from below
    m.on_schedule_end(ScheduleEndContext(new_req_ids=()))
    m.engine.wait(keys, timeout=5)
    assert not m.has_pending_work()
    assert m.engine.stats().pinned_blocks == 0
    m.shutdown()


class _PicklableVllmSpec:
    """Stands for vLLM's ``LoadStoreSpec``: a module-level class, as pickle needs."""


def test_specs_pickle_to_a_worker_process_as_their_slot_ids() -> None:
    # vLLM's multiprocess executor pickles the connector metadata, specs included, to workers
    base_spec = VllmTypes.from_module(
        SimpleNamespace(
            LookupResult=SimpleNamespace(__members__=dict.fromkeys(
                ("MISS", "HIT", "HIT_PENDING", "RETRY"))),
            LoadStoreSpec=_PicklableVllmSpec, PrepareStoreOutput=PrepareStoreOutput,
            OffloadingEvent=OffloadingEvent, RequestOffloadingContext=RequestOffloadingContext,
        )
    ).load_store_spec  # fmt: skip
    engine = BlockingEngine(PrimaryTier(4, 16))
    for types in (VllmTypes(), VllmTypes(load_store_spec=base_spec)):
        m = AiotierOffloadingManager(engine, types=types)
        out = m.prepare_store(to_keys([1, 2]), _CTX)
        assert out is not None
        sent = pickle.loads(pickle.dumps(out.store_spec))
        assert type(sent) is type(out.store_spec)
        assert sent.block_ids == out.store_spec.block_ids and sent.buffers == ()
        assert isinstance(sent, PrimaryLoadStoreSpec)
        if types.load_store_spec is base_spec:
            assert isinstance(sent, _PicklableVllmSpec)
        m.complete_store(to_keys([1, 2]), _CTX)
        engine.clear()
    engine.close()
