"""``get_or_load``'s single flight: concurrent callers of one key that misses the primary share
one look through the tiers and, when every tier misses, one call of the loader.

A flight is a task of its own, so a caller cancelled while it waits leaves the flight (and every
other caller) alone; the flight is forgotten the moment it ends, so a later call looks again
(and a loader that failed is tried again).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

from ..errors import TieringError

__all__ = ["Flights", "Loader", "load_through"]

#: What ``get_or_load`` calls on a miss: an async callable returning the value's bytes.
Loader = Callable[[], Awaitable[bytes | bytearray | memoryview]]


class Flights:
    """The flights in progress, by key."""

    __slots__ = ("_closing", "_flights")

    def __init__(self) -> None:
        self._flights: dict[bytes, asyncio.Task[bytes]] = {}
        self._closing = False

    def join(self, k: bytes, fly: Callable[[], Awaitable[bytes]]) -> asyncio.Future[bytes]:
        """The flight of ``k``, started with ``fly`` when none is in progress; await the result
        (shielded: a cancelled caller does not cancel the flight)."""
        task = self._flights.get(k)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._run(fly), name="aiotier-load")
            self._flights[k] = task
            task.add_done_callback(lambda t: self._ended(k, t))
        return asyncio.shield(task)

    def _ended(self, k: bytes, task: asyncio.Task[bytes]) -> None:
        if self._flights.get(k) is task:
            del self._flights[k]
        if not task.cancelled():
            task.exception()  # every waiter may have been cancelled: the error is not "lost"

    async def _run(self, fly: Callable[[], Awaitable[bytes]]) -> bytes:
        try:
            return await fly()
        except asyncio.CancelledError:
            if self._closing:  # the callers were not cancelled: they learn why it ended
                raise TieringError("the engine closed during get_or_load") from None
            raise

    def cancel(self) -> list[asyncio.Task[bytes]]:
        """End every flight (the engine is closing): its callers get a ``TieringError``.
        Returns the tasks to await."""
        self._closing = True
        tasks = list(self._flights.values())
        for t in tasks:
            t.cancel()
        return tasks


async def load_through(
    get: Callable[[bytes], Awaitable[bytes | None]],
    put: Callable[[bytes, bytes], Awaitable[object]],
    k: bytes,
    loader: Loader,
) -> bytes:
    """One flight of ``get_or_load``: the tiers (``get``), then the loader, stored (``put``,
    awaited: the callers learn the value once write-through tiers hold it)."""
    data = await get(k)
    if data is None:
        data = await call_loader(loader)
        await put(k, data)
    return data


async def call_loader(loader: Loader) -> bytes:
    """Call ``loader`` and return its value as bytes; a ``TypeError`` naming the loader when it
    is not an async callable or gives something that is not bytes-like."""
    pending = loader()
    if not inspect.isawaitable(pending):
        raise TypeError(
            f"get_or_load: the loader {loader!r} must be an async callable; it returned "
            f"{type(pending).__name__}"
        )
    return _as_bytes(await pending, loader)


def _as_bytes(value: object, loader: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(
        f"get_or_load: the loader {loader!r} returned {type(value).__name__}, not bytes-like "
        "(encode the value first, or use aiotier.cached with a codec)"
    )
