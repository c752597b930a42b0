"""Core benchmarks: primary-hit lookups, prefix scans, scale, index memory, metrics overhead."""

from __future__ import annotations

import asyncio
import gc
import random
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

from .. import MemoryTier, PrimaryTier, RequestContext, TieringEngine
from .common import Case, Measure, alternate

__all__ = ["run"]

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


async def lookup_hit(
    n_blocks: int, ops: int, rounds: int, peer: bool = True, hot: int | None = None
) -> Case:
    """Primary hits, keys drawn uniformly from all blocks (or from the first ``hot`` ones)."""
    engine = await _filled_engine(n_blocks)
    keys = _keys(n_blocks)
    rng = random.Random(1)
    span = n_blocks if hot is None else min(hot, n_blocks)
    sample = [keys[rng.randrange(span)] for _ in range(ops)]
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


async def scale(points: list[int], ops: int, rounds: int) -> list[Case]:
    """lookup_hit as the index grows, against the figure at the smallest size.

    Two access patterns: ``uniform`` over every block (each lookup misses the CPU caches once
    the index outgrows them, for a plain dict too: ``dict_same_scale`` gives that dict's own
    figure and ratio), and ``hot_1000`` (the same 1000 keys at every size: what the index
    structure itself costs as it grows).
    """
    out = []
    for access, hot in (("uniform", None), ("hot_1000", 1000)):
        base: float | None = None
        for n in points:
            case = await lookup_hit(n, ops, rounds, peer=False, hot=hot)
            assert case.aiotier is not None and case.floor is not None
            if base is None:
                base = case.aiotier
            out.append(
                Case(
                    "scale",
                    {"blocks": n, "ops": ops, "access": access},
                    "us/op",
                    False,
                    case.aiotier,
                    floor=Measure(f"lookup_hit at {points[0]} blocks, same access", base),
                    extra={
                        "dict_same_scale_us": case.floor.value,
                        "ratio_to_dict_same_scale": case.floor.value / case.aiotier,
                    },
                )
            )
            gc.collect()
    return out


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


async def step_loop(provider: Any, steps: int) -> float:
    """ms per step of the BENCHMARKS.md step shape, under ``provider``."""
    rng = random.Random(3)
    block = 64
    n_keys = 4096
    keys = _keys(n_keys)
    tier = MemoryTier(n_keys * block * 4)
    engine = TieringEngine(
        PrimaryTier(n_keys, block), [tier], meter_provider=provider,
        max_inflight_promotions=4096,
    )  # fmt: skip
    await engine.open()
    for k in keys:
        if rng.random() < 0.9:
            engine.prepare_store([k])
            engine.complete_store([k], sizes=[block])
        else:
            await tier.write(k, bytes(block))
    engine.end_step()  # the fill's own samples are not part of the measured steps
    engine.take_events()
    active = [f"r{i}" for i in range(128)]
    next_id = 128
    t = _now()
    for _step in range(steps):
        for rid in active:
            start = rng.randrange(n_keys - 32)
            await engine.lookup_prefix(keys[start : start + 32], RequestContext(rid))
        for i in range(16):
            sk = [b"new-%d-%d-%d" % (_step, i, j) for j in range(4)]
            out = engine.prepare_store(sk)
            if out is not None:
                engine.complete_store(list(out.keys_to_store))
        admitted = active[:16]
        finished = active[16:32]
        active = active[32:] + [f"r{next_id + i}" for i in range(32)]
        next_id += 32
        engine.end_step(new_req_ids=admitted, finished_req_ids=finished)
        await asyncio.sleep(0)  # let promotions run, as a scheduler's forward pass would
    elapsed = (_now() - t) / steps * 1e3
    await engine.aclose(flush=False)
    return elapsed



async def metrics_overhead(steps: int, rounds: int) -> Case:
    """The step loop of BENCHMARKS.md with an SDK provider + Prometheus reader vs the no-op API."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    sdk = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    noop = NoOpMeterProvider()

    async def with_sdk() -> float:
        return await step_loop(sdk, steps)

    async def without() -> float:
        return await step_loop(noop, steps)

    med = await alternate({"floor": without, "aiotier": with_sdk}, rounds)
    sdk.shutdown()
    return Case(
        "metrics_overhead",
        {"steps": steps, "requests_per_step": 128, "prefix_keys": 32, "primary_hit_rate": 0.9},
        "ms/step",
        False,
        med["aiotier"],
        floor=Measure("same loop, no-op meter", med["floor"]),
    )


async def run(quick: bool) -> list[Case]:
    rounds = 5 if quick else 15
    ops = 20_000 if quick else 200_000
    cases = [await lookup_hit(1000, ops, rounds), await lookup_prefix(rounds, ops // 64)]
    cases += await scale([1000, 100_000] if quick else [1000, 100_000, 1_000_000], ops, rounds)
    cases.append(await memory(100_000 if quick else 1_000_000))
    cases.append(await metrics_overhead(5 if quick else 20, 3 if quick else 15))
    return cases
