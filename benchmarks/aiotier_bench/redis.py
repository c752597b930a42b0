"""``redis_promote``: promoting blocks from a shared Redis, against a plain MGET and aiocache.

The aiotier figure is what a scheduler sees: the blocks are requested 64 at a time with
``lookup_prefix`` (which starts their promotions from the Redis tier) and then ``wait``; the
bytes land in the primary arena, verified. The floor is the fastest simple thing that moves the
same bytes: redis-py ``MGET`` of the same 64 values per round trip, no verification, no copy.
The peer is what a user would reach for instead: aiocache ``RedisCache.get`` of each value (64
concurrent gets per batch, raw bytes, no serializer work). All three read the same values from
the same server in the same process run, alternating rounds; figures are GB/s medians.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiotier import RedisTier

from .common import (
    BENCH_EXTRA,
    Case,
    LoopLagTicker,
    alternate,
    engine_promoter,
    note_missing,
    promote_case,
)

__all__ = ["local_redis_server", "run", "run_local"]

BLOCK_SIZE = 256 * 1024
BATCH = 64
NAMESPACE = "aiotier-bench"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _answers_ping(port: int) -> bool:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 0.5)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(b"*1\r\n$4\r\nPING\r\n")
        await writer.drain()
        return (await asyncio.wait_for(reader.read(16), 0.5)).startswith(b"+PONG")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def local_redis_server(maxmemory: str = "2gb") -> AsyncIterator[str | None]:
    """A private ``redis-server`` on 127.0.0.1 for the run, or ``None`` when none is installed.

    Nothing is persisted, and the server is stopped by its own pid when the block ends.
    """
    exe = await asyncio.to_thread(shutil.which, "redis-server")
    if exe is None:
        yield None
        return
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        exe,
        "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 15
        while not await _answers_ping(port):
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {port} did not start")
            await asyncio.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _skipped(why: str) -> list[Case]:
    return [Case("redis_promote", {"block_size": BLOCK_SIZE}, "GB/s", True, None, skipped=why)]


def _driver_info() -> Any:
    """redis-py's own ``DriverInfo``, given up front: else redis-py reads its version from the
    package metadata (file system calls on the loop) for every connection the floor opens."""
    try:
        import redis
        from redis.driver_info import DriverInfo
    except ImportError:  # an older redis-py: it has no such lookup to avoid
        return None
    return DriverInfo(name="redis-py", lib_version=redis.__version__)


async def run_local(quick: bool) -> list[Case]:
    """:func:`run` against a server of its own; a skipped case when redis-server or redis-py
    is missing."""
    if importlib.util.find_spec("redis") is None:
        note_missing("redis (redis-py)", "redis_promote is skipped")
        return _skipped(f"redis-py is not installed ({BENCH_EXTRA})")
    async with local_redis_server() as url:
        if url is None:
            return _skipped("redis-server is not installed (apt-get install redis-server)")
        return await run(quick, url)


async def run(quick: bool, url: str) -> list[Case]:
    """The ``redis_promote`` case on the server at ``url`` (its namespace is emptied after)."""
    blocks = 256 if quick else 1024
    rounds = 5 if quick else 7
    keys = [f"bench-block-{i}".encode() for i in range(blocks)]
    batches = [keys[i : i + BATCH] for i in range(0, blocks, BATCH)]
    total_bytes = blocks * BLOCK_SIZE
    payload = os.urandom(BLOCK_SIZE)

    import redis.asyncio as redis_asyncio

    try:
        from aiocache import RedisCache
        from aiocache.serializers import NullSerializer
    except ImportError:
        note_missing("aiocache", "redis_promote runs without its aiocache peer")
        RedisCache = None

    tier = RedisTier(url, namespace=NAMESPACE, timeout=30.0)
    await tier.open()
    # the floor client gets its driver info up front too, or redis-py reads package metadata
    # from disk on the loop for every connection (which the loop-lag figures would count)
    info = _driver_info()
    plain = redis_asyncio.Redis.from_url(url, **({} if info is None else {"driver_info": info}))
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    peer = (
        None
        if RedisCache is None
        else RedisCache(
            serializer=NullSerializer(encoding=None), endpoint=host, port=int(port), namespace=""
        )
    )
    stack = contextlib.AsyncExitStack()
    try:
        # Every block differs in a few bytes, so no layer can get away with sharing one object.
        for batch in batches:
            items = [(k, k[-8:].rjust(8, b"-") + payload[8:]) for k in batch]
            errors = await tier.write_many(items)
            if any(errors):
                raise RuntimeError(f"writing the benchmark blocks failed: {errors!r}")
        rkeys = [tier.redis_key(k) for k in keys]
        rkey_batches = [rkeys[i : i + BATCH] for i in range(0, blocks, BATCH)]
        str_batches = [[k.decode() for k in b] for b in rkey_batches]

        ticker = LoopLagTicker()
        promote = await stack.enter_async_context(engine_promoter(tier, batches, BLOCK_SIZE))

        async def aiotier_round() -> float:
            async with ticker:
                t0 = time.perf_counter()
                await promote()
                return total_bytes / (time.perf_counter() - t0) / 1e9

        floor_ticker = LoopLagTicker()

        async def floor_round() -> float:
            async with floor_ticker:
                t0 = time.perf_counter()
                for b in rkey_batches:
                    values = await plain.mget(b)
                    assert all(v is not None for v in values)
                return total_bytes / (time.perf_counter() - t0) / 1e9

        async def peer_round() -> float:
            assert peer is not None
            t0 = time.perf_counter()
            for b in str_batches:
                values = await asyncio.gather(*(peer.get(k) for k in b))
                assert all(v is not None for v in values)
            return total_bytes / (time.perf_counter() - t0) / 1e9

        contenders: dict[str, Callable[[], Awaitable[float]]] = {
            "aiotier": aiotier_round, "floor": floor_round,
        }  # fmt: skip
        if peer is not None:
            contenders["peer"] = peer_round
        figures = await alternate(contenders, rounds)
        params = {
            "block_size": BLOCK_SIZE,
            "blocks": blocks,
            "batch": BATCH,
            "rounds": rounds,
            "via": "engine lookup_prefix+wait",
            "server": "local redis-server, loopback",
        }
        return [
            promote_case(
                "redis_promote",
                params,
                figures,
                "redis-py pipelined MGET (64 keys)",
                "aiocache RedisCache.get (64 concurrent)",
                (ticker, floor_ticker),
            )
        ]
    finally:
        await stack.aclose()
        with contextlib.suppress(Exception):
            async for k in plain.scan_iter(match=f"{NAMESPACE}:*", count=1000):
                await plain.delete(k)
        await plain.aclose()
        # aiocache 0.12's close() calls a method redis-py 8 no longer has; close its client.
        if peer is not None:
            await peer.client.aclose()
        await tier.aclose()
