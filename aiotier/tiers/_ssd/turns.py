"""Per-key turns: writes and removes of one key never overlap.

Two writes of one key racing on two threads could land in either order whatever order the
caller saw; taking turns on the loop makes the order of calls the order in the index (and the
index never has two writes of a key to reconcile). Reads take no turn: they see the copy the
index pointed at when they started, old or new, whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

__all__ = ["KeyTurns"]


class KeyTurns(dict[bytes, "asyncio.Future[None] | None"]):
    """Who holds the turn of each key: None, or a future set when the holder releases it,
    made only once somebody waits for that turn (most turns are taken and released with no
    one waiting: a future per block would cost more than the block's own bookkeeping).

    A dict, so that ``key in turns`` (is a write or remove of it in flight?), asked for every
    block read, costs no Python call.
    """

    __slots__ = ()

    async def acquire(self, keys: Sequence[bytes]) -> None:
        """Hold the turn of every key in ``keys``: all at once, never some of them, so two
        batches that share keys cannot each hold a part and wait for the other."""
        while True:
            for k in keys:
                if k in self:
                    fut = self[k]
                    if fut is None:
                        fut = self[k] = asyncio.get_running_loop().create_future()
                    await asyncio.shield(fut)
                    break
            else:
                self.update(dict.fromkeys(keys))
                return

    def release(self, keys: Iterable[bytes]) -> None:
        """End the turns of ``keys`` and wake whoever waits for them."""
        pop = self.pop
        for key in keys:
            fut = pop(key, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
