"""The engine: the async shell that drives the synchronous core and owns every task.

Data flows one way. ``lookup`` asks the block table; on a primary miss it asks the secondary
tiers, reserves primary slots at once (so a second lookup sees the promotion in flight) and
hands the read to a task. The task lets the tier read straight into the arena and tells the
table the block is ready, which wakes waiters. Evicted blocks are copied out synchronously and
written down by one writer task per tier, in order, so no tier ever ends up with older bytes
than a later ``put`` or ``delete`` left there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, Final, Literal, TypeVar, cast

from opentelemetry.metrics import MeterProvider

from ._core.requests import RequestState
from ._core.stats import StepStats, TotalStats
from ._core.table import ORPHAN, PENDING, PROMOTING, READY
from ._types import (
    BlockEvent,
    LoadSpec,
    LookupResult,
    PrepareStoreOutput,
    RequestContext,
    StoreSpec,
    normalize_key,
    normalize_keys,
)
from .errors import BlockNotReadyError, ConfigError, TieringError
from .telemetry import Telemetry
from .tiers.base import SecondaryTier, TierUsage
from .tiers.primary import PrimaryTier

__all__ = ["EngineStats", "TieringEngine", "WritePolicy"]

WritePolicy = Literal["write_back", "write_through", "none"]
_WRITE_POLICIES: Final = ("write_back", "write_through", "none")

_HIT: Final = LookupResult.HIT
_MISS: Final = LookupResult.MISS
_RETRY: Final = LookupResult.RETRY

_WRITE: Final = 0
_REMOVE: Final = 1
_BATCH: Final = 64  # queued tier operations handed to one write_many / remove round
_MAX_BUFFERED_SAMPLES: Final = 100_000  # flush metrics early when nobody calls end_step
_MAX_EVENTS: Final = 65_536

_now = time.perf_counter
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine.

    ``counters`` holds totals since the engine was created, keyed by metric and labels, e.g.
    ``("lookups", "primary", "hit")``, ``("promotions", "ssd", "ok")``,
    ``("tier_errors", "redis", "read")``.
    """

    tiers: Mapping[str, TierUsage]
    promotions_in_flight: int
    pinned_blocks: int
    pending_writes: int
    step: int
    counters: Mapping[tuple[str, ...], int]


class _Inflight:
    """A key whose answer is RETRY: a promotion read, or a store not completed yet."""

    __slots__ = ("deferrals", "holders", "slot", "tier", "waiters")

    def __init__(self, slot: int, tier: int) -> None:
        self.slot = slot
        self.tier = tier  # index of the source tier; -1 for a pending store
        self.waiters: list[asyncio.Future[None]] = []
        self.holders: list[RequestState] = []
        self.deferrals: list[_Deferral] = []


class _Deferral:
    """An anonymous call's deferral: observed when the last of its keys settles."""

    __slots__ = ("remaining", "start")

    def __init__(self, start: float, remaining: int) -> None:
        self.start = start
        self.remaining = remaining


class _Op:
    """One queued tier mutation."""

    __slots__ = ("data", "demotion", "done", "key", "kind")

    def __init__(
        self,
        kind: int,
        key: bytes,
        data: bytes | None = None,
        *,
        demotion: bool = False,
        done: asyncio.Future[bool] | None = None,
    ) -> None:
        self.kind = kind
        self.key = key
        self.data = data
        self.demotion = demotion
        self.done = done


class TieringEngine:
    """Blocks in a primary arena over secondary tiers, with HIT / MISS / RETRY lookups.

    See the package documentation for the scheduler protocol; every public method is safe to
    call from one event loop, and none of them raises because a tier failed.
    """

    def __init__(
        self,
        primary: PrimaryTier,
        secondary: Sequence[SecondaryTier] = (),
        *,
        write_policy: WritePolicy = "write_back",
        meter_provider: MeterProvider | None = None,
        promotion_timeout: float = 5.0,
        max_inflight_promotions: int = 64,
        backoff_seconds: float = 1.0,
        io_timeout: float | None = None,
        pin_steps: int = 16,
        step_interval: float | None = None,
        max_pending_write_bytes: int | None = None,
        open_timeout: float = 300.0,
        immutable_keys: bool = False,
    ) -> None:
        if not isinstance(primary, PrimaryTier):
            raise TypeError(f"primary must be a PrimaryTier, got {type(primary).__name__}")
        tiers = tuple(secondary)
        names = {primary.name}
        for t in tiers:
            if not isinstance(t, SecondaryTier):
                raise TypeError(f"secondary tiers must be SecondaryTier, got {type(t).__name__}")
            if t.name in names:
                raise ConfigError(f"tier name {t.name!r} is used twice; give each tier a name")
            names.add(t.name)
        if write_policy not in _WRITE_POLICIES:
            raise ConfigError(
                f"write_policy must be one of {', '.join(_WRITE_POLICIES)}, got {write_policy!r}"
            )
        _positive("promotion_timeout", promotion_timeout)
        _positive("backoff_seconds", backoff_seconds)
        if io_timeout is not None:
            _positive("io_timeout", io_timeout)
        if step_interval is not None:
            _positive("step_interval", step_interval)
        _positive("open_timeout", open_timeout)
        if not isinstance(immutable_keys, bool):
            raise ConfigError(f"immutable_keys must be a bool, got {immutable_keys!r}")
        if max_pending_write_bytes is None:
            max_pending_write_bytes = max(primary.arena.nbytes, 64 << 20)
        for field, value in (("max_inflight_promotions", max_inflight_promotions),
                             ("pin_steps", pin_steps),
                             ("max_pending_write_bytes", max_pending_write_bytes)):  # fmt: skip
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{field} must be an int >= 1, got {value!r}")

        self.primary = primary
        self.tiers = tiers
        self.write_policy: WritePolicy = write_policy
        self.promotion_timeout = float(promotion_timeout)
        self.max_inflight_promotions = max_inflight_promotions
        self.backoff_seconds = float(backoff_seconds)
        self.io_timeout = float(io_timeout if io_timeout is not None else promotion_timeout)
        self.pin_steps = pin_steps
        self.step_interval = step_interval
        self.open_timeout = float(open_timeout)
        #: Keys name their content (a hash of the bytes, as vLLM's prefix-cache block hashes):
        #: a put or store of a key never changes its bytes, so copies below stay valid.
        self.immutable_keys = immutable_keys

        # the hot path reads these directly
        self._arena = primary.arena
        self._table = primary.table
        self._index = primary.table.index
        self._state = primary.table.state
        self._pname = primary.name

        self._stats = StepStats()
        self._totals = TotalStats()
        self._telemetry = Telemetry(meter_provider, self._usage_by_tier)
        self._tier_evictions = [0] * len(tiers)

        self._inflight: dict[bytes, _Inflight] = {}
        self._promoting = 0  # keys whose promotion read is in flight
        self._store_deadline: dict[int, float] = {}  # pending-store slot -> RETRY deadline
        self._backoff: dict[tuple[int, bytes], float] = {}  # (tier, key) -> until
        self._demoting: dict[bytes, bytes] = {}  # bytes on their way down to a tier
        self._queues: list[deque[_Op]] = [deque() for _ in tiers]
        self._queue_wakeups: list[asyncio.Event] = []
        # per tier, keys with a queued (or running) write / remove: lookups and write-downs
        # consult these so that no older bytes are read or left behind
        self._writing: list[Counter[bytes]] = [Counter() for _ in tiers]
        self._removing: list[Counter[bytes]] = [Counter() for _ in tiers]
        # per tier, keys whose last write or remove there failed: the tier may hold older
        # bytes, so it is not read for them until a later write or remove succeeds
        self._stale: list[set[bytes]] = [set() for _ in tiers]
        self._queued_bytes = 0
        # bytes copied out for write-back and not yet written: a demotion past this is dropped
        self._max_queued_bytes = max_pending_write_bytes

        self._requests: dict[str, RequestState] = {}
        self._anon = RequestState("<anonymous>")  # loads and stores of calls without a request
        self._anon_promo: dict[bytes, int] = {}  # anonymous RETRY pins, dropped at end_step
        self._pin_expiry: deque[tuple[int, RequestState, bytes, int]] = deque()
        self._events: deque[BlockEvent] = deque(maxlen=_MAX_EVENTS)
        self._step = 0

        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.Task[None]] = []
        self._ticker: asyncio.Task[None] | None = None
        self._opened = False
        self._closed = False

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

        A tier's ``open`` may rebuild an index (an SSD directory), so it gets ``open_timeout``
        rather than ``io_timeout``; a tier that fails to open is an error for the caller.
        """
        if self._closed:
            raise TieringError("this engine was closed; create a new one")
        if self._opened:
            return
        opened: list[SecondaryTier] = []
        try:
            for t in self.tiers:
                try:
                    async with asyncio.timeout(self.open_timeout):
                        await t.open()
                except TimeoutError:
                    raise TieringError(
                        f"tier {t.name!r} did not open within {self.open_timeout}s"
                    ) from None
                opened.append(t)
        except BaseException:
            for t in reversed(opened):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(t.aclose(), self.io_timeout)
            raise
        self._opened = True
        loop = asyncio.get_running_loop()
        cascade = self.write_policy == "write_back"
        for i, t in enumerate(self.tiers):
            # hand-overs feed the tier below; from a tier that keeps its bytes in memory they
            # are also taken with no tier below, so its evictions are reported as events
            t.handover_evicted = (cascade and i + 1 < len(self.tiers)) or t.cheap_handover
            t.report_evicted = not t.handover_evicted  # otherwise the hand-over names them
            self._tier_evictions[i] = t.evictions
            self._queue_wakeups.append(asyncio.Event())
            self._writers.append(loop.create_task(self._writer(i), name=f"aiotier-writer-{t.name}"))
        if self.step_interval is not None:
            self._ticker = loop.create_task(self._tick(self.step_interval), name="aiotier-step")

    async def aclose(self, *, flush: bool = True) -> None:
        """Cancel promotions, write down primary-only blocks (``write_back``), close the tiers.

        Nothing outlives the call: no task, pin or file handle. ``flush=False`` skips the
        write-down of blocks that live only in the primary.
        """
        if self._closed:
            return
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=self.io_timeout)
        for key, rec in list(self._inflight.items()):
            if rec.tier >= 0:  # its task was cancelled before it could count itself
                self._stats.promotions[(self.tiers[rec.tier].name, "cancelled")] += 1
            self._settle(key)
        self._promoting = 0  # a task cancelled before its first step never ran its cleanup
        if self._opened:
            # copies a failed write or remove may have left behind are the one thing a restart
            # would not know to avoid: try once more to remove them (a write-down follows them)
            for ti, stale in enumerate(self._stale):
                for k in list(stale):
                    self._enqueue(ti, _Op(_REMOVE, k))
            if flush and self.write_policy == "write_back" and self.tiers:
                self._write_down_primary()
            await self._drain_queues(self.io_timeout * 2, discard=True)
            for w in self._writers:
                w.cancel()
            await asyncio.gather(*self._writers, return_exceptions=True)
            for t in reversed(self.tiers):
                try:
                    await asyncio.wait_for(t.aclose(), self.io_timeout)
                except Exception:
                    self._stats.tier_errors[(t.name, "close")] += 1
        self._flush_metrics()
        self._requests.clear()
        self._anon_promo.clear()
        self._pin_expiry.clear()
        self._index.clear()  # lookups after close take the slow path, which raises
        self._table.unpin_all()

    def _check_open(self) -> None:
        if self._closed:
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
        try:
            slot = self._index.get(key)  # type: ignore[arg-type]
        except TypeError:
            slot = None
        if (
            slot is not None
            and self._state[slot] == READY
            and exclude_tier is None
            and (req is None or req.__class__ is RequestContext)
        ):
            self._stats.primary_hit += 1
            return _HIT
        k = normalize_key(key)
        self._check_open()
        exclude = self._tier_index(exclude_tier)
        rs = self._request(req)
        slot = self._index.get(k)  # a str key hits here
        if slot is not None and self._state[slot] == READY:
            self._stats.primary_hit += 1
            return _HIT
        results = await self._scan([k], rs, exclude, prefix=False)
        return results[0]

    async def lookup_prefix(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None
    ) -> int | None:
        """How many leading keys are HIT; ``None`` if a RETRY came before the first MISS.

        The scan goes on past a RETRY, so the promotions of later keys start at once.
        """
        if isinstance(keys, str | bytes):
            raise TypeError("keys must be a sequence of keys, not a single str or bytes key")
        if keys.__class__ is not list and keys.__class__ is not tuple:
            keys = list(keys)  # an iterator is read once, by both paths below
        if req is not None and req.__class__ is not RequestContext:
            _check_req(req)
        index = self._index
        state = self._state
        n = 0
        try:
            for key in keys:
                slot = index.get(key)  # type: ignore[arg-type]
                if slot is None or state[slot] != READY:
                    break
                n += 1
            else:
                self._stats.primary_hit += n
                return n
        except TypeError:
            pass  # an unhashable key: normalize_keys below names it
        ks = normalize_keys(keys)
        self._check_open()
        rs = self._request(req)
        results = await self._scan(ks, rs, -1, prefix=True)
        count = 0
        for r in results:
            if r is _HIT:
                count += 1
            elif r is _RETRY:
                return None
            else:
                break
        return count

    async def _scan(
        self, ks: list[bytes], rs: RequestState | None, exclude: int, *, prefix: bool
    ) -> list[LookupResult]:
        """The slow path of both lookups: primary states, then the tiers, then promotions."""
        stats = self._stats
        index = self._index
        state = self._state
        results: list[LookupResult] = [_MISS] * len(ks)
        need: list[int] = []
        protected: list[int] = []
        retry_keys: list[bytes] = []
        now = _now()
        for i, k in enumerate(ks):
            answer = self._primary_answer(k, rs, now, protected)
            if answer is None:
                stats.primary_miss += 1
                need.append(i)
                continue
            results[i] = answer
            slot = index.get(k)
            if slot is not None and state[slot] != PENDING:
                protected.append(slot)
            if answer is _HIT:
                stats.primary_hit += 1
            elif answer is _RETRY:
                stats.primary_retry += 1
                retry_keys.append(k)
            else:
                stats.primary_miss += 1
        if need:
            started = _now()
            if rs is not None:
                rs.busy += 1  # end_step must not forget a request whose lookup is suspended
            try:
                consulted, _ = await self._consult_tiers(
                    ks, need, results, rs, exclude, protected, prefix
                )
            finally:
                if rs is not None:
                    rs.busy -= 1
            elapsed = _now() - started
            for i, r in enumerate(results):
                # HITs were sampled before the await: a concurrent store may have evicted one
                if r is _HIT and self._settled_answer(ks[i]) is not _HIT:
                    results[i] = _MISS
            if consulted:  # only a lookup that asked a secondary tier has a sync delay
                if rs is not None:
                    rs.add_sync(elapsed)
                else:  # the buffers may have been swapped by an end_step during the await
                    self._stats.sync_delays.append(elapsed)
                    self._maybe_flush()
            retry_keys.extend(ks[i] for i in need if results[i] is _RETRY)
        if retry_keys:
            self._defer(rs, retry_keys, _now())  # the deferral starts when RETRY is answered
        return results

    def _primary_answer(
        self,
        k: bytes,
        rs: RequestState | None,
        now: float,
        protected: Sequence[int] = (),
        hold: bool = True,
    ) -> LookupResult | None:
        """The primary's answer for ``k``, or None when the tiers must be asked."""
        slot = self._index.get(k)
        if slot is not None:
            st = self._state[slot]
            if st == READY:
                return _HIT
            if st == PROMOTING:
                if hold:
                    self._hold(rs, k, slot)
                return _RETRY
            # PENDING: a store in flight answers RETRY until its deadline
            return _RETRY if now < self._store_deadline.get(slot, 0.0) else _MISS
        data = self._demoting.get(k)
        if data is not None:
            return _HIT if self._readmit(k, data, protected) else _MISS
        return None

    async def _consult_tiers(
        self,
        ks: list[bytes],
        need: list[int],
        results: list[LookupResult],
        rs: RequestState | None,
        exclude: int,
        protected: list[int],
        prefix: bool,
        hold: bool = True,
    ) -> tuple[bool, list[tuple[int, int]]]:
        """Ask each tier, in order, about the keys nobody above it had; then start promotions.

        Returns whether any tier was asked, and ``(position, tier)`` of blocks a tier has but
        the primary had no room for.
        """
        consulted = False
        found: dict[int, list[int]] = {}  # tier -> positions in ks it will promote
        pending = need
        for ti, tier in enumerate(self.tiers):
            if not pending or ti == exclude:
                continue
            ask = (
                [i for i in pending if not self._skip(ti, ks[i])]
                if self._may_skip(ti)
                else pending
            )
            if not ask:
                continue
            consulted = True
            try:
                async with asyncio.timeout(self.promotion_timeout):
                    answers = await tier.lookup_many([ks[i] for i in ask])
                if len(answers) != len(ask):
                    raise TieringError(
                        f"tier {tier.name!r} answered {len(answers)} lookups for {len(ask)} keys"
                    )
            except Exception:
                self._stats.tier_errors[(tier.name, "lookup")] += 1
                answers = [_MISS] * len(ask)
            settled: set[int] = set()
            hits: list[int] = []
            retries = 0
            for i, a in zip(ask, answers, strict=True):
                if a is _HIT:
                    hits.append(i)
                    settled.add(i)
                elif a is _RETRY:
                    retries += 1
                    results[i] = _RETRY
                    settled.add(i)
            lookups = self._stats.lookups
            for outcome, n in (
                ("hit", len(hits)),
                ("retry", retries),
                ("miss", len(ask) - len(settled)),
            ):
                if n:
                    lookups[(tier.name, outcome)] += n
            if hits:
                found[ti] = hits
            pending = [i for i in pending if i not in settled] if settled else pending
        if self._closed:
            return consulted, []
        if prefix and pending:
            # keys after the first key that no tier has cannot extend the prefix
            first_miss = pending[0]
            found = {ti: [i for i in pos if i < first_miss] for ti, pos in found.items()}
        unplaced: list[tuple[int, int]] = []
        for ti in sorted(found):
            for i in self._start_promotion(ti, ks, found[ti], results, rs, protected, hold):
                unplaced.append((i, ti))
        return consulted, unplaced

    def _hint(self, ti: int, k: bytes) -> bool | None:
        """The tier's ``contains_hint``, never raising (a fault is counted and means unknown)."""
        if k in self._stale[ti]:
            return None
        try:
            return self.tiers[ti].contains_hint(k)
        except Exception:
            self._stats.tier_errors[(self.tiers[ti].name, "hint")] += 1
            return None

    def _may_skip(self, ti: int) -> bool:
        """False when no key can be skipped for tier ``ti`` (the common case: one check per
        batch instead of one per key)."""
        return bool(self._removing[ti] or self._stale[ti] or self._backoff)

    def _skip(self, ti: int, k: bytes) -> bool:
        """True while ``k`` must not be read from tier ``ti``: backing off, being removed, or
        possibly stale there."""
        if self._removing[ti][k] or k in self._stale[ti]:
            return True
        until = self._backoff.get((ti, k))
        if until is None:
            return False
        if _now() < until:
            return True
        del self._backoff[(ti, k)]
        return False

    def _start_promotion(
        self,
        ti: int,
        ks: list[bytes],
        positions: list[int],
        results: list[LookupResult],
        rs: RequestState | None,
        protected: list[int],
        hold: bool = True,
    ) -> list[int]:
        """Reserve slots synchronously for keys found in tier ``ti`` and start one read task.

        ``hold`` pins each promoted block for the caller (``rs``, or until the next step for
        anonymous lookups); ``get`` passes False since it copies the bytes out at once.

        Returns the positions that got no slot (they answer MISS, counted as allocation
        failures of the promotion phase).
        """
        keys: list[bytes] = []
        taken: set[bytes] = set()
        where: list[int] = []
        now = _now()
        index = self._index
        demoting = self._demoting
        may_skip = self._may_skip(ti)
        for i in positions:
            k = ks[i]
            if may_skip and self._skip(ti, k):
                # a put or delete queued a remove while we awaited the tier: its answer is stale
                results[i] = _MISS
                continue
            if k in index or k in taken or k in demoting:
                # a concurrent lookup got there while this one awaited the tiers
                answer = self._primary_answer(k, rs, now, protected, hold)
                results[i] = answer if answer is not None else _MISS
                continue
            keys.append(k)
            taken.add(k)
            where.append(i)
        budget = max(self.max_inflight_promotions - self._promoting, 0)
        unplaced = where[budget:]
        keys = keys[:budget]
        where = where[:budget]
        got = self._table.allocate(keys, PROMOTING, protected) if keys else None
        while keys and got is None:
            # not room for all: promote the longest leading run that fits
            unplaced.insert(0, where.pop())
            keys.pop()
            got = self._table.allocate(keys, PROMOTING, protected) if keys else None
        for i in unplaced:
            results[i] = _MISS
        self._stats.alloc_failures["promotion"] += len(unplaced)
        if got is None:
            return unplaced
        slots, evicted = got
        self._evicted(evicted)
        for k, slot, i in zip(keys, slots, where, strict=True):
            self._table.pin(slot)  # the read's own pin: the slot stays reserved until it ends
            self._inflight[k] = _Inflight(slot, ti)
            if hold:
                self._hold(rs, k, slot)
            results[i] = _RETRY
            protected.append(slot)
        self._promoting += len(keys)
        task = asyncio.get_running_loop().create_task(self._promote(ti, keys, slots, _now()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return unplaced

    async def _promote(self, ti: int, keys: list[bytes], slots: list[int], started: float) -> None:
        """Read ``keys`` from tier ``ti`` straight into their reserved slots."""
        tier = self.tiers[ti]
        views = [self._arena.slot_view(s) for s in slots]
        read = asyncio.ensure_future(tier.read_many_into(keys, views))
        read.add_done_callback(_consume)
        outcome = "ok"
        results: list[int | Exception] = []
        try:
            done, _ = await asyncio.wait({read}, timeout=self.promotion_timeout)
            if not done:
                outcome = "timeout"
            elif read.exception() is not None:
                outcome = "error"
            else:
                results = read.result()
                if len(results) != len(keys):
                    outcome = "error"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            if not read.done():
                read.cancel()
            self._stats.promotion_durations.append((tier.name, _now() - started))
            failed: list[int] = []
            ok = 0
            ok_bytes = 0
            for n, (k, slot) in enumerate(zip(keys, slots, strict=True)):
                result = results[n] if outcome == "ok" else None
                if isinstance(result, int) and result >= 0:
                    if self._promoted(ti, k, slot, result):
                        ok += 1
                        ok_bytes += result
                    continue
                rec = self._inflight.get(k)
                if rec is None or rec.slot != slot:
                    # superseded by a put or delete meanwhile: whatever the read did is moot
                    self._stats.promotions[(tier.name, "cancelled")] += 1
                    failed.append(slot)
                    continue
                # -1 (the tier lost the block meanwhile) is a failed promotion, not a tier fault
                if outcome in ("error", "timeout") or isinstance(result, Exception):
                    self._stats.tier_errors[(tier.name, "read")] += 1
                self._stats.promotions[(tier.name, "error" if outcome == "ok" else outcome)] += 1
                self._promotion_failed(ti, k, slot)
                failed.append(slot)
            if ok:
                self._stats.promotions[(tier.name, "ok")] += ok
                self._stats.read_bytes[tier.name] += ok_bytes
            self._promoting -= len(keys)
            if failed:
                if read.done():
                    self._release_read_pins(failed)
                else:
                    # the tier may still write into these slots: keep them until it stops
                    read.add_done_callback(partial(self._release_read_pins, failed))

    def _promoted(self, ti: int, k: bytes, slot: int, length: int) -> bool:
        """Make a promoted block loadable; False if the read turned out moot or too long (the
        caller counts the successes once per batch)."""
        table = self._table
        tier = self.tiers[ti]
        rec = self._inflight.get(k)
        if rec is None or rec.slot != slot:
            # superseded by a put or delete meanwhile: the slot is an orphan, the read is moot
            self._stats.promotions[(tier.name, "cancelled")] += 1
            table.unpin(slot)
            return False
        if length > self._arena.block_size:
            self._stats.tier_errors[(tier.name, "read")] += 1
            self._stats.promotions[(tier.name, "error")] += 1
            self._promotion_failed(ti, k, slot)
            table.unpin(slot)
            return False
        self._arena.lengths[slot] = length
        self._state[slot] = READY
        table.clean[slot] = 1 if ti == 0 else 0
        table.unpin(slot)
        self._settle(k)
        return True

    def _promotion_failed(self, ti: int, k: bytes, slot: int) -> None:
        """Turn the key into a MISS now, and back off from reading it from that tier."""
        rec = self._inflight.get(k)
        if rec is None or rec.slot != slot:
            return
        self._drop_holders(k, slot)
        self._table.detach(slot)  # an orphan until the read's own pin goes
        self._backoff[(ti, k)] = _now() + self.backoff_seconds
        self._settle(k)

    def _drop_holders(self, k: bytes, slot: int) -> None:
        """Release the RETRY pins requests (and anonymous calls) hold on a promoting block."""
        rec = self._inflight.get(k)
        if rec is not None:
            for holder in rec.holders:
                if holder.promo_pins.get(k) == slot:
                    del holder.promo_pins[k]
                    self._table.unpin(slot)
        if self._anon_promo.get(k) == slot:
            del self._anon_promo[k]
            self._table.unpin(slot)

    def _release_read_pins(self, slots: list[int], _done: object = None) -> None:
        for slot in slots:
            if self._table.pins[slot] > 0:
                self._table.unpin(slot)

    def _hold(self, rs: RequestState | None, k: bytes, slot: int) -> None:
        """Pin a promoted block for the request that got RETRY for it, until it loads it."""
        if rs is not None and self._requests.get(rs.req_id) is not rs:
            return  # the request finished while its lookup awaited a tier: it holds nothing
        if rs is None:
            if k not in self._anon_promo:
                self._anon_promo[k] = slot
                self._table.pin(slot)
            return
        if k in rs.promo_pins:
            return
        rs.promo_pins[k] = slot
        self._table.pin(slot)
        rec = self._inflight.get(k)
        if rec is not None:
            rec.holders.append(rs)
        self._pin_expiry.append((self._step + self.pin_steps, rs, k, slot))

    def _drop_promo_pin(self, rs: RequestState, k: bytes) -> None:
        slot = rs.promo_pins.pop(k, None)
        if slot is not None:
            self._table.unpin(slot)

    def _defer(self, rs: RequestState | None, keys: list[bytes], now: float) -> None:
        """Arm the async delay: per request at its first RETRY, per anonymous call until settled."""
        if rs is not None:
            rs.defer(now)
            return
        tracked = [k for k in keys if self._track(k) is not None]
        if tracked:
            d = _Deferral(now, len(tracked))
            for k in tracked:
                rec = self._inflight[k]
                rec.deferrals.append(d)

    def _track(self, k: bytes) -> _Inflight | None:
        """The in-flight record of ``k`` (created for a pending store), or None if settled."""
        rec = self._inflight.get(k)
        if rec is not None:
            return rec
        slot = self._index.get(k)
        if (
            slot is not None
            and self._state[slot] == PENDING
            and _now() < self._store_deadline.get(slot, 0.0)
        ):
            rec = self._inflight[k] = _Inflight(slot, -1)
            return rec
        return None

    def _settle(self, k: bytes) -> None:
        rec = self._inflight.pop(k, None)
        if rec is None:
            return
        for fut in rec.waiters:
            if not fut.done():
                fut.set_result(None)
        if rec.deferrals:
            now = _now()
            for d in rec.deferrals:
                d.remaining -= 1
                if d.remaining == 0:
                    self._stats.async_delays.append(now - d.start)

    def _readmit(self, k: bytes, data: bytes, protected: Sequence[int] = ()) -> bool:
        """Put bytes that are on their way down back into the primary, if there is room."""
        got = self._table.allocate([k], READY, protected)
        if got is None:
            self._stats.alloc_failures["promotion"] += 1
            return False
        (slot,), evicted = got
        self._evicted(evicted)
        self._arena.write(slot, data)
        return True

    async def wait(
        self, keys: Sequence[bytes | str], *, timeout: float | None = None
    ) -> list[LookupResult]:
        """Await until none of ``keys`` is in flight; return their settled HIT or MISS.

        Starts nothing. Raises ``TimeoutError`` when ``timeout`` passes first.
        """
        ks = normalize_keys(keys)
        if timeout is not None:
            _positive("timeout", timeout, allow_zero=True)
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        for k in ks:
            while True:
                rec = self._track(k)
                if rec is None:
                    break
                limit = self.promotion_timeout
                if rec.tier < 0:
                    limit = max(0.0, self._store_deadline.get(rec.slot, 0.0) - _now())
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        raise TimeoutError(f"block {k[:64]!r} still in flight after {timeout}s")
                    limit = min(limit, left)
                fut: asyncio.Future[None] = loop.create_future()
                rec.waiters.append(fut)
                try:
                    await asyncio.wait_for(fut, limit)
                except TimeoutError:
                    if rec.tier < 0 and self._inflight.get(k) is rec:
                        self._settle(k)  # the store's RETRY window is over: it answers MISS
                finally:
                    with contextlib.suppress(ValueError):
                        rec.waiters.remove(fut)
                if self._closed:
                    break
        return [self._settled_answer(k) for k in ks]

    def _settled_answer(self, k: bytes) -> LookupResult:
        slot = self._index.get(k)
        return _HIT if slot is not None and self._state[slot] == READY else _MISS

    # ------------------------------------------------------------------ loads

    def prepare_load(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None
    ) -> LoadSpec:
        """Pin every key (each must be a HIT) and return read-only views of their bytes."""
        ks = normalize_keys(keys)
        self._check_open()
        slots = []
        for k in ks:
            slot = self._index.get(k)
            if slot is None or self._state[slot] != READY:
                what = "absent" if slot is None else _STATE_NAMES[self._state[slot]]
                raise BlockNotReadyError(
                    f"block {k[:64]!r} is not loadable from the primary tier ({what}); "
                    "nothing was pinned"
                )
            slots.append(slot)
        rs = self._request(req) or self._anon
        for k, slot in zip(ks, slots, strict=True):
            self._table.pin(slot)
            rs.load_pins.setdefault(k, []).append(slot)
        arena = self._arena
        return LoadSpec(tuple(slots), tuple(arena.data_view(s) for s in slots))

    def complete_load(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None
    ) -> None:
        """Unpin blocks loaded with ``prepare_load`` (and the request's promotion pins on them)."""
        ks = normalize_keys(keys)
        rs = self._known_request(req)
        need = Counter(ks)
        for k, n in need.items():
            if len(rs.load_pins.get(k, ())) < n:
                raise ValueError(
                    f"complete_load of block {k[:64]!r} that request "
                    f"{rs.req_id!r} did not prepare_load"
                )
        for k in ks:
            slots = rs.load_pins[k]
            self._table.unpin(slots.pop())
            if not slots:
                del rs.load_pins[k]
            self._drop_promo_pin(rs, k)

    def touch(self, keys: Iterable[bytes | str]) -> None:
        """Mark blocks as recently used."""
        ks = normalize_keys(keys)
        policy = self._table.policy
        for k in ks:
            slot = self._index.get(k)
            if slot is not None:
                policy.touch(slot)

    # ------------------------------------------------------------------ stores

    def prepare_store(
        self, keys: Sequence[bytes | str], req: RequestContext | None = None
    ) -> PrepareStoreOutput | None:
        """Allocate primary blocks for the keys not yet present; None (nothing changed) if full."""
        ks = normalize_keys(keys)
        self._check_open()
        rs = self._request(req) or self._anon
        new: list[bytes] = []
        seen: set[bytes] = set()
        protected: list[int] = []
        for k in ks:
            if k in seen:
                continue
            seen.add(k)
            slot = self._index.get(k)
            if slot is None:
                new.append(k)
            else:
                protected.append(slot)
        self._stats.alloc_sizes.append(len(new))
        got = self._table.allocate(new, PENDING, protected) if new else ([], [])
        if got is None:
            self._stats.alloc_failures["store"] += 1
            return None
        slots, evicted = got
        evicted_keys = self._evicted(evicted)
        deadline = _now() + self.promotion_timeout
        for k, slot in zip(new, slots, strict=True):
            # the storer holds a writable view: the slot stays its own until complete_store,
            # even if a put or delete of the key replaces it meanwhile
            self._table.pin(slot)
            old = rs.stores.get(k)
            if old is not None:  # prepared again after a put/delete replaced the first one
                rs.stale_stores.setdefault(k, []).append(old)
            rs.stores[k] = slot
            self._store_deadline[slot] = deadline
        arena = self._arena
        spec = StoreSpec(tuple(slots), tuple(arena.slot_view(s) for s in slots))
        return PrepareStoreOutput(tuple(new), spec, tuple(evicted_keys))

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
        self._check_open()
        rs = self._known_request(req)
        bs = self._arena.block_size
        if sizes is None:
            lengths = [bs] * len(ks)
        else:
            lengths = list(sizes)
            if len(lengths) != len(ks):
                raise ValueError(f"sizes has {len(lengths)} entries for {len(ks)} keys")
            for k, n in zip(ks, lengths, strict=True):
                if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= bs:
                    raise ValueError(f"size {n!r} of block {k[:64]!r} is not in 0..{bs}")
        if len(set(ks)) != len(ks):
            raise ValueError("complete_store was given the same key twice")
        for k in ks:
            if k not in rs.stores and not rs.stale_stores.get(k):
                raise ValueError(
                    f"complete_store of block {k[:64]!r} that request {rs.req_id!r} "
                    "did not prepare (or already completed)"
                )
        stored: list[bytes] = []
        for k, n in zip(ks, lengths, strict=True):
            stale = rs.stale_stores.get(k)
            if stale:
                # completes the oldest prepare of the key, which a put or delete superseded
                self._table.unpin(stale.pop(0))
                if not stale:
                    del rs.stale_stores[k]
                continue
            slot = rs.stores.pop(k)
            self._store_deadline.pop(slot, None)
            if self._state[slot] != PENDING or self._index.get(k) != slot:
                self._table.unpin(slot)  # replaced or deleted meanwhile: the newer write wins
                continue
            self._table.unpin(slot)
            if success:
                self._arena.lengths[slot] = n
                self._state[slot] = READY
                self._table.policy.touch(slot)
                stored.append(k)
            else:
                self._table.detach(slot)  # freed now, or when a waiting get lets go
            self._settle(k)
        if stored:
            self._events.append(BlockEvent(tuple(stored), self._pname, False))
            for k in stored:
                self._replaced_everywhere(k, self._index[k])

    async def put(self, key: bytes | str, data: bytes | bytearray | memoryview) -> bool:
        """Store ``data`` in the primary, replacing the key everywhere; False when no room."""
        k = normalize_key(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"data must be bytes-like, got {type(data).__name__}")
        try:
            data = memoryview(data).cast("B")  # any item size or shape, as its raw bytes
        except TypeError:
            raise TypeError(f"data for block {k[:64]!r} must be C-contiguous") from None
        n = data.nbytes
        bs = self._arena.block_size
        if n > bs:
            raise ValueError(f"data for block {k[:64]!r} is {n} bytes, block_size is {bs}")
        self._check_open()
        slot = self._index.get(k)
        if slot is not None and self._state[slot] == READY and self._table.pins[slot] == 0:
            self._arena.write(slot, data)  # in place: no new block requested
            self._table.policy.touch(slot)
        else:
            self._stats.alloc_sizes.append(1)
            got = self._table.allocate([k], READY) if slot is None else self._replace_slot(k, slot)
            if got is None:
                self._stats.alloc_failures["store"] += 1
                return False
            (slot,), evicted = got
            self._evicted(evicted)  # copies the victims' bytes out before the slot is reused
            self._arena.write(slot, data)
        self._events.append(BlockEvent((k,), self._pname, False))
        self._replaced_everywhere(k, slot)
        return True

    def _replace_slot(
        self, k: bytes, old: int
    ) -> tuple[list[int], list[tuple[bytes, int, int]]] | None:
        """A fresh slot for ``k`` whose current slot is pinned, pending or promoting.

        The new slot takes over the index entry; the old one is forgotten only once the
        allocation succeeded, so a full arena changes nothing.
        """
        got = self._table.allocate([k], READY, (old,))
        if got is not None:
            self._forget(k, old)
        return got

    def _forget(self, k: bytes, slot: int) -> None:
        """Drop the primary's block for ``k``: in-flight readers and loaders keep their pins."""
        st = self._state[slot]
        if st == PROMOTING:
            self._drop_holders(k, slot)
        elif st == PENDING:
            self._store_deadline.pop(slot, None)
        self._table.detach(slot)
        self._settle(k)

    def _replaced_everywhere(self, k: bytes, slot: int) -> None:
        """After a new version of ``k`` lands in the primary, no tier may serve an older one."""
        for ti in range(len(self.tiers)):
            self._backoff.pop((ti, k), None)
        self._demoting.pop(k, None)
        if self.write_policy == "write_through" and self.tiers:
            data = self._arena.read(slot)
            # on its way down until every tier has it: lookups find these bytes, never an
            # older copy a tier still holds while its write is queued
            queued = [self._enqueue(ti, _Op(_WRITE, k, data, demotion=True))
                      for ti in range(len(self.tiers))]  # fmt: skip
            if any(queued):
                self._demoting[k] = data
            self._table.clean[slot] = 1
            return
        if self.immutable_keys:
            # the same bytes as any copy below: keep those copies (other engines sharing a
            # tier may be reading them), and skip the write-back if the first tier has one
            held = bool(self.tiers) and not self._writing[0][k] and self._hint(0, k) is True
            self._table.clean[slot] = 1 if held else 0
            return
        self._table.clean[slot] = 0
        for ti in range(len(self.tiers)):
            if self._writing[ti][k] or self._hint(ti, k) is not False:
                self._enqueue(ti, _Op(_REMOVE, k))

    async def get(self, key: bytes | str, req: RequestContext | None = None) -> bytes | None:
        """The block's bytes: from the primary, or promoted from a tier and awaited; else None.

        ``get`` counts as its own anonymous request for the metrics; it pins a block only while
        it waits for it and copies it out.
        """
        k = normalize_key(key)
        self._check_open()
        _check_req(req)  # a get is observed as its own anonymous request: no state kept
        data = self._copy_ready(k)
        if data is not None:
            self._stats.primary_hit += 1
            return data
        data = self._demoting.get(k)
        if data is not None:
            self._stats.primary_hit += 1
            self._readmit(k, data)
            return data
        deferred: float | None = None
        sync: float | None = None
        try:
            for _attempt in range(2):  # a second look if the block moved down while promoting
                rec = self._track(k)
                if rec is None:
                    self._stats.primary_miss += 1
                    started = _now()
                    consulted, unplaced = await self._consult_tiers(
                        [k], [0], [_MISS], None, -1, [], False, False
                    )
                    if consulted:
                        sync = (sync or 0.0) + _now() - started
                    if unplaced:
                        return await self._read_around(k, unplaced[0][1])
                    rec = self._inflight.get(k)
                    if rec is None:  # nothing in flight: a concurrent call may have landed it
                        return self._copy_ready(k) or self._demoting.get(k)
                else:
                    self._stats.primary_retry += 1
                if deferred is None:
                    deferred = _now()
                data = await self._await_block(k, rec.slot)
                if data is not None or self._closed:
                    return data
            return None
        finally:
            # one request's worth of observations per get, however many looks it took
            if sync is not None:
                self._stats.sync_delays.append(sync)
            if deferred is not None:
                self._stats.async_delays.append(_now() - deferred)
            self._maybe_flush()

    async def _await_block(self, k: bytes, slot: int) -> bytes | None:
        """Wait for the block in flight in ``slot`` and copy it out (pinned meanwhile)."""
        self._table.pin(slot)  # not evicted between landing and being copied out
        try:
            with contextlib.suppress(TimeoutError):
                await self.wait([k], timeout=self.promotion_timeout + 1.0)
            if self._state[slot] == READY and self._table.keys[slot] == k:
                return self._arena.read(slot)
            # replaced by a put meanwhile (the newer bytes), or pushed down while promoting
            return self._copy_ready(k) or self._demoting.get(k)
        finally:
            if not self._closed:  # aclose dropped every pin already
                self._table.unpin(slot)

    def _copy_ready(self, k: bytes) -> bytes | None:
        """The bytes of ``k`` if it is loadable from the primary (marking it recently used)."""
        slot = self._index.get(k)
        if slot is None or self._state[slot] != READY:
            return None
        self._table.policy.touch(slot)
        return self._arena.read(slot)

    async def _read_around(self, k: bytes, ti: int) -> bytes | None:
        """A block tier ``ti`` has but the primary has no room for: read it privately.

        If it moved down meanwhile, it is on its way (``_demoting``) or in a tier below.
        """
        buf = bytearray(self._arena.block_size)
        for tj in range(ti, len(self.tiers)):
            if tj > ti:
                data = self._demoting.get(k)
                if data is not None:
                    return data
                if self._skip(tj, k):
                    continue
            tier = self.tiers[tj]
            try:
                async with asyncio.timeout(self.promotion_timeout):
                    n = await tier.read_into(k, memoryview(buf))
            except Exception:
                self._stats.tier_errors[(tier.name, "read")] += 1
                return None
            if n >= 0:
                self._stats.read_bytes[tier.name] += n
                return bytes(buf[:n])
        return self._demoting.get(k)

    async def delete(self, key: bytes | str) -> bool:
        """Remove the block from every tier; True if any tier had it."""
        k = normalize_key(key)
        self._check_open()
        present = False
        slot = self._index.get(k)
        if slot is not None:
            present = self._state[slot] in (READY, PROMOTING)
            self._forget(k, slot)
            self._events.append(BlockEvent((k,), self._pname, True))
        if self._demoting.pop(k, None) is not None:
            present = True
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[bool]] = []
        for ti in range(len(self.tiers)):
            self._backoff.pop((ti, k), None)
            fut: asyncio.Future[bool] = loop.create_future()
            self._enqueue(ti, _Op(_REMOVE, k, done=fut))
            waits.append(fut)
        if waits:
            done, _ = await asyncio.wait(waits, timeout=self.io_timeout * 2)
            present = present or any(f.result() for f in done if not f.cancelled())
        return present

    # ------------------------------------------------------------------ demotion and writers

    def _evicted(self, evicted: list[tuple[bytes, int, int]]) -> list[bytes]:
        """Account primary evictions; copy the bytes out for write-back before slots are reused."""
        if not evicted:
            return []
        keys = [k for k, _, _ in evicted]
        self._stats.evictions[self._pname] += len(evicted)
        self._events.append(BlockEvent(tuple(keys), self._pname, True))
        if self.write_policy == "write_back" and self.tiers:
            for k, slot, clean in evicted:
                if clean and not self._removing[0][k] and self._hint(0, k) is not False:
                    continue
                data = self._arena.read(slot)
                if self._enqueue(0, _Op(_WRITE, k, data, demotion=True)):
                    self._demoting[k] = data
        return keys

    def _enqueue(self, ti: int, op: _Op) -> bool:
        """Queue a tier mutation; a demotion past the byte bound is dropped (and counted)."""
        if op.kind == _WRITE:
            assert op.data is not None
            size = len(op.data)
            if op.demotion and self._queued_bytes + size > self._max_queued_bytes:
                self._stats.tier_errors[(self.tiers[ti].name, "write")] += 1
                self._stale[ti].add(op.key)  # the tier may keep an older copy: never read it
                return False
            self._queued_bytes += size
            self._writing[ti][op.key] += 1
        else:
            self._removing[ti][op.key] += 1
        self._queues[ti].append(op)
        if self._queue_wakeups:
            self._queue_wakeups[ti].set()
        return True

    def _dequeued(self, ti: int, op: _Op) -> None:
        """Bookkeeping once a queued operation was applied (or dropped)."""
        counter = self._writing[ti] if op.kind == _WRITE else self._removing[ti]
        counter[op.key] -= 1
        if counter[op.key] <= 0:
            del counter[op.key]
        if op.kind == _WRITE:
            self._queued_bytes -= len(op.data or b"")
            if (
                op.demotion
                and self._demoting.get(op.key) is op.data
                and not any(w[op.key] for w in self._writing)
            ):
                del self._demoting[op.key]  # below now, in every tier it was going to

    async def _writer(self, ti: int) -> None:
        """Apply tier ``ti``'s queued writes and removes in order, batching neighbours."""
        q = self._queues[ti]
        wakeup = self._queue_wakeups[ti]
        while True:
            if not q:
                wakeup.clear()
                await wakeup.wait()
                continue
            kind = q[0].kind
            batch: list[_Op] = []
            while q and q[0].kind == kind and len(batch) < _BATCH:
                batch.append(q.popleft())
            try:
                if kind == _WRITE:
                    await self._apply_writes(ti, batch)
                else:
                    await self._apply_removes(ti, batch)
            finally:
                for op in batch:
                    self._dequeued(ti, op)

    async def _batch(self, tier: SecondaryTier, call: Awaitable[list[_T]], n: int) -> list[_T]:
        """One batched tier call within ``io_timeout``; a fault becomes ``n`` per-key errors."""
        try:
            async with asyncio.timeout(self.io_timeout):
                answers = await call
            if len(answers) != n:
                raise TieringError(f"tier {tier.name!r} answered {len(answers)} of {n}")
            return answers
        except Exception as exc:
            return [cast(_T, exc)] * n

    async def _apply_writes(self, ti: int, batch: list[_Op]) -> None:
        tier = self.tiers[ti]
        items = [(op.key, op.data or b"") for op in batch]
        errors = await self._batch(tier, tier.write_many(items), len(items))
        written: list[bytes] = []
        stale = self._stale[ti]
        for op, err in zip(batch, errors, strict=True):
            if err is None:
                self._stats.write_bytes[tier.name] += len(op.data or b"")
                written.append(op.key)
                stale.discard(op.key)
            else:
                self._stats.tier_errors[(tier.name, "write")] += 1
                stale.add(op.key)  # an older copy may still be there
        if written:
            self._events.append(BlockEvent(tuple(written), tier.name, False))
        if tier.handover_evicted:
            handed = tier.take_evicted()
            below = self.write_policy == "write_back" and ti + 1 < len(self.tiers)
            for k, data in handed if below else ():
                if self._removing[ti][k] or k in self._stale[ti]:
                    continue  # deleted, replaced or possibly stale since written here
                if self._enqueue(ti + 1, _Op(_WRITE, k, data, demotion=True)):
                    self._demoting[k] = data
            if handed:
                self._events.append(BlockEvent(tuple(k for k, _ in handed), tier.name, True))
        elif tier.report_evicted:
            gone = tier.take_evicted_keys()
            if gone:
                self._events.append(BlockEvent(tuple(gone), tier.name, True))

    async def _apply_removes(self, ti: int, batch: list[_Op]) -> None:
        tier = self.tiers[ti]
        keys = [op.key for op in batch]
        answers = await self._batch(tier, tier.remove_many(keys), len(keys))
        stale = self._stale[ti]
        removed: list[bytes] = []
        for op, answer in zip(batch, answers, strict=True):
            if isinstance(answer, Exception):
                self._stats.tier_errors[(tier.name, "remove")] += 1
                stale.add(op.key)  # the copy meant to go may still be there
            else:
                stale.discard(op.key)
                if answer:
                    removed.append(op.key)
            if op.done is not None and not op.done.done():
                op.done.set_result(answer is True)
        if removed:
            self._events.append(BlockEvent(tuple(removed), tier.name, True))

    def _write_down_primary(self) -> None:
        """At close (write_back): queue the primary's blocks for the first persistent tier.

        Blocks that tier already holds are skipped: a put or store of a key removes its older
        copies everywhere, so a copy below is always the same bytes.
        """
        ti = next((i for i, t in enumerate(self.tiers) if t.persistent), 0)
        table = self._table
        for k, slot in list(self._index.items()):
            if self._state[slot] != READY:
                continue
            hint = self._hint(ti, k)
            held = hint or (ti == 0 and table.clean[slot] and hint is None)
            if held and not self._removing[ti][k]:  # a queued remove will take that copy away
                continue
            self._enqueue(ti, _Op(_WRITE, k, self._arena.read(slot)))

    async def _drain_queues(self, timeout: float, *, discard: bool) -> None:
        """Await every queued write and remove; past ``timeout`` drop them (and count them)
        when ``discard``, else raise ``TimeoutError`` leaving them queued."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pause = 0.0005
        while any(self._queues) or any(self._writing) or any(self._removing):
            if loop.time() >= deadline:
                if not discard:
                    queued = sum(len(q) for q in self._queues)
                    raise TimeoutError(f"{queued} tier operations still queued after {timeout}s")
                for ti, q in enumerate(self._queues):
                    while q:
                        op = q.popleft()
                        op_name = "write" if op.kind == _WRITE else "remove"
                        self._stats.tier_errors[(self.tiers[ti].name, op_name)] += 1
                        if op.done is not None and not op.done.done():
                            op.done.set_result(False)
                        self._dequeued(ti, op)
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.01)

    async def flush(self, timeout: float | None = None) -> None:
        """Await until every queued write and remove has reached its tier.

        Raises ``TimeoutError`` (nothing is dropped) when ``timeout`` passes first.
        """
        self._check_open()
        await self._drain_queues(
            timeout if timeout is not None else self.io_timeout * 2, discard=False
        )

    # ------------------------------------------------------------------ step boundary

    def take_events(self) -> list[BlockEvent]:
        """Stored and removed events since the last call."""
        out = list(self._events)
        self._events.clear()
        return out

    def end_step(
        self, *, new_req_ids: Iterable[str] = (), finished_req_ids: Iterable[str] = ()
    ) -> None:
        """The schedule-step boundary: observe delays, release expired pins, export metrics."""
        new = _str_ids("new_req_ids", new_req_ids)
        finished = _str_ids("finished_req_ids", finished_req_ids)
        now = _now()
        for rid in new:
            rs = self._requests.get(rid)
            if rs is not None:
                self._observe(rs, now)
                if not rs.holds_anything():
                    del self._requests[rid]
        for rid in finished:
            rs = self._requests.pop(rid, None)
            if rs is not None:
                self._observe(rs, now)
                self._release_request(rs)
        self._step += 1
        expiry = self._pin_expiry
        while expiry and expiry[0][0] <= self._step:
            _, rs, k, slot = expiry.popleft()
            if rs.promo_pins.get(k) == slot:
                self._drop_promo_pin(rs, k)
        for slot in self._anon_promo.values():
            self._table.unpin(slot)
        self._anon_promo.clear()
        if self._store_deadline:
            for k, rec in list(self._inflight.items()):
                if rec.tier < 0 and now >= self._store_deadline.get(rec.slot, 0.0):
                    self._settle(k)
        if len(self._backoff) > 4096:
            t = _now()
            self._backoff = {k: u for k, u in self._backoff.items() if u > t}
        self._flush_metrics()

    def _observe(self, rs: RequestState, now: float) -> None:
        sync, deferred = rs.take_delays(now)
        if sync is not None:
            self._stats.sync_delays.append(sync)
        if deferred is not None:
            self._stats.async_delays.append(deferred)

    def _release_request(self, rs: RequestState) -> None:
        """A finished request lets go of everything it held."""
        for k in list(rs.promo_pins):
            self._drop_promo_pin(rs, k)
        for slots in rs.load_pins.values():
            for slot in slots:
                self._table.unpin(slot)
        rs.load_pins.clear()
        for k, slot in rs.stores.items():
            self._store_deadline.pop(slot, None)
            self._table.unpin(slot)  # an orphan (replaced meanwhile) is freed with its last pin
            if self._state[slot] == PENDING and self._index.get(k) == slot:
                self._table.detach(slot)
                self._settle(k)
        rs.stores.clear()
        for slots in rs.stale_stores.values():
            for slot in slots:
                self._table.unpin(slot)
        rs.stale_stores.clear()

    def _flush_metrics(self) -> None:
        stats = self._stats
        self._stats = StepStats()
        for ti, tier in enumerate(self.tiers):
            grown = tier.evictions - self._tier_evictions[ti]
            if grown > 0:
                stats.evictions[tier.name] += grown
            self._tier_evictions[ti] = tier.evictions
        self._totals.merge(stats, self._pname)
        self._telemetry.flush(stats, self._pname)

    def _maybe_flush(self) -> None:
        """Without a scheduler calling end_step, keep the sample buffers bounded."""
        if self._stats.samples() > _MAX_BUFFERED_SAMPLES:
            self._flush_metrics()

    async def _tick(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.end_step()

    # ------------------------------------------------------------------ introspection

    def stats(self) -> EngineStats:
        """A snapshot: per-tier usage, promotions in flight, pinned blocks, counters."""
        self._maybe_flush()
        counters = Counter(self._totals.counters)
        pending = TotalStats()
        pending.merge(self._stats, self._pname)
        counters.update(pending.counters)
        pins = self._table.pins
        # promoting slots carry their read's pin, pending stores their storer's
        pinned = len(pins) - pins.count(0)
        return EngineStats(
            tiers={name: usage for name, usage in self._usages()},
            promotions_in_flight=self._promoting,
            pinned_blocks=pinned,
            pending_writes=sum(len(q) for q in self._queues),
            step=self._step,
            counters=dict(counters),
        )

    def _usages(self) -> list[tuple[str, TierUsage]]:
        out = [(self._pname, self.primary.usage())]
        for t in self.tiers:
            try:
                out.append((t.name, t.usage()))
            except Exception:
                self._stats.tier_errors[(t.name, "usage")] += 1
        return out

    def _usage_by_tier(self) -> list[tuple[str, int]]:
        return [(name, u.bytes_used) for name, u in self._usages()]

    # ------------------------------------------------------------------ helpers

    def _request(self, req: RequestContext | None) -> RequestState | None:
        if req is None:
            return None
        _check_req(req)
        rs = self._requests.get(req.req_id)
        if rs is None:
            rs = self._requests[req.req_id] = RequestState(req.req_id)
        return rs

    def _known_request(self, req: RequestContext | None) -> RequestState:
        """The state of a request that prepared something (an empty one if it never did)."""
        if req is None:
            return self._anon
        _check_req(req)
        return self._requests.get(req.req_id) or RequestState(req.req_id)

    def _tier_index(self, tier: SecondaryTier | str | None) -> int:
        if tier is None:
            return -1
        for i, t in enumerate(self.tiers):
            if t is tier or t.name == tier:
                return i
        raise ValueError(f"exclude_tier {tier!r} is not one of this engine's secondary tiers")


_STATE_NAMES: Final = {0: "free", PENDING: "store pending", PROMOTING: "being promoted",
                       READY: "ready", ORPHAN: "replaced"}  # fmt: skip


def _check_req(req: object) -> None:
    if req is not None and not isinstance(req, RequestContext):
        raise TypeError(f"req must be a RequestContext or None, got {type(req).__name__}")


def _consume(fut: asyncio.Future[Any]) -> None:
    """Mark a background call's exception as seen: the engine counted it already."""
    if not fut.cancelled():
        fut.exception()


def _positive(field: str, value: object, *, allow_zero: bool = False) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{field} must be a number, got {type(value).__name__}")
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        raise ConfigError(f"{field} must be > 0, got {value!r}")


def _str_ids(field: str, ids: Iterable[str]) -> tuple[str, ...]:
    if isinstance(ids, str):
        raise TypeError(f"{field} must be an iterable of request ids, not a single str")
    out = tuple(ids)
    for rid in out:
        if not isinstance(rid, str):
            raise TypeError(f"{field} must hold str request ids, got {type(rid).__name__}")
    return out
