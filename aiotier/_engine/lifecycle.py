"""Opening and closing the secondary tiers: in order, each bounded, none left half-open."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from ..errors import TieringError
from ..tiers.base import SecondaryTier

__all__ = ["close_tiers", "open_tiers"]


async def open_tiers(
    tiers: Sequence[SecondaryTier], block_size: int, open_timeout: float, close_timeout: float
) -> None:
    """Open each tier in order, after telling it the block size. A tier's ``open`` may rebuild
    an index, hence ``open_timeout``; if one fails, those already open are closed again (each
    within ``close_timeout``) and the failure is raised."""
    opened: list[SecondaryTier] = []
    try:
        for t in tiers:
            t.configure_block_size(block_size)
            try:
                async with asyncio.timeout(open_timeout):
                    await t.open()
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
