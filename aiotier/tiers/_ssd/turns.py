"""Per-key turns: writes and removes of one key never overlap.

Two writes of one key racing on two threads could land in either order whatever order the
caller saw; taking turns on the loop makes the order of calls the order in the index (and the
index never has two writes of a key to reconcile). Reads take no turn: they see the copy the
index pointed at when they started, old or new, whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

__all__ = ["KeyTurns"]


class KeyTurns(dict[bytes, asyncio.Future[None]]):
    """Who holds the turn of each key: a future, set when the holder releases it.

    A dict (key -> future), so that ``key in turns`` (is a write or remove of it in
    flight?), asked for every block read, costs no Python call.
    """

    __slots__ = ()

    async def acquire(self, keys: Sequence[bytes]) -> None:
        """Hold the turn of every key in ``keys``: all at once, never some of them, so two
        batches that share keys cannot each hold a part and wait for the other."""
        loop = asyncio.get_running_loop()
        while True:
            for k in keys:
                fut = self.get(k)
                if fut is not None:
                    await asyncio.shield(fut)
                    break
            else:
                for k in keys:
                    self[k] = loop.create_future()
                return

    def release(self, key: bytes) -> None:
        """End the turn of ``key`` and wake whoever waits for it."""
        fut = self.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(None)
