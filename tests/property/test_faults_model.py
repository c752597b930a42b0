"""Stateful model test under faults: concurrent requests over a tiny primary and faulty tiers.

Each ``batch`` rule runs several operations at once (``asyncio.gather``): put, get, delete,
lookup (+ wait + load), lookup_prefix (+ wait + load), prepare/complete store and end_step,
with a few loop ticks between their steps so they interleave. Below a 4-block primary sit two
``FaultyTier`` memory tiers with seeded errors, delays, hangs, corrupted reads and full disks.

The model is a log of versions per key, updated at the instant the engine mutates (put and
complete_store mutate without suspending, delete before its first await), so concurrency needs
no guessing: a read that started while version ``i`` was current may return version ``i`` or
a later one, or nothing (a faulty tier makes MISS legal) — never other bytes.

Invariants checked: no wrong or stale bytes (get, and every loaded view, which must also stay
unchanged while pinned); capacity never exceeded; promotions in flight never above their
bound; every RETRY settles within ``promotion_timeout`` plus a margin; pins back to zero once
requests finish; every deferral observed exactly once in the async-delay histogram; no
exception reaches a caller; no task survives ``aclose()``.

``AIOTIER_TEST_FAULTS_EXAMPLES`` / ``AIOTIER_TEST_FAULTS_STEPS`` make the run longer
(docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aiotier import (
    BlockNotReadyError,
    LookupResult,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    TieringEngine,
    TieringError,
)
from aiotier.testing import FaultyTier, MetricsProbe

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
ASYNC = "aiotier_lookup_async_delay_seconds"
BLOCK = 16
NUM_BLOCKS = 4
PROMOTION_TIMEOUT = 0.25
MARGIN = 1.5  # scheduling slack on a loaded CI machine, on top of promotion_timeout
MAX_INFLIGHT = 2
BATCH_BOUND = 20.0  # a batch that takes longer than this is a hang

KEY_NAMES = [f"k{i}" for i in range(8)]
KEYS = st.sampled_from(KEY_NAMES)
VALUES = st.binary(min_size=0, max_size=BLOCK)
REQ_IDS = ["a", "b", "c"]
REQS = st.sampled_from([*(RequestContext(r) for r in REQ_IDS), None])
NAMED_REQS = st.sampled_from([RequestContext(r) for r in REQ_IDS])
TICKS = st.integers(0, 3)

_get_call: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "_get_call", default=None
)

# figures for docs/reliability.md, printed at the end of the run with -s
FIGURES: Counter[str] = Counter()


class CountingEngine(TieringEngine):
    """Counts the deferred ``get()`` calls: those that ``wait`` inside ``get``, once or twice
    (a second look after the block moved down); each is one anonymous request, observed once.
    Tells ``stored(key, value)`` the moment a put's synchronous half stored its value: with
    write-through tiers ``put`` then awaits their writes, while other calls run, so the model
    learns the order of its versions from here.
    """

    get_deferrals = 0
    stored: Callable[[str, bytes], None] = staticmethod(lambda key, value: None)

    def _put(self, key: Any, data: Any, *ttl: Any) -> Any:
        stored, acks = super()._put(key, data, *ttl)
        if stored:
            self.stored(key, data)
        return stored, acks

    async def get(self, key: bytes | str, req: RequestContext | None = None) -> bytes | None:
        waits: list[int] = []
        token = _get_call.set(waits)
        try:
            return await super().get(key, req)
        finally:
            _get_call.reset(token)
            self.get_deferrals += bool(waits)
            FIGURES["gets_deferred_twice"] += len(waits) > 1

    async def wait(
        self, keys: Sequence[bytes | str], *, timeout: float | None = None
    ) -> list[LookupResult]:
        waits = _get_call.get()
        if waits is not None:
            waits.append(1)
        return await super().wait(keys, timeout=timeout)


#: per-tier write policies: the upper tier written back and the lower through, the upper only
#: read (the primary feeds the lower), the upper through and the lower fed by its evictions
MIXED_POLICIES = [
    {"lower": "write_through"},
    {"upper": "none"},
    {"upper": "write_through", "lower": "write_back"},
]


class Versions:
    """Every value each key has had, in the order the engine applied them (None: absent)."""

    def __init__(self) -> None:
        self.log: dict[bytes, list[bytes | None]] = {k.encode(): [None] for k in KEY_NAMES}

    def now(self, key: str | bytes) -> int:
        return len(self.log[_b(key)]) - 1

    def write(self, key: str | bytes, value: bytes | None) -> None:
        self.log[_b(key)].append(value)

    def allowed(self, key: str | bytes, since: int) -> list[bytes | None]:
        return self.log[_b(key)][since:]


def _b(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


async def _ticks(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


# --------------------------------------------------------------------- operations of a batch
# Each strategy draws a tuple (name, args...); FaultsModel.<name> runs it against the engine.

_OPS = st.one_of(
    st.tuples(st.just("op_put"), KEYS, VALUES),
    st.tuples(st.just("op_get"), KEYS, REQS),
    st.tuples(st.just("op_delete"), KEYS),
    st.tuples(st.just("op_lookup"), KEYS, REQS, TICKS),
    st.tuples(
        st.just("op_lookup_prefix"), st.lists(KEYS, min_size=1, max_size=4), NAMED_REQS, TICKS
    ),
    st.tuples(
        st.just("op_store"),
        st.lists(KEYS, min_size=1, max_size=3, unique=True),
        VALUES,
        st.booleans(),
        REQS,
        TICKS,
    ),
    st.tuples(st.just("op_new_step"), st.lists(st.sampled_from(REQ_IDS), max_size=2)),
)
# one operation in about 24 is a clear of everything (more would leave little to promote)
OPS = st.integers(0, 23).flatmap(lambda n: st.just(("op_clear",)) if n == 0 else _OPS)


class FaultsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.versions = Versions()
        self.engine: CountingEngine | None = None
        self.tiers: list[FaultyTier] = []
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.probe = MetricsProbe(self.reader)
        self.req_retried: set[str] = set()  # requests that saw RETRY since their last observation
        self.observed_req = 0  # request deferrals the engine must have observed at end_step
        self.anon_retries = 0  # anonymous lookups answered RETRY: one deferral each
        self.max_seen_inflight = 0
        self.storing: set[tuple[str, str]] = set()  # (request id or "", key) being stored
        self.closing = False  # aclose() has started: calls may now raise TieringError
        self.closed = False  # then every later rule is a no-op (no precondition: replayable)

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(coro)

    @property
    def e(self) -> CountingEngine:
        assert self.engine is not None
        return self.engine

    @initialize(policy=st.sampled_from(["write_back", "write_back", "write_through", "none",
                                        *MIXED_POLICIES]),
                evict=st.sampled_from(["lru", "arc", "lfuda"]), seed=st.integers(0, 2**16),
                remove_faults=st.booleans())  # fmt: skip
    def start(self, policy: Any, evict: str, seed: int, remove_faults: bool) -> None:
        upper = (
            FaultyTier(MemoryTier(5 * BLOCK), seed=seed, name="upper")
            .fail("read", 0.1)
            .corrupt(0.1)
            .delay("read", 0.002, 0.3)
            .hang("read", 0.01)
            .fail("lookup", 0.05)
            .delay("lookup", 0.001, 0.3)
            .hang("lookup", 0.01)
            .disk_full(0.1)
            .delay("write", 0.002, 0.3)
        )
        lower = (
            FaultyTier(MemoryTier(64 * BLOCK), seed=seed + 1, name="lower")
            .fail("read", 0.05)
            .corrupt(0.05)
            .delay("read", 0.003, 0.5)
            .delay("lookup", 0.002, 0.5)
            .fail("write", 0.05)
            .delay("write", 0.003, 0.5)
            .fail("clear", 0.2)
        )
        if remove_faults:
            upper.fail("remove", 0.1)
            lower.fail("remove", 0.1).hang("remove", 0.01)
        self.tiers = [upper, lower]
        self.engine = engine = CountingEngine(
            PrimaryTier(NUM_BLOCKS, BLOCK, policy=evict),
            self.tiers,
            write_policy=policy,  # type: ignore[arg-type]
            promotion_timeout=PROMOTION_TIMEOUT,
            max_inflight_promotions=MAX_INFLIGHT,
            backoff_seconds=0.05,
            meter_provider=self.provider,
        )
        engine.stored = lambda key, value: self.versions.write(key, bytes(value))
        self.run(self.e.open())

    # ----------------------------------------------------------------- the operations

    async def op_put(self, key: str, value: bytes) -> None:
        # the model follows at the moment the value was stored (CountingEngine.stored)
        if await self.e.put(key, value):
            FIGURES["puts"] += 1

    async def op_get(self, key: str, req: RequestContext | None) -> None:
        since = self.versions.now(key)
        got = await self.e.get(key, req)
        FIGURES["gets"] += 1
        if got is None:
            FIGURES["gets_none"] += 1
            return
        allowed = self.versions.allowed(key, since)
        assert got in allowed, f"get({key!r}) returned {got!r}; allowed: {allowed!r}"

    async def op_delete(self, key: str) -> None:
        self.versions.write(key, None)  # delete drops the key before its first await
        await self.e.delete(key)

    async def op_clear(self) -> None:
        for key in KEY_NAMES:  # clear drops every key before its first await
            self.versions.write(key, None)
        try:
            await self.e.clear(timeout=1.0)
        except TieringError:
            if self.closing:
                raise
            FIGURES["clears_failed"] += 1  # a tier is unread until a clear succeeds
        else:
            FIGURES["clears"] += 1

    async def _settle(self, keys: Sequence[str]) -> list[LookupResult]:
        """A RETRY must settle within promotion_timeout (+ margin), to HIT or MISS."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            results = await self.e.wait(keys, timeout=PROMOTION_TIMEOUT + MARGIN)
        except TimeoutError:
            raise AssertionError(
                f"RETRY of {keys!r} still unsettled after {loop.time() - t0:.2f}s"
            ) from None
        assert all(r in (HIT, MISS) for r in results), results
        FIGURES["retries_settled"] += 1
        return results

    async def _load(
        self, keys: list[str], since: list[int], req: RequestContext | None, ticks: int
    ) -> None:
        """Load HIT blocks: right bytes, and unchanged while pinned across interleavings.

        A HIT from a call that suspended (it asked a tier about another key) is a snapshot: a
        concurrent put, delete or eviction may have changed the block since. Then prepare_load
        refuses, and must leave every pin as it was.
        """
        pins = list(self.e.core.table.pins)
        try:
            spec = self.e.prepare_load(keys, req)
        except BlockNotReadyError:
            assert list(self.e.core.table.pins) == pins, "a refused prepare_load changed pins"
            FIGURES["loads_raced"] += 1
            return
        seen = [bytes(buf) for buf in spec.buffers]
        for k, s, data in zip(keys, since, seen, strict=True):
            allowed = self.versions.allowed(k, s)
            assert data in allowed, f"loaded {k!r} = {data!r}; allowed: {allowed!r}"
        await _ticks(ticks)
        assert [bytes(buf) for buf in spec.buffers] == seen, "a pinned block changed under a load"
        self.e.complete_load(keys, req)
        FIGURES["loads"] += len(keys)

    def _retried(self, req: RequestContext | None) -> None:
        if req is None:
            self.anon_retries += 1
        else:
            self.req_retried.add(req.req_id)

    async def op_lookup(self, key: str, req: RequestContext | None, ticks: int) -> None:
        since = self.versions.now(key)
        answer = await self.e.lookup(key, req)
        FIGURES["lookups"] += 1
        if answer is RETRY:
            self._retried(req)
            (answer,) = await self._settle([key])
        if answer is HIT:  # nothing suspends between the answer and prepare_load
            await self._load([key], [since], req, ticks)

    async def op_lookup_prefix(self, keys: list[str], req: RequestContext, ticks: int) -> None:
        since = [self.versions.now(k) for k in keys]
        n = await self.e.lookup_prefix(keys, req)
        FIGURES["lookups"] += 1
        if n is None:
            self._retried(req)
            results = await self._settle(keys)
            n = 0
            for r in results:
                if r is not HIT:
                    break
                n += 1
        if n:
            await self._load(keys[:n], since[:n], req, ticks)

    async def op_store(
        self, keys: list[str], value: bytes, success: bool, req: RequestContext | None, ticks: int
    ) -> None:
        # One caller stores a key once at a time: preparing a key again before completing it
        # makes the first preparation stale (the engine completes the key once).
        owner = req.req_id if req is not None else ""
        keys = [k for k in keys if (owner, k) not in self.storing]
        if not keys:
            return
        out = self.e.prepare_store(keys, req)
        if out is None:
            FIGURES["stores_refused"] += 1
            return
        mine = {(owner, k.decode()) for k in out.keys_to_store}
        self.storing |= mine
        at_prepare = {k: self.versions.now(k) for k in out.keys_to_store}
        for buf in out.store_spec.buffers:
            buf[: len(value)] = value
        await _ticks(ticks)  # the store is pending: other operations see RETRY meanwhile
        self.storing -= mine
        self.e.complete_store(out.keys_to_store, req, success=success,
                              sizes=[len(value)] * len(out.keys_to_store))  # fmt: skip
        FIGURES["stores"] += 1
        if success:
            for k in out.keys_to_store:
                # a put or delete of the key while the store was pending wins over it
                if self.versions.now(k) == at_prepare[k]:
                    self.versions.write(k, value)

    async def op_new_step(self, new: list[str]) -> None:
        # admitted even while one of its own calls is suspended in the engine (pinned by
        # test_request_admitted_while_its_lookup_waits_on_a_tier)
        self._end_step(new, [])

    def _end_step(self, new: Sequence[str], finished: Sequence[str]) -> None:
        for rid in set(new) | set(finished):
            rs = self.e.core.requests.get(rid)
            armed = rs is not None and rs.deferred_at is not None
            # (a close under way has already let go of every request's state)
            if rid in self.req_retried and not self.closing:
                assert armed, f"request {rid!r} got RETRY but its deferral is not armed"
            self.observed_req += armed
            self.req_retried.discard(rid)
        self.e.end_step(new_req_ids=new, finished_req_ids=finished)

    # ----------------------------------------------------------------- rules

    @rule(ops=st.lists(OPS, min_size=1, max_size=6))
    def batch(self, ops: list[tuple[Any, ...]]) -> None:
        if self.closed:
            return

        async def sample(stop: asyncio.Event) -> None:
            while not stop.is_set():
                inflight = self.e.stats().promotions_in_flight
                self.max_seen_inflight = max(self.max_seen_inflight, inflight)
                assert inflight <= MAX_INFLIGHT, f"{inflight} promotions in flight"
                await asyncio.sleep(0.0005)

        async def go() -> None:
            stop = asyncio.Event()
            sampler = asyncio.ensure_future(sample(stop))
            calls: list[Callable[..., Awaitable[None]]] = [getattr(self, op[0]) for op in ops]
            try:
                async with asyncio.timeout(BATCH_BOUND):
                    await asyncio.gather(*(c(*op[1:]) for c, op in zip(calls, ops, strict=True)))
            finally:
                stop.set()
                if sampler.done():
                    sampler.result()  # the sampler's own assertion, if it failed
                else:
                    sampler.cancel()
                    await asyncio.gather(sampler, return_exceptions=True)

        self.run(go())
        FIGURES["batches"] += 1
        FIGURES["operations"] += len(ops)
        self.check_structure()

    @rule(new=st.lists(st.sampled_from(REQ_IDS), max_size=3),
          finished=st.lists(st.sampled_from(REQ_IDS), max_size=2))  # fmt: skip
    def end_step(self, new: list[str], finished: list[str]) -> None:
        if self.closed:
            return
        self._end_step(new, finished)
        self.check_structure()

    @rule(ms=st.integers(0, 20))
    def let_background_work_run(self, ms: int) -> None:
        self.run(asyncio.sleep(ms / 1000))

    @rule()
    def quiesce(self) -> None:
        if not self.closed:
            self.run(self._quiesce())

    @rule(
        ops=st.lists(OPS, min_size=1, max_size=6),
        after=st.integers(0, 6),
        flush=st.booleans(),
        now=st.integers(0, 7),
    )
    def close_under_load(
        self, ops: list[tuple[Any, ...]], after: int, flush: bool, now: int
    ) -> None:
        """aclose() while operations are in flight: they end (a closed-engine error at most)
        and no task, pin or promotion survives. Only one draw in eight closes (``now == 0``),
        so most examples run their whole length first."""
        if self.closed:
            return
        if now:
            self.batch(ops)
            return

        async def guarded(op: tuple[Any, ...]) -> None:
            try:
                await getattr(self, op[0])(*op[1:])
            except (TieringError, ValueError):
                if not self.closing:
                    raise
                FIGURES["calls_cut_by_close"] += 1

        async def closer() -> None:
            await _ticks(after)
            self.closing = True
            await self.e.aclose(flush=flush)

        async def go() -> None:
            async with asyncio.timeout(BATCH_BOUND):
                await asyncio.gather(closer(), *(guarded(op) for op in ops))

        self.run(go())
        self.closed = True
        assert self.e.stats().promotions_in_flight == 0
        assert self.e.stats().pinned_blocks == 0
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        assert not pending, f"tasks survived aclose(): {pending}"
        FIGURES["closes_under_load"] += 1

    async def _quiesce(self) -> None:
        """Settle everything in flight, then every deferral so far must be observed once."""
        await self._settle(KEY_NAMES)
        # a read whose key was settled by a put or delete meanwhile runs on to its own timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PROMOTION_TIMEOUT + MARGIN
        while self.e.stats().promotions_in_flight or self.e.core.inflight.waiting_keys():
            assert loop.time() < deadline, (
                f"promotions still in flight: {self.e.stats().promotions_in_flight}, "
                f"keys {self.e.core.inflight.waiting_keys()}"
            )
            await asyncio.sleep(0.002)
        self.e.end_step()  # hands the settled anonymous deferrals to the meter
        expected = self.observed_req + self.anon_retries + self.e.get_deferrals
        got = self.probe.count(ASYNC)
        assert got == expected, (
            f"async-delay observations {got} != deferrals {expected} (requests "
            f"{self.observed_req}, anonymous lookups {self.anon_retries}, "
            f"gets {self.e.get_deferrals})"
        )

    def check_structure(self) -> None:
        e = self.e
        table = e.core.table
        assert len(table.index) <= NUM_BLOCKS
        assert min(table.pins) >= 0
        stats = e.stats()
        assert stats.tiers["primary"].blocks <= NUM_BLOCKS
        for t in self.tiers:
            usage = t.usage()
            assert usage.bytes_used <= usage.capacity_bytes, (t.name, usage)
        assert stats.promotions_in_flight <= MAX_INFLIGHT

    def teardown(self) -> None:
        try:
            self._teardown()
        finally:
            # after a failure too: close the engine and reap every task before the loop goes
            if self.engine is not None and not self.e.core.closed:
                self.run(self.e.aclose(flush=False))
            leftover = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for t in leftover:
                t.cancel()
            if leftover:
                self.run(asyncio.gather(*leftover, return_exceptions=True))
            self.loop.close()
            self.provider.shutdown()

    def _teardown(self) -> None:
        if self.engine is None:
            return
        if self.closed:
            FIGURES["examples"] += 1
            return
        self.run(self._quiesce())
        self._end_step([], REQ_IDS)  # every request finishes
        self.e.end_step()  # anonymous RETRY pins go at the next step
        assert self.e.stats().pinned_blocks == 0, "pins left after every request finished"
        assert len(self.e.core.pins.share) == 0, "promoted blocks still counted after all"
        self.run(self._quiesce())
        FIGURES["deferrals_observed"] += self.probe.count(ASYNC)
        counters = self.e.stats().counters
        for (metric, *labels), n in counters.items():
            if metric in ("tier_errors", "promotions") and labels[-1] != "ok":
                FIGURES[f"{metric}_{labels[-1]}"] += n
        FIGURES["tier_calls"] += sum(sum(t.calls.values()) for t in self.tiers)
        self.run(self.e.aclose())
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        assert not pending, f"tasks survived aclose(): {pending}"
        FIGURES["examples"] += 1


FaultsModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("AIOTIER_TEST_FAULTS_EXAMPLES", "100")),
    stateful_step_count=int(os.environ.get("AIOTIER_TEST_FAULTS_STEPS", "30")),
    deadline=None,
    # no "explain" phase: its line tracer makes each replay ~10x slower on Python 3.11
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestFaultsModel = FaultsModel.TestCase


def test_print_figures() -> None:
    """Runs after the machine (same module, defined later): the figures for reliability.md."""
    if FIGURES:
        print("\nfaults model:", dict(sorted(FIGURES.items())))
