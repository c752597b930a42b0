"""The engine: the async shell around the synchronous core, and the owner of every task.

Every public call does the same few things: validate and normalise its arguments, ask the core
(:class:`~aiotier._core.engine_core.EngineCore`, which owns every state change), await the tiers
where the core says I/O is needed, and hand the outcome back to the core. The await-side pieces
live in :mod:`aiotier._engine`: tier lookups and promotion reads (``reads``), the writer tasks
(``writers``) and the cache API (``cache_api``, over ``cache`` and ``values``). The primary-hit
paths of ``lookup`` and ``lookup_prefix`` stay inline here, over aliases of the block table's
arrays.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Final, Literal, Unpack

from opentelemetry.metrics import MeterProvider

from ._core.engine_core import EngineCore
from ._core.requests import RequestState
from ._core.table import READY
from ._engine.breakers import Breakers
from ._engine.cache import CacheCalls
from ._engine.cache_api import CacheAPI
from ._engine.clearing import check_clearable, clear_everything
from ._engine.lifecycle import (
    open_tiers,
    release_shared_memory,
    tier_setups,
    write_down_and_close,
)
from ._engine.loading import Flights
from ._engine.options import EngineArgs, EngineOptions, WritePolicy, build_core, engine_options
from ._engine.reads import TierReads
from ._engine.status import EngineStats, EngineStatus, TierHealth
from ._engine.stepping import StepExport
from ._engine.threads import CallerThreadAnswers, EngineLock
from ._engine.values import Values
from ._engine.writers import Writers
from ._types import (
    BlockEvent,
    LoadSpec,
    LookupResult,
    PrepareStoreOutput,
    RequestContext,
    normalize_key,
    normalize_keys,
)
from ._validate import check_positive, check_req, str_ids
from .errors import ConfigError, TieringError
from .telemetry import Telemetry
from .tiers.base import SecondaryTier
from .tiers.primary import PrimaryTier

__all__ = ["EngineOptions", "EngineStats", "TierHealth", "TieringEngine", "WritePolicy"]


_HIT: Final = LookupResult.HIT
_MISS: Final = LookupResult.MISS
_RETRY: Final = LookupResult.RETRY


class TieringEngine(CacheAPI):
    """Blocks in a primary arena over secondary tiers, with HIT / MISS / RETRY lookups.

    See the package documentation for the scheduler protocol; every public method is safe to
    call from one event loop, and none of them raises because a tier failed. The cache API
    (``get``, ``get_or_load``, ``put``, ``delete``) comes from
    :class:`~aiotier._engine.cache_api.CacheAPI`.
    """

    def __init__(
        self,
        primary: PrimaryTier,
        secondary: Sequence[SecondaryTier] = (),
        *,
        meter_provider: MeterProvider | None = None,
        **options: Unpack[EngineArgs],
    ) -> None:
        """``options`` are :class:`~aiotier.EngineOptions`' fields (its docs list them)."""
        self.tiers, o = engine_options(primary, secondary, options)
        tiers = self.tiers
        self.primary = primary
        #: The options this engine was built with (defaults filled in).
        self.options = o

        self._writers: Writers | None = None
        self._guard = guard = EngineLock()
        self._core = core = build_core(primary, tiers, o, self._notify_writer)
        self._setups = tier_setups(primary.block_size, tiers, core.routes)
        breakers = Breakers(tiers, o.breaker, guard)
        self._writers = Writers(core, tiers, o.tier_timeout, guard, breakers)
        self._reads = TierReads(core, tiers, o.promotion_timeout, guard, breakers)
        self._cache = CacheCalls(
            core,
            tiers,
            self._reads,
            guard,
            breakers,
            wait=lambda ks, timeout: self.wait(ks, timeout=timeout),
            promotion_timeout=o.promotion_timeout,
            io_timeout=o.tier_timeout,
        )
        self._values = Values(core, len(tiers), guard, self._cache.get)
        if o.default_ttl is not None:
            self._values.check_ttl_fits(o.default_ttl)
        self._status = status = EngineStatus(
            core, primary, tiers, guard, breakers, lambda: self._opened and not core.closed
        )
        telemetry = Telemetry(
            meter_provider,
            {
                "tier_usage": status.usage_by_tier,
                "tier_breaker_state": status.breaker_levels,
                "tier_events": status.tier_events,
            },
            counts=core.totals.counters,
            health=self.health,
        )
        self._export = StepExport(core, tiers, guard, telemetry)

        # the primary-hit paths read these directly (the table never replaces them)
        self._index = primary.table.index
        self._state = primary.table.state
        self._all_ready = primary.table.all_ready
        # every key ready, none with a TTL (the slow path checks deadlines): the prefix hits
        self._live_ready = primary.table.live_ready
        # slots holding a block with a TTL (most slots have none: one membership test)
        self._expiring = primary.table.deadlines.at
        self._stats = core.stats
        # open, not closed, and no admission policy counting sightings: the only state the
        # primary-hit fast paths check (with sightings to count, hits take the slow path);
        # the caller-thread answers keep a copy, set with it
        self._fast = False

        self._flights = Flights()
        self._closing: asyncio.Task[None] | None = None
        self._opened = False
        #: the answers other threads get without a hop to the loop (``BlockingEngine``)
        self._now = CallerThreadAnswers(primary.table, guard, core.stats, core.values.cached)

    @property
    def core(self) -> EngineCore:
        """The engine's synchronous state machine, for inspection in tests and tools.

        Reading it is safe; changing it behind the engine's back is not. Its layout is
        described in ``docs/architecture.md`` and may change between minor versions.
        """
        return self._core

    def _notify_writer(self, ti: int) -> None:
        if self._writers is not None:
            self._writers.notify(ti)

    def _share_with_threads(self, lock: AbstractContextManager[Any]) -> None:
        """Threads other than the loop's will call in (``BlockingEngine``): every core
        transition takes ``lock``, on the loop too. Call before ``open``."""
        self._guard.share(lock)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> TieringEngine:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Open every tier (in order) and start the background writers.

        Each tier opens with a :class:`~aiotier.tiers.base.TierSetup`: the primary's block
        size, and what its evictions hand over. A tier's ``open`` may rebuild an index (an SSD
        directory), so it gets ``open_timeout`` rather than ``io_timeout``; a tier that fails to
        open is an error for the caller.
        """
        if self._core.closed:
            raise TieringError("this engine was closed; create a new one")
        if self._opened:
            return
        if self.primary.shared_memory_released:
            raise ConfigError(
                "this PrimaryTier's shared memory was released when the engine using it "
                "closed (workers could no longer attach): create a new PrimaryTier"
            )
        o = self.options
        await open_tiers(self.tiers, self._setups, o.open_timeout, o.tier_timeout)
        self._opened = True
        self._guard.bind()
        self._fast = self._now.fast = not self._core.sightings
        usages = [t.usage() for t in self.tiers]
        self._core.count_tier_evictions_from(
            [u.evictions for u in usages], [u.expirations for u in usages]
        )
        assert self._writers is not None
        self._writers.start()
        if o.step_interval is not None:
            self._export.start_ticker(o.step_interval, self.end_step)
        else:
            self._export.start_idle_export()

    async def aclose(self, *, flush: bool = True) -> None:
        """Cancel promotions, write down primary-only blocks (``write_back``), close the tiers.

        Nothing outlives the call: no task, pin or file handle. ``flush=False`` skips the
        write-down of blocks that live only in the primary. A caller cancelled meanwhile does
        not stop the close (each of its steps is bounded by ``io_timeout``): it goes on to the
        end, and a second ``aclose()`` awaits it.
        """
        self._guard.check_loop()
        with self._guard.lock:
            if self._closing is None:
                self._core.closed = True
                self._fast = self._now.fast = False
                # promotions and the ticker stop now, not a loop turn later when the close runs
                self._reads.cancel_tasks()
                self._export.stop_ticker()
                self._closing = asyncio.get_running_loop().create_task(
                    self._close(flush), name="aiotier-close"
                )
        await asyncio.shield(self._closing)

    async def _close(self, flush: bool) -> None:
        core, lock = self._core, self._guard.lock
        await asyncio.gather(*self._flights.cancel(), return_exceptions=True)
        await self._export.ticker_stopped()
        await self._reads.cancel(self.options.tier_timeout)
        with lock:
            core.release_all()
        if self._opened:
            assert self._writers is not None
            await write_down_and_close(
                core, self.tiers, self._writers, lock, self.options.tier_timeout, flush=flush
            )
        self._export.close()
        await release_shared_memory(self.primary)

    def _check_open(self) -> None:
        if self._core.closed:
            raise TieringError("the engine is closed")
        if not self._opened:
            raise TieringError("the engine is not open: use 'async with engine' or 'await open()'")

    # ------------------------------------------------------------------ lookups

    async def lookup(
        self,
        key: bytes | str,
        req: RequestContext | None = None,
        *,
        exclude_tier: SecondaryTier | str | None = None,
    ) -> LookupResult:
        """HIT, MISS or RETRY for one key (see the scheduler protocol)."""
        # BlockTable.ready_slot, inlined: the call costs ~7% of a primary hit (callgrind). Only a
        # bytes key takes the fast path: a memoryview hashes and compares equal to the bytes it
        # views, and must get the error every other path gives it
        slot = self._index.get(key) if key.__class__ is bytes else None
        if (
            slot is not None
            and self._state[slot] == READY
            and slot not in self._expiring
            and exclude_tier is None
            and (req is None or req.__class__ is RequestContext)
            and self._fast
        ):
            self._stats.primary_hit += 1
            return _HIT
        k = normalize_key(key)
        exclude = self._tier_index(exclude_tier)
        with self._guard.lock:
            rs = self._lookup_begins(k, req)
            if rs is _HIT:
                return _HIT
        self._guard.check_loop()
        scan = await self._reads.scan([k], rs, exclude, prefix=False)
        self._export.flush_if_full()
        return scan.results[0]

    def _lookup_begins(
        self, k: bytes, req: RequestContext | None
    ) -> RequestState | Literal[LookupResult.HIT] | None:
        """(Under the lock.) ``lookup`` up to the scan: HIT, or the request's state."""
        self._check_open()
        rs = self._request(req)
        if self._core.sightings:
            self._core.saw([k])
        self._core.expiry.check((k,))  # past its TTL: absent from here on
        if self._core.table.ready_slot(k) is not None:  # a str key hits here
            self._stats.primary_hit += 1
            return _HIT
        return rs

    def _lookup_without_tiers(self, key: bytes | str, req: RequestContext | None) -> LookupResult:
        """``lookup`` of an engine with no secondary tier, from any thread: no tier to ask and
        no promotion to start, so the whole answer is one transition (nothing to await)."""
        assert not self.tiers
        k = normalize_key(key)
        with self._guard.lock:
            rs = self._lookup_begins(k, req)
            if rs is _HIT:
                return _HIT
            promotions = self._core.promotions
            scan = promotions.begin([k], rs, -1, prefix=False)
            promotions.finish(scan, at_once=True)  # places nothing: there is no tier
        self._export.flush_if_full()
        return scan.results[0]

    async def lookup_prefix(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None
    ) -> int | None:
        """How many leading keys are HIT; ``None`` if a RETRY came before the first MISS.

        The scan goes on past a RETRY, so the promotions of later keys start at once.
        """
        keys = _key_sequence(keys, req)
        if (
            self._fast
            and _only_bytes(keys)
            # a prefix that grew since it was stored misses its last key: the slow path at
            # once, rather than through the KeyError of the gather below
            and (not keys or keys[-1] in self._index)
            # with blocks with a TTL about, also none of these may have one (slow path checks)
            and (self._live_ready if self._expiring else self._all_ready)(keys)  # type: ignore[arg-type]
        ):
            # all hits (a miss, a str key or a bad one goes the slow way: it answers or names it)
            n = len(keys)
            self._stats.primary_hit += n
            return n
        _, results = await self._scan_prefix(keys, req)
        first_miss = results.index(_MISS) if _MISS in results else len(results)
        if _RETRY in results and results.index(_RETRY) < first_miss:
            return None  # something before the first MISS is on its way
        return first_miss  # every answer before it is a HIT

    async def prefetch(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None, *, timeout: float
    ) -> int:
        """Start the promotions ``lookup_prefix`` would, then wait at most ``timeout`` seconds.

        Returns how many leading keys are loadable from the primary at that moment (all of them
        as soon as all landed). Never raises because the deadline passed: promotions still in
        flight go on, and a later lookup answers from them. Pins as for ``lookup_prefix``.
        """
        keys = _key_sequence(keys, req)
        check_positive("timeout", timeout, allow_zero=True)
        if (
            self._fast
            and _only_bytes(keys)
            # with blocks with a TTL about, also none of these may have one (slow path checks)
            and (self._live_ready if self._expiring else self._all_ready)(keys)  # type: ignore[arg-type]
        ):
            ready = len(keys)
            self._stats.primary_hit += ready
        else:
            ks, results = await self._scan_prefix(keys, req)
            first_miss = results.index(_MISS) if _MISS in results else len(results)
            if _RETRY in results[:first_miss]:
                with contextlib.suppress(TimeoutError):
                    await self._reads.wait(ks[:first_miss], timeout)
            with self._guard.lock:
                ready = self._core.answers.ready_prefix(ks)
        outcome = "complete" if ready == len(keys) else "partial" if ready else "none"
        with self._guard.lock:
            self._stats.count("prefetches", outcome)
        return ready

    async def _scan_prefix(
        self, keys: Sequence[bytes | str], req: RequestContext | None
    ) -> tuple[list[bytes], list[LookupResult]]:
        """The slow path of ``lookup_prefix`` and ``prefetch``: every key's answer."""
        ks = normalize_keys(keys)
        with self._guard.lock:
            self._check_open()
            rs = self._request(req)
        self._guard.check_loop()
        results = (await self._reads.scan(ks, rs, -1, prefix=True)).results
        self._export.flush_if_full()
        if self._core.sightings:
            first_miss = results.index(_MISS) if _MISS in results else len(results)
            with self._guard.lock:
                self._core.saw(ks[: first_miss + 1])  # each key up to where the prefix stops
        return ks, results

    async def wait(
        self, keys: Sequence[bytes | str], *, timeout: float | None = None
    ) -> list[LookupResult]:
        """Await until none of ``keys`` is in flight; return their settled HIT or MISS.

        Starts nothing. Raises ``TimeoutError`` when ``timeout`` passes first.
        """
        ks = normalize_keys(keys)
        if timeout is not None:
            check_positive("timeout", timeout, allow_zero=True)
        self._check_open()
        self._guard.check_loop()
        return await self._reads.wait(ks, timeout)

    # ------------------------------------------------------------------ loads and stores

    def prepare_load(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None
    ) -> LoadSpec:
        """Pin every key (each must be a HIT) and return read-only views of their bytes."""
        ks = normalize_keys(keys)
        check_req(req)
        with self._guard.lock:
            self._check_open()
            return self._core.prepare_load(ks, None if req is None else req.req_id)

    def complete_load(self, keys: Sequence[bytes | str], req: RequestContext | None = None) -> None:
        """Unpin blocks loaded with ``prepare_load`` (and the request's promotion pins on them)."""
        ks = normalize_keys(keys)
        check_req(req)
        with self._guard.lock:
            self._core.complete_load(ks, None if req is None else req.req_id)

    def touch(self, keys: Iterable[bytes | str], *, first_use: bool = False) -> None:
        """Mark blocks as recently used, in order (the last one the most recent); keys not in
        the primary are ignored. ``first_use=True`` counts each as its first use, not a further
        one (ARC keeps it among the blocks seen once; LRU makes no difference)."""
        ks = normalize_keys(keys)
        with self._guard.lock:
            self._core.touch(ks, first_use=first_use)

    def prepare_store(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None
    ) -> PrepareStoreOutput | None:
        """Allocate primary blocks for the keys not yet present; None (nothing changed) if full."""
        ks = normalize_keys(keys)
        check_req(req)
        with self._guard.lock:
            self._check_open()
            return self._core.prepare_store(ks, None if req is None else req.req_id)

    def complete_store(
        self,
        keys: Sequence[bytes | str],
        req: RequestContext | None = None,
        *,
        success: bool = True,
        sizes: Sequence[int] | None = None,
    ) -> None:
        """Make prepared blocks loadable (``sizes`` gives lengths), or free them on failure."""
        ks = normalize_keys(keys)
        check_req(req)
        with self._guard.lock:
            self._check_open()
            self._core.complete_store(
                ks, None if req is None else req.req_id, success=success, sizes=sizes
            )

    async def clear(self, *, timeout: float | None = None) -> None:
        """Drop every block, from the primary and from every secondary tier (durably, for a
        persistent one): once this returns, no lookup, ``get`` or promotion finds a block stored
        before the call. For a cache whose contents went invalid at once (new model weights).

        Loads and stores handed out before the call are cancelled as :meth:`clear_primary`
        says; queued writes and removes are dropped. On a tier shared by a fleet
        (Redis, an object store) this empties the tier's whole prefix, for every engine using
        it. Raises :class:`~aiotier.errors.ConfigError`, changing nothing, when a tier cannot
        clear; :class:`~aiotier.errors.TieringError` when a tier's clear failed or did not end
        within ``timeout`` (default ``open_timeout``): that tier is then not read until a later
        ``clear`` succeeds.
        """
        self._check_open()
        self._guard.check_loop()
        check_clearable(self.tiers)
        assert self._writers is not None
        await clear_everything(
            self._core, self.tiers, self._writers, self._guard,
            timeout if timeout is not None else self.options.open_timeout,
        )  # fmt: skip

    def clear_primary(self) -> None:
        """Drop every block of the primary arena; the secondary tiers keep theirs (and their
        queued writes), so later lookups promote from them again. No I/O, no await: for a
        scheduler whose own KV cache was reset (vLLM's ``reset_cache``).

        Loads and stores handed out before the call are cancelled: a store of them makes
        nothing visible. Their slots stay pinned (the caller may still read or write them) until
        they complete, the request finishes, or :meth:`release_cleared`. A ``complete_load`` or
        ``complete_store`` of a key prefers one handed out after the call. Blocks only the
        primary held are lost.
        """
        with self._guard.lock:
            self._check_open()
            self._core.clear(secondary=False)

    def release_cleared(self) -> None:
        """The loads and stores handed out before the last clear will never complete (the
        caller dropped them, as vLLM does at a reset): their slots are released now. Call it
        once nothing reads or writes those slots any more."""
        with self._guard.lock:
            self._core.release_cancelled()

    async def flush(self, timeout: float | None = None) -> None:
        """Await until every queued write and remove has reached its tier.

        Raises ``TimeoutError`` (nothing is dropped) when ``timeout`` passes first; None means
        twice ``io_timeout`` (an engine's own bound, so a dead tier cannot hold a flush forever).
        """
        self._check_open()
        self._guard.check_loop()
        assert self._writers is not None
        await self._writers.drain(
            timeout if timeout is not None else self.options.tier_timeout * 2, discard=False
        )

    # ------------------------------------------------------------------ step boundary

    def take_events(self) -> list[BlockEvent]:
        """Stored and removed events since the last call."""
        with self._guard.lock:
            return self._core.take_events()

    def end_step(
        self, *, new_req_ids: Iterable[str] = (), finished_req_ids: Iterable[str] = ()
    ) -> None:
        """The schedule-step boundary: observe delays, release expired pins, export metrics."""
        new = str_ids("new_req_ids", new_req_ids)
        finished = str_ids("finished_req_ids", finished_req_ids)
        with self._guard.lock:
            self._core.end_step(new, finished)
        self._export.stepped()

    # ------------------------------------------------------------------ introspection

    def stats(self) -> EngineStats:
        """A snapshot: per-tier usage, promotions in flight, pinned blocks, counters."""
        return self._status.stats()

    def health(self) -> dict[str, TierHealth]:
        """Each tier, the primary first, as a readiness probe sees it: safe from any thread.

        ``/readyz`` of :func:`aiotier.telemetry.start_prometheus_server` serves this.
        """
        return self._status.health()

    # ------------------------------------------------------------------ helpers

    def _request(self, req: RequestContext | None) -> RequestState | None:
        if req is None:
            return None
        check_req(req)
        return self._core.requests.open(req.req_id)

    def _tier_index(self, tier: SecondaryTier | str | None) -> int:
        if tier is None:
            return -1
        for i, t in enumerate(self.tiers):
            if t is tier or t.name == tier:
                return i
        raise ValueError(f"exclude_tier {tier!r} is not one of this engine's secondary tiers")


def _only_bytes(keys: Sequence[object]) -> bool:
    """Whether every key is a ``bytes`` (one C-level pass): a primary hit answered for others,
    such as a memoryview equal to a stored key, would skip the key check."""
    return _BYTES.issuperset(map(type, keys))


_BYTES: frozenset[type] = frozenset({bytes})


def _key_sequence(keys: Sequence[bytes | str], req: RequestContext | None) -> Sequence[bytes | str]:
    """``keys`` as a list or tuple (an iterator is read once), after the checks that come first."""
    if keys.__class__ is not list and keys.__class__ is not tuple:
        if isinstance(keys, str | bytes):
            raise TypeError("keys must be a sequence of keys, not a single str or bytes key")
        keys = list(keys)
    if req is not None and req.__class__ is not RequestContext:
        check_req(req)
    return keys
