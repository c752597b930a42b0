"""``TieringEngine.clear``: every block dropped, from the primary and from every tier.

Order matters, so that no block written before the call is served after it:

1. the core forgets the primary's blocks and every queued write and remove, and reads no tier
   (one synchronous transition, under the engine's lock);
2. the writers finish the batch they are applying and start no new one, so nothing old lands in
   a tier after its clear (what callers store meanwhile is queued, and written afterwards; a
   tier being cleared hands none of the blocks it evicts to the tier below);
3. each tier clears; one that succeeds is read again, one that fails stays unread;
4. the writers resume.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .._core.engine_core import EngineCore
from ..errors import ConfigError, TieringError
from ..tiers.base import SecondaryTier
from .threads import EngineLock
from .writers import Writers

__all__ = ["check_clearable", "clear_everything"]


def check_clearable(tiers: Sequence[SecondaryTier]) -> None:
    """Refuse before anything changes when a tier cannot clear."""
    unable = [t.name for t in tiers if not t.capabilities.clearable]
    if unable:
        raise ConfigError(
            f"clear(): tier(s) {', '.join(map(repr, unable))} cannot be cleared "
            f"(SecondaryTier.clear is not implemented); nothing was changed"
        )


async def clear_everything(
    core: EngineCore,
    tiers: Sequence[SecondaryTier],
    writers: Writers,
    guard: EngineLock,
    timeout: float,
) -> None:
    """Steps 1-4 above within ``timeout`` (each tier's clear gets what is left of it).

    Raises :class:`TieringError` naming every tier whose clear failed or ran out of time; those
    tiers are not read until a later ``clear`` succeeds (the primary is empty either way).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    with guard.lock:
        core.clear()
    ok = [False] * len(tiers)
    failed: list[str] = []
    try:
        try:
            await writers.pause(timeout)
        except TimeoutError:
            raise TieringError(
                f"clear(): a write to a tier did not finish within {timeout}s; no tier was "
                f"cleared and none is read until a clear succeeds"
            ) from None
        for ti, tier in enumerate(tiers):
            try:
                async with asyncio.timeout_at(deadline):
                    await tier.clear()
                ok[ti] = True
            except Exception as exc:
                failed.append(f"{tier.name!r} ({type(exc).__name__}: {exc})")
    finally:
        # also when cancelled: a tier not cleared stays unread until a clear succeeds
        with guard.lock:
            for ti in range(len(tiers)):
                core.coherence.cleared(ti, ok=ok[ti])
        writers.resume()
    if failed:
        raise TieringError(
            f"clear(): tier(s) {', '.join(failed)} may still hold old blocks: they are not read "
            f"until a clear succeeds"
        )
