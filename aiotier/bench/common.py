"""Shared measuring tools: medians of rounds, case records in the documented JSON, loop lag."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Case", "LoopLagTicker", "Measure", "amedian", "median_of"]


@dataclass(slots=True)
class Measure:
    """One measured figure with its name (for a floor or a peer)."""

    name: str
    value: float


@dataclass(slots=True)
class Case:
    """A benchmark result in the shape of ``shared/BENCHMARKS.md``."""

    name: str
    params: dict[str, Any]
    unit: str
    higher_is_better: bool
    aiotier: float | None
    floor: Measure | None = None
    peer: Measure | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    def _ratio(self, other: Measure | None) -> float | None:
        if other is None or self.aiotier is None or not other.value or not self.aiotier:
            return None
        if self.higher_is_better:
            return self.aiotier / other.value
        return other.value / self.aiotier

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "params": self.params,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "aiotier": self.aiotier,
            "floor": _measure(self.floor),
            "peer": _measure(self.peer),
            "ratio_to_floor": self._ratio(self.floor),
            "ratio_to_peer": self._ratio(self.peer),
        }
        if self.skipped:
            out["skipped"] = self.skipped
        out.update(self.extra)
        return out


def _measure(m: Measure | None) -> dict[str, Any] | None:
    return None if m is None else {"name": m.name, "value": m.value}


def median_of(fn: Callable[[], float], rounds: int, warmup: int = 1) -> float:
    """Median of ``rounds`` calls of ``fn`` (each returns its own figure), after warm-up calls."""
    for _ in range(warmup):
        fn()
    return statistics.median(fn() for _ in range(rounds))


async def amedian(fn: Callable[[], Awaitable[float]], rounds: int, warmup: int = 1) -> float:
    """Async form of :func:`median_of`."""
    for _ in range(warmup):
        await fn()
    return statistics.median([await fn() for _ in range(rounds)])


class LoopLagTicker:
    """Records how late a periodic task wakes while a benchmark runs (event-loop health)."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            self.lags.append(max(0.0, loop.time() - due))

    async def __aenter__(self) -> LoopLagTicker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def summary_ms(self) -> dict[str, float]:
        if not self.lags:
            return {"p99_ms": 0.0, "max_ms": 0.0}
        lags = sorted(self.lags)
        p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
        return {"p99_ms": p99 * 1e3, "max_ms": lags[-1] * 1e3}


def now() -> float:
    return time.perf_counter()
