"""What lets threads other than the event loop's call into an engine (``BlockingEngine``).

One lock that every core transition runs under, on the loop as in caller threads (never held
across an await); wake-ups posted to the engine's loop from whichever thread makes them (a
``complete_store`` in a caller thread settles a store that a ``wait`` on the loop awaits); and
the primary hits a caller's thread answers itself. An engine used from its event loop alone
keeps a lock of its own that nothing contends.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .._core.stats import StepStats
from .._core.table import READY, BlockTable
from .._types import RequestContext, normalize_key, normalize_keys
from ..errors import TieringError

__all__ = ["CallerThreadAnswers", "EngineLock"]


class EngineLock:
    """The engine's lock and event loop, shared by the engine and its await-side parts."""

    __slots__ = ("_loop", "_thread", "lock")

    def __init__(self) -> None:
        # uncontended while only the loop calls in; a C-level lock: no Python call to enter
        self.lock: Any = threading.RLock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def bind(self) -> None:
        """The engine opened on the running loop: wake-ups go there."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def share(self, lock: Any) -> None:
        """Other threads will call in: core transitions take ``lock`` from now on."""
        self.lock = lock

    def check_loop(self) -> None:
        """Raise unless the running loop is the engine's: its tasks, timers and events live
        there, and awaiting its work from another loop would hang or fail obscurely."""
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            raise TieringError(
                "this engine belongs to the event loop that opened it and was called from "
                "another one: open and use it in one loop (asyncio.run once), or use "
                "BlockingEngine from other threads"
            )

    def call(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the engine's loop: now when called there, else posted to it."""
        if self._loop is None or self._thread == threading.get_ident():
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)


class CallerThreadAnswers:
    """What a caller's thread may answer itself, under the engine's lock, with no hop to the
    loop: a primary hit of ``lookup``, ``lookup_prefix`` and ``get``. Anything else (a miss, a
    bad argument) is answered by the loop, which also names the bad argument."""

    __slots__ = (
        "_cached", "_expiring", "_guard", "_index", "_live_ready", "_state", "_stats", "fast",
    )  # fmt: skip

    def __init__(
        self,
        table: BlockTable,
        guard: EngineLock,
        stats: StepStats,
        cached: Callable[[bytes], bytes | None],
    ) -> None:
        # the table never replaces these: read directly
        self._index, self._state, self._live_ready = table.index, table.state, table.live_ready
        self._expiring = table.deadlines.at  # slots with a TTL: the loop checks their deadline
        self._guard = guard
        self._stats = stats
        self._cached = cached
        #: the engine is open, not closing, and no admission policy counts sightings: the only
        #: state a primary hit depends on (the engine sets it)
        self.fast = False

    def hit(self, key: bytes | str, req: RequestContext | None) -> bool:
        """``lookup``'s primary hit, from any thread; False sends the call to the loop (which
        also names any bad argument)."""
        if key.__class__ is not bytes:
            key = _valid_key(key, req)  # type: ignore[assignment]
            if key is None:
                return False
        elif req is not None and req.__class__ is not RequestContext:
            return False
        lock = self._guard.lock
        lock.acquire()  # not `with`, which binds __enter__ and __exit__ on each call
        try:
            # BlockTable.ready_slot, inlined (as in TieringEngine.lookup)
            slot = self._index.get(key)  # type: ignore[arg-type]
            hit = not (
                slot is None
                or self._state[slot] != READY
                or slot in self._expiring
                or not self.fast
            )
            if hit:
                self._stats.primary_hit += 1
        finally:
            lock.release()
        return hit

    def prefix_hits(
        self, keys: Sequence[bytes | str], req: RequestContext | None
    ) -> int | None:
        """``lookup_prefix`` when every key is a hit, from any thread; else None."""
        try:
            ks = normalize_keys(keys)
        except (TypeError, ValueError):
            return None
        if _valid_key(b"", req) is None:
            return None
        lock = self._guard.lock
        lock.acquire()
        try:
            hits = len(ks) if self.fast and self._live_ready(ks) else None
            if hits is not None:
                self._stats.primary_hit += hits
        finally:
            lock.release()
        return hits

    def cached(self, key: bytes | str, req: RequestContext | None) -> bytes | None:
        """``get``'s hit, from any thread; None sends the call to the loop."""
        k = _valid_key(key, req)
        lock = self._guard.lock
        lock.acquire()
        try:
            data = self._cached(k) if k is not None and self.fast else None
        finally:
            lock.release()
        return data


def _valid_key(key: object, req: object) -> bytes | None:
    """The key's bytes when ``key`` and ``req`` are valid, else None (the caller then takes the
    path that raises the error naming them)."""
    if req is not None and req.__class__ is not RequestContext:
        return None
    try:
        return normalize_key(key)
    except (TypeError, ValueError):
        return None
