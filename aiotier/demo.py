"""A simulated inference scheduler over the default tiers: what ``aiotier demo`` runs.

Requests share prompt prefixes drawn from a Zipf distribution; each step the scheduler asks
``lookup_prefix`` for the waiting requests, admits those whose prefix is settled, loads the
hits, stores the blocks it "computed", and calls ``end_step`` — the vLLM-style protocol.

Two ways to run: ``steps`` steps over which ``requests`` arrive (the default: a quick tour), or a
steady ``rate`` of requests per second for ``duration`` seconds, or until ``stop`` is set (the
command line sets it on Ctrl-C) — the shape to scrape while Prometheus and Grafana watch.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from . import MemoryTier, PrimaryTier, RequestContext, SSDTier, TieringEngine
from .testing import MetricsProbe
from .tiers.base import SecondaryTier

__all__ = ["DemoConfig", "run_demo"]


@dataclass(slots=True)
class DemoConfig:
    steps: int = 200
    requests: int = 1200
    #: Seconds of steady load at ``rate`` (instead of ``steps``); None with ``forever`` unset:
    #: the step-based run.
    duration: float | None = None
    #: Requests per second in a timed or open-ended run.
    rate: float = 100.0
    #: Run at ``rate`` until stopped (Ctrl-C).
    forever: bool = False
    block_size: int = 32 * 1024
    # Sized so that the default run sheds no demotion and refuses no allocation, also on a busy
    # two-core machine: the primary holds what a step pins (max_running requests of up to
    # blocks_per_prompt blocks) with room to spare, and the memory tier takes enough of the
    # evictions that the SSD's writes stay well within the write-back backlog (64 MiB).
    primary_mib: int = 24
    memory_mib: int = 32
    ssd_mib: int = 512
    ssd_dir: str | None = None
    redis_url: str | None = None
    s3_url: str | None = None
    metrics_port: int | None = None
    prompts: int = 400
    blocks_per_prompt: int = 16
    zipf_s: float = 1.1
    seed: int = 0
    max_running: int = 32
    forward_pass_ms: float = 5.0
    #: ``TieringEngine``'s options (the ``[engine]`` table of ``--config``).
    engine_options: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class DemoResult:
    steps: int = 0
    seconds: float = 0.0
    requests_issued: int = 0
    requests_done: int = 0
    blocks_loaded: int = 0
    blocks_stored: int = 0
    #: Why the run ended: "steps", "duration" or "stopped".
    ended: str = "steps"
    summary: dict[str, Any] = field(default_factory=dict)


def _zipf_cdf(n: int, s: float) -> list[float]:
    weights = [1.0 / (i + 1) ** s for i in range(n)]
    total = sum(weights)
    acc = 0.0
    cdf = []
    for w in weights:
        acc += w / total
        cdf.append(acc)
    return cdf


def _quantile(bounds: list[float], counts: list[int], q: float) -> float | None:
    """Bucket-interpolated quantile, as Prometheus's ``histogram_quantile`` computes it."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    seen = 0
    lower = 0.0
    for i, c in enumerate(counts):
        upper = bounds[i] if i < len(bounds) else bounds[-1]
        if seen + c >= rank and c:
            return lower + (upper - lower) * (rank - seen) / c
        seen += c
        lower = upper
    return bounds[-1]


def _histogram(reader: InMemoryMetricReader, otel_name: str) -> tuple[list[float], list[int]]:
    data = reader.get_metrics_data()
    for rm in getattr(data, "resource_metrics", None) or ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == otel_name and m.data.data_points:
                    p = m.data.data_points[0]
                    return list(p.explicit_bounds), list(p.bucket_counts)
    return [], []


@contextlib.asynccontextmanager
async def _tiers(cfg: DemoConfig) -> AsyncIterator[list[SecondaryTier]]:
    tmp = None
    ssd_dir = cfg.ssd_dir
    if ssd_dir is None:
        tmp = ssd_dir = tempfile.mkdtemp(prefix="aiotier-demo-")
    try:  # a tier refused here (a bad URL, an extra missing) leaves no temporary directory
        tiers: list[SecondaryTier] = [
            MemoryTier(cfg.memory_mib << 20),
            SSDTier(ssd_dir, cfg.ssd_mib << 20),
        ]
        if cfg.redis_url:
            from .tiers.redis import RedisTier

            tiers.append(RedisTier(cfg.redis_url, namespace="aiotier-demo"))
        if cfg.s3_url:
            from .tiers.objectstore import ObjectStoreTier

            tiers.append(ObjectStoreTier.from_url(cfg.s3_url, prefix="aiotier-demo/"))
        yield tiers
    finally:
        if tmp is not None:
            await asyncio.to_thread(shutil.rmtree, tmp, True)


async def run_demo(
    cfg: DemoConfig,
    progress: Callable[[DemoResult], object] | None = None,
    *,
    stop: asyncio.Event | None = None,
) -> DemoResult:
    """Run the simulation; ``progress(result so far)`` is called after each step.

    Setting ``stop`` ends the run after the current step: the engine closes, and the result and
    its summary cover what ran.
    """
    rng = random.Random(cfg.seed)
    cdf = _zipf_cdf(cfg.prompts, cfg.zipf_s)
    reader = InMemoryMetricReader()
    if cfg.metrics_port is not None:
        from .telemetry import start_prometheus_server

        # /metrics, and /healthz and /readyz for the demo's engine
        provider = start_prometheus_server(cfg.metrics_port, metric_readers=[reader])
    else:
        provider = MeterProvider(metric_readers=[reader])
    num_blocks = max(1, (cfg.primary_mib << 20) // cfg.block_size)
    result = DemoResult()
    payload = bytes(range(256)) * (cfg.block_size // 256 + 1)
    timed = cfg.forever or cfg.duration is not None

    def prompt_blocks(prompt: int, length: int) -> list[bytes]:
        # blocks are named by their prefix, as a KV cache names them by token-hash chains
        return [b"p%d/b%d" % (prompt, i) for i in range(length)]

    def arrivals(step: int, elapsed: float) -> int:
        """Requests due by now: spread over the steps, or at a steady rate."""
        if timed:
            return int(cfg.rate * elapsed) - result.requests_issued
        return math.ceil(cfg.requests * (step + 1) / cfg.steps) - result.requests_issued

    def over(step: int, elapsed: float) -> str | None:
        if stop is not None and stop.is_set():
            return "stopped"
        if not timed:
            return "steps" if step >= cfg.steps else None
        if cfg.duration is not None and elapsed >= cfg.duration:
            return "duration"
        return None

    started = time.perf_counter()
    try:
        async with _tiers(cfg) as tiers, TieringEngine(
            PrimaryTier(num_blocks, cfg.block_size),
            tiers,
            meter_provider=provider,
            **cfg.engine_options,
        ) as engine:
            waiting: list[tuple[str, list[bytes]]] = []
            running: dict[str, int] = {}
            step = 0
            while (ended := over(step, time.perf_counter() - started)) is None:
                for _ in range(arrivals(step, time.perf_counter() - started)):
                    prompt = min(bisect.bisect_left(cdf, rng.random()), cfg.prompts - 1)
                    length = rng.randint(cfg.blocks_per_prompt // 2, cfg.blocks_per_prompt)
                    rid = f"req-{result.requests_issued}"
                    waiting.append((rid, prompt_blocks(prompt, length)))
                    result.requests_issued += 1
                admitted: list[str] = []
                still: list[tuple[str, list[bytes]]] = []
                for rid, keys in waiting:
                    if len(running) + len(admitted) >= cfg.max_running:
                        still.append((rid, keys))
                        continue
                    req = RequestContext(rid)
                    hits = await engine.lookup_prefix(keys, req)
                    if hits is None:
                        still.append((rid, keys))  # RETRY: promotions in flight, ask next step
                        continue
                    if hits:
                        engine.prepare_load(keys[:hits], req)
                        engine.complete_load(keys[:hits], req)
                        result.blocks_loaded += hits
                    out = engine.prepare_store(keys[hits:], req)
                    if out is not None:
                        for buf in out.store_spec.buffers:
                            buf[:] = payload[: cfg.block_size]
                        engine.complete_store(list(out.keys_to_store), req)
                        result.blocks_stored += len(out.keys_to_store)
                    admitted.append(rid)
                waiting = still
                for rid in admitted:
                    running[rid] = rng.randint(2, 8)  # decode steps left
                finished = [rid for rid, left in running.items() if left <= 0]
                for rid in finished:
                    del running[rid]
                for rid in running:
                    running[rid] -= 1
                engine.end_step(new_req_ids=admitted, finished_req_ids=finished)
                result.requests_done += len(finished)
                step += 1
                result.steps = step
                # the forward pass: the loop is free, promotions and write-backs progress
                await asyncio.sleep(cfg.forward_pass_ms / 1e3)
                result.seconds = time.perf_counter() - started
                if progress is not None:
                    progress(result)
            result.ended = ended
            result.seconds = time.perf_counter() - started
            result.summary = _summary(engine, reader, result)
    finally:
        provider.shutdown()
    return result


def _summary(
    engine: TieringEngine, reader: InMemoryMetricReader, r: DemoResult
) -> dict[str, Any]:
    engine.end_step()
    probe = MetricsProbe(reader)
    out: dict[str, Any] = {"tiers": {}, "delays_ms": {}}
    for name in [engine.primary.name, *(t.name for t in engine.tiers)]:
        hit = probe.value("aiotier_lookups_total", tier=name, result="hit")
        miss = probe.value("aiotier_lookups_total", tier=name, result="miss")
        retry = probe.value("aiotier_lookups_total", tier=name, result="retry")
        asked = hit + miss + retry
        out["tiers"][name] = {
            "lookups": int(asked),
            "hit_rate": hit / asked if asked else None,
            "promotions": int(probe.value("aiotier_promotions_total", tier=name, outcome="ok")),
            "evictions": int(probe.value("aiotier_evictions_total", tier=name)),
            "read_mib": probe.value("aiotier_read_bytes_total", tier=name) / 2**20,
            "written_mib": probe.value("aiotier_write_bytes_total", tier=name) / 2**20,
            "errors": int(probe.value("aiotier_tier_errors_total", tier=name)),
            "dropped": int(probe.value("aiotier_demotions_dropped_total", tier=name)),
        }
    delays = (("sync", "aiotier.lookup_sync_delay"), ("async", "aiotier.lookup_async_delay"))
    for label, otel in delays:
        bounds, counts = _histogram(reader, otel)
        out["delays_ms"][label] = {
            f"p{int(q * 100)}": (None if (v := _quantile(bounds, counts, q)) is None else v * 1e3)
            for q in (0.5, 0.9, 0.99)
        } | {"count": sum(counts)}
    out["blocks_per_second"] = (r.blocks_loaded + r.blocks_stored) / r.seconds if r.seconds else 0
    out["allocation_failures"] = int(probe.value("aiotier_allocation_failures_total"))
    return out
