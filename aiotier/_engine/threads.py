"""What lets threads other than the event loop's call into an engine (``BlockingEngine``).

Two things, and nothing else: one lock that every core transition runs under, on the loop as in
caller threads (never held across an await), and wake-ups posted to the engine's loop from
whichever thread makes them (a ``complete_store`` in a caller thread settles a store that a
``wait`` on the loop awaits). An engine used from its event loop alone keeps the no-op lock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["NO_LOCK", "Guard"]


class _NoLock:
    """A lock that is never contended: one event loop runs one transition at a time."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


NO_LOCK = _NoLock()


class Guard:
    """The engine's lock and event loop, shared by the engine and its await-side parts."""

    __slots__ = ("_loop", "_thread", "lock")

    def __init__(self) -> None:
        self.lock: Any = NO_LOCK
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def bind(self) -> None:
        """The engine opened on the running loop: wake-ups go there."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def share(self, lock: Any) -> None:
        """Other threads will call in: core transitions take ``lock`` from now on."""
        self.lock = lock

    def call(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the engine's loop: now when called there, else posted to it."""
        if self._loop is None or self._thread == threading.get_ident():
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)
