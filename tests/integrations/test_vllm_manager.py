"""How ``AiotierOffloadingManager`` bridges vLLM's contract and aiotier's.

vLLM's own test sequences are replayed in ``test_vllm_cpu_manager.py`` and
``test_vllm_tiering.py``; these tests cover what only aiotier has: its metrics through
OpenTelemetry, keys as bytes, stores completed per request, finishes held back for transfers
in flight, resets that cancel what vLLM never completes, vLLM's classes taken from its module,
specs pickled to a worker, many scheduler threads. Every test ends with no pinned block.
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
from helpers import write_one
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import BlockingEngine, BlockNotReadyError, MemoryTier, PrimaryTier
from aiotier.integrations.vllm import (
    AiotierOffloadingManager,
    LookupResult,
    Medium,
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
            await write_one(tier, k, k)

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


# -- aiotier's own metrics, through OpenTelemetry -----------------------------------------------

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


class TestDelaysAndFinishes:
    """aiotier's lookup delays and finishes over a 5-block primary and a memory tier whose
    reads take 0.1 s, so a promotion is still in flight when the next lookup comes."""

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
        assert tiering.lookup(block, _CTX) is HIT_PENDING  # its promotion started
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
        assert tiering.lookup(block, ctx) is HIT_PENDING
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
    events = [(ids(e.keys), e.medium, e.removed, e.ownership) for e in m.take_events()]
    cpu = Medium.CPU
    # the write below lands on the engine's loop, before or after the second store completes
    assert [e for e in events if e[1] == cpu] == [
        ([1], cpu, False, None), ([1], cpu, True, None), ([2], cpu, False, None),
    ]  # fmt: skip
    assert [e for e in events if e[1] != cpu] == [([1], "DRAM", False, "memory")]
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
    # evicts 1 to promote 5 (a read from memory may have landed before the answer)
    assert m.lookup(to_key(5), _CTX) in (VLookupResult.HIT_PENDING, VLookupResult.HIT)
    engine.wait(to_keys([5]), timeout=5)
    engine.flush()
    events = m.take_events()
    assert all(isinstance(e, VOffloadingEvent) for e in events)
    # 1 stored and evicted from the primary, written back to the memory tier (CPU too)
    assert sorted((ids(e.keys), e.removed) for e in events) == [
        ([1], False), ([1], False), ([1], True),
    ]  # fmt: skip
    assert {e.medium for e in events} == {VMedium.CPU}
    m.on_request_finished(_CTX)
    m.on_schedule_end()
    assert engine.stats().pinned_blocks == 0
    m.shutdown()  # not the manager's engine: left open
    assert engine.lookup(to_key(5)).name == "HIT"
    engine.close()

    with pytest.raises(TypeError, match="PR #46363"):
        VllmTypes.from_module(SimpleNamespace(__name__="vllm.v1.kv_offload.abstract"))


@pytest.mark.parametrize("fence", [True, False], ids=["vllm-0.33", "vllm-0.32"])
def test_a_reset_lets_go_of_a_finished_requests_stores_in_flight(fence: bool) -> None:
    """The issue's sequence: prepare_store([k1, k2], x), on_request_finished(x), reset_cache(),
    on_schedule_end(). vLLM never completes x's store: both blocks must be let go, so four
    new blocks fit in the 4-block primary (they stayed pinned: prepare_store answered None)."""
    m = make_manager(types=VllmTypes(reset_fence=fence))
    x = ReqContext(req_id="x")
    assert m.prepare_store(to_keys([1, 2]), x) is not None
    m.on_request_finished(x)
    m.reset_cache()
    m.on_schedule_end(ScheduleEndContext(new_req_ids=()))
    assert m.engine.stats().pinned_blocks == 0
    out = m.prepare_store(to_keys([3, 4, 5, 6]), _CTX)
    assert out is not None and len(out.keys_to_store) == 4
    m.complete_store(to_keys([3, 4, 5, 6]), _CTX)
    m.on_reset_flushed()
    m.shutdown()


@pytest.mark.parametrize("fence", [True, False], ids=["vllm-0.33", "vllm-0.32"])
def test_a_store_prepared_again_after_a_reset_completes_to_a_hit(fence: bool) -> None:
    """The issue's sequence: prepare_store([k3], x), reset_cache(), prepare_store([k3, k4], x),
    complete_store([k3, k4], x): k3 is a HIT (it answered pending, then MISS, and its slot
    stayed pinned)."""
    m = make_manager(types=VllmTypes(reset_fence=fence))
    x = ReqContext(req_id="x")
    k3, k4 = to_keys([3, 4])
    assert m.prepare_store([k3], x) is not None
    m.reset_cache()
    out = m.prepare_store([k3, k4], x)
    assert out is not None and out.keys_to_store == [k3, k4]
    m.complete_store([k3, k4], x)
    assert [m.lookup(k, x) for k in (k3, k4)] == [HIT, HIT]
    m.on_reset_flushed()
    assert m.engine.stats().pinned_blocks == 0
    m.on_request_finished(x)
    m.on_schedule_end()
    m.shutdown()


def test_a_reset_keeps_requests_that_go_on(manager: AiotierOffloadingManager) -> None:
    """A request loading and storing at the reset goes on after it: its recency, loads and
    stores from before the reset are forgotten, the new ones count as usual."""
    ctx = ReqContext(req_id="resumed")
    manager.prepare_store(to_keys([1]), ctx)
    manager.complete_store(to_keys([1]), ctx)
    manager.prepare_load(to_keys([1]), ctx)
    manager.reset_cache()
    manager.on_reset_flushed()
    assert manager.lookup(to_key(1), ctx) is MISS
    manager.prepare_store(to_keys([1, 2]), ctx)
    manager.complete_store(to_keys([1, 2]), ctx)
    manager.on_request_finished(ctx)
    manager.on_schedule_end()
    assert manager.count_hits(to_keys([1, 2]), ctx) == 2


def test_count_hits_stops_at_a_store_in_flight(manager: AiotierOffloadingManager) -> None:
    """vLLM's ``lookup(keys)`` before PR #46363 counted the blocks before a pending write."""
    manager.prepare_store(to_keys([1]), _CTX)
    manager.complete_store(to_keys([1]), _CTX)
    manager.prepare_store(to_keys([2]), _CTX)
    assert manager.count_hits(to_keys([1, 2, 3]), _CTX) == 1
    manager.complete_store(to_keys([2]), _CTX)
    assert manager.count_hits(to_keys([1, 2, 3]), _CTX) == 2
    manager.on_request_finished(_CTX)
    manager.on_schedule_end()


def test_lock_and_bad_input(manager: AiotierOffloadingManager) -> None:
    with manager.lock:  # the manager's own calls never take it
        assert manager.lookup(to_key(1), _CTX) is MISS
    assert manager.lock is manager.lock and not manager.lock.locked()
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


def test_every_call_of_vllms_manager_is_answered_by_aiotier() -> None:
    """vLLM's ``OffloadingManager`` (of the vLLM installed): the manager overrides every one of
    its calls, and mixed into it (as the shipped spec does) it is a complete manager."""
    from vllm_subjects import vllm_base

    if vllm_base is None:
        pytest.skip("vLLM is not importable here")
    ours = AiotierOffloadingManager
    theirs = vllm_base.OffloadingManager
    calls = [n for n in dir(theirs) if not n.startswith("_")]
    assert {"lookup", "prepare_load", "prepare_store", "reset_cache", "get_stats"} <= set(calls)
    assert [n for n in calls if getattr(ours, n, None) in (None, getattr(theirs, n))] == []

    class Mixed(ours, theirs):  # type: ignore[misc, valid-type]
        pass

    m = Mixed.create(PrimaryTier(2, 16), types=VllmTypes.from_module(vllm_base))
    assert isinstance(m, theirs)
    m.shutdown()
