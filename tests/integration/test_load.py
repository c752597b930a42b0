"""Load: thousands of concurrent simulated requests over a 1,000-block primary and an SSD tier.

Each request looks up a prefix of a document's blocks (documents picked with a Zipf-like skew,
so hot ones stay in the primary, warm ones come back from the SSD and cold ones are computed),
waits for what is on its way, loads and verifies the hits, stores the rest, and finishes. All
requests are started at once and arrive in bursts of 200 every quarter second, so hundreds
overlap at a time.

Asserted: no wrong bytes ever loaded, no exception reaches a request, every RETRY settles in
time, promotions in flight never above ``max_inflight_promotions`` (sampled every few ms from
``engine.stats()``), tasks bounded, resident memory bounded, no pin or task left at the end.
Reported (``-s``): peak RSS and its growth, p99/max event-loop lag, hit rates, throughput.
Nothing leaves the process: the only files are the SSD tier's, in a temporary directory.

``AIOTIER_TEST_LOAD_REQUESTS`` / ``AIOTIER_TEST_LOAD_KEYS`` (defaults 2,000 / 20,000) scale it
up; the long run in docs/reliability.md uses 10,000 / 100,000.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import resource
import time
from collections import Counter
from pathlib import Path

from helpers import aiotier_tasks

from aiotier import BlockNotReadyError, PrimaryTier, RequestContext, SSDTier, TieringEngine
from aiotier.tiers._ssd.layout import Geometry
from aiotier_bench.common import LoopLagTicker

REQUESTS = int(os.environ.get("AIOTIER_TEST_LOAD_REQUESTS", "2000"))
KEYS = int(os.environ.get("AIOTIER_TEST_LOAD_KEYS", "20000"))
BLOCKS_PER_DOC = 16
DOCS = KEYS // BLOCKS_PER_DOC
NUM_BLOCKS = 1000
BLOCK = 1024
MAX_INFLIGHT = 32
PROMOTION_TIMEOUT = 2.0
MAX_PENDING_WRITES = 8 << 20
BURST = 200  # requests arrive in bursts of this many at once ...
BURST_INTERVAL = 0.25  # ... every this many seconds
FORWARD_PASS = (0.002, 0.010)  # seconds a request computes between its load and its store
ZIPF_S = 0.8  # document popularity ~ 1 / rank**s: a hot head and a long warm tail
ZIPF = list(itertools.accumulate(1 / (r + 1) ** ZIPF_S for r in range(DOCS)))
RUN_BOUND = 60.0 + REQUESTS * 0.03  # the whole run, seconds: a bound on time, not a target
PAGE = os.sysconf("SC_PAGE_SIZE")


def block_bytes(key: bytes) -> bytes:
    return (key * (BLOCK // len(key) + 1))[:BLOCK]


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:  # test code, not aiotier: no thread hop needed
        return int(f.read().split()[1]) * PAGE


class Figures:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.peak_inflight = 0
        self.peak_tasks = 0
        self.peak_rss = 0
        self.peak_active = 0
        self.active = 0


async def _sample(engine: TieringEngine, figures: Figures, stop: asyncio.Event) -> None:
    """Every few ms: promotions in flight (must stay within the bound), tasks and RSS."""
    while not stop.is_set():
        inflight = engine.stats().promotions_in_flight
        assert inflight <= MAX_INFLIGHT, f"{inflight} promotions in flight > {MAX_INFLIGHT}"
        figures.peak_inflight = max(figures.peak_inflight, inflight)
        figures.peak_tasks = max(figures.peak_tasks, len(asyncio.all_tasks()))
        figures.peak_rss = max(figures.peak_rss, rss_bytes())
        await asyncio.sleep(0.005)


async def _request(engine: TieringEngine, i: int, rng: random.Random, figures: Figures) -> None:
    await asyncio.sleep((i // BURST) * BURST_INTERVAL)
    figures.active += 1
    figures.peak_active = max(figures.peak_active, figures.active)
    rid = f"req-{i}"
    req = RequestContext(rid)
    doc = rng.choices(range(DOCS), cum_weights=ZIPF)[0]
    doc = (doc * 7919) % DOCS  # spread hot documents over the key space
    length = rng.randint(4, BLOCKS_PER_DOC)
    keys = [b"doc%d-block%d" % (doc, j) for j in range(length)]
    c = figures.counts
    try:
        n = await engine.lookup_prefix(keys, req)
        if n is None:
            c["retry"] += 1
            settled = await engine.wait(keys, timeout=PROMOTION_TIMEOUT + 5.0)
            n = await engine.lookup_prefix(keys, req)
            if n is None:  # settled, then another request's promotion started meanwhile
                n = 0
                for r in settled:
                    if r.value != "hit":
                        break
                    n += 1
        engine.end_step(new_req_ids=[rid])
        hits = keys[:n]
        if hits:
            try:
                spec = engine.prepare_load(hits, req)
            except BlockNotReadyError:
                c["load_raced"] += 1  # evicted between the answer and the load: count as miss
                hits = []
            else:
                for k, view in zip(hits, spec.buffers, strict=True):
                    assert view == block_bytes(k), f"wrong bytes loaded for {k!r}"
                engine.complete_load(hits, req)
        await asyncio.sleep(rng.uniform(*FORWARD_PASS))  # the forward pass
        c["blocks_hit"] += len(hits)
        missing = keys[len(hits) :]
        if missing:
            out = engine.prepare_store(missing, req)
            if out is None:
                c["store_refused"] += 1
            else:
                for k, buf in zip(out.keys_to_store, out.store_spec.buffers, strict=True):
                    buf[:] = block_bytes(k)
                await asyncio.sleep(0)
                engine.complete_store(out.keys_to_store, req)
                c["blocks_stored"] += len(out.keys_to_store)
        c["blocks_asked"] += len(keys)
        c["requests"] += 1
    finally:
        engine.end_step(finished_req_ids=[rid])
        figures.active -= 1


async def test_thousands_of_concurrent_requests_stay_bounded(tmp_path: Path) -> None:
    figures = Figures()
    rng = random.Random(7)
    baseline_rss = rss_bytes()
    ssd = SSDTier(tmp_path / "ssd", KEYS * Geometry.slot_size_for(BLOCK), io_threads=2)  # all
    engine = TieringEngine(
        PrimaryTier(NUM_BLOCKS, BLOCK),
        [ssd],
        promotion_timeout=PROMOTION_TIMEOUT,
        max_inflight_promotions=MAX_INFLIGHT,
        max_pending_write_bytes=MAX_PENDING_WRITES,
    )
    stop = asyncio.Event()
    t0 = time.perf_counter()
    async with engine, LoopLagTicker(0.001) as lag:
        sampler = asyncio.ensure_future(_sample(engine, figures, stop))
        try:
            async with asyncio.timeout(RUN_BOUND):
                await asyncio.gather(
                    *(_request(engine, i, random.Random(rng.random()), figures)
                      for i in range(REQUESTS))
                )  # fmt: skip
        finally:
            stop.set()
            await sampler  # re-raises its assertion, if the bound was ever exceeded
        elapsed = time.perf_counter() - t0
        t_flush = time.perf_counter()
        await engine.flush(timeout=120)  # the write-back backlog reaches the SSD
        t_flush = time.perf_counter() - t_flush
        engine.end_step()
        stats = engine.stats()
        assert stats.pinned_blocks == 0
        assert stats.promotions_in_flight == 0
        assert stats.tiers["primary"].blocks <= NUM_BLOCKS
        assert stats.tiers["ssd"].bytes_used <= ssd.capacity_bytes
        counters = stats.counters
    assert not aiotier_tasks()
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not leftover, leftover

    c = figures.counts
    assert c["requests"] == REQUESTS
    growth = figures.peak_rss - baseline_rss
    # the arena, the queued write-back copies, the SSD index (~200 B/block) and the requests'
    # own objects, with generous slack: a leak of any per-request or per-block state breaks it
    bound = NUM_BLOCKS * BLOCK + MAX_PENDING_WRITES + KEYS * 400 + REQUESTS * 4096 + (96 << 20)
    assert growth < bound, f"RSS grew by {growth >> 20} MiB (bound {bound >> 20} MiB)"
    # tasks: the requests themselves, at most MAX_INFLIGHT promotions (a task and its read
    # each), the SSD tier's hops, the writer, the sampler and the lag ticker
    assert figures.peak_tasks <= REQUESTS + 2 * MAX_INFLIGHT + 16, figures.peak_tasks

    def total(metric: str, *labels: str) -> int:
        return sum(
            v for k, v in counters.items() if k[0] == metric and k[1 : 1 + len(labels)] == labels
        )

    lags = lag.summary_ms()
    ru_maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(
        f"\nload test: {REQUESTS} requests over {KEYS} keys ({DOCS} documents), "
        f"{NUM_BLOCKS}-block primary + SSD, in {elapsed:.1f}s "
        f"({REQUESTS / elapsed:.0f} req/s, {c['blocks_asked'] / elapsed:.0f} blocks/s)\n"
        f"  peak concurrent requests {figures.peak_active}, peak tasks {figures.peak_tasks}, "
        f"peak promotions in flight {figures.peak_inflight} (bound {MAX_INFLIGHT})\n"
        f"  blocks asked {c['blocks_asked']}, hit {c['blocks_hit']}, stored {c['blocks_stored']}, "
        f"requests deferred {c['retry']}, stores refused {c['store_refused']}, "
        f"loads raced {c['load_raced']}\n"
        f"  promotions ok {total('promotions', 'ssd', 'ok')}, "
        f"evictions {total('evictions')}, "
        f"demotions dropped (write backlog over {MAX_PENDING_WRITES >> 20} MiB) "
        f"{total('demotions_dropped', 'ssd', 'backlog')}, tier errors {total('tier_errors')}, "
        f"allocation failures {total('allocation_failures')}\n"
        f"  RSS: baseline {baseline_rss / 2**20:.0f} MiB, peak {figures.peak_rss / 2**20:.0f} MiB "
        f"(+{growth / 2**20:.0f} MiB, bound +{bound / 2**20:.0f} MiB), "
        f"process ru_maxrss {ru_maxrss / 2**20:.0f} MiB\n"
        f"  write-back backlog drained in {t_flush:.1f}s after the last request\n"
        f"  event-loop lag p99 {lags['p99_ms']:.2f} ms, max {lags['max_ms']:.2f} ms"
    )
    if os.environ.get("AIOTIER_TEST_LOAD_VERBOSE"):
        print({k: v for k, v in sorted(counters.items())})
