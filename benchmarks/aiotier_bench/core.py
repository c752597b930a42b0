"""Core benchmarks: primary-hit lookups, prefix scans, scale, index memory, promotion from a
memory tier, metrics overhead. Public API only (``from aiotier import ...``, ``stats()``)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import random
import statistics
import time
import tracemalloc
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiotier import (
    AdmissionPolicy,
    AdmitAfter,
    AdmitAll,
    BlockingEngine,
    LookupResult,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    TieringEngine,
)

from .bare import BareEngine
from .common import Case, Measure, alternate, note_missing
from .counting import CallCounter, CountingMeterProvider
from .phases import promotion_phases

__all__ = ["CASES", "run"]

_now = time.perf_counter


def _keys(n: int) -> list[bytes]:
    return [b"block-%012d" % i for i in range(n)]


async def _filled_engine(n: int, block_size: int = 16, **kw: Any) -> TieringEngine:
    engine = TieringEngine(PrimaryTier(n, block_size), **kw)
    await engine.open()
    for i, k in enumerate(_keys(n)):
        engine.prepare_store([k])
        engine.complete_store([k], sizes=[0])
        if i % 4096 == 0:  # as a scheduler would: step boundaries drain the buffers
            engine.end_step()
            engine.take_events()
    engine.end_step()
    engine.take_events()
    return engine


async def lookup_hit(n_blocks: int, ops: int, rounds: int, peer: bool = True) -> Case:
    """Primary hits, keys drawn uniformly from all blocks."""
    engine = await _filled_engine(n_blocks)
    keys = _keys(n_blocks)
    rng = random.Random(1)
    sample = [keys[rng.randrange(n_blocks)] for _ in range(ops)]
    req = RequestContext("bench")
    table = dict.fromkeys(keys, 0)

    async def coro_get(k: bytes) -> int | None:
        return table.get(k)

    async def floor() -> float:
        t = _now()
        for k in sample:
            await coro_get(k)
        return (_now() - t) / ops * 1e6

    async def ours() -> float:
        lookup = engine.lookup
        t = _now()
        for k in sample:
            await lookup(k, req)
        return (_now() - t) / ops * 1e6

    fns: dict[str, Callable[[], Awaitable[float]]] = {"floor": floor, "aiotier": ours}
    if peer:
        try:
            from aiocache import SimpleMemoryCache
        except ImportError:
            note_missing("aiocache", "lookup_hit runs without its aiocache peer")
            peer = False
        else:
            cache = SimpleMemoryCache()
            for k in keys[: min(n_blocks, 100_000)]:
                await cache.set(k, b"")
            peer_sample = sample[: max(ops // 10, 100)]

            async def aiocache_get() -> float:
                t = _now()
                for k in peer_sample:
                    await cache.get(k)
                return (_now() - t) / len(peer_sample) * 1e6

            fns["peer"] = aiocache_get
    med = await alternate(fns, rounds)
    await engine.aclose(flush=False)
    return Case(
        "lookup_hit",
        {"blocks": n_blocks, "ops": ops, "with_request_context": True},
        "us/op",
        False,
        med["aiotier"],
        floor=Measure("await coroutine doing dict.get", med["floor"]),
        peer=Measure("aiocache SimpleMemoryCache.get", med["peer"]) if "peer" in med else None,
    )


async def lookup_prefix(rounds: int, calls: int) -> Case:
    engine = await _filled_engine(4096)
    keys = _keys(4096)
    rng = random.Random(2)
    prefixes = []
    for _ in range(calls):
        start = rng.randrange(4096 - 64)
        prefixes.append(keys[start : start + 64])
    req = RequestContext("bench")
    table = dict.fromkeys(keys, 0)

    async def floor() -> float:
        get = table.get
        t = _now()
        for p in prefixes:
            for k in p:
                get(k)
        return (_now() - t) / calls * 1e6

    async def ours() -> float:
        lp = engine.lookup_prefix
        t = _now()
        for p in prefixes:
            await lp(p, req)
        return (_now() - t) / calls * 1e6

    med = await alternate({"floor": floor, "aiotier": ours}, rounds)
    await engine.aclose(flush=False)
    return Case(
        "lookup_prefix",
        {"keys_per_call": 64, "all_hits": True},
        "us/call",
        False,
        med["aiotier"],
        floor=Measure("64 plain dict.get", med["floor"]),
    )


SCALE_TARGETS = {"uniform": 2.5, "hot_1000": 1.3}


async def scale(points: list[int], ops: int, rounds: int) -> list[Case]:
    """``lookup_hit`` as the index grows; each point's floor measured beside it, alternating.

    Two access patterns per point, each its own case:

    - ``uniform``: keys drawn uniformly over every block. Once the index outgrows the CPU caches
      each lookup misses them, a plain dict's too, so the floor is the ``lookup_hit`` floor (an
      awaited coroutine doing ``dict.get``) on a dict of the same size and the same keys.
      Target: aiotier within 2.5x of it.
    - ``hot_1000``: the same 1000 keys at every size, which stay in the CPU caches: what the index
      structure itself costs as it grows. The floor is ``lookup_hit`` of the same 1000 keys on an
      engine of ``points[0]`` blocks, kept open for the whole case and alternated with every
      point (at ``points[0]`` itself the two are separate measurements of one engine: their
      ratio shows the run's noise). Target: within 1.3x of it.

    Each case carries ``aiotier_over_floor`` (the "within N x" figure) beside the target.
    """
    base_n = points[0]
    ref = await _filled_engine(base_n)
    hot_keys = _keys(min(1000, base_n))
    rng = random.Random(1)
    hot_sample = [hot_keys[rng.randrange(len(hot_keys))] for _ in range(ops)]
    req = RequestContext("bench")
    out: list[Case] = []

    def timed_lookups(engine: TieringEngine, sample: list[bytes]) -> Callable[[], Awaitable[float]]:
        async def run() -> float:
            lookup = engine.lookup
            t = _now()
            for k in sample:
                await lookup(k, req)
            return (_now() - t) / len(sample) * 1e6

        return run

    try:
        for n in points:
            engine = ref if n == base_n else await _filled_engine(n)
            keys = _keys(n)
            uniform = [keys[rng.randrange(n)] for _ in range(ops)]
            table = dict.fromkeys(keys, 0)
            del keys

            async def coro_get(k: bytes, table: dict[bytes, int] = table) -> int | None:
                return table.get(k)

            async def dict_uniform(sample: list[bytes] = uniform) -> float:
                t = _now()
                for k in sample:
                    await coro_get(k)
                return (_now() - t) / len(sample) * 1e6

            med = await alternate(
                {
                    "uniform": timed_lookups(engine, uniform),
                    "dict_uniform": dict_uniform,
                    "hot": timed_lookups(engine, hot_sample),
                    "hot_ref": timed_lookups(ref, hot_sample),
                },
                rounds,
            )
            for access, ours, floor in (
                ("uniform", med["uniform"],
                 Measure(f"await coroutine doing dict.get, dict of {n} keys, same keys",
                         med["dict_uniform"])),
                ("hot_1000", med["hot"],
                 Measure(f"lookup_hit at {base_n} blocks, same 1000 keys, same run",
                         med["hot_ref"])),
            ):  # fmt: skip
                out.append(
                    Case(
                        "scale",
                        {"blocks": n, "ops": ops, "access": access, "rounds": rounds},
                        "us/op",
                        False,
                        ours,
                        floor=floor,
                        extra={
                            "aiotier_over_floor": ours / floor.value,
                            "target_max_aiotier_over_floor": SCALE_TARGETS[access],
                        },
                    )
                )
            del table, uniform
            if engine is not ref:
                await engine.aclose(flush=False)
            del engine
            gc.collect()
    finally:
        await ref.aclose(flush=False)
    # uniform rows first, then hot rows, each by size: how the table reads best
    return sorted(out, key=lambda c: (c.params["access"] != "uniform", c.params["blocks"]))


async def memory(n: int) -> Case:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    primary = PrimaryTier(n, 1)  # the arena itself is 1 byte per block here
    engine = TieringEngine(primary)
    await engine.open()
    for i in range(n):
        k = b"block-%012d" % i
        engine.prepare_store([k])
        engine.complete_store([k], sizes=[0])
        if i % 4096 == 0:  # as a scheduler would: step boundaries drain the buffers
            engine.end_step()
            engine.take_events()
    engine.end_step()
    engine.take_events()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per_block = (after - before - primary.arena.nbytes) / n
    await engine.aclose(flush=False)
    return Case(
        "memory",
        {"blocks": n, "key_bytes": 18, "includes_key_objects": True},
        "bytes/block",
        False,
        per_block,
    )


# ---------------------------------------------------------------- metrics_overhead: the step loop

STEP_PRIMARY_BLOCKS = 4096
STEP_POOL_KEYS = 4096  # the keys the requests' prefixes are drawn from
STEP_REQUESTS = 128  # waiting requests, each re-checking its prefix every step
STEP_PREFIX = 32
STEP_ADMIT = 16  # admitted per step (waiting -> running); as many new requests arrive
STEP_RUNNING = 48  # running requests kept; past that the 16 oldest finish each step
STEP_STORES = 16  # stores of 4 blocks per step
# steps before the measured ones: the running set fills up and the primary's hit rate settles
# (from the fill's 90% to about 70% here, as stores of new blocks push prefix blocks down)
STEP_WARMUP = 20


@dataclass(slots=True)
class StepRun:
    """One run of the step loop: per-step figures over its measured steps."""

    wall_ms: float  # perf_counter
    cpu_ms: float  # time.thread_time: this thread's CPU time, the loop's whole work
    end_step_cpu_ms: float  # thread_time inside engine.end_step (where the flush happens)
    primary_hit_rate: float  # of the primary's lookup answers (stats() counters)
    promotions_per_step: float
    sdk_calls_per_step: float | None = None
    sdk_calls_by_instrument: dict[str, float] | None = None


async def step_loop(
    provider: Any, steps: int, counting: CountingMeterProvider | None = None
) -> StepRun:
    """The BENCHMARKS.md step shape under ``provider``: a scheduler's waiting and running sets.

    Each step: the 128 waiting requests each re-check their own 32-key prefix (``lookup_prefix``
    with the request's ``RequestContext``) drawn from 4096 keys, 90% of which start in the
    4096-block primary and the rest in a ``MemoryTier`` below (the primary's hit rate settles
    lower during the warm-up; the measured rate is reported); 16 stores of 4 new blocks; the
    16 oldest waiting requests are admitted (they join the running set) and 16 new ones arrive;
    once more than 48 run, the 16 oldest finish; then ``end_step(new_req_ids=admitted,
    finished_req_ids=finished)`` and one ``sleep(0)`` (a scheduler's forward pass yields: the
    promotions run).

    Every admitted request finishes later, so its pins are released. (A loop that drops admitted
    requests without finishing them pins ever more of the primary, and its steps slow down as
    eviction walks past the pinned blocks: that was this benchmark's ~55 ms step.) Keys,
    contexts and store keys are made before the clock starts; ``STEP_WARMUP`` steps run first.
    """
    rng = random.Random(3)
    block = 64
    n_keys = STEP_POOL_KEYS
    keys = _keys(n_keys)
    tier = MemoryTier(STEP_PRIMARY_BLOCKS * block * 4)
    engine = TieringEngine(
        PrimaryTier(STEP_PRIMARY_BLOCKS, block), [tier], meter_provider=counting or provider,
        max_inflight_promotions=4096,
    )  # fmt: skip
    await engine.open()
    for k in keys:
        if rng.random() < 0.9:
            engine.prepare_store([k])
            engine.complete_store([k], sizes=[block])
        else:
            await tier.write_many([(k, bytes(block))])
    engine.end_step()  # the fill's own samples are not part of the measured steps
    engine.take_events()
    total_steps = STEP_WARMUP + steps
    n_requests = STEP_REQUESTS + STEP_ADMIT * total_steps
    requests: deque[tuple[RequestContext, list[bytes]]] = deque()
    for i in range(n_requests):
        start = rng.randrange(n_keys - STEP_PREFIX)
        requests.append((RequestContext(f"r{i}"), keys[start : start + STEP_PREFIX]))
    waiting = deque(requests.popleft() for _ in range(STEP_REQUESTS))
    running: deque[str] = deque()
    store_keys = [
        [[b"new-%d-%d-%d" % (s, i, j) for j in range(4)] for i in range(STEP_STORES)]
        for s in range(total_steps)
    ]

    async def one_step(step: int) -> float:
        lookup_prefix = engine.lookup_prefix
        for req, prefix in waiting:
            await lookup_prefix(prefix, req)
        for sk in store_keys[step]:
            out = engine.prepare_store(sk)
            if out is not None:
                engine.complete_store(list(out.keys_to_store))
        admitted = [waiting.popleft()[0].req_id for _ in range(STEP_ADMIT)]
        waiting.extend(requests.popleft() for _ in range(STEP_ADMIT))
        running.extend(admitted)
        finished = (
            [running.popleft() for _ in range(STEP_ADMIT)] if len(running) > STEP_RUNNING else []
        )
        c0 = time.thread_time()
        engine.end_step(new_req_ids=admitted, finished_req_ids=finished)
        spent = time.thread_time() - c0
        await asyncio.sleep(0)  # let promotions run, as a scheduler's forward pass would
        return spent

    for step in range(STEP_WARMUP):
        await one_step(step)
    before = engine.stats().counters
    if counting is not None:
        counting.reset()
    end_step_cpu = 0.0
    t, c = _now(), time.thread_time()
    for step in range(STEP_WARMUP, total_steps):
        end_step_cpu += await one_step(step)
    wall, cpu = _now() - t, time.thread_time() - c
    calls = None if counting is None else dict(counting.calls)
    after = engine.stats().counters
    await engine.aclose(flush=False)

    def delta(key: tuple[str, ...]) -> int:
        return after.get(key, 0) - before.get(key, 0)

    answers = {r: delta(("lookups", "primary", r)) for r in ("hit", "miss", "retry")}
    return StepRun(
        wall_ms=wall / steps * 1e3,
        cpu_ms=cpu / steps * 1e3,
        end_step_cpu_ms=end_step_cpu / steps * 1e3,
        primary_hit_rate=answers["hit"] / max(1, sum(answers.values())),
        promotions_per_step=delta(("promotions", "memory", "ok")) / steps,
        sdk_calls_per_step=None if calls is None else sum(calls.values()) / steps,
        sdk_calls_by_instrument=(
            None if calls is None else {k: v / steps for k, v in sorted(calls.items())}
        ),
    )


def _sdk_provider() -> Any:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry

    return MeterProvider(metric_readers=[PrometheusMetricReader(registry=CollectorRegistry())])


async def metrics_overhead(steps: int, rounds: int) -> Case:
    """The step loop with an SDK ``MeterProvider`` + Prometheus reader vs the API's no-op meter.

    Three figures, from the least to the most direct:

    - the A/B: median wall ms per step of alternating rounds (``aiotier`` vs ``floor``); its
      run-to-run noise on this machine is larger than a 5% bar;
    - ``cpu_overhead``: the same A/B in ``time.thread_time`` (this thread's CPU time, which
      leaves out time the thread was not running);
    - ``flush_share``: thread_time spent inside ``engine.end_step()`` (where the step's metrics
      are handed to OpenTelemetry) with the SDK minus the same with the no-op meter, over the
      SDK run's whole step, both per step, medians of the same alternating rounds;

    and one count, noise-free: ``sdk_calls_per_step``, the ``add``/``record`` calls the engine
    makes on the SDK's instruments per step (an un-timed extra run whose provider wraps the SDK's
    instruments in counters, :class:`~aiotier_bench.counting.CountingMeterProvider`).
    """
    from opentelemetry.metrics import NoOpMeterProvider

    sdk = _sdk_provider()
    noop = NoOpMeterProvider()
    runs: dict[str, list[StepRun]] = {"sdk": [], "noop": []}

    async def with_sdk() -> float:
        r = await step_loop(sdk, steps)
        runs["sdk"].append(r)
        return r.wall_ms

    async def without() -> float:
        r = await step_loop(noop, steps)
        runs["noop"].append(r)
        return r.wall_ms

    med = await alternate({"floor": without, "aiotier": with_sdk}, rounds)
    sdk.shutdown()
    counting_sdk = _sdk_provider()
    counted = await step_loop(None, steps, counting=CountingMeterProvider(counting_sdk))
    counting_sdk.shutdown()

    def m(which: str, attr: str) -> float:
        # the first run of each is alternate()'s warm-up, left out as in its medians
        return float(statistics.median(getattr(r, attr) for r in runs[which][1:]))

    cpu_sdk, cpu_noop = m("sdk", "cpu_ms"), m("noop", "cpu_ms")
    es_sdk, es_noop = m("sdk", "end_step_cpu_ms"), m("noop", "end_step_cpu_ms")
    return Case(
        "metrics_overhead",
        {
            "steps": steps,
            "rounds": rounds,
            "waiting_requests": STEP_REQUESTS,
            "prefix_keys": STEP_PREFIX,
            "admitted_per_step": STEP_ADMIT,
            "finished_per_step": STEP_ADMIT,
            "stores_per_step": STEP_STORES,
            "initial_primary_share": 0.9,
        },
        "ms/step",
        False,
        med["aiotier"],
        floor=Measure("same loop, no-op meter", med["floor"]),
        extra={
            "overhead": med["aiotier"] / med["floor"] - 1,
            "cpu_ms_per_step_sdk": cpu_sdk,
            "cpu_ms_per_step_noop": cpu_noop,
            "cpu_overhead": cpu_sdk / cpu_noop - 1,
            "end_step_cpu_ms_sdk": es_sdk,
            "end_step_cpu_ms_noop": es_noop,
            "flush_cpu_ms_per_step": es_sdk - es_noop,
            "flush_share": (es_sdk - es_noop) / cpu_sdk,
            "flush_share_clock": "time.thread_time",
            "sdk_calls_per_step": counted.sdk_calls_per_step,
            "sdk_calls_per_step_by_instrument": counted.sdk_calls_by_instrument,
            "primary_hit_rate": m("sdk", "primary_hit_rate"),
            "promotions_per_step": m("sdk", "promotions_per_step"),
        },
    )


# ---------------------------------------------------------------- memory_promote

PROMOTE_BLOCK = 4096
PROMOTE_PRIMARY = 128
PROMOTE_BATCH = 64
_PROMOTED_OK = ("promotions", "memory", "ok")


async def memory_promote(rounds: int, n_keys: int = 4096) -> list[Case]:
    """Promotion from a ``MemoryTier``, requested as a scheduler does; µs per promoted block.

    4 KiB blocks, ``n_keys`` of them written into a ``MemoryTier`` under a 128-block
    ``PrimaryTier`` (write policy ``write_back``, the default). A round walks the keys in batches
    of 64 that are not in the primary (it holds the two previous batches): ``lookup_prefix`` of
    the batch (which must answer None: promotions started), ``await engine.wait(batch)``, then
    ``end_step``. With a ``RequestContext`` per batch, each request is admitted at its own step's
    ``end_step`` and finished at the next one (``new_req_ids`` / ``finished_req_ids``); the
    anonymous variant passes no context. Every round checks, through ``engine.stats().counters``,
    that exactly ``n_keys`` promotions from the memory tier succeeded, and fails otherwise.

    Floor, in the same run: the bare work per block, a ``dict.get`` of the bytes, a 4 KiB copy
    into a preallocated buffer (``memoryview`` slice assignment), a ``dict`` set of the index.
    ``bare_protocol``: the anonymous variant's calls made by
    :class:`~aiotier_bench.bare.BareEngine` (only the state any engine of the SPEC must keep,
    over the same kind of tier): what a Python engine can reach on this loop and machine.
    ``bare_inline``: the same with the engine's choice for a tier whose calls never suspend (its
    lookup called at once, its read in a loop callback, no task or timer): the ceiling of that
    design.
    ``python_calls_per_block`` counts the interpreter's profile events over one more round of
    each variant (:class:`~aiotier_bench.counting.CallCounter`): noise-free, unlike the time.
    """
    bs, batch = PROMOTE_BLOCK, PROMOTE_BATCH
    keys = [b"promote-%08d" % i for i in range(n_keys)]
    payload = random.Random(4).randbytes(bs)
    values = [k.rjust(24, b"-") + payload[24:] for k in keys]  # no two blocks alike
    batches = [keys[i : i + batch] for i in range(0, n_keys, batch)]
    engines: dict[str, TieringEngine] = {}
    for variant in ("request", "anonymous"):
        tier = MemoryTier(2 * n_keys * bs)
        await tier.write_many(list(zip(keys, values, strict=True)))
        # every slot may hold a promotion here: the loop stores nothing it would need room for
        engine = TieringEngine(PrimaryTier(PROMOTE_PRIMARY, bs), [tier], max_promotion_share=1.0)
        await engine.open()
        engines[variant] = engine
    serial = itertools.count()
    bares: dict[bool, BareEngine] = {}
    for inline in (False, True):
        bare_tier = MemoryTier(2 * n_keys * bs)
        await bare_tier.write_many(list(zip(keys, values, strict=True)))
        bares[inline] = BareEngine(PROMOTE_PRIMARY, bs, bare_tier, inline=inline)

    async def bare_round(inline: bool = False) -> float:
        bare = bares[inline]
        before = bare.totals[_PROMOTED_OK]
        lookup_prefix, wait, end_step = bare.lookup_prefix, bare.wait, bare.end_step
        t = _now()
        for b in batches:
            await lookup_prefix(b)
            await wait(b)
            end_step()
        elapsed = _now() - t
        if bare.totals[_PROMOTED_OK] - before != n_keys:
            raise RuntimeError("memory_promote: the bare protocol did not promote every key")
        return elapsed / n_keys * 1e6

    async def promote_round(engine: TieringEngine, with_request: bool) -> float:
        before = engine.stats().counters.get(_PROMOTED_OK, 0)
        lookup_prefix, wait, end_step = engine.lookup_prefix, engine.wait, engine.end_step
        answers: list[int | None] = []
        t = _now()
        if with_request:
            previous: tuple[str, ...] = ()
            for b in batches:
                req = RequestContext(f"promote-{next(serial)}")
                answers.append(await lookup_prefix(b, req))
                await wait(b)
                end_step(new_req_ids=(req.req_id,), finished_req_ids=previous)
                previous = (req.req_id,)
            end_step(finished_req_ids=previous)
        else:
            for b in batches:
                answers.append(await lookup_prefix(b))
                await wait(b)
                end_step()
        elapsed = _now() - t
        promoted = engine.stats().counters.get(_PROMOTED_OK, 0) - before
        if promoted != n_keys or any(a is not None for a in answers):
            raise RuntimeError(
                f"memory_promote: expected {n_keys} promotions from the memory tier and every "
                f"lookup_prefix to answer None, got {promoted} promotions and answers "
                f"{sorted({repr(a) for a in answers})}"
            )
        return elapsed / n_keys * 1e6

    source = dict(zip(keys, values, strict=True))
    arena = memoryview(bytearray(PROMOTE_PRIMARY * bs))
    offsets = [(i % PROMOTE_PRIMARY) * bs for i in range(n_keys)]
    index: dict[bytes, int] = {}

    async def floor() -> float:
        get = source.get
        t = _now()
        for k, off in zip(keys, offsets):  # noqa: B905 - the floor does no extra check
            v = get(k)
            arena[off : off + bs] = v  # type: ignore[assignment]
            index[k] = off
        return (_now() - t) / n_keys * 1e6

    async def with_request() -> float:
        return await promote_round(engines["request"], True)

    async def anonymous() -> float:
        return await promote_round(engines["anonymous"], False)

    try:
        med = await alternate(
            {
                "floor": floor,
                "request": with_request,
                "anonymous": anonymous,
                "bare": bare_round,
                "bare_inline": partial(bare_round, True),
            },
            rounds,
        )
        calls: dict[str, tuple[float, float]] = {}
        for variant, fn in (("request", with_request), ("anonymous", anonymous)):
            gc.collect()
            with CallCounter() as counter:
                await fn()
            calls[variant] = (counter.calls / n_keys, counter.c_calls / n_keys)
        phases = await promotion_phases(
            keys, values, block_size=bs, primary_blocks=PROMOTE_PRIMARY, batch=batch,
            rounds=rounds,
        )  # fmt: skip
    finally:
        for engine in engines.values():
            await engine.aclose(flush=False)
    out = []
    for variant in ("request", "anonymous"):
        out.append(
            Case(
                "memory_promote",
                {
                    "block_size": bs,
                    "keys": n_keys,
                    "primary_blocks": PROMOTE_PRIMARY,
                    "batch": batch,
                    "rounds": rounds,
                    "request_context": variant == "request",
                    "write_policy": "write_back",
                    "via": "lookup_prefix(64) + wait + end_step",
                },
                "us/block",
                False,
                med[variant],
                floor=Measure("dict.get + 4 KiB memoryview copy + dict set", med["floor"]),
                extra={
                    "python_calls_per_block": calls[variant][0],
                    "c_calls_per_block": calls[variant][1],
                    "target_ratio_to_floor": 0.25,
                    "bare_protocol_us_per_block": med["bare"],
                    "bare_protocol_ratio_to_floor": med["floor"] / med["bare"],
                    "ratio_to_bare_protocol": med["bare"] / med[variant],
                    "bare_inline_us_per_block": med["bare_inline"],
                    "ratio_to_bare_inline": med["bare_inline"] / med[variant],
                    **(
                        {
                            "core_phases_us_per_batch": phases,
                            # the batch as measured, less its core calls replayed without awaits
                            # (their minimum over rounds): tasks, timers, waiters, loop turns
                            "await_side_us_per_batch": med[variant] * batch - phases["total"],
                        }
                        if variant == "anonymous"
                        else {}
                    ),
                },
            )
        )
    return out


# ---------------------------------------------------------------- the group

CaseRunner = Callable[[bool], Awaitable[list[Case]]]


def _filled_facade(n: int) -> BlockingEngine:
    facade = BlockingEngine(PrimaryTier(n, 16))
    for k in _keys(n):
        facade.prepare_store([k])
        facade.complete_store([k], sizes=[0])
    facade.end_step()
    facade.take_events()
    return facade


async def blocking_lookup_hit(ops: int, rounds: int) -> list[Case]:
    """A primary-hit ``lookup`` through ``BlockingEngine`` from a plain thread (no hop to the
    loop), against the async engine's own ``lookup_hit`` in the same run; and a portal round
    trip (a ``get`` that misses everywhere, so it goes to the loop and back)."""
    n = 1000
    keys = _keys(n)
    rng = random.Random(2)
    sample = [keys[rng.randrange(n)] for _ in range(ops)]
    req = RequestContext("bench")
    engine = await _filled_engine(n)
    facade = await asyncio.to_thread(_filled_facade, n)

    async def floor() -> float:
        lookup = engine.lookup
        t = _now()
        for k in sample:
            await lookup(k, req)
        return (_now() - t) / ops * 1e6

    def facade_round() -> float:
        lookup = facade.lookup
        t = _now()
        for k in sample:
            lookup(k, req)
        return (_now() - t) / ops * 1e6

    misses = max(ops // 200, 50)

    def round_trips() -> float:
        get = facade.get
        t = _now()
        for _ in range(misses):
            get(b"absent")
        return (_now() - t) / misses * 1e6

    async def ours() -> float:
        return await asyncio.to_thread(facade_round)

    async def hops() -> float:
        return await asyncio.to_thread(round_trips)

    try:
        med = await alternate({"floor": floor, "aiotier": ours, "round_trip": hops}, rounds)
    finally:
        await asyncio.to_thread(facade.close)
        await engine.aclose()
    return [
        Case(
            "blocking_lookup_hit",
            {"blocks": n, "ops": ops, "with_request_context": True, "caller": "plain thread"},
            "us/op",
            False,
            med["aiotier"],
            floor=Measure("async TieringEngine.lookup (lookup_hit)", med["floor"]),
            extra={"portal_round_trip_us": med["round_trip"], "target_ratio_to_floor": 0.5},
        )
    ]


async def _blocking_lookup_hit(quick: bool) -> list[Case]:
    return await blocking_lookup_hit(_ops(quick), _rounds(quick))


async def _lookup_hit(quick: bool) -> list[Case]:
    return [await lookup_hit(1000, _ops(quick), _rounds(quick))]


async def _lookup_prefix(quick: bool) -> list[Case]:
    return [await lookup_prefix(_rounds(quick), _ops(quick) // 64)]


async def _scale(quick: bool) -> list[Case]:
    points = [1000, 100_000] if quick else [1000, 100_000, 1_000_000]
    return await scale(points, _ops(quick), _rounds(quick))


async def _memory(quick: bool) -> list[Case]:
    return [await memory(100_000 if quick else 1_000_000)]


async def _metrics_overhead(quick: bool) -> list[Case]:
    return [await metrics_overhead(8 if quick else 40, 3 if quick else 15)]


def scan_polluted_trace(rounds: int, hot: int = 48, scan: int = 80, seed: int = 5) -> list[bytes]:
    """A hot working set looked up again and again, interleaved with one-off scans."""
    rng = random.Random(seed)
    trace: list[bytes] = []
    for r in range(rounds):
        for _ in range(3):
            trace += [b"hot-%d" % rng.randrange(hot) for _ in range(hot)]
        trace += [b"scan-%d-%d" % (r, i) for i in range(scan)]
    return trace


async def policy_hit_ratio(policy: str, admission: AdmissionPolicy | None, trace: list[bytes],
                           blocks: int) -> float:  # fmt: skip
    """Hits per lookup when a scheduler replays ``trace``: a HIT is loaded and touched, a MISS
    stored (what the primary admits of it)."""
    primary = PrimaryTier(blocks, 16, policy=policy)
    engine = TieringEngine(primary, admission={"primary": admission} if admission else None)
    hits = 0
    async with engine:
        for i, key in enumerate(trace):
            req = RequestContext(f"r{i}")
            if await engine.lookup(key, req) is LookupResult.HIT:
                hits += 1
                engine.prepare_load([key], req)
                engine.complete_load([key], req)
                engine.touch([key])
            else:
                out = engine.prepare_store([key], req)
                if out is not None and out.keys_to_store:
                    engine.complete_store(list(out.keys_to_store), req, sizes=[0])
            engine.end_step(finished_req_ids=[req.req_id])
    return hits / len(trace)


async def policy_cases(rounds: int) -> list[Case]:
    """Hit ratio of LRU and ARC, with no admission, AdmitAfter(2) and AdmitAfter(3), on a
    scan-polluted trace through the scheduler path (lookup, then load or store); the floor is
    plain LRU on the same trace. A lookup and the store after it are two sightings, so
    AdmitAfter(2) admits every block looked up once before its store: AdmitAfter(3) is the one
    that keeps one-off blocks out."""
    trace = scan_polluted_trace(rounds)
    blocks = 64
    lru = await policy_hit_ratio("lru", None, trace, blocks)
    out = []
    for policy in ("lru", "arc"):
        for admission in (None, AdmitAfter(2), AdmitAfter(3)):
            ratio = lru if (policy, admission) == ("lru", None) else (
                await policy_hit_ratio(policy, admission, trace, blocks)
            )
            out.append(Case(
                "policy",
                {"policy": policy, "admission": repr(admission or AdmitAll()),
                 "primary_blocks": blocks, "lookups": len(trace), "hot_keys": 48,
                 "scan_keys_per_round": 80, "via": "lookup; load+touch or store"},
                "hit ratio", True, ratio, floor=Measure("LRU, no admission", lru),
            ))  # fmt: skip
    return out


async def _policy(quick: bool) -> list[Case]:
    return await policy_cases(10 if quick else 40)


async def _memory_promote(quick: bool) -> list[Case]:
    return await memory_promote(5 if quick else 15)


def _rounds(quick: bool) -> int:
    return 5 if quick else 15


def _ops(quick: bool) -> int:
    return 20_000 if quick else 200_000


CASES: dict[str, CaseRunner] = {
    "lookup_hit": _lookup_hit,
    "lookup_prefix": _lookup_prefix,
    "scale": _scale,
    "memory": _memory,
    "memory_promote": _memory_promote,
    "metrics_overhead": _metrics_overhead,
    "policy": _policy,
    "blocking_lookup_hit": _blocking_lookup_hit,
}


async def run(quick: bool, cases: Iterable[str] | None = None) -> list[Case]:
    """Every core case (or the named ones, in this module's order)."""
    wanted = set(CASES) if cases is None else set(cases)
    out: list[Case] = []
    for name, runner in CASES.items():
        if name in wanted:
            out += await runner(quick)
    return out
