"""The ``trace`` case of ``aiotier bench``: request traces replayed through aiotier's policies,
beside the offline optimum, the infinite cache and vLLM's own managers (the peer).

Per trace and capacity (a share of the trace's unique blocks), one ``trace`` case per eviction
policy and admission policy aiotier ships, and one ``trace_tiered`` case: a primary of 5% over
a memory tier that holds every block, with hits per tier and bytes moved, beside vLLM's
``TieringOffloadingManager`` over its example tier. ``--quick`` replays the first
:data:`QUICK_WINDOW` requests of each trace; the full run replays all of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiotier import (
    AdmissionPolicy,
    AdmitAfter,
    AdmitAll,
    AdmitTinyLFU,
    MemoryTier,
    PrimaryTier,
    TieringEngine,
)

from .common import Case, Measure
from .trace_engine import EngineBackend
from .trace_optimum import infinite_hits, optimum_hits, prefix_optimum_hits
from .trace_replay import ReplayBackend, ReplayResult, replay
from .traces import SHIPPED_DIR, Trace, load_trace, shipped_traces

__all__ = ["ADMISSIONS", "CAPACITY_SHARES", "COMBINATIONS", "QUICK_WINDOW", "run", "trace_cases"]

#: Capacities, as shares of the replayed requests' unique blocks.
CAPACITY_SHARES = (0.02, 0.05, 0.10, 0.25)
#: Admission policies by the names the config file gives them.
ADMISSIONS: dict[str, Callable[[], AdmissionPolicy]] = {
    "all": AdmitAll,
    "after:2": lambda: AdmitAfter(2),
    "tinylfu": AdmitTinyLFU,
}
#: (eviction policy, admission policy) pairs replayed: every one aiotier ships.
COMBINATIONS: tuple[tuple[str, str], ...] = tuple(
    (p, a) for p in ("lru", "arc", "lfuda") for a in ADMISSIONS
)
TIERED_SHARE = 0.05
QUICK_WINDOW = 500
#: Python calls per request are counted (noise-free, unlike µs) at this capacity, on the first
#: COUNT_WINDOW requests: counting makes a replay several times slower.
COUNT_SHARE = 0.05
COUNT_WINDOW = 300
#: Each timed replay runs this many times, rounds interleaved across the backends, and reports
#: its median: one replay's µs moves by a third between runs on a shared machine.
TIMED_REPEATS = 3
BLOCK_SIZE = 16  # bytes: the replay moves no real KV data, so CI can run it
OPTIMUM = "offline optimum: Belady with bypass, per block"
#: The field of aiotier's vLLM adapter (LRU primary, admitting all) replayed through vLLM's calls.
ADAPTER = "aiotier_vllm_adapter"


def _note(msg: str) -> None:
    print(f"note: {msg}", file=sys.stderr)


async def _engine_run(
    trace: Trace, capacity: int, policy: str, admission: str, count_calls: bool = False
) -> ReplayResult:
    adm = ADMISSIONS[admission]()
    engine = TieringEngine(
        PrimaryTier(capacity, BLOCK_SIZE, policy=policy), admission={"primary": adm}
    )
    async with engine:
        return await replay(trace, EngineBackend(engine), count_calls=count_calls)


async def _vllm_run(
    trace: Trace, capacity: int, policy: str, count_calls: bool = False
) -> ReplayResult:
    from .trace_vllm import VllmBackend, vllm_manager

    backend: ReplayBackend = VllmBackend(vllm_manager(capacity, policy))
    return await replay(trace, backend, count_calls=count_calls)


async def _adapter_run(trace: Trace, capacity: int, count_calls: bool = False) -> ReplayResult:
    """aiotier's vLLM adapter over an LRU primary, from a thread with no loop, as vLLM calls it."""
    from .trace_vllm import adapter_replay

    primary = PrimaryTier(capacity, BLOCK_SIZE, policy="lru")
    return await asyncio.to_thread(adapter_replay, trace, primary, count_calls=count_calls)


@contextmanager
def _frozen_heap() -> Iterator[None]:
    """Freeze what is alive now (vLLM, torch, the trace) out of the collector's sight.

    vLLM's engine core does the same once it has started (``freeze_gc_heap``), so a manager
    there never pays for full collections walking the interpreter's startup heap; here, without
    it, a replay that happens to trigger one pays a third of a second for vLLM's imports."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _median(runs: list[ReplayResult]) -> ReplayResult:
    """The first of ``runs`` with their median time (the replays must agree on every count)."""
    first = runs[0]
    for r in runs[1:]:
        if (r.hits, r.deferrals, r.store_failures) != (first.hits, first.deferrals,
                                                       first.store_failures):  # fmt: skip
            raise RuntimeError(f"repeated replays disagree: {first} against {r}")
    return dataclasses.replace(first, seconds=statistics.median(r.seconds for r in runs))


def _counted(trace: Trace) -> tuple[Trace, int]:
    """The window whose Python calls are counted, and its capacity."""
    window = trace.window(COUNT_WINDOW)
    return window, max(1, round(COUNT_SHARE * window.unique_blocks))


def _figures(r: ReplayResult, counted: ReplayResult | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"hit_ratio": r.hit_ratio, "us_per_request": r.us_per_request}
    if counted is not None:
        out["python_calls_per_request"] = counted.python_calls_per_request
    return out


async def trace_cases(path: str | Path, window: int | None) -> list[Case]:
    """Every case of one trace file (its first ``window`` requests; None: all of them)."""
    from .trace_vllm import adapter_types, vllm_unavailable, vllm_version

    trace = await asyncio.to_thread(load_trace, path, window)  # file I/O off the loop
    missing = vllm_unavailable()  # imports vLLM where it can: before the heap is frozen
    adapter_label = adapter_types()[2]
    with _frozen_heap():
        peer_label = None if missing else f"vLLM {vllm_version()}"
        return await _cases(trace, missing, peer_label, adapter_label)


async def _cases(
    trace: Trace, missing: str | None, peer_label: str | None, adapter_label: str
) -> list[Case]:
    refs = list(trace.references())
    unique = len(set(refs))
    infinite = infinite_hits(trace) / len(refs)
    if missing:
        _note(f"{missing}: the trace cases run without vLLM's managers as their peer")
    small, small_capacity = _counted(trace)
    peers = () if missing else ("lru", "arc")
    out: list[Case] = []
    for share in CAPACITY_SHARES:
        capacity = max(1, round(share * unique))
        optimum = optimum_hits(refs, capacity) / len(refs)
        prefix_optimum = prefix_optimum_hits(trace, capacity) / len(refs)
        count = share == COUNT_SHARE
        runs: dict[str, list[ReplayResult]] = {}
        for _ in range(TIMED_REPEATS):
            for p in peers:
                runs.setdefault(p, []).append(await _vllm_run(trace, capacity, p))
            runs.setdefault(ADAPTER, []).append(await _adapter_run(trace, capacity))
            for policy, admission in COMBINATIONS:
                r = await _engine_run(trace, capacity, policy, admission)
                runs.setdefault(f"{policy}/{admission}", []).append(r)
        vllm: dict[str, dict[str, Any]] = {}
        for p in peers:
            vc = await _vllm_run(small, small_capacity, p, count_calls=True) if count else None
            vllm[p] = _figures(_median(runs[p]), vc)
        ac = await _adapter_run(small, small_capacity, count_calls=True) if count else None
        adapter = {**_figures(_median(runs[ADAPTER]), ac), "policy": "lru", "admission": "all",
                   "types": adapter_label}  # fmt: skip
        best = max(vllm, key=lambda p: vllm[p]["hit_ratio"]) if vllm else None
        lru = _median(runs["lru/all"]).hit_ratio  # the floor: LRU admitting every block
        for policy, admission in COMBINATIONS:
            r = _median(runs[f"{policy}/{admission}"])
            rc = None
            if count:
                rc = await _engine_run(small, small_capacity, policy, admission, True)
            extra: dict[str, Any] = {
                **_figures(r, rc),
                "optimum_hit_ratio": optimum,
                "optimum_prefix_hit_ratio": prefix_optimum,
                "infinite_hit_ratio": infinite,
                "share_of_optimum": r.hit_ratio / optimum if optimum else None,
                "deferrals": r.deferrals,
                "store_failures": r.store_failures,
                ADAPTER: adapter,
            }
            if count:
                extra["calls_counted_on"] = {"requests": len(small.requests),
                                             "capacity_blocks": small_capacity}  # fmt: skip
            if best is not None:
                extra["peer_us_per_request"] = vllm[best]["us_per_request"]
                extra["vllm"] = vllm
            else:
                extra["vllm"] = missing
            out.append(Case(
                "trace",
                {"trace": trace.name, "requests": len(trace.requests), "capacity_share": share,
                 "capacity_blocks": capacity, "policy": policy, "admission": admission},
                "hit ratio", True, r.hit_ratio,
                floor=Measure("aiotier lru, admission all", lru),
                peer=None if best is None else Measure(
                    f"{peer_label} CPUOffloadingManager({best})", vllm[best]["hit_ratio"]),
                extra=extra,
            ))  # fmt: skip
    out.append(await _tiered_case(trace, unique, infinite, missing, peer_label))
    return out


async def _tiered_case(
    trace: Trace, unique: int, infinite: float, missing: str | None, peer_label: str | None
) -> Case:
    """A primary of :data:`TIERED_SHARE` over a memory tier that holds every block."""
    capacity = max(1, round(TIERED_SHARE * unique))
    # a scheduler promotes a request's whole prefix at once: the default bound of 64 blocks
    # promoting would take a long prompt several steps, in which its first blocks can go again
    engine = TieringEngine(
        PrimaryTier(capacity, BLOCK_SIZE),
        [MemoryTier(4 * unique * BLOCK_SIZE)],
        promotion_timeout=30.0,
        max_inflight_promotions=capacity,
    )
    async with engine:
        backend = EngineBackend(engine)
        r = await replay(trace, backend)
        tiers = backend.tier_counts()
    extra: dict[str, Any] = {
        **_figures(r),
        "infinite_hit_ratio": infinite,
        "hit_blocks": r.hits,
        "deferrals": r.deferrals,
        "store_failures": r.store_failures,
        "tiers": tiers,
        "max_inflight_promotions": capacity,
    }
    peer = None
    if missing:
        extra["vllm"] = missing
    else:
        from .trace_vllm import VllmBackend, tiering_manager

        manager = await asyncio.to_thread(tiering_manager, capacity)  # files: off the loop
        try:
            p = await replay(trace, VllmBackend(manager))
        finally:
            await asyncio.to_thread(manager.shutdown)
        extra["peer_us_per_request"] = p.us_per_request
        extra["peer_deferrals"] = p.deferrals
        peer = Measure(f"{peer_label} TieringOffloadingManager(lru) over its example tier",
                       p.hit_ratio)  # fmt: skip
    return Case(
        "trace_tiered",
        {"trace": trace.name, "requests": len(trace.requests), "capacity_share": TIERED_SHARE,
         "capacity_blocks": capacity, "policy": "lru", "admission": "all",
         "below": "memory tier holding every block"},
        "hit ratio", True, r.hit_ratio, peer=peer, extra=extra,
    )  # fmt: skip


async def run(quick: bool, files: Sequence[str | Path] = ()) -> list[Case]:
    """The trace cases of ``files``, else of the traces shipped with the repository."""
    paths = [Path(f) for f in files] or shipped_traces()
    if not paths:
        reason = (
            f"no trace given and none found under {SHIPPED_DIR} (they ship with the "
            "repository, not the package): pass --trace FILE"
        )
        return [Case("trace", {}, "hit ratio", True, None, skipped=reason)]
    out: list[Case] = []
    for path in paths:
        out += await trace_cases(path, QUICK_WINDOW if quick else None)
    return out
