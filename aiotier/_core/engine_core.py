"""The engine's state machine: every state change of a lookup, load, store or step, and no I/O.

:class:`EngineCore` composes the primary's arena and block table with the protocol state kept in
the modules beside it (requests, pins, in-flight keys, tier coherence, write-back queues,
promotions) and owns every transition of it. It awaits nothing: where a transition needs I/O it
*returns* it (promotion batches to read, write ops queued for the writers) and the async engine
performs it and hands the outcome back. So each rule of the SPEC is enforced in one synchronous
place and can be unit-tested without an event loop.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import repeat
from typing import Final, cast

from .._types import (
    BlockEvent,
    LoadSpec,
    PrepareStoreOutput,
    StoreSpec,
)
from ..errors import BlockNotReadyError
from .admission import AdmissionPolicy
from .answers import Answers
from .arena import Arena
from .coherence import BatchHint, Coherence, Hint
from .copy_policy import CopyPolicy
from .expiry import Expiry
from .gather import gather
from .inflight import InflightTable
from .pins import PinLedger, PromotionShare
from .primary_values import PrimaryValues
from .promotion import Promotions
from .requests import RequestBook, RequestState
from .staging import StagingBuffers
from .stats import CountKey, StepSnapshot, StepStats, TotalStats
from .table import PENDING, PROMOTING, READY, BlockTable, SlotState
from .write_routes import WriteRoutes
from .writeback import WriteQueues, remove

__all__ = ["EngineCore"]

MAX_EVENTS: Final = 65_536
#: Expired primary slots reclaimed per step boundary at most (bounded work per step).
RECLAIM_PER_STEP: Final = 1024


class EngineCore:
    """Blocks in a primary arena over ``len(tier_names)`` secondary tiers, as plain state.

    ``hints`` are the tiers' ``contains_hint`` (called synchronously; they do no I/O), and
    ``batch_hints`` their ``contains_hints`` (by default, ``hints`` key by key);
    ``notify(ti)`` is called when an op is queued for tier ``ti`` whose queue was empty;
    ``clock`` gives seconds; ``wall_clock`` gives unix seconds, for blocks' expiry;
    ``tier_expiry[ti]`` says whether tier ``ti`` honours expiry itself.
    """

    def __init__(
        self,
        arena: Arena,
        table: BlockTable,
        *,
        primary_name: str = "primary",
        tier_names: Sequence[str] = (),
        hints: Sequence[Hint] = (),
        batch_hints: Sequence[BatchHint] = (),
        write_policy: str | Sequence[str] = "write_back",
        immutable_keys: bool = False,
        promotion_timeout: float = 5.0,
        backoff_seconds: float = 1.0,
        pin_steps: int = 16,
        max_inflight_promotions: int = 64,
        max_promotion_share: float = 1.0,
        max_pending_write_bytes: int = 64 << 20,
        stage_demotions: bool = True,
        primary_admission: AdmissionPolicy | None = None,
        tier_admission: Sequence[AdmissionPolicy | None] = (),
        notify: Callable[[int], None] = lambda ti: None,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
        tier_expiry: Sequence[bool] = (),
    ) -> None:
        self.arena = arena
        self.table = table
        self.primary_name = primary_name
        self.tier_names = tuple(tier_names)
        #: where copies go between the tiers (``write_policy``: one for all, or one per tier)
        self.routes = routes = WriteRoutes.of(write_policy, len(self.tier_names))
        self.immutable_keys = immutable_keys
        self.promotion_timeout = promotion_timeout
        self.clock = clock
        self.stats = StepStats(primary_name)
        self.totals = TotalStats()
        self.events: deque[BlockEvent] = deque(maxlen=MAX_EVENTS)
        self.requests = RequestBook()
        share = PromotionShare(
            math.ceil(max_promotion_share * arena.num_blocks), table.state, table.step_holds
        )
        self.pins = PinLedger(table, pin_steps, share)
        self.inflight = InflightTable(self.stats)
        self.coherence = Coherence(
            self.tier_names, hints, self.stats, clock, backoff_seconds, batch_hints
        )
        #: reused buffers for blocks copied out of the arena on their way down; None when the
        #: first tier keeps the bytes it is given (they are then copied into ``bytes``)
        self.staging = (
            StagingBuffers(arena.block_size, max(1, max_pending_write_bytes // arena.block_size))
            if stage_demotions
            else None
        )
        self.writes = WriteQueues(
            self.tier_names,
            self.coherence,
            self.stats,
            self.events,
            max_bytes=max_pending_write_bytes,
            below=routes.below,
            notify=notify,
            admission=tier_admission,
            immutable=immutable_keys,
            staging=self.staging,
        )
        self.primary_admission = primary_admission
        # each policy that counts sightings, once even when it serves several tiers
        seen: dict[int, AdmissionPolicy] = {}
        for policy in (primary_admission, *tier_admission):
            if policy is not None and policy.counts_sightings:
                seen.setdefault(id(policy), policy)
        #: the policies to tell of every sighting (none by default: lookups then skip it)
        self.sightings = tuple(seen.values())
        self.copies = CopyPolicy(
            table,
            arena,
            self.coherence,
            self.writes,
            self.staging,
            self.stats,
            self.events,
            primary_name=primary_name,
            routes=routes,
            immutable_keys=immutable_keys,
        )
        #: what each key answers, and what a caller that got RETRY is owed
        self.answers = Answers(
            table,
            self.inflight,
            self.coherence,
            self.pins,
            self.requests,
            self.copies,
            self.stats,
            clock,
            promotion_timeout,
        )
        self.promotions = Promotions(
            table,
            arena,
            self.pins,
            self.inflight,
            self.coherence,
            self.answers,
            self.copies,
            self.stats,
            clock,
            self.tier_names,
            max_inflight_promotions,
        )
        #: blocks with a TTL: their deadlines in the primary, and what is past them dropped
        self.expiry = Expiry(
            table,
            self.coherence,
            self.stats,
            self.events,
            primary_name=primary_name,
            tier_names=self.tier_names,
            tier_expiry=tier_expiry,
            forget=self.forget,
            remove=lambda ti, k: self.writes.push(ti, remove(k)),
            wall_clock=wall_clock,
        )
        self.promotions.expiry = self.expiry
        #: the cache API's synchronous halves: put, and get's hits
        self.values = PrimaryValues(
            table,
            arena,
            self.copies,
            self.coherence,
            self.expiry,
            self.stats,
            self.events,
            primary_name=primary_name,
            forget=self.forget,
        )
        self._tier_evictions = [0] * len(self.tier_names)
        self._tier_expirations = [0] * len(self.tier_names)

    @property
    def closed(self) -> bool:
        """Set when the engine starts closing: lookups suspended in a tier start no promotion."""
        return self.promotions.closed

    @closed.setter
    def closed(self, value: bool) -> None:
        self.promotions.closed = value

    @property
    def step(self) -> int:
        """Step boundaries passed so far."""
        return self.pins.step

    def settle(self, k: bytes) -> None:
        """``k`` is no longer in flight: its waiters wake, its deferrals count it."""
        self.inflight.settle(k, self.clock())

    # -- sightings ------------------------------------------------------------------------------

    def saw(self, keys: Sequence[bytes]) -> None:
        """One call named each of ``keys`` (for admission policies that count)."""
        for policy in self.sightings:
            policy.saw(keys)

    # -- loads -----------------------------------------------------------------------------------

    def request(self, req_id: str | None) -> RequestState:
        """The state of ``req_id`` (created at its first call), or the anonymous one."""
        return self.requests.anonymous if req_id is None else self.requests.open(req_id)

    def known_request(self, req_id: str | None) -> RequestState:
        """The state of a request that prepared something (an empty one if it never did)."""
        return self.requests.anonymous if req_id is None else self.requests.known(req_id)

    def prepare_load(self, ks: Sequence[bytes], req_id: str | None = None) -> LoadSpec:
        """Pin every key (each must be a HIT) and return read-only views of their bytes;
        ``BlockNotReadyError`` (nothing pinned) names a key that is not."""
        table = self.table
        slots = []
        for k in ks:
            slot = table.index.get(k)
            if slot is None or table.state[slot] != READY:
                what = "absent" if slot is None else _STATE_NAMES[SlotState(table.state[slot])]
                raise BlockNotReadyError(
                    f"block {k[:64]!r} is not loadable from the primary tier ({what}); "
                    "nothing was pinned"
                )
            slots.append(slot)
        rs = self.request(req_id)
        self.pins.pin_loads(rs, ks, slots)
        return LoadSpec(tuple(slots), rs.load_views.hold(ks, partial(self.arena.data_views, slots)))

    def complete_load(self, ks: Sequence[bytes], req_id: str | None = None) -> None:
        rs = self.known_request(req_id)
        self.pins.unpin_loads(rs, ks)
        rs.load_views.release_loaded(ks)

    def touch(self, ks: Iterable[bytes], *, first_use: bool = False) -> None:
        """Mark blocks used, in order (the last one the most recent); ``first_use`` counts each
        as its first use (ARC keeps it among the blocks seen once), not a further one."""
        table = self.table
        slots = [s for s in map(table.index.get, ks) if s is not None]
        if slots:
            (table.refresh_many if first_use else table.touch_many)(slots)

    # -- stores ----------------------------------------------------------------------------------

    def prepare_store(
        self, ks: Sequence[bytes], req_id: str | None = None
    ) -> PrepareStoreOutput | None:
        """Allocate primary blocks for the keys not yet present; None (nothing changed) if full."""
        rs = self.request(req_id)
        distinct = list(dict.fromkeys(ks))
        present = list(map(self.table.index.get, distinct))
        if present.count(None) == len(distinct):  # the common case: every key is new
            new, protected = distinct, []
        else:
            new = [k for k, slot in zip(distinct, present, strict=True) if slot is None]
            protected = [slot for slot in present if slot is not None]
        self.stats.observe("allocation_size", len(new))
        if self.sightings:
            self.saw(distinct)
        if new:
            new = self._admit(new, protected)
        got = self.copies.allocate(new, PENDING, protected) if new else ([], ())
        if got is None:
            self.stats.counts[("allocation_failures", "store")] += 1
            return None
        slots, evicted_keys = got
        self.pins.pin_stores(rs, new, slots)
        self.inflight.store_deadline.update(
            dict.fromkeys(slots, self.clock() + self.promotion_timeout)
        )
        views = rs.store_views.hold(new, partial(self.arena.slot_views, slots))
        return PrepareStoreOutput(tuple(new), StoreSpec(tuple(slots), views), tuple(evicted_keys))

    def _admit(self, new: list[bytes], protected: list[int]) -> list[bytes]:
        """The keys of a ``prepare_store`` the primary's admission policy lets in; each is
        weighed against the block it would evict (in eviction order), or a free slot."""
        name = self.primary_name
        policy = self.primary_admission
        if policy is None:
            self.stats.counts[("admissions", name, "admitted")] += len(new)
            return new
        victims = (
            self.table.eviction_candidates(len(new), protected) if policy.weighs_victims else []
        )
        admitted = policy.admit_into_primary(new, len(self.table.free), victims)
        self.stats.counts[("admissions", name, "admitted")] += len(admitted)
        if len(admitted) < len(new):
            self.stats.counts[("admissions", name, "rejected")] += len(new) - len(admitted)
        return admitted

    def complete_store(
        self,
        ks: Sequence[bytes],
        req_id: str | None = None,
        *,
        success: bool = True,
        sizes: Sequence[int] | None = None,
    ) -> None:
        """Make prepared blocks loadable (``sizes`` gives lengths), or free them on failure."""
        bs = self.arena.block_size
        lengths: list[int] | None = None
        if sizes is not None:
            lengths = list(sizes)
            if len(lengths) != len(ks):
                raise ValueError(f"sizes has {len(lengths)} entries for {len(ks)} keys")
            for k, n in zip(ks, lengths, strict=True):
                if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= bs:
                    raise ValueError(f"size {n!r} of block {k[:64]!r} is not in 0..{bs}")
        rs = self.known_request(req_id)
        taken = self.pins.take_stores(rs, ks)
        rs.store_views.release(ks, latest=False)
        table, index, state = self.table, self.table.index, self.table.state
        store_deadline = self.inflight.store_deadline
        current = cast(list[int], taken)  # when None is not in it
        if (
            success
            and None not in taken
            and gather(state, current).count(PENDING) == len(current)
            and table.owns_all(ks, current)
        ):  # the common case, checked at C speed: every block is the key's pending store
            pop = store_deadline.pop
            for s in current:
                pop(s, None)
            stored = settled = list(ks)
            slots, stored_lengths = current, lengths
            table.stores_landed(current)
        else:
            stored, settled = [], []
            slots, stored_lengths = [], []
            for k, n, slot in zip(ks, lengths or repeat(bs), taken, strict=False):
                if slot is None:
                    continue  # completes an earlier prepare, which a put or delete superseded
                store_deadline.pop(slot, None)
                if state[slot] != PENDING or index.get(k) != slot:
                    continue  # replaced or deleted meanwhile: the newer write wins
                settled.append(k)
                if success:
                    stored.append(k)
                    slots.append(slot)
                    stored_lengths.append(n)
                else:
                    table.detach(slot)
            table.mark_ready_many(slots, clean=False)
        if slots:
            if stored_lengths is None:  # each a whole block
                self.arena.fill_lengths(slots)
            else:
                self.arena.set_lengths(slots, stored_lengths)
            table.refresh_many(slots)  # a first use: ARC keeps them among the blocks seen once
        if settled:
            self.inflight.settle_many(settled, self.clock())
        if stored:
            self.events.append(BlockEvent(tuple(stored), self.primary_name, False))
            self.copies.replaced_everywhere_many(stored, slots)

    # -- deleting and clearing ------------------------------------------------------------------

    def forget(self, k: bytes, slot: int) -> None:
        """Drop the primary's block for ``k``: in-flight readers and loaders keep their pins."""
        st = self.table.state[slot]
        if st == PROMOTING:
            self.promotions.superseded(k, slot)
        elif st == PENDING:
            self.inflight.store_deadline.pop(slot, None)
        self.pins.drop_step_hold(slot)
        self.table.detach(slot)
        self.settle(k)

    def delete(self, k: bytes, done: Sequence[Callable[[bool], None]]) -> bool:
        """Drop ``k`` from the primary and queue its removal from every tier (``done[ti]`` gets
        whether tier ``ti`` had it); True if the primary or a demotion had it."""
        present = False
        slot = self.table.index.get(k)
        if slot is not None:
            present = self.table.state[slot] in (READY, PROMOTING)
            self.forget(k, slot)
            self.events.append(BlockEvent((k,), self.primary_name, True))
        if k in self.coherence.in_transit:
            present = True
        self.coherence.replaced(k)
        for ti, callback in enumerate(done):
            self.writes.push(ti, remove(k, callback))
        return present

    def clear(self, *, secondary: bool = True) -> None:
        """Drop every block of the primary (as :meth:`delete` would: in-flight readers and
        loaders keep their pins, a promotion's bytes are not kept) and cancel every load and
        store handed out (their pins stay until they complete: :meth:`PinLedger.cancel`). With
        ``secondary`` also drop every queued write and remove, and read no tier until its own
        clear reports (:meth:`Coherence.cleared`); without it the tiers keep their blocks and
        their queued writes (copies, not views of the primary's slots)."""
        table = self.table
        removed: list[bytes] = []
        for k, slot in list(table.index.items()):
            if table.state[slot] in (READY, PROMOTING):
                removed.append(k)
            self.forget(k, slot)
        if removed:
            self.events.append(BlockEvent(tuple(removed), self.primary_name, True))
        for rs in (*self.requests.live(), self.requests.anonymous):
            self.pins.cancel(rs)
            rs.load_views.cancel()
            rs.store_views.cancel()
        if not secondary:
            return
        self.writes.drop_all(failed=False)
        self.coherence.in_transit.clear()
        for ti in range(len(self.tier_names)):
            self.coherence.clearing(ti)

    def release_cancelled(self) -> None:
        """Loads and stores a clear cancelled will never complete: their slots are released."""
        for rs in (*self.requests.live(), self.requests.anonymous):
            self.pins.release_cancelled(rs)
            rs.load_views.release_cancelled()
            rs.store_views.release_cancelled()

    # -- the step boundary -----------------------------------------------------------------------

    def end_step(self, new: Iterable[str], finished: Iterable[str]) -> None:
        """Observe delays, release finished requests and expired pins, expire store windows,
        let staging buffers the step did not need go."""
        now = self.clock()
        delays = self.requests.step(new, finished, now)
        observe = self.stats.observe
        for v in delays.sync:
            observe("sync_delay", v)
        for v in delays.deferred:
            observe("async_delay", v)
        for rs in delays.finished:
            self.release_request(rs)
        self.pins.next_step()
        deadlines = self.inflight.store_deadline
        if deadlines:
            keys = self.table.keys
            for slot, deadline in list(deadlines.items()):
                if now >= deadline:
                    del deadlines[slot]
                    k = keys[slot]
                    if k is not None:
                        self.inflight.settle(k, now)
        self.coherence.prune_backoff()
        self.expiry.reclaim(RECLAIM_PER_STEP)
        if self.staging is not None:
            self.staging.trim()

    def release_request(self, rs: RequestState) -> None:
        """A finished request lets go of everything it held; its pending stores are aborted."""
        rs.load_views.release_all()
        rs.store_views.release_all()
        for k, slot in self.pins.release_request(rs):
            self.inflight.store_deadline.pop(slot, None)
            if self.table.state[slot] == PENDING and self.table.owns(k, slot):
                self.table.detach(slot)
                self.settle(k)

    def take_events(self) -> list[BlockEvent]:
        out = list(self.events)
        self.events.clear()
        return out

    def take_step(
        self, tier_evictions: Sequence[int] = (), tier_expirations: Sequence[int] = ()
    ) -> StepSnapshot:
        """Hand this step's metric buffers over (adding each tier's own evictions and
        expirations since the last call, from its monotonic ``usage()`` counts) and add them
        to the totals."""
        for ti, n in enumerate(tier_evictions):
            grown = n - self._tier_evictions[ti]
            if grown > 0:
                self.stats.counts[("evictions", self.tier_names[ti])] += grown
            self._tier_evictions[ti] = n
        for ti, n in enumerate(tier_expirations):
            grown = n - self._tier_expirations[ti]
            if grown > 0:
                self.stats.counts[("expirations", self.tier_names[ti])] += grown
            self._tier_expirations[ti] = n
        snap = self.stats.take()
        self.totals.merge(snap.counts)
        return snap

    def counters(self) -> Counter[CountKey]:
        """Counter totals so far, the current step's included."""
        out = Counter(self.totals.counters)
        out.update(self.stats.peek_counts())
        return out

    def count_tier_evictions_from(
        self, tier_evictions: Sequence[int], tier_expirations: Sequence[int] = ()
    ) -> None:
        """Each tier's ``usage().evictions`` (and ``expirations``) when the engine opened: only
        growth after it counts."""
        self._tier_evictions = list(tier_evictions)
        self._tier_expirations = list(tier_expirations) or [0] * len(self.tier_names)

    # -- closing ---------------------------------------------------------------------------------

    def release_all(self) -> None:
        """The engine is closing (``closed`` is set) and its tasks are cancelled: promotions not
        settled yet count as cancelled, every waiter wakes, every request lets go of its pins."""
        self.promotions.cancel_all()
        for k in self.inflight.waiting_keys():
            self.settle(k)
        for rs in self.requests.finish_all():
            self.release_request(rs)
        self.release_request(self.requests.anonymous)
        self.pins.release_all()


_STATE_NAMES: Final = {
    SlotState.FREE: "free",
    SlotState.PENDING: "store pending",
    SlotState.PROMOTING: "being promoted",
    SlotState.READY: "ready",
    SlotState.ORPHAN: "replaced",
}
