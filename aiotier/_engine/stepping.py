"""The step boundary's export: each step's buffers handed to OpenTelemetry, and the ticker that
ends steps on a timer for servers without a scheduler."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Final

from .._core.engine_core import RECLAIM_PER_STEP, EngineCore
from ..telemetry import Telemetry
from ..tiers.base import SecondaryTier
from .threads import EngineLock

__all__ = ["IDLE_EXPORT_INTERVAL", "MAX_BUFFERED_SAMPLES", "StepExport"]

#: Samples buffered before they are exported without waiting for ``end_step``.
MAX_BUFFERED_SAMPLES: Final = 100_000
#: Seconds between exports of an engine that no scheduler steps (no ``step_interval``, no
#: ``end_step`` call yet): a cache-only service's counters and delays move without settings.
IDLE_EXPORT_INTERVAL: Final = 1.0


class StepExport:
    """Exports the core's step buffers through ``telemetry``: at each ``end_step``, early when
    nobody calls it and samples pile up, and on a timer (``step_interval``)."""

    __slots__ = ("_core", "_guard", "_stepped", "_ticker", "_tiers", "telemetry")

    def __init__(
        self,
        core: EngineCore,
        tiers: Sequence[SecondaryTier],
        guard: EngineLock,
        telemetry: Telemetry,
    ) -> None:
        self._core = core
        self._tiers = tuple(tiers)
        self._guard = guard
        self.telemetry = telemetry
        self._ticker: asyncio.Task[None] | None = None
        self._stepped = False

    def flush(self) -> None:
        """Hand the buffers of the step so far to the instruments."""
        usages = [t.usage() for t in self._tiers]
        with self._guard.lock:
            snap = self._core.take_step(
                [u.evictions for u in usages], [u.expirations for u in usages]
            )
        self.telemetry.flush(snap)  # the SDK takes its own locks: not under the engine's

    def stepped(self) -> None:
        """``end_step`` was called: export the step (a scheduler drives the exports from now)."""
        self._stepped = True
        self.flush()

    def flush_if_full(self) -> None:
        """Keep the sample buffers bounded when no scheduler calls ``end_step``."""
        if self._core.stats.sample_count() > MAX_BUFFERED_SAMPLES:
            self.flush()

    def start_ticker(self, interval: float, end_step: Callable[[], None]) -> None:
        """Call ``end_step`` every ``interval`` seconds until :meth:`stop_ticker`."""
        self._ticker = asyncio.get_running_loop().create_task(
            _tick(interval, end_step), name="aiotier-step"
        )

    def start_idle_export(self) -> None:
        """Export every ``IDLE_EXPORT_INTERVAL`` seconds until the first ``end_step``."""
        self._ticker = asyncio.get_running_loop().create_task(
            self._export_while_idle(), name="aiotier-export"
        )

    async def _export_while_idle(self) -> None:
        while not self._stepped:
            await asyncio.sleep(IDLE_EXPORT_INTERVAL)
            if not self._stepped:
                with self._guard.lock:  # what end_step would reclaim: blocks past their TTL
                    self._core.expiry.reclaim(RECLAIM_PER_STEP)
                self.flush()

    def stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()

    async def ticker_stopped(self) -> None:
        if self._ticker is not None:
            await asyncio.gather(self._ticker, return_exceptions=True)

    def close(self) -> None:
        """The engine closed: the last buffers go out, and its gauges stop reporting."""
        self.flush()
        self.telemetry.detach()


async def _tick(interval: float, end_step: Callable[[], None]) -> None:
    while True:
        await asyncio.sleep(interval)
        end_step()
