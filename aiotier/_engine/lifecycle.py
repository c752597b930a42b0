"""Opening and closing the tiers: in order, each bounded, none left half-open; at close,
what must go down first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from .._core.engine_core import EngineCore
from .._core.write_routes import WriteRoutes
from ..errors import TieringError
from ..tiers.base import SecondaryTier, TierSetup
from ..tiers.primary import PrimaryTier
from .writers import Writers

__all__ = [
    "close_tiers",
    "open_tiers",
    "release_shared_memory",
    "tier_setups",
    "write_down_and_close",
]


def tier_setups(
    block_size: int, tiers: Sequence[SecondaryTier], routes: WriteRoutes
) -> list[TierSetup]:
    """What the engine asks of each tier when it opens it. Evicted bytes feed the write-back
    tier below; from a tier that keeps them in memory anyway they are also taken with none
    (its evictions are reported as events either way)."""
    return [
        TierSetup(
            block_size,
            "bytes" if routes.below[i] is not None or t.capabilities.cheap_evictions else "keys",
        )
        for i, t in enumerate(tiers)
    ]


async def open_tiers(
    tiers: Sequence[SecondaryTier],
    setups: Sequence[TierSetup],
    open_timeout: float,
    close_timeout: float,
) -> None:
    """Open each tier in order with its setup. A tier's ``open`` may rebuild an index, hence
    ``open_timeout``; if one fails, those already open are closed again (each within
    ``close_timeout``) and the failure is raised."""
    opened: list[SecondaryTier] = []
    try:
        for t, setup in zip(tiers, setups, strict=True):
            try:
                async with asyncio.timeout(open_timeout):
                    await t.open(setup)
            except TimeoutError:
                raise TieringError(f"tier {t.name!r} did not open within {open_timeout}s") from None
            opened.append(t)
    except BaseException:
        for t in reversed(opened):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t.aclose(), close_timeout)
        raise


async def close_tiers(
    tiers: Sequence[SecondaryTier], timeout: float, failed: Callable[[SecondaryTier], None]
) -> None:
    """Close the tiers, the last first, each within ``timeout``; ``failed(tier)`` for each
    that raised or ran out of time."""
    for t in reversed(tiers):
        try:
            await asyncio.wait_for(t.aclose(), timeout)
        except Exception:
            failed(t)


async def write_down_and_close(
    core: EngineCore,
    tiers: Sequence[SecondaryTier],
    writers: Writers,
    lock: Any,
    io_timeout: float,
    *,
    flush: bool,
) -> None:
    """Queue what must go down before the tiers close (with ``flush``, the primary's blocks for
    the first persistent tier when it is write-back), drain the writers (within twice
    ``io_timeout``; what is left is dropped), stop them and close the tiers (a failure to
    close is counted)."""
    down = core.routes.write_down_to([t.capabilities.persistent for t in tiers])
    with lock:
        core.copies.at_close(down if flush else None)
    await writers.drain(io_timeout * 2, discard=True)
    await writers.stop()

    def failed(t: SecondaryTier) -> None:
        with lock:
            core.stats.count("tier_errors", t.name, "close")

    await close_tiers(tiers, io_timeout, failed)


async def release_shared_memory(primary: PrimaryTier) -> None:
    """Remove the primary's shared-memory segment, if it has one (system calls: off the loop)."""
    if primary.shared_memory_name is None:
        return
    try:
        await asyncio.to_thread(primary.release_shared_memory)
    except RuntimeError:  # no new thread at interpreter exit (3.12+): one system call
        primary.release_shared_memory()
