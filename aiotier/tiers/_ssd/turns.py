"""Per-key turns: writes and removes of one key never overlap.

A write and an unlink of the same file racing on two threads could leave either on disk
whatever order the caller saw; taking turns on the loop makes the order of calls the order on
disk. Reads take no turn: they see the old or the new complete file (a rename is atomic).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

__all__ = ["KeyTurns"]


class KeyTurns(dict[bytes, asyncio.Future[None]]):
    """Who holds the turn of each digest: a future, set when the holder releases it.

    A dict (digest -> future), so that ``digest in turns`` (is a write or unlink of it in
    flight?), asked for every block read, costs no Python call.
    """

    __slots__ = ()

    async def acquire(self, digests: Sequence[bytes]) -> None:
        """Hold the turn of every digest in ``digests``: all at once, never some of them, so
        two batches that share digests cannot each hold a part and wait for the other."""
        loop = asyncio.get_running_loop()
        while True:
            for d in digests:
                fut = self.get(d)
                if fut is not None:
                    await asyncio.shield(fut)
                    break
            else:
                for d in digests:
                    self[d] = loop.create_future()
                return

    def release(self, digest: bytes) -> None:
        """End the turn of ``digest`` and wake whoever waits for it."""
        fut = self.pop(digest, None)
        if fut is not None and not fut.done():
            fut.set_result(None)
