"""A synchronous facade for synchronous schedulers: the engine on an event loop in a thread.

``BlockingEngine`` starts an event loop in a background thread (an anyio blocking portal),
builds and opens a :class:`~aiotier.TieringEngine` there, and offers the engine's methods as
plain calls. Calls that need no I/O run in the caller's thread, against the engine's core,
under one lock that the loop side also takes around each of its transitions (never across an
await): a primary hit, ``prepare_load``, ``complete_load``, ``touch``, ``prepare_store``,
``complete_store``, ``put``, ``take_events``, ``end_step``, ``stats``. Only calls that must start
or await I/O go to the loop through the portal. Any number of threads may call at once.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures.thread  # noqa: F401 - its exit hook first (see the end)
import contextlib
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._engine.values import has_head
from ._types import (
    BlockEvent,
    LoadSpec,
    LookupResult,
    PrepareStoreOutput,
    RequestContext,
)
from .engine import EngineStats, TierHealth, TieringEngine
from .errors import TieringError
from .tiers.base import SecondaryTier
from .tiers.primary import PrimaryTier

__all__ = ["BlockingEngine"]

_T = TypeVar("_T")
_HIT = LookupResult.HIT


#: The running loop of the calling thread, or None: a C call, cheap enough for the hit paths.
_running_loop = asyncio._get_running_loop


def _refuse_inside_a_loop(what: str) -> None:
    """Every call that may wait refuses a running loop, hit or miss: code that only hits in
    tests must not start blocking its loop in production."""
    if _running_loop() is None:
        return
    raise RuntimeError(
        f"BlockingEngine.{what} was called from a running event loop, which it would block: "
        "use TieringEngine there (BlockingEngine.engine on the engine's own loop)"
    )


class BlockingEngine:
    """``TieringEngine``'s methods as plain calls, for synchronous code.

    ``BlockingEngine(primary, secondary, **engine_kwargs)`` takes the engine's arguments; use it
    as a context manager or call :meth:`close`. Results and errors are the engine's (a ``wait``
    past its timeout raises ``TimeoutError``). ``.engine`` is the async engine, for code that
    runs on its loop.
    """

    def __init__(
        self,
        primary: PrimaryTier,
        secondary: Sequence[SecondaryTier] = (),
        **engine_kwargs: Any,
    ) -> None:
        _refuse_inside_a_loop("__init__")
        self._lock = threading.RLock()
        self._closed = False
        self._close_done = threading.Event()
        self._portal_cm = start_blocking_portal("asyncio")
        self._portal: BlockingPortal = self._portal_cm.__enter__()
        try:
            self.engine: TieringEngine = self._portal.call(
                self._open, primary, tuple(secondary), engine_kwargs
            )
        except BaseException:
            self._portal_cm.__exit__(*sys.exc_info())
            raise
        self._hit_now = self.engine._now.hit  # the hot path: one bound method, no lookups
        self._no_tiers = not self.engine.tiers
        _OPEN.add(self)

    async def _open(
        self, primary: PrimaryTier, secondary: tuple[SecondaryTier, ...], kwargs: dict[str, Any]
    ) -> TieringEngine:
        engine = TieringEngine(primary, secondary, **kwargs)
        engine._share_with_threads(self._lock)
        await engine.open()
        return engine

    @property
    def portal(self) -> BlockingPortal:
        """The anyio portal of the engine's event loop: ``portal.call(coro_fn, *args)`` runs
        your own async code there (next to ``.engine``)."""
        return self._portal

    def _call(self, fn: Callable[..., Awaitable[_T]], *args: Any, **kwargs: Any) -> _T:
        """Run a coroutine method of the engine on its loop and wait for it here."""
        _refuse_inside_a_loop(fn.__name__)
        if self._closed:
            raise TieringError("the engine is closed")
        return self._portal.call(partial(fn, *args, **kwargs))

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> BlockingEngine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self, *, flush: bool = True) -> None:
        """Close the engine (as ``aclose``) and stop its loop; calls in flight end first. A
        second call waits for the first to end. An engine still open when the interpreter
        exits is closed then (its loop's thread would otherwise hold the exit up)."""
        _refuse_inside_a_loop("close")  # on the engine's own loop it would wait for itself
        with self._lock:
            first = not self._closed
            self._closed = True
        if not first:
            self._close_done.wait()
            return
        try:
            self._portal.call(partial(self.engine.aclose, flush=flush))
        finally:
            try:
                self._portal_cm.__exit__(None, None, None)
            finally:
                _OPEN.discard(self)
                self._close_done.set()

    # -- lookups -------------------------------------------------------------------------------

    def lookup(
        self,
        key: bytes | str,
        req: RequestContext | None = None,
        *,
        exclude_tier: SecondaryTier | str | None = None,
    ) -> LookupResult:
        """:meth:`TieringEngine.lookup`; a primary hit, and any answer of an engine with no
        secondary tier (nothing to await), answers in the caller's thread."""
        if exclude_tier is None and _running_loop() is None:
            if self._hit_now(key, req):
                return _HIT
            if self._no_tiers:
                return self.engine._lookup_without_tiers(key, req)
        return self._call(self.engine.lookup, key, req, exclude_tier=exclude_tier)

    def lookup_prefix(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None
    ) -> int | None:
        """:meth:`TieringEngine.lookup_prefix`; all-hit prefixes answer in the caller's thread."""
        if _running_loop() is None and not isinstance(keys, str | bytes):
            keys = keys if keys.__class__ in (list, tuple) else list(keys)
            n = self.engine._now.prefix_hits(keys, req)
            if n is not None:
                return n
        return self._call(self.engine.lookup_prefix, keys, req)

    def wait(self, keys: Sequence[bytes | str], timeout: float | None = None) -> list[LookupResult]:
        """:meth:`TieringEngine.wait`: blocks until none of ``keys`` is in flight."""
        return self._call(self.engine.wait, keys, timeout=timeout)

    def prefetch(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None, *, timeout: float
    ) -> int:
        """:meth:`TieringEngine.prefetch`."""
        return self._call(self.engine.prefetch, keys, req, timeout=timeout)

    # -- loads and stores (no I/O: the caller's thread) ------------------------------------------

    def prepare_load(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None
    ) -> LoadSpec:
        """:meth:`TieringEngine.prepare_load` (the caller's thread)."""
        return self.engine.prepare_load(keys, req)

    def complete_load(self, keys: Sequence[bytes | str], req: RequestContext | None = None) -> None:
        """:meth:`TieringEngine.complete_load` (the caller's thread)."""
        self.engine.complete_load(keys, req)

    def touch(self, keys: Iterable[bytes | str], *, first_use: bool = False) -> None:
        """:meth:`TieringEngine.touch` (the caller's thread)."""
        self.engine.touch(keys, first_use=first_use)

    def prepare_store(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None
    ) -> PrepareStoreOutput | None:
        """:meth:`TieringEngine.prepare_store` (the caller's thread)."""
        return self.engine.prepare_store(keys, req)

    def complete_store(
        self,
        keys: Sequence[bytes | str],
        req: RequestContext | None = None,
        *,
        success: bool = True,
        sizes: Sequence[int] | None = None,
    ) -> None:
        """:meth:`TieringEngine.complete_store` (the caller's thread)."""
        self.engine.complete_store(keys, req, success=success, sizes=sizes)

    # -- cache API -------------------------------------------------------------------------------

    def get(self, key: bytes | str, req: RequestContext | None = None) -> bytes | None:
        """:meth:`TieringEngine.get`; a resident block is copied in the caller's thread."""
        if _running_loop() is None:
            data = self.engine._now.cached(key, req)
            if data is not None:
                if not has_head(data):
                    return data
                value = self.engine._values.inline(data)  # a small value with a TTL, live
                if value is not None:
                    return value
        return self._call(self.engine.get, key, req)

    def put(
        self, key: bytes | str, data: bytes | bytearray | memoryview, *, ttl: float | None = None
    ) -> bool:
        """:meth:`TieringEngine.put`: stored from the caller's thread; with write-through
        tiers, their writes are awaited on the engine's loop."""
        if self.engine.core.routes.through:
            _refuse_inside_a_loop("put")  # it waits for the loop
        stored, acks = self.engine._put(key, data, self.engine._ttl(ttl))
        if acks is not None and stored:
            self._call(self.engine._written_through, acks)
        return stored

    def delete(self, key: bytes | str) -> bool:
        """:meth:`TieringEngine.delete`."""
        return self._call(self.engine.delete, key)

    def flush(self, timeout: float | None = None) -> None:
        """:meth:`TieringEngine.flush`: blocks until queued writes and removes are done."""
        self._call(self.engine.flush, timeout)

    def clear(self, *, timeout: float | None = None) -> None:
        """:meth:`TieringEngine.clear`: every block dropped, from every tier."""
        self._call(self.engine.clear, timeout=timeout)

    def clear_primary(self) -> None:
        """:meth:`TieringEngine.clear_primary` (the caller's thread)."""
        self.engine.clear_primary()

    def release_cleared(self) -> None:
        """:meth:`TieringEngine.release_cleared` (the caller's thread)."""
        self.engine.release_cleared()

    # -- the step boundary -----------------------------------------------------------------------

    def take_events(self) -> list[BlockEvent]:
        """:meth:`TieringEngine.take_events`."""
        return self.engine.take_events()

    def end_step(
        self, *, new_req_ids: Iterable[str] = (), finished_req_ids: Iterable[str] = ()
    ) -> None:
        """:meth:`TieringEngine.end_step` (the caller's thread)."""
        self.engine.end_step(new_req_ids=new_req_ids, finished_req_ids=finished_req_ids)

    def stats(self) -> EngineStats:
        """:meth:`TieringEngine.stats`."""
        return self.engine.stats()

    def health(self) -> dict[str, TierHealth]:
        """Each tier as a readiness probe sees it (:meth:`TieringEngine.health`)."""
        return self.engine.health()


#: BlockingEngines not closed yet, closed at interpreter exit (weakly held: one dropped
#: unclosed stops its loop when collected).
_OPEN: weakref.WeakSet[BlockingEngine] = weakref.WeakSet()


def _close_open_engines() -> None:
    for engine in list(_OPEN):
        with contextlib.suppress(Exception):
            engine.close()


# At exit the engines must close while their tiers' thread pools still take work and before
# the interpreter joins the loop's thread: threading's exit hooks run then, in reverse order
# of registration, so this one (registered after the pools', imported above) runs first. Where
# that hook is missing, a plain atexit hook (too late for the pools: blocks not written down).
_register = getattr(threading, "_register_atexit", atexit.register)
_register(_close_open_engines)
