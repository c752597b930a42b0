"""Shared measuring tools: medians of rounds, case records in the documented JSON, loop lag."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiotier.tiers.base import SecondaryTier

__all__ = [
    "BENCH_EXTRA",
    "Case",
    "LoopLagTicker",
    "Measure",
    "alternate",
    "engine_promoter",
    "note_missing",
    "promote_case",
]

BENCH_EXTRA = "pip install 'aiotier[bench]'"
_noted: set[tuple[str, str]] = set()


def note_missing(module: str, consequence: str) -> None:
    """Say once on stderr that a peer's package is missing and what the run does without it."""
    if (module, consequence) not in _noted:
        _noted.add((module, consequence))
        print(
            f"note: {module} is not installed: {consequence} (it comes with the bench extra: "
            f"{BENCH_EXTRA})",
            file=sys.stderr,
        )


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


async def alternate(
    fns: dict[str, Callable[[], Awaitable[float]]],
    rounds: int,
    before: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Warm each contender up once, then run them in turn ``rounds`` times; their medians.

    Alternating puts the aiotier figure, its floor and its peer under the same machine noise.
    ``before(name)`` runs ahead of every call (e.g. to drop page caches for a cold round).
    """
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds + 1):
        for name, fn in fns.items():
            if before is not None:
                before(name)
            value = await fn()
            if r:
                samples[name].append(value)
    return {name: statistics.median(v) for name, v in samples.items()}


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


@contextlib.asynccontextmanager
async def engine_promoter(
    tier: SecondaryTier, batches: list[list[bytes]], block_size: int
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Promote every block of ``batches`` from ``tier`` the scheduler's way: ``lookup_prefix``
    of one batch (promotions start), then ``wait``, then the step boundary.

    The primary holds two batches, so each call promotes every block again from the tier (the
    engine's write policy is ``none``: evictions drop, nothing is written back).
    """
    from aiotier import LookupResult, PrimaryTier, TieringEngine

    primary = PrimaryTier(2 * max(len(b) for b in batches), block_size)
    # the whole primary is a promotion buffer: nothing is stored that would need room
    engine = TieringEngine(
        primary, [tier], write_policy="none", promotion_timeout=30.0, max_promotion_share=1.0
    )

    async def promote() -> None:
        for batch in batches:
            await engine.lookup_prefix(batch)
            results = await engine.wait(batch)
            if any(r is not LookupResult.HIT for r in results):
                raise RuntimeError(f"promotion failed: {results[:3]!r}")
            engine.end_step()

    async with engine:
        yield promote


def promote_case(
    name: str,
    params: dict[str, Any],
    figures: dict[str, float],
    floor: str,
    peer: str,
    tickers: tuple[LoopLagTicker, LoopLagTicker],
    extra: dict[str, Any] | None = None,
) -> Case:
    """A promotion case in GB/s: ``figures`` of ``aiotier``, ``floor`` and (when measured)
    ``peer``, with the loop lag of the aiotier rounds and, to compare, of the floor's rounds."""
    lag, floor_lag = (t.summary_ms() for t in tickers)
    return Case(
        name,
        params,
        "GB/s",
        True,
        figures["aiotier"],
        floor=Measure(floor, figures["floor"]),
        peer=Measure(peer, figures["peer"]) if "peer" in figures else None,
        extra={
            **(extra or {}),
            "loop_lag_p99_ms": lag["p99_ms"],
            "loop_lag_max_ms": lag["max_ms"],
            # the same ticker during the floor's rounds: what the machine itself adds
            "floor_loop_lag_p99_ms": floor_lag["p99_ms"],
            "floor_loop_lag_max_ms": floor_lag["max_ms"],
        },
    )
