"""Replay a request trace through a cache the way a vLLM-style scheduler drives it.

Time is compressed into scheduler steps: a request arrives at step ``arrival_ms //
ms_per_step`` and, once admitted, runs ``output_length`` steps (one token per step) before it
finishes. Each step, every waiting request (those deferred earlier first, then the arrivals) is
looked up:

1. the prefix lookup of its block keys: a RETRY anywhere before the first miss (a promotion or a
   pending store) defers the request to the next step, which looks it up again;
2. otherwise it is admitted: its leading hits are prepared for loading (and touched), the rest
   of its blocks are prepared for storing (a full cache stores nothing and is counted);
3. at the end of the step the transfers it started complete (``complete_load``,
   ``complete_store``), then the step boundary names the admitted and finished requests.

Its hits are the leading hits of the lookup that admits it; the hit ratio is hits over every
block reference of the trace. Only the calls into the cache are timed (``us_per_request``),
from a collected heap.
Steps in which nothing arrives, finishes or waits are skipped: nothing the cache sees happens
in them.
"""

from __future__ import annotations

import gc
import heapq
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .counting import CallCounter
from .traces import Trace, block_key

__all__ = ["Admitted", "ReplayBackend", "ReplayResult", "replay"]

_now = time.perf_counter


@dataclass(slots=True)
class Admitted:
    """What admitting one request started: the keys it loads and the keys it stores."""

    req_id: str
    loads: Sequence[bytes]
    stores: Sequence[bytes]
    store_failed: bool = False


class ReplayBackend(Protocol):
    """A cache driven by :func:`replay`, as a scheduler drives its KV offloading manager."""

    async def lookup(self, req_id: str, keys: list[bytes]) -> int | None:
        """Leading hits of ``keys``, or None to defer the request (something is on its way)."""

    def admit(self, req_id: str, keys: list[bytes], hits: int) -> Admitted:
        """Prepare the loads of ``keys[:hits]`` and the stores of the rest."""

    def complete(self, admitted: Admitted) -> None:
        """The transfers ``admit`` prepared are done."""

    def end_step(self, new_req_ids: list[str], finished_req_ids: list[str]) -> None:
        """The scheduler step ends."""

    async def between_steps(self, waiting: list[list[bytes]]) -> None:
        """Time passes between steps (untimed): ``waiting`` are the deferred requests' keys."""


@dataclass(slots=True)
class ReplayResult:
    """Counts of one replay."""

    requests: int = 0
    blocks: int = 0
    hits: int = 0
    deferrals: int = 0
    store_failures: int = 0
    steps: int = 0
    seconds: float = 0.0  # in the backend's calls
    python_calls: int | None = None  # in the backend's calls, when counted
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.blocks if self.blocks else 0.0

    @property
    def us_per_request(self) -> float:
        return self.seconds / self.requests * 1e6 if self.requests else 0.0

    @property
    def python_calls_per_request(self) -> float | None:
        if self.python_calls is None or not self.requests:
            return None
        return self.python_calls / self.requests


class _Meter:
    """Time (and optionally count the Python calls of) the stretches spent in the backend."""

    __slots__ = ("_counter", "_t", "seconds")

    def __init__(self, count_calls: bool) -> None:
        self.seconds = 0.0
        self._t = 0.0
        self._counter = CallCounter() if count_calls else None

    def start(self) -> None:
        if self._counter is not None:
            self._counter.__enter__()
        self._t = _now()

    def stop(self) -> None:
        self.seconds += _now() - self._t
        if self._counter is not None:
            self._counter.__exit__(None, None, None)

    @property
    def calls(self) -> int | None:
        return None if self._counter is None else self._counter.calls


async def replay(
    trace: Trace, backend: ReplayBackend, *, ms_per_step: float = 1000.0, count_calls: bool = False
) -> ReplayResult:
    """Replay ``trace`` through ``backend`` step by step (see the module's docstring).

    ``count_calls`` also counts the Python calls made inside the backend's calls
    (``sys.setprofile``: noise-free where times are not, and slower)."""
    if ms_per_step <= 0:
        raise ValueError(f"ms_per_step must be > 0, got {ms_per_step}")
    arrivals: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(trace.requests):
        arrivals[int(r.arrival_ms // ms_per_step)].append(i)
    keys = [[block_key(b) for b in r.blocks] for r in trace.requests]
    result = ReplayResult(requests=len(trace.requests), blocks=trace.reference_count)
    meter = _Meter(count_calls)
    # no garbage of the replay before and the collector's counts at zero: the collections a
    # replay pays for are the ones its own allocations trigger
    gc.collect()
    waiting: deque[int] = deque()
    finishing: list[tuple[int, int]] = []  # (step, request index)
    pending_steps = sorted(arrivals)
    nxt = 0
    step = pending_steps[0] if pending_steps else 0
    while nxt < len(pending_steps) or waiting or finishing:
        if not waiting:  # skip idle steps: jump to the next arrival or finish
            upcoming = [s for s in (
                pending_steps[nxt] if nxt < len(pending_steps) else None,
                finishing[0][0] if finishing else None,
            ) if s is not None]  # fmt: skip
            step = max(step, min(upcoming))
        if nxt < len(pending_steps) and pending_steps[nxt] <= step:
            waiting.extend(arrivals[pending_steps[nxt]])
            nxt += 1
        result.steps += 1
        admitted: list[Admitted] = []
        still: deque[int] = deque()
        for i in waiting:
            rid, ks = f"r{i}", keys[i]
            meter.start()
            hits = await backend.lookup(rid, ks)
            if hits is None:
                meter.stop()
                result.deferrals += 1
                still.append(i)
                continue
            a = backend.admit(rid, ks, hits)
            meter.stop()
            result.hits += hits
            result.store_failures += a.store_failed
            admitted.append(a)
            heapq.heappush(finishing, (step + max(1, trace.requests[i].output_length), i))
        waiting = still
        finished: list[str] = []
        while finishing and finishing[0][0] <= step:
            finished.append(f"r{heapq.heappop(finishing)[1]}")
        meter.start()
        for a in admitted:
            backend.complete(a)
        backend.end_step([a.req_id for a in admitted], finished)
        meter.stop()
        await backend.between_steps([keys[i] for i in waiting])
        step += 1
    result.seconds, result.python_calls = meter.seconds, meter.calls
    return result
