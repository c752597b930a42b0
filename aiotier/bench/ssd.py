"""``ssd_promote`` / ``ssd_demote`` / ``ssd_open``: the SSD tier against a floor and peers.

``ssd_promote`` moves N blocks from an :class:`~aiotier.tiers.SSDTier` into the primary arena,
requested as a scheduler does (``lookup_prefix`` of 64 keys, then ``wait``; until the engine
exists, the tier's own ``read_many_into``), every block verified. The floor is the fastest simple
thing that moves the same bytes: a synchronous ``open`` + ``os.preadv`` + ``close`` of the same
files into one reused, page-aligned buffer (a ``bytearray`` sits 16 bytes past a page boundary,
which makes the kernel copy ~4x slower through 4K aliasing and would flatter us). The peers are
``diskcache.Cache.get`` of the same values and naive aiofiles (``async with aiofiles.open`` +
``read`` per file, 64 files gathered at once: three thread hops per file). Warm and cold (pages
dropped with ``posix_fadvise(DONTNEED)`` before each round of every contender). Two more
figures bound what is possible: ``sync_same_work`` (the tier's work — header and payload into
64 arena slots, xxh3 — done synchronously) and ``same_work_all_cpus`` (that work split over one
thread per CPU with the event loop idle: the copy's own ceiling on the machine).

``ssd_demote`` writes N evicted blocks down: the engine's write-back (``put`` into a primary that
holds 64 blocks, then ``flush``) when the engine exists, the tier's ``write_many`` otherwise;
floor: a synchronous temp-file write + rename of the same bytes; peer: ``diskcache.Cache.set``.

``ssd_open``: the index rebuild of ``SSDTier.open()`` over N files (restart time), and the cost
of the checksum on the promotion path. Rounds alternate contenders; figures are medians.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import mmap
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiofiles
import xxhash

from .. import LookupResult, PrimaryTier, SSDTier, TieringEngine
from ..tiers.framing import HEADER
from .common import Case, LoopLagTicker, Measure, alternate, note_missing

__all__ = ["CASES", "main", "run"]

CASES = ("ssd_promote", "ssd_demote", "ssd_open")

BATCH = 64
KiB = 1024
MiB = 1024 * KiB


def _diskcache(case: str) -> Any:
    """The diskcache module, or None (and a note) when the bench extra is not installed."""
    try:
        import diskcache
    except ImportError:
        note_missing("diskcache", f"{case} runs without its diskcache peer")
        return None
    return diskcache


def _drop_pages(paths: list[str]) -> None:
    """Evict the files' pages from the page cache (clean pages only: data is synced at setup)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _all_files(root: str) -> list[str]:
    out: list[str] = []
    for dirpath, _dirs, files in os.walk(root):
        out.extend(os.path.join(dirpath, f) for f in files)
    return out


def _sync_files(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.asynccontextmanager
async def _promoter(
    tier: SSDTier, keys: list[bytes], block_size: int
) -> AsyncIterator[tuple[Callable[[], Awaitable[None]], str]]:
    batches = [keys[i : i + BATCH] for i in range(0, len(keys), BATCH)]

    # One batch of room (the caller keeps at least two batches): every round promotes every
    # block again from the SSD tier (write policy "none": evictions drop, no write-back). The
    # whole primary is a promotion buffer: nothing is stored that would need room.
    primary = PrimaryTier(BATCH, block_size)
    engine = TieringEngine(
        primary, [tier], write_policy="none", promotion_timeout=60.0, max_promotion_share=1.0
    )

    async def promote() -> None:
        for batch in batches:
            await engine.lookup_prefix(batch)
            results = await engine.wait(batch, timeout=60.0)
            if any(r is not LookupResult.HIT for r in results):
                raise RuntimeError(f"promotion failed: {results[:3]!r}")
            engine.end_step()

    async with engine:
        yield promote, "engine lookup_prefix(64)+wait"


async def _idle_lag() -> dict[str, float]:
    """The ticker's lateness with nothing else running: this machine's own noise floor."""
    ticker = LoopLagTicker()
    async with ticker:
        await asyncio.sleep(0.5)
    return ticker.summary_ms()


async def _promote_cases(
    root: str, block_size: int, blocks: int, rounds: int, io_threads: int
) -> list[Case]:
    diskcache = _diskcache("ssd_promote")
    keys = [f"bench-{block_size}-{i}".encode() for i in range(blocks)]
    payload = os.urandom(block_size)
    values = [k[-8:].rjust(8, b"-") + payload[8:] for k in keys]  # no two blocks alike
    total = blocks * block_size
    tier_dir = os.path.join(root, f"tier-{block_size}")
    dc_dir = os.path.join(root, f"diskcache-{block_size}")
    tier = SSDTier(tier_dir, 2 * total + 64 * MiB, io_threads=io_threads)
    await tier.open()
    cache = None if diskcache is None else diskcache.Cache(dc_dir, size_limit=4 * total)
    same_work_pool = ThreadPoolExecutor(max(2, os.cpu_count() or 2))
    try:
        for i in range(0, blocks, BATCH):
            items = list(zip(keys[i : i + BATCH], values[i : i + BATCH], strict=True))
            errors = await tier.write_many(items)
            if any(errors):
                raise RuntimeError(f"writing benchmark blocks failed: {errors[:3]!r}")
        if cache is not None:
            for k, v in zip(keys, values, strict=True):
                cache.set(k, v)
        tier_files = [os.path.join(tier_dir, p) for p in _tier_paths(tier, keys, block_size)]
        dc_files = _all_files(dc_dir) if cache is not None else []
        _sync_files(tier_files + dc_files)
        floor_buf = mmap.mmap(-1, block_size + 4096)  # page-aligned: the fastest simple target
        floor_view = memoryview(floor_buf)

        def floor_round_sync() -> float:
            t0 = time.perf_counter()
            for p in tier_files:
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.preadv(fd, [floor_view], 0)
                finally:
                    os.close(fd)
            return total / (time.perf_counter() - t0) / 1e9

        async def floor_round() -> float:
            return floor_round_sync()

        # The same work as the tier, done synchronously: into 64 distinct slots of a bytearray
        # arena (as the engine's), header and payload in one preadv, xxh3 verified.
        arena = memoryview(bytearray(BATCH * block_size))
        slots = [arena[i * block_size : (i + 1) * block_size] for i in range(BATCH)]
        hdr_lens = [HEADER.size + len(k) for k in keys]

        def same_work_part(part: range) -> None:
            for i in part:
                hdr = bytearray(hdr_lens[i])
                fd = os.open(tier_files[i], os.O_RDONLY)
                try:
                    os.preadv(fd, [hdr, slots[i % BATCH]], 0)
                finally:
                    os.close(fd)
                if xxhash.xxh3_64_intdigest(slots[i % BATCH]) != HEADER.unpack_from(hdr)[5]:
                    raise RuntimeError("checksum mismatch")

        async def same_work_round() -> float:
            t0 = time.perf_counter()
            same_work_part(range(blocks))
            return total / (time.perf_counter() - t0) / 1e9

        async def same_work_threads_round() -> float:
            # The copy's own ceiling with every CPU on it: the same work split over one thread
            # per CPU (half of each 64-block batch each on two), the event loop only waiting.
            n = max(2, os.cpu_count() or 2)
            step = -(-BATCH // n)
            t0 = time.perf_counter()
            for b in range(0, blocks, BATCH):
                end = min(b + BATCH, blocks)
                parts = [range(j, min(end, j + step)) for j in range(b, end, step)]
                list(same_work_pool.map(same_work_part, parts))
            return total / (time.perf_counter() - t0) / 1e9

        async def diskcache_round() -> float:
            assert cache is not None
            t0 = time.perf_counter()
            for k in keys:
                if cache.get(k) is None:
                    raise RuntimeError("diskcache lost a value")
            return total / (time.perf_counter() - t0) / 1e9

        async def naive_read(p: str) -> int:
            async with aiofiles.open(p, "rb") as f:
                return len(await f.read())

        async def naive_round() -> float:
            t0 = time.perf_counter()
            for i in range(0, blocks, BATCH):
                await asyncio.gather(*(naive_read(p) for p in tier_files[i : i + BATCH]))
            return total / (time.perf_counter() - t0) / 1e9

        out: list[Case] = []
        async with _promoter(tier, keys, block_size) as (promote, via):
            for cache_state in ("warm", "cold"):
                ticker = LoopLagTicker()

                async def aiotier_round(ticker: LoopLagTicker = ticker) -> float:
                    async with ticker:
                        t0 = time.perf_counter()
                        await promote()
                        return total / (time.perf_counter() - t0) / 1e9

                def before(name: str, cache_state: str = cache_state) -> None:
                    if cache_state == "cold":
                        _drop_pages(dc_files if name == "diskcache" else tier_files)
                    else:
                        gc.collect()

                contenders: dict[str, Callable[[], Awaitable[float]]] = {
                    "aiotier": aiotier_round,
                    "floor": floor_round,
                    "naive": naive_round,
                    "same_work": same_work_round,
                    "same_work_threads": same_work_threads_round,
                }
                if cache is not None:
                    contenders["diskcache"] = diskcache_round
                figures = await alternate(contenders, rounds, before)
                lag = ticker.summary_ms()
                idle = await _idle_lag()
                out.append(
                    Case(
                        "ssd_promote",
                        {
                            "block_size": block_size,
                            "blocks": blocks,
                            "cache": cache_state,
                            "batch": BATCH,
                            "rounds": rounds,
                            "via": via,
                            "io_threads": tier.io_threads,
                        },
                        "GB/s",
                        True,
                        figures["aiotier"],
                        floor=Measure(
                            "sync open+os.preadv+close, one reused buffer", figures["floor"]
                        ),
                        peer=(
                            Measure("diskcache.Cache.get", figures["diskcache"])
                            if "diskcache" in figures
                            else None
                        ),
                        extra={
                            "naive_aiofiles": figures["naive"],
                            "ratio_to_naive_aiofiles": figures["aiotier"] / figures["naive"],
                            "loop_lag_p99_ms": lag["p99_ms"],
                            "loop_lag_max_ms": lag["max_ms"],
                            "loop_lag_idle_p99_ms": idle["p99_ms"],
                            "sync_same_work": figures["same_work"],
                            "ratio_to_sync_same_work": figures["aiotier"] / figures["same_work"],
                            "same_work_all_cpus": figures["same_work_threads"],
                            "ratio_to_same_work_all_cpus": (
                                figures["aiotier"] / figures["same_work_threads"]
                            ),
                        },
                    )
                )
        return out
    finally:
        same_work_pool.shutdown()
        if cache is not None:
            cache.close()
        await tier.aclose()
        shutil.rmtree(tier_dir, ignore_errors=True)
        shutil.rmtree(dc_dir, ignore_errors=True)


def _tier_paths(tier: SSDTier, keys: list[bytes], block_size: int) -> Iterator[str]:
    from ..tiers.framing import frame_size
    from ..tiers.ssd import block_relpath, key_digest

    for k in keys:
        yield block_relpath(key_digest(k), frame_size(k, block_size))


async def _demote_case(root: str, block_size: int, blocks: int, rounds: int) -> Case:
    diskcache = _diskcache("ssd_demote")
    payload = os.urandom(block_size)
    total = blocks * block_size
    tier_dir = os.path.join(root, f"demote-tier-{block_size}")
    floor_dir = os.path.join(root, f"demote-floor-{block_size}")
    dc_dir = os.path.join(root, f"demote-diskcache-{block_size}")
    os.makedirs(floor_dir, exist_ok=True)
    tier = SSDTier(tier_dir, (rounds + 2) * (total + blocks * 256) + 64 * MiB)
    cache = (
        None
        if diskcache is None
        else diskcache.Cache(dc_dir, size_limit=(rounds + 2) * total * 2)
    )
    counter = {"aiotier": 0, "floor": 0, "diskcache": 0, "tier": 0}

    def round_items(name: str) -> list[tuple[bytes, bytes]]:
        counter[name] += 1
        r = counter[name]
        keys = [f"{name}-{r}-{i}".encode() for i in range(blocks)]
        return [(k, k[-8:].rjust(8, b"-") + payload[8:]) for k in keys]

    engine = TieringEngine(PrimaryTier(BATCH, block_size), [tier], write_policy="write_back")
    await engine.open()
    try:

        async def aiotier_round() -> float:
            items = round_items("aiotier")
            t0 = time.perf_counter()
            for k, v in items:
                if not await engine.put(k, v):
                    raise RuntimeError("put failed")
            await engine.flush(timeout=120.0)
            return total / (time.perf_counter() - t0) / 1e9

        async def tier_round() -> float:
            items = round_items("tier")
            t0 = time.perf_counter()
            for i in range(0, blocks, BATCH):
                errors = await tier.write_many(items[i : i + BATCH])
                if any(errors):
                    raise RuntimeError(f"write failed: {errors[:3]!r}")
            return total / (time.perf_counter() - t0) / 1e9

        async def floor_round() -> float:
            items = round_items("floor")
            t0 = time.perf_counter()
            for k, v in items:
                name = os.path.join(floor_dir, k.decode())
                tmp = name + ".tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    os.write(fd, v)
                finally:
                    os.close(fd)
                os.rename(tmp, name)
            return total / (time.perf_counter() - t0) / 1e9

        async def diskcache_round() -> float:
            assert cache is not None
            items = round_items("diskcache")
            t0 = time.perf_counter()
            for k, v in items:
                cache.set(k, v)
            return total / (time.perf_counter() - t0) / 1e9

        contenders: dict[str, Callable[[], Awaitable[float]]] = {
            "aiotier": aiotier_round,
            "floor": floor_round,
            "tier": tier_round,
        }
        if cache is not None:
            contenders["diskcache"] = diskcache_round
        figures = await alternate(contenders, rounds)
        return Case(
            "ssd_demote",
            {
                "block_size": block_size,
                "blocks": blocks,
                "rounds": rounds,
                "fsync": False,
                "via": "engine put into a 64-block primary (write_back), then flush",
            },
            "GB/s",
            True,
            figures["aiotier"],
            floor=Measure("sync write+rename", figures["floor"]),
            peer=(
                Measure("diskcache.Cache.set", figures["diskcache"])
                if "diskcache" in figures
                else None
            ),
            extra={"tier_write_many": figures["tier"]},
        )
    finally:
        await engine.aclose(flush=False)
        if cache is not None:
            cache.close()
        for d in (tier_dir, floor_dir, dc_dir):
            shutil.rmtree(d, ignore_errors=True)


async def _open_case(root: str, blocks: int) -> Case:
    """Restart time: ``SSDTier.open()`` over ``blocks`` files, and the checksum's cost."""
    path = os.path.join(root, "open")
    payload = os.urandom(4 * KiB)
    async with SSDTier(path, 1 << 40) as tier:
        for i in range(0, blocks, 256):
            items = [(f"o{j}".encode(), payload) for j in range(i, min(blocks, i + 256))]
            errors = await tier.write_many(items)
            if any(errors):
                raise RuntimeError(f"write failed: {errors[:3]!r}")
    samples = []
    for _ in range(3):
        tier = SSDTier(path, 1 << 40)
        t0 = time.perf_counter()
        await tier.open()
        samples.append(time.perf_counter() - t0)
        assert tier.usage().blocks == blocks
        await tier.aclose()
    shutil.rmtree(path, ignore_errors=True)
    checksum = {}
    for size in (256 * KiB, MiB):
        buf = os.urandom(size)
        n = max(50, (64 * MiB) // size)
        t0 = time.perf_counter()
        for _ in range(n):
            xxhash.xxh3_64_intdigest(buf)
        el = time.perf_counter() - t0
        checksum[f"xxh3_us_per_{size // KiB}KiB"] = el / n * 1e6
        checksum["xxh3_GBps"] = n * size / el / 1e9
    return Case(
        "ssd_open",
        {"blocks": blocks, "payload": 4 * KiB, "rounds": 3},
        "s",
        False,
        statistics.median(samples),
        extra={"per_block_us": statistics.median(samples) / blocks * 1e6, **checksum},
    )


async def run(
    quick: bool, io_threads: int | None = None, cases: Iterable[str] | None = None
) -> list[Case]:
    """Every SSD case (or the named ones of :data:`CASES`); ``quick`` keeps it to about 15 s."""
    wanted = set(CASES) if cases is None else set(cases)
    threads = io_threads if io_threads is not None else SSDTier(".", 1).io_threads
    base = os.environ.get("AIOTIER_BENCH_DIR") or None
    root = tempfile.mkdtemp(prefix="aiotier-bench-ssd-", dir=base)
    rounds = 2 if quick else 7
    # The promotion runs need at least two batches of 64 (the primary holds one).
    promote = [(256 * KiB, 128 if quick else 1024), (MiB, 128 if quick else 512)]
    demote = [(256 * KiB, 32 if quick else 1024), (MiB, 16 if quick else 256)]
    try:
        out: list[Case] = []
        if "ssd_promote" in wanted:
            for block_size, blocks in promote:
                out += await _promote_cases(root, block_size, blocks, rounds, threads)
        if "ssd_demote" in wanted:
            for block_size, blocks in demote:
                out.append(await _demote_case(root, block_size, blocks, rounds))
        if "ssd_open" in wanted:
            out.append(await _open_case(root, 2_000 if quick else 100_000))
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m aiotier.bench.ssd [--quick] [--json FILE]``: print the cases."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--io-threads", type=int, default=None)
    args = ap.parse_args(argv)
    cases = asyncio.run(run(args.quick, args.io_threads))
    rows = [c.to_json() for c in cases]
    for r in rows:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cases": rows}, f, indent=2)


if __name__ == "__main__":
    main()
