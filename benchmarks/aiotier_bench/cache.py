"""The ``cache`` case: ``get_or_load`` as a web service uses it, beside aiocache's and cashews'
in-memory caches in the same run.

- ``cache_hit``: hits of 4 KiB values. aiotier copies the value out of its arena; the peers hand
  back the object they hold. The peer figure is the faster of the two peers' own get-or-compute
  on a hit (aiocache ``SimpleMemoryCache.get``, cashews ``get_or_set``).
- ``cache_stampede``: 1,000 concurrent misses of one key whose loader takes 10 ms: how many
  times each library runs the loader (aiotier's single flight; aiocache's ``cached`` and
  ``cached_stampede`` decorators; cashews' ``get_or_set`` and its ``cache(lock=True)``).
- ``cache_write_through``: ``put`` of 4 KiB values acknowledged by a write-through tier (an SSD
  tier, and a memory tier), against the same ``put`` with the tier written back (it returns
  before any tier write): the cost of waiting for the tier.
- ``cache_large_value``: ``get`` of a 1 MiB value stored over 16 blocks of 64 KiB (its pieces
  read, joined and checked against the value's digest), against one copy of 1 MiB (the floor:
  any cache that hands out bytes it does not share copies them once).
- ``cache_ttl``: the cost of a TTL: ``get_or_load`` and ``get`` hits of 4 KiB values stored with
  a TTL, against the same calls on values stored without one, in the same run and engine (the
  floor is the call without TTL; ``ratio_to_floor`` is what a TTL leaves of its speed). A hit
  of a value with a TTL checks the slot's deadline, then the value's head (its checksum and the
  value's digest) before copying the value out.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiotier.engine import TieringEngine
from aiotier.tiers.memory import MemoryTier
from aiotier.tiers.primary import PrimaryTier
from aiotier.tiers.ssd import SSDTier

from .common import Case, Measure, alternate, note_missing

__all__ = ["CASE_NAMES", "run"]

CASE_NAMES = (
    "cache_hit", "cache_stampede", "cache_large_value", "cache_ttl", "cache_write_through"
)  # fmt: skip
_VALUE = bytes(range(256)) * 16  # 4 KiB
_KEYS = 1024
_now = time.perf_counter


async def cache_hit(ops: int, rounds: int) -> Case:
    keys = [f"user:{i}" for i in range(_KEYS)]
    sample = [keys[(i * 7919) % _KEYS] for i in range(ops)]
    engine = TieringEngine(PrimaryTier(_KEYS, len(_VALUE)))
    await engine.open()

    async def load() -> bytes:
        return _VALUE

    for k in keys:
        await engine.get_or_load(k, load)
    table = dict.fromkeys(keys, _VALUE)

    async def coro_get(k: str) -> bytes | None:
        return table.get(k)

    async def floor() -> float:
        t = _now()
        for k in sample:
            await coro_get(k)
        return (_now() - t) / ops * 1e6

    async def ours() -> float:
        get_or_load = engine.get_or_load
        t = _now()
        for k in sample:
            await get_or_load(k, load)
        return (_now() - t) / ops * 1e6

    fns: dict[str, Callable[[], Awaitable[float]]] = {"floor": floor, "aiotier": ours}
    peers: dict[str, str] = {}
    peer_sample = sample[: max(ops // 10, 100)]
    try:
        from aiocache import SimpleMemoryCache
    except ImportError:
        note_missing("aiocache", "cache_hit runs without its aiocache peer")
    else:
        aio = SimpleMemoryCache()
        for k in keys:
            await aio.set(k, _VALUE)

        async def aiocache_get() -> float:
            t = _now()
            for k in peer_sample:
                await aio.get(k)
            return (_now() - t) / len(peer_sample) * 1e6

        fns["aiocache"] = aiocache_get
        peers["aiocache"] = "aiocache SimpleMemoryCache.get"
    try:
        from cashews import Cache
    except ImportError:
        note_missing("cashews", "cache_hit runs without its cashews peer")
    else:
        cashews = Cache()
        cashews.setup("mem://")
        for k in keys:
            await cashews.set(k, _VALUE)

        async def cashews_get_or_set() -> float:
            t = _now()
            for k in peer_sample:
                await cashews.get_or_set(k, load)
            return (_now() - t) / len(peer_sample) * 1e6

        fns["cashews"] = cashews_get_or_set
        peers["cashews"] = "cashews mem:// get_or_set"
    med = await alternate(fns, rounds)
    await engine.aclose(flush=False)
    best = min(peers, key=lambda p: med[p]) if peers else None
    return Case(
        "cache_hit",
        {"value_bytes": len(_VALUE), "keys": _KEYS, "ops": ops},
        "us/op",
        False,
        med["aiotier"],
        floor=Measure("await coroutine doing dict.get", med["floor"]),
        peer=Measure(peers[best], med[best]) if best is not None else None,
        extra={f"{p}_us": med[p] for p in peers},
    )


async def _stampede(get: Callable[[], Awaitable[Any]], callers: int) -> None:
    await asyncio.gather(*(get() for _ in range(callers)))


async def cache_stampede(callers: int = 1000) -> Case:
    calls: dict[str, int] = {}

    def loader_for(name: str) -> Callable[[], Awaitable[bytes]]:
        calls[name] = 0

        async def load() -> bytes:
            calls[name] += 1
            await asyncio.sleep(0.01)
            return _VALUE

        return load

    async with TieringEngine(PrimaryTier(16, len(_VALUE))) as engine:
        load = loader_for("aiotier")
        await _stampede(lambda: engine.get_or_load("hot", load), callers)
    try:
        from aiocache import cached, cached_stampede
    except ImportError:
        note_missing("aiocache", "cache_stampede runs without its aiocache peers")
    else:
        await _stampede(cached(ttl=60)(loader_for("aiocache cached")), callers)
        await _stampede(cached_stampede(lease=2, ttl=60)(loader_for("aiocache cached_stampede")),
                        callers)  # fmt: skip
    try:
        from cashews import Cache
    except ImportError:
        note_missing("cashews", "cache_stampede runs without its cashews peers")
    else:
        cashews = Cache()
        cashews.setup("mem://")
        plain = loader_for("cashews get_or_set")
        await _stampede(lambda: cashews.get_or_set("hot", plain, expire=60), callers)
        await _stampede(cashews(ttl=60, key="hot-locked", lock=True)(
            loader_for("cashews cache(lock=True)")), callers)  # fmt: skip
    peers = {k: v for k, v in calls.items() if k != "aiotier"}
    best = min(peers, key=lambda p: peers[p]) if peers else None
    return Case(
        "cache_stampede",
        {"callers": callers, "loader_seconds": 0.01},
        "loader calls",
        False,
        calls["aiotier"],
        peer=Measure(best, peers[best]) if best is not None else None,
        extra={"loader_calls": calls},
    )


async def cache_large_value(rounds: int, gets: int = 50) -> Case:
    block = 64 * 1024
    big = bytes(range(256)) * 4096  # 1 MiB
    engine = TieringEngine(PrimaryTier(64, block))
    await engine.open()
    assert await engine.put("big", big)
    source = memoryview(bytearray(big))

    async def floor() -> float:
        t = _now()
        for _ in range(gets):
            source.tobytes()
        return (_now() - t) / gets * 1e6

    async def ours() -> float:
        t = _now()
        for _ in range(gets):
            await engine.get("big")
        return (_now() - t) / gets * 1e6

    t = _now()
    for _ in range(gets):
        assert await engine.put("big", big)
    put_us = (_now() - t) / gets * 1e6
    med = await alternate({"floor": floor, "aiotier": ours}, rounds)
    await engine.aclose(flush=False)
    return Case(
        "cache_large_value",
        {"value_bytes": len(big), "block_size": block, "pieces": len(big) // block},
        "us/get",
        False,
        med["aiotier"],
        floor=Measure("one copy of 1 MiB", med["floor"]),
        extra={"put_us": put_us},
    )


async def cache_ttl(ops: int, rounds: int) -> Case:
    keys = [f"user:{i}" for i in range(_KEYS)]
    sample = [keys[(i * 7919) % _KEYS] for i in range(ops)]
    # blocks hold a 4 KiB value with its 72-byte head; both kinds of value live in one engine
    engine = TieringEngine(PrimaryTier(2 * _KEYS, 2 * len(_VALUE)))
    await engine.open()

    async def load() -> bytes:
        return _VALUE

    for k in keys:
        assert await engine.put(k, _VALUE)
        assert await engine.put("ttl:" + k, _VALUE, ttl=24 * 3600.0)
    with_ttl = ["ttl:" + k for k in sample]

    def timed(
        call: Callable[[str], Awaitable[Any]], ks: list[str]
    ) -> Callable[[], Awaitable[float]]:
        async def run() -> float:
            t = _now()
            for k in ks:
                await call(k)
            return (_now() - t) / ops * 1e6

        return run

    async def get_or_load(k: str) -> bytes:
        return await engine.get_or_load(k, load)

    med = await alternate(
        {
            "get_or_load": timed(get_or_load, sample),
            "get_or_load_ttl": timed(get_or_load, with_ttl),
            "get": timed(engine.get, sample),
            "get_ttl": timed(engine.get, with_ttl),
        },
        rounds,
    )
    assert await engine.get(with_ttl[0]) == _VALUE
    await engine.aclose(flush=False)
    return Case(
        "cache_ttl",
        {"value_bytes": len(_VALUE), "keys": _KEYS, "ops": ops, "ttl_s": 24 * 3600},
        "us/op",
        False,
        med["get_or_load_ttl"],
        floor=Measure("get_or_load hit of a value without TTL", med["get_or_load"]),
        extra={
            "get_us": med["get"],
            "get_ttl_us": med["get_ttl"],
            "get_ttl_ratio": med["get"] / med["get_ttl"] if med["get_ttl"] else None,
        },
    )


async def cache_write_through(ops: int, rounds: int) -> Case:
    d = await asyncio.to_thread(tempfile.mkdtemp, prefix="aiotier-bench-")
    try:
        tiers = {
            "write_back": MemoryTier(64 << 20, name="tier"),
            "memory": MemoryTier(64 << 20, name="tier"),
            "ssd": SSDTier(d, 64 << 20, name="tier"),
        }
        engines = {
            name: TieringEngine(
                PrimaryTier(4 * ops, len(_VALUE)),  # no eviction: the put's own cost
                [tier],
                write_policy="write_back" if name == "write_back" else "write_through",
            )
            for name, tier in tiers.items()
        }
        for e in engines.values():
            await e.open()

        def puts(e: TieringEngine) -> Callable[[], Awaitable[float]]:
            async def run() -> float:
                t = _now()
                for i in range(ops):
                    assert await e.put(f"k{i}", _VALUE)
                return (_now() - t) / ops * 1e6

            return run

        try:
            med = await alternate({name: puts(e) for name, e in engines.items()}, rounds)
        finally:
            for e in engines.values():
                await e.aclose(flush=False)
    finally:
        await asyncio.to_thread(shutil.rmtree, d, True)
    return Case(
        "cache_write_through",
        {"value_bytes": len(_VALUE), "ops": ops, "tier": "ssd", "fsync": False},
        "us/put",
        False,
        med["ssd"],
        floor=Measure("put with the tier written back (no wait)", med["write_back"]),
        extra={"memory_tier_write_through_us": med["memory"]},
    )


async def run(quick: bool, cases: tuple[str, ...] = CASE_NAMES) -> list[Case]:
    out: list[Case] = []
    if "cache_hit" in cases:
        out.append(await cache_hit(20_000 if quick else 200_000, 5 if quick else 15))
    if "cache_stampede" in cases:
        out.append(await cache_stampede())
    if "cache_large_value" in cases:
        out.append(await cache_large_value(5 if quick else 15))
    if "cache_ttl" in cases:
        out.append(await cache_ttl(20_000 if quick else 200_000, 5 if quick else 15))
    if "cache_write_through" in cases:
        out.append(await cache_write_through(500 if quick else 2000, 5 if quick else 15))
    return out
