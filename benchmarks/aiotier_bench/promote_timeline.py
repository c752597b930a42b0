"""Where the time of an SSD promotion batch goes, phase by phase: the wall-clock figure beside
``promote_instructions ssd``'s count of the loop's instructions.

``python -m aiotier_bench.promote_timeline`` builds ``ssd_promote``'s warm setup (1024 blocks
of 256 KiB in an ``SSDTier`` in a temporary directory, a 64-block ``PrimaryTier``, batches of
64 as ``lookup_prefix`` + ``wait`` + ``end_step``) and times each batch's phases from marks
taken in the tier's thread plumbing (:mod:`aiotier.tiers._ssd.hops`, wrapped for this run
only): the lookup; the loop's work until the first op goes to a thread; the thread's wake-up;
the threads' reading (first op's start to the last op's end, and how far apart the ops end);
the last op's post to the loop; its settling on the loop (the landing in the primary); the
caller's wake-up; ``end_step``. The same process alternates those rounds with the same work
split over one thread per CPU (``ssd_promote``'s ``same_work_all_cpus``), so the batch's
serial share (everything outside the threads' reading) shows beside its ceiling. Medians
over the batches of ``--rounds`` rounds, in µs.

Beside the phases, the CPU each round used per batch (``time.process_time``: every thread of
the process, the kernel's time on their behalf included): the engine's, its event loop
thread's alone, and ``same_work_all_cpus``'s. The engine's CPU spread over every CPU is the
least its batch can take however well its phases overlap: the ratio's bound on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiotier import LookupResult, PrimaryTier, SSDTier, TieringEngine
from aiotier._core.arena import Arena
from aiotier.tiers._ssd import hops
from aiotier.tiers._ssd.layout import Geometry
from aiotier.tiers._ssd.slot import HEAD_SIZE, check_slot

__all__ = ["main", "measure"]

BATCH, BLOCKS, BLOCK = 64, 1024, 256 * 1024
_now = time.perf_counter
#: Marks of one run: (what, start, end); a "submit" mark has no end (0.0).
_Marks = list[tuple[str, float, float]]


def _instrument(marks: _Marks) -> Callable[[], None]:
    """Wrap the runner's hop start, thread body and loop-side end to mark each; returns the
    undo."""
    run_ops, start_hop, hop_done = hops.run_ops, hops.HopRunner._start_hop, hops.HopRunner._hop_done

    def timed_run_ops(ops: list[hops.DiskOp], nowait: Any) -> list[Any]:
        t0 = _now()
        try:
            return run_ops(ops, nowait)
        finally:
            marks.append(("op", t0, _now()))

    def timed_start_hop(self: hops.HopRunner, max_ops: int) -> bool:
        marks.append(("submit", _now(), 0.0))
        return start_hop(self, max_ops)

    def timed_hop_done(self: hops.HopRunner, batch: list[hops.DiskOp], outcome: Any) -> None:
        t0 = _now()
        hop_done(self, batch, outcome)
        marks.append(("done", t0, _now()))

    hops.run_ops = timed_run_ops
    hops.HopRunner._start_hop = timed_start_hop  # type: ignore[method-assign]
    hops.HopRunner._hop_done = timed_hop_done  # type: ignore[method-assign]

    def undo() -> None:
        hops.run_ops = run_ops
        hops.HopRunner._start_hop = start_hop  # type: ignore[method-assign]
        hops.HopRunner._hop_done = hop_done  # type: ignore[method-assign]

    return undo


def _phases(batch: tuple[float, float, float, float], marks: _Marks) -> dict[str, float] | None:
    """One batch's phases (µs) from its four call marks and the plumbing's marks inside it."""
    t0, looked, waited, stepped = batch
    inside = [m for m in marks if t0 <= m[1] <= stepped]
    submits = [m[1] for m in inside if m[0] == "submit"]
    ops = [m for m in inside if m[0] == "op"]
    dones = [m for m in inside if m[0] == "done"]
    if not (submits and ops and dones):
        return None
    first_start = min(m[1] for m in ops)
    ends = sorted(m[2] for m in ops)
    last_done = max(dones, key=lambda m: m[1])
    us = 1e6
    return {
        "lookup": (looked - t0) * us,
        "to_first_submit": (submits[0] - looked) * us,
        "to_first_thread": (first_start - submits[0]) * us,
        "last_op_starts_after": (max(m[1] for m in ops) - first_start) * us,
        "threads_reading": (ends[-1] - first_start) * us,
        "ops_end_apart": (ends[-1] - ends[0]) * us,
        "to_loop": (last_done[1] - ends[-1]) * us,
        "landing": (last_done[2] - last_done[1]) * us,
        "to_caller": (waited - last_done[2]) * us,
        "end_step": (stepped - waited) * us,
        "batch": (stepped - t0) * us,
        "serial": ((stepped - t0) - (ends[-1] - first_start)) * us,
    }


async def measure(
    rounds: int = 7, root: str | None = None, blocks: int = BLOCKS
) -> dict[str, float]:
    """The median phases (µs per batch) over ``rounds`` rounds of ``blocks`` blocks (a
    multiple of 64), and ``same_work_all_cpus``'s median batch in the same process."""
    if blocks % BATCH or blocks < BATCH or rounds < 1:
        raise ValueError(f"blocks={blocks} must be a multiple of {BATCH}, rounds={rounds} >= 1")
    where = await asyncio.to_thread(tempfile.mkdtemp, prefix="aiotier-timeline-", dir=root)
    keys = [b"bench-%d" % i for i in range(blocks)]
    payload = os.urandom(BLOCK)
    tier = SSDTier(where, 2 * blocks * Geometry.slot_size_for(BLOCK), block_size=BLOCK)
    pool = ThreadPoolExecutor(max(2, os.cpu_count() or 2))
    fds: dict[str, int] = {}
    marks: _Marks = []
    undo = _instrument(marks)
    try:
        await tier.open()
        for at in range(0, blocks, BATCH):
            chunk = keys[at : at + BATCH]
            await tier.write_many([(k, k.rjust(24, b"-") + payload[24:]) for k in chunk])
        engine = TieringEngine(
            PrimaryTier(BATCH, BLOCK), [tier], write_policy="none", promotion_timeout=60.0,
            max_promotion_share=1.0,
        )  # fmt: skip
        located = [tier.locate(k) for k in keys]
        for path in {w[0] for w in located if w is not None}:
            fds[path] = await asyncio.to_thread(os.open, path, os.O_RDONLY)
        slot_at = [(fds[w[0]], w[1]) for w in located if w is not None]
        if len(slot_at) != blocks:
            raise RuntimeError("a benchmark block is missing from the tier")
        seqs = [tier.index.seq[tier.index.lru[k]] for k in keys]
        slots = Arena(BATCH, BLOCK).slot_views(list(range(BATCH)))

        def same_work_part(part: range) -> None:
            for i in part:
                head = bytearray(HEAD_SIZE + len(keys[i]))
                os.preadv(slot_at[i][0], [head, slots[i % BATCH]], slot_at[i][1])
                check_slot(head, keys[i], seqs[i], slots[i % BATCH])

        def same_work_round() -> list[float]:
            n = max(2, os.cpu_count() or 2)
            step = -(-BATCH // n)
            out = []
            for b in range(0, blocks, BATCH):
                parts = [range(j, min(j + step, b + BATCH)) for j in range(b, b + BATCH, step)]
                t0 = _now()
                list(pool.map(same_work_part, parts))
                out.append((_now() - t0) * 1e6)
            return out

        async def engine_round() -> list[tuple[float, float, float, float]]:
            out = []
            for b in range(0, blocks, BATCH):
                batch = keys[b : b + BATCH]
                t0 = _now()
                await engine.lookup_prefix(batch)
                t1 = _now()
                results = await engine.wait(batch, timeout=60.0)
                t2 = _now()
                engine.end_step()
                out.append((t0, t1, t2, _now()))
                if any(r is not LookupResult.HIT for r in results):
                    raise RuntimeError(f"promotion failed: {results[:3]!r}")
            return out

        phases: list[dict[str, float]] = []
        same_work: list[float] = []
        cpu: dict[str, list[float]] = {"engine": [], "loop": [], "same_work": []}
        per_batch = 1e6 * BATCH / blocks  # seconds per round to µs per batch
        async with engine:
            for r in range(rounds + 1):
                gc.collect()
                marks.clear()
                c0, t0 = time.process_time(), time.thread_time()
                batches = await engine_round()
                c1, t1 = time.process_time(), time.thread_time()
                gc.collect()
                c2 = time.process_time()
                sw = same_work_round()
                c3 = time.process_time()
                if r:  # the first round warms up
                    phases += [p for b in batches if (p := _phases(b, marks)) is not None]
                    same_work += sw
                    cpu["engine"].append((c1 - c0) * per_batch)
                    cpu["loop"].append((t1 - t0) * per_batch)
                    cpu["same_work"].append((c3 - c2) * per_batch)
        figures = {name: statistics.median(p[name] for p in phases) for name in phases[0]}
        figures["same_work_all_cpus_batch"] = statistics.median(same_work)
        figures["cpu_engine"] = statistics.median(cpu["engine"])
        figures["cpu_loop_thread"] = statistics.median(cpu["loop"])
        figures["cpu_same_work_all_cpus"] = statistics.median(cpu["same_work"])
        return figures
    finally:
        undo()
        pool.shutdown()
        for fd in fds.values():
            await asyncio.to_thread(os.close, fd)
        await tier.aclose()
        await asyncio.to_thread(shutil.rmtree, where, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    figures = asyncio.run(measure(args.rounds, os.environ.get("AIOTIER_BENCH_DIR") or None))
    print(f"ssd_promote warm, {BATCH} blocks of {BLOCK >> 10} KiB per batch: median µs per batch")
    for name, value in figures.items():
        print(f"  {name:<26} {value:8.0f}")
    ceiling = figures["same_work_all_cpus_batch"]
    print(f"  batch / same_work_all_cpus: {ceiling / figures['batch']:.3f}"
          f" (threads' reading alone: {ceiling / figures['threads_reading']:.3f})")  # fmt: skip
    cpus = os.cpu_count() or 1
    least = figures["cpu_engine"] / cpus
    print(f"  the engine's CPU per batch over {cpus} CPUs, {least:.0f} µs, bounds the ratio even"
          f" with every phase overlapped: {ceiling / least:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
