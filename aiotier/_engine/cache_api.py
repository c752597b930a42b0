"""The cache API of :class:`~aiotier.TieringEngine`: ``get``, ``get_or_load``, ``put`` and
``delete`` of values of any size, with a TTL, acknowledged by write-through tiers.

A base class of the engine, apart from the scheduler protocol it sits beside: these methods use
the engine's parts (the core, the lock, the values, the flights) through the attributes the
engine sets in its constructor, declared below.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from .._core.engine_core import EngineCore
from .._core.values import PIECE_KEY_PREFIX, check_value_key
from .._core.writeback import WriteAcks
from .._types import MAX_KEY_BYTES, RequestContext, normalize_key
from .._validate import check_req, check_ttl, value_data
from .cache import CacheCalls
from .loading import Flights, Loader, load_through
from .options import EngineOptions
from .stepping import StepExport
from .threads import CallerThreadAnswers, EngineLock
from .values import Values, has_head

__all__ = ["CacheAPI"]


class CacheAPI:
    """``get``, ``get_or_load``, ``put`` and ``delete`` (mixed into ``TieringEngine``)."""

    options: EngineOptions
    _core: EngineCore
    _guard: EngineLock
    _cache: CacheCalls
    _values: Values
    _flights: Flights
    _now: CallerThreadAnswers
    _export: StepExport

    def _check_open(self) -> None:
        raise NotImplementedError  # the engine's

    async def get(self, key: bytes | str, req: RequestContext | None = None) -> bytes | None:
        """The value's bytes: from the primary, or promoted from a tier and awaited; else None.

        A value stored over several blocks comes back whole or not at all (None when a piece
        is gone); one past its TTL is None, wherever it was found. ``get`` counts as its own
        anonymous request for the metrics (one lookup per block it reads); it pins a block only
        while it waits for it and copies it out.
        """
        k = normalize_key(key)
        check_req(req)  # a get is observed as its own anonymous request: no state kept
        with self._guard.lock:
            self._check_open()
            if self._core.sightings:
                self._core.saw([k])
        self._guard.check_loop()
        try:
            data = await self._cache.get(k)
            if data is not None and has_head(data):
                value = self._values.inline(data)  # a small value with a TTL, live
                return value if value is not None else await self._values.get(k, data)
            return data
        finally:
            self._export.flush_if_full()

    async def get_or_load(
        self, key: bytes | str, loader: Loader, *, ttl: float | None = None
    ) -> bytes:
        """The block's bytes as ``get`` finds them; on a miss everywhere, ``await loader()``,
        stored as by ``put`` (with ``ttl``) and returned.

        Single flight: concurrent callers of a key that misses the primary share one look
        through the tiers and at most one call of ``loader`` (the first caller's). A loader
        exception reaches every caller waiting on that call and stores nothing; the next call
        tries again. A caller cancelled while waiting does not cancel the load for the others.
        The value is returned even when the primary has no room to keep it. ``loader`` must be
        an async callable returning bytes-like (``TypeError`` otherwise); a value the engine
        cannot take raises ``ValueError``, as ``put`` does.
        """
        if not callable(loader):
            raise TypeError(f"get_or_load: loader must be an async callable, got {loader!r}")
        if ttl is not None:
            ttl = self._ttl(ttl)  # checked on a hit too
        data = self._now.cached(key, None)  # a primary hit starts no task
        if data is not None:
            if not has_head(data):
                return data
            value = self._values.inline(data)  # a small value with a TTL, live
            if value is not None:
                return value
        k = normalize_key(key)
        with self._guard.lock:
            self._check_open()
        self._guard.check_loop()

        expires = self.options.default_ttl if ttl is None else ttl

        def store(k: bytes, data: bytes) -> Awaitable[bool]:
            return self._store(k, data, expires)

        return await self._flights.join(k, lambda: load_through(self.get, store, k, loader))

    async def put(
        self, key: bytes | str, data: bytes | bytearray | memoryview, *, ttl: float | None = None
    ) -> bool:
        """Store ``data`` in the primary, replacing the key everywhere; False when no room.

        ``ttl`` (seconds > 0; default ``default_ttl``): past it the value is a MISS for
        ``get``, ``get_or_load``, ``lookup`` and ``lookup_prefix`` on every tier, and its space
        is reclaimed (docs/web-cache.md, "Expiry"); the scheduler protocol's blocks
        (``prepare_store``/``complete_store``) never expire.

        A value larger than ``block_size`` is stored over several blocks (up to
        ``max_value_bytes``; larger raises ``ValueError``): its pieces first, then one block
        that names them, so ``get`` sees the old value or the new one, whole. False, with the
        old value still there, when the primary cannot hold every piece now.

        With write-through tiers (``write_policy``), ``put`` returns once each of them has
        the value: it took it, its admission policy kept it out, or its write failed (the
        write failed, the tier's circuit was open, its queue was full, or it took longer than
        twice ``io_timeout``: counted in ``aiotier_tier_errors_total{op="write"}`` or
        ``aiotier_demotions_dropped_total``, never raised). So while the tier is healthy, a put
        that returned is on that tier.
        """
        self._guard.check_loop()
        # _store inlined (the hot path of a burst of puts: no coroutine or call it can spare)
        no_ttl = ttl is None and self.options.default_ttl is None
        stored, acks = self._put(key, data, None if no_ttl else self._ttl(ttl))
        if acks is not None and stored:
            await self._written_through(acks)
        return stored

    async def _store(
        self, key: bytes | str, data: bytes | bytearray | memoryview, ttl: float | None
    ) -> bool:
        """``put`` with its ``ttl`` checked: stored, then write-through writes awaited."""
        stored, acks = self._put(key, data, ttl)
        if acks is not None and stored:
            await self._written_through(acks)
        return stored

    async def _written_through(self, acks: WriteAcks) -> None:
        """Await the outcome of a put's write-through writes (at most twice ``io_timeout``)."""
        taken = asyncio.get_running_loop().create_future()

        def settled() -> None:
            if not taken.done():
                taken.set_result(None)

        with self._guard.lock:
            acks.when_settled(settled)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.options.tier_timeout * 2):
                await taken

    @property
    def max_value_bytes(self) -> int:
        """The largest value ``put`` takes: ``num_blocks - 1`` blocks (the primary must hold
        all its pieces and the block naming them at once)."""
        return self._values.max_bytes

    def _ttl(self, ttl: object) -> float | None:
        """A call's ``ttl`` checked (``default_ttl`` when None), as seconds or None."""
        seconds = check_ttl(ttl) if ttl is not None else self.options.default_ttl
        if seconds is not None:
            self._values.check_ttl_fits(seconds)
        return seconds

    def _put(
        self, key: bytes | str, data: bytes | bytearray | memoryview, ttl: float | None = None
    ) -> tuple[bool, WriteAcks | None]:
        """The synchronous half of ``put`` (a caller's thread can run it: ``BlockingEngine``):
        whether the primary took the value, and the write-through writes to await. ``ttl``
        is checked already (:meth:`_ttl`)."""
        k = key if type(key) is bytes and len(key) <= MAX_KEY_BYTES else normalize_key(key)
        if k.startswith(PIECE_KEY_PREFIX):
            check_value_key(k)  # raises
        view = memoryview(data) if type(data) is bytes else value_data(k, data)
        acks = WriteAcks() if self._core.routes.through else None
        with self._guard.lock:
            self._check_open()
            expires_at = None if ttl is None else self._core.expiry.wall_clock() + ttl
            return self._values.put(k, view, acks, expires_at), acks

    async def delete(self, key: bytes | str) -> bool:
        """Remove the value from every tier; True if any tier had it.

        A value over several blocks loses its pieces too when the block naming them is in the
        primary; pieces of one found only below are left to age out of their tiers.
        """
        k = normalize_key(key)
        check_value_key(k)
        with self._guard.lock:
            self._check_open()
            self._values.forget(self._values.pieces_of(k))
        self._guard.check_loop()
        return await self._cache.delete(k)
