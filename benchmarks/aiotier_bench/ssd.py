"""``ssd_promote`` / ``ssd_demote`` / ``ssd_open``: the SSD tier against a floor and peers.

What each case measures, its floors and its peers: ``docs/ssd.md``, "The benchmark cases".
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiofiles
import xxhash

from aiotier import LookupResult, PrimaryTier, SSDTier, TieringEngine
from aiotier._core.arena import Arena
from aiotier.tiers._ssd.layout import Geometry
from aiotier.tiers._ssd.slot import HEAD_SIZE, check_slot, encode_head

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


def _slot_files(root: str) -> list[str]:
    return sorted(os.path.join(root, f) for f in os.listdir(root) if f.startswith("slots-"))


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
    tier = SSDTier(tier_dir, 2 * total + 64 * MiB, io_threads=io_threads, block_size=block_size)
    await tier.open()
    cache = None if diskcache is None else diskcache.Cache(dc_dir, size_limit=4 * total)
    same_work_pool = ThreadPoolExecutor(max(2, os.cpu_count() or 2))
    fds: dict[str, int] = {}
    try:
        for i in range(0, blocks, BATCH):
            items = list(zip(keys[i : i + BATCH], values[i : i + BATCH], strict=True))
            errors = await tier.write_many(items)
            if any(errors):
                raise RuntimeError(f"writing benchmark blocks failed: {errors[:3]!r}")
        if cache is not None:
            for k, v in zip(keys, values, strict=True):
                cache.set(k, v)
        tier_files = _slot_files(tier_dir)
        dc_files = _all_files(dc_dir) if cache is not None else []
        _sync_files(tier_files + dc_files)
        # Where each block is: its slot file (opened once, as the tier's are) and offset.
        where = [tier.locate(k) for k in keys]
        fds = {p: os.open(p, os.O_RDONLY) for p in tier_files}
        slot_fd = [fds[w[0]] for w in where if w is not None]
        slot_off = [w[1] for w in where if w is not None]
        seqs = [tier.index.seq[tier.index.lru[k]] for k in keys]
        if len(slot_fd) != blocks:
            raise RuntimeError("a benchmark block is missing from the tier")
        head_lens = [HEAD_SIZE + len(k) for k in keys]
        # 64 slots of an arena like the engine's primary (a bytearray cut in block_size slots)
        slots = Arena(BATCH, block_size).slot_views(list(range(BATCH)))

        def floor_round_sync() -> float:
            t0 = time.perf_counter()
            for i in range(blocks):
                head = bytearray(head_lens[i])
                os.preadv(slot_fd[i], [head, slots[i % BATCH]], slot_off[i])
            return total / (time.perf_counter() - t0) / 1e9

        async def floor_round() -> float:
            return floor_round_sync()

        # The tier's whole work done synchronously: the same preadv, then the slot check.
        def same_work_part(part: range) -> None:
            for i in part:
                head = bytearray(head_lens[i])
                view = slots[i % BATCH]
                os.preadv(slot_fd[i], [head, view], slot_off[i])
                check_slot(head, keys[i], seqs[i], view)

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

        async def diskcache_slots_round() -> float:
            # The engine's end state: each batch's values in 64 reused arena slots (the round
            # above drops each value at once, so the allocator hands the same buffer back,
            # still in the CPU's caches; holding 64 values instead would measure page faults).
            assert cache is not None
            t0 = time.perf_counter()
            for i, k in enumerate(keys):
                value = cache.get(k)
                if value is None:
                    raise RuntimeError("diskcache lost a value")
                slots[i % BATCH][: len(value)] = value
            return total / (time.perf_counter() - t0) / 1e9

        async def naive_read(i: int) -> int:
            path, off = where[i] or ("", 0)
            async with aiofiles.open(path, "rb") as f:
                await f.seek(off)
                return len(await f.read(head_lens[i] + block_size))

        async def naive_round() -> float:
            t0 = time.perf_counter()
            for i in range(0, blocks, BATCH):
                await asyncio.gather(*(naive_read(j) for j in range(i, min(blocks, i + BATCH))))
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
                        _drop_pages(dc_files if name.startswith("diskcache") else tier_files)
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
                    contenders["diskcache_slots"] = diskcache_slots_round
                figures = await alternate(contenders, rounds, before)
                batch_peer = (
                    {
                        "diskcache_into_slots": figures["diskcache_slots"],
                        "ratio_to_diskcache_into_slots": (
                            figures["aiotier"] / figures["diskcache_slots"]
                        ),
                    }
                    if "diskcache_slots" in figures
                    else {}
                )
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
                            "sync os.preadv of each slot (header+payload) into 64 arena slots",
                            figures["floor"],
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
                            **batch_peer,
                        },
                    )
                )
        return out
    finally:
        same_work_pool.shutdown()
        for fd in fds.values():
            os.close(fd)
        if cache is not None:
            cache.close()
        await tier.aclose()
        shutil.rmtree(tier_dir, ignore_errors=True)
        shutil.rmtree(dc_dir, ignore_errors=True)


async def _demote_case(root: str, block_size: int, blocks: int, rounds: int) -> Case:
    diskcache = _diskcache("ssd_demote")
    payload = os.urandom(block_size)
    total = blocks * block_size
    tier_dir = os.path.join(root, f"demote-tier-{block_size}")
    floor_path = os.path.join(root, f"demote-floor-{block_size}")
    dc_dir = os.path.join(root, f"demote-diskcache-{block_size}")
    slot_size = Geometry.slot_size_for(block_size)
    # Room for two rounds: from the third on, every write evicts one (a full cache's life).
    tier = SSDTier(tier_dir, 2 * blocks * slot_size)
    cache = (
        None
        if diskcache is None
        else diskcache.Cache(dc_dir, size_limit=(rounds + 2) * total * 2)
    )
    names = ("aiotier", "short_switch", "floor", "diskcache", "tier", "same_work", "no_copy_out")
    counter = dict.fromkeys(names, 0)
    floor_fd = os.open(floor_path, os.O_RDWR | os.O_CREAT, 0o600)
    os.posix_fallocate(floor_fd, 0, blocks * slot_size)

    def round_items(name: str) -> list[tuple[bytes, bytes]]:
        counter[name] += 1
        r = counter[name]
        keys = [f"{name}-{r}-{i}".encode() for i in range(blocks)]
        return [(k, k[-8:].rjust(8, b"-") + payload[8:]) for k in keys]

    # The write-back backlog may hold a whole round: every evicted block is written (a smaller
    # bound drops what a burst of puts evicts faster than the tier writes, and counts it).
    engine = TieringEngine(
        PrimaryTier(BATCH, block_size),
        [tier],
        write_policy="write_back",
        max_pending_write_bytes=2 * total,
    )
    await engine.open()
    # Per engine round: the puts' share of the time, the loop thread's CPU per put while they
    # ran, and how much of the round's demotions the tier had written when they ended (what
    # overlapped the puts; the rest waited for the flush).
    phases: dict[str, list[float]] = {"puts_share": [], "loop_cpu_us": [], "overlap": []}
    try:

        async def engine_round(name: str) -> float:
            items = round_items(name)
            written = engine.stats().counters.get(("write_bytes", tier.name), 0)
            t0, c0 = time.perf_counter(), time.thread_time()
            for i, (k, v) in enumerate(items, 1):
                if not await engine.put(k, v):
                    raise RuntimeError("put failed")
                if i % BATCH == 0:  # a scheduler step: the writer runs between steps
                    await asyncio.sleep(0)
            t1, c1 = time.perf_counter(), time.thread_time()
            during = engine.stats().counters.get(("write_bytes", tier.name), 0) - written
            await engine.flush(timeout=120.0)
            elapsed = time.perf_counter() - t0
            counters = engine.stats().counters
            if counters.get(("tier_errors", tier.name, "write"), 0):
                raise RuntimeError("a demotion was dropped or failed")
            # every block but the primary's last BATCH went down in this round
            down = counters.get(("write_bytes", tier.name), 0) - written
            if down < (blocks - BATCH) * block_size:
                raise RuntimeError(f"only {down} bytes reached the tier")
            if name == "aiotier":
                phases["puts_share"].append((t1 - t0) / elapsed)
                phases["loop_cpu_us"].append((c1 - c0) / blocks * 1e6)
                phases["overlap"].append(during / down)
            return down / elapsed / 1e9

        async def aiotier_round() -> float:
            return await engine_round("aiotier")

        async def short_switch_round() -> float:
            # The same with the interpreter's switch interval at 0.5 ms (5 ms by default): how
            # much of the gap is the tier's threads waiting for the GIL while the loop computes
            # (docs/ssd.md, "Writes under a busy event loop"). A process-wide setting, restored.
            interval = sys.getswitchinterval()
            sys.setswitchinterval(5e-4)
            try:
                return await engine_round("short_switch")
            finally:
                sys.setswitchinterval(interval)

        async def tier_round() -> float:
            # The tier alone: its write_many of 64-block batches (what the engine's writer calls).
            items = round_items("tier")
            t0 = time.perf_counter()
            for i in range(0, blocks, BATCH):
                errors = await tier.write_many(items[i : i + BATCH])
                if any(errors):
                    raise RuntimeError(f"write failed: {errors[:3]!r}")
            return total / (time.perf_counter() - t0) / 1e9

        async def floor_round() -> float:
            # The same slot writes, synchronously: header encoded (xxh3 of the payload), then
            # payload and header written at the slot's offset of a preallocated file.
            items = round_items("floor")
            t0 = time.perf_counter()
            for i, (k, v) in enumerate(items):
                head = encode_head(k, i + 1, v)
                os.pwritev(floor_fd, [v], i * slot_size + len(head))
                os.pwrite(floor_fd, head, i * slot_size)
            return total / (time.perf_counter() - t0) / 1e9

        # The engine's passes over memory, synchronously: each put's copy into a 64-slot arena,
        # the victim's copy out into a reused buffer (what write-back must do before the slot
        # is reused), and the floor's write of that copy; and the same without the copy out.
        arena = memoryview(bytearray(BATCH * block_size))
        staging = [bytearray(block_size) for _ in range(blocks)]

        def same_work(name: str, *, copy_out: bool) -> float:
            items = round_items(name)
            t0 = time.perf_counter()
            for i, (k, v) in enumerate(items):
                slot = arena[(i % BATCH) * block_size : (i % BATCH + 1) * block_size]
                slot[:] = v
                out: memoryview | bytearray = slot
                if copy_out:
                    out = staging[i]
                    out[:] = slot
                head = encode_head(k, i + 1, out)
                os.pwritev(floor_fd, [out], i * slot_size + len(head))
                os.pwrite(floor_fd, head, i * slot_size)
            return total / (time.perf_counter() - t0) / 1e9

        async def same_work_round() -> float:
            return same_work("same_work", copy_out=True)

        async def no_copy_out_round() -> float:
            return same_work("no_copy_out", copy_out=False)

        async def diskcache_round() -> float:
            assert cache is not None
            items = round_items("diskcache")
            t0 = time.perf_counter()
            for k, v in items:
                cache.set(k, v)
            return total / (time.perf_counter() - t0) / 1e9

        contenders: dict[str, Callable[[], Awaitable[float]]] = {
            "aiotier": aiotier_round,
            "short_switch": short_switch_round,
            "floor": floor_round,
            "tier": tier_round,
            "same_work": same_work_round,
            "no_copy_out": no_copy_out_round,
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
                "via": "engine put into a 64-block primary (write_back), steps of 64 puts, "
                "then flush; every evicted block written",
            },
            "GB/s",
            True,
            figures["aiotier"],
            floor=Measure("sync pwritev of each slot (payload, then header)", figures["floor"]),
            peer=(
                Measure("diskcache.Cache.set", figures["diskcache"])
                if "diskcache" in figures
                else None
            ),
            extra={
                "ratio_to_sync_same_work": figures["aiotier"] / figures["same_work"],
                "puts_share_of_round": statistics.median(phases["puts_share"]),
                "loop_cpu_us_per_put": statistics.median(phases["loop_cpu_us"]),
                "written_while_putting": statistics.median(phases["overlap"]),
                "switch_interval_0_5ms": figures["short_switch"],
                "switch_interval_0_5ms_over_sync_same_work": (
                    figures["short_switch"] / figures["same_work"]
                ),
                "tier_write_many": figures["tier"],
                "tier_write_many_over_floor": figures["tier"] / figures["floor"],
                "sync_same_work": figures["same_work"],
                "sync_same_work_over_floor": figures["same_work"] / figures["floor"],
                "sync_without_victim_copy": figures["no_copy_out"],
                "sync_without_victim_copy_over_floor": figures["no_copy_out"] / figures["floor"],
                "evictions": tier.usage().evictions,
            },
        )
    finally:
        await engine.aclose(flush=False)
        os.close(floor_fd)
        if cache is not None:
            cache.close()
        shutil.rmtree(tier_dir, ignore_errors=True)
        shutil.rmtree(dc_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(floor_path)


async def _open_cases(root: str, blocks: int) -> list[Case]:
    """Restart time at ``blocks`` blocks: ``SSDTier.open()`` after a clean close (checkpoint)
    and after a crash (no checkpoint: the header scan), and the checksum's cost."""
    path = os.path.join(root, "open")
    payload_len = 4 * KiB
    payload = os.urandom(payload_len)
    slot_size = Geometry.slot_size_for(payload_len)
    capacity = blocks * slot_size
    async with SSDTier(path, capacity, block_size=payload_len) as tier:
        for i in range(0, blocks, 256):
            items = [(f"o{j}".encode(), payload) for j in range(i, min(blocks, i + 256))]
            errors = await tier.write_many(items)
            if any(errors):
                raise RuntimeError(f"write failed: {errors[:3]!r}")
    checkpoint = os.path.join(path, "checkpoint")
    samples: dict[str, list[float]] = {"clean": [], "crash": []}
    for _ in range(3):
        for after in ("clean", "crash"):
            if after == "crash":
                os.unlink(checkpoint)  # what a killed process leaves: slots, no checkpoint
            tier = SSDTier(path, capacity)
            t0 = time.perf_counter()
            await tier.open()
            samples[after].append(time.perf_counter() - t0)
            assert tier.last_start is not None and tier.last_start.after == after
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
    out = []
    for after, target in (("clean", 3.0), ("crash", 10.0)):
        seconds = statistics.median(samples[after])
        out.append(
            Case(
                "ssd_open",
                {"blocks": blocks, "after": after, "payload": payload_len, "rounds": 3},
                "us/block",
                False,
                seconds / blocks * 1e6,
                extra={
                    "seconds": seconds,
                    "target_us_per_block": target,
                    **(checksum if after == "crash" else {}),
                },
            )
        )
    return out


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
    # more blocks than the primary holds (64): the rest is demoted
    demote = [(256 * KiB, 128 if quick else 1024), (MiB, 96 if quick else 256)]
    try:
        out: list[Case] = []
        if "ssd_promote" in wanted:
            for block_size, blocks in promote:
                out += await _promote_cases(root, block_size, blocks, rounds, threads)
        if "ssd_demote" in wanted:
            for block_size, blocks in demote:
                out.append(await _demote_case(root, block_size, blocks, rounds))
        if "ssd_open" in wanted:
            out += await _open_cases(root, 2_000 if quick else 100_000)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m aiotier_bench.ssd [--quick] [--json FILE]``: print the cases."""
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
