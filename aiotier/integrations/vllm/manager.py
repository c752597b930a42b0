"""vLLM's ``OffloadingManager`` over a :class:`~aiotier.BlockingEngine`, without importing vLLM.

vLLM's offloading connector drives a manager from its scheduler, in plain synchronous Python,
once per request per step. :class:`AiotierOffloadingManager` presents vLLM 0.33's manager
contract (and 0.32's where they differ, read from the vLLM module passed to
:meth:`VllmTypes.from_module`) over aiotier's engine: aiotier's primary arena is the manager's
offloaded medium and its secondary tiers (memory, SSD, Redis, object store) sit below it.

Where the contracts differ (``docs/vllm.md`` says how): aiotier's RETRY is vLLM's HIT_PENDING
for a block on its way into the primary; ``complete_store`` completes what the request's own
``prepare_store`` allocated; a finish waits for the request's transfers, then applies its
recency (:mod:`.recency`); a reset empties the primary alone and cancels what vLLM will never
complete, whose pins go at ``on_reset_flushed``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiotier import BlockEvent, BlockingEngine, LoadSpec, PrimaryTier, SecondaryTier, StoreSpec
from aiotier import LookupResult as TierAnswer

from .held import add_one, remove_one
from .keys import req_id as _req_id
from .keys import request as _request
from .keys import tier_keys as _tier_keys
from .keys import to_tier_key
from .primary_state import InPrimary, promoting_tier, promotions_by_tier, slot_state, slot_states
from .recency import RequestAccess, walk_tail_to_head
from .stats import StatsTaker, tier_labels
from .tier_kinds import TierKinds
from .types import (
    LoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    PrepareStoreOutput,
    PrimaryLoadStoreSpec,
    RequestOffloadingContext,
    VllmTypes,
)

__all__ = ["CONFIG_INFO_KEYS", "AiotierOffloadingManager", "VllmTypes", "to_tier_key"]

#: The labels of the series :meth:`AiotierOffloadingManager.config_info` fills (one per tier):
#: what an offloading spec's ``config_info_keys`` declares.
CONFIG_INFO_KEYS = ("tier", "kind", "num_blocks", "block_size", "capacity_bytes", "policy")


@dataclass(slots=True)
class _Request:
    """One request's loads and stores prepared and not completed yet, and what it used."""

    loads: dict[bytes, int] = field(default_factory=dict)  # key -> loads prepared (held.py)
    stores: dict[bytes, int] = field(default_factory=dict)  # keys its prepare_store allocated
    access: RequestAccess = field(default_factory=RequestAccess)
    sources: dict[bytes, str] = field(default_factory=dict)  # key -> tier it is promoted from
    position: Callable[[bytes], int | None] | None = None
    finished: bool = False

    def idle(self) -> bool:
        return not self.loads and not self.stores


# ---------------------------------------------------------------------------------------------
# The manager


class AiotierOffloadingManager:
    """vLLM's ``OffloadingManager`` interface over a :class:`~aiotier.BlockingEngine`.

    Every method takes vLLM's arguments (``req_context`` may be vLLM's ``ReqContext`` or the
    stand-in; ``None`` or an empty ``req_id`` is an anonymous call) and returns vLLM's shapes,
    built from ``types``. Calls that need no I/O (a primary hit, loads, stores, events, the step
    boundary) run in the caller's thread; a lookup that must ask a tier goes to the engine's
    loop. The bookkeeping is locked, so several threads may call, each request from one thread
    at a time; :attr:`lock` is for callers that need several calls to be one (vLLM 0.33's
    scheduler holds it across a step).

    ``media`` maps aiotier tier names to the ``medium`` of their events (default: the primary's
    is ``types.primary_medium``, ``Medium.CPU``; a memory tier's ``CPU``, the others'
    ``STORAGE``). ``owns_engine=True`` makes :meth:`shutdown` close the
    engine (:meth:`create` sets it).
    """

    def __init__(
        self,
        engine: BlockingEngine,
        *,
        types: VllmTypes | None = None,
        media: Mapping[str, Any] | None = None,
        enable_events: bool = True,
        owns_engine: bool = False,
    ) -> None:
        if not isinstance(engine, BlockingEngine):
            raise TypeError(f"engine must be a BlockingEngine, got {type(engine).__name__}")
        self.engine = engine
        self.types = types = types if types is not None else VllmTypes()
        primary = engine.engine.primary
        tiers = engine.engine.tiers
        self._primary_name = primary.name
        self._tiers = kinds = TierKinds(tiers, types, media or {})
        self._no_tiers = not tiers
        spec_class = types.load_store_spec
        self._lazy_views = isinstance(spec_class, type) and issubclass(
            spec_class, PrimaryLoadStoreSpec
        )
        self._media: dict[str, Any] = {primary.name: types.primary_medium}
        for name, medium in kinds.medium.items():
            self._media[name] = medium if types.secondary_medium is None else types.secondary_medium
        self._media.update(media or {})
        self.enable_events = enable_events
        self.owns_engine = owns_engine
        result = types.lookup_result  # vLLM's enum or the stand-in: typed as the stand-in
        self._miss: LookupResult = result.MISS
        self._hit: LookupResult = result.HIT
        self._hit_pending: LookupResult = result.HIT_PENDING
        self._retry: LookupResult = result.RETRY
        self._lock = threading.Lock()  # the manager's bookkeeping; never held across a call
        self._caller_lock = threading.Lock()  # :attr:`lock`
        self._requests: dict[str, _Request] = {}
        self._storing: dict[bytes, int] = {}  # keys with a store prepared, not completed
        self._finished: list[str] = []  # finished and idle: told to the engine at the next step
        self._events: list[Any] = []  # vLLM's events due before the engine's next ones
        self._allocation_sizes: list[int] = []
        self._promotions_held = False
        self._stats = StatsTaker(tier_labels(primary.name, kinds.names))

    @classmethod
    def create(
        cls,
        primary: PrimaryTier,
        secondary: Iterable[SecondaryTier] = (),
        *,
        types: VllmTypes | None = None,
        media: Mapping[str, Any] | None = None,
        enable_events: bool = True,
        **engine_kwargs: Any,
    ) -> AiotierOffloadingManager:
        """Build a :class:`~aiotier.BlockingEngine` from the engine's arguments and a manager
        that owns it (:meth:`shutdown` closes it)."""
        engine = BlockingEngine(primary, tuple(secondary), **engine_kwargs)
        return cls(engine, types=types, media=media, enable_events=enable_events, owns_engine=True)

    @property
    def lock(self) -> threading.Lock:
        """A lock for callers that need several calls to see one state (vLLM 0.33's scheduler
        holds it from a lookup's HIT to the ``prepare_load`` that pins it). Not reentrant, as
        vLLM's own; the manager's methods never take it, and are safe to call without it."""
        return self._caller_lock

    # -- lookups -------------------------------------------------------------------------------

    def lookup(self, key: OffloadKey | bytes, req_context: Any = None) -> LookupResult:
        """Whether one block is ready to load: HIT, MISS, HIT_PENDING (a store or a promotion
        of it in flight; this lookup may have started the promotion) or RETRY (a tier has not
        answered yet). After a reset, until ``on_reset_flushed``, only the primary is asked."""
        k = to_tier_key(key)
        rid = _req_id(req_context)
        exclude = "" if self._no_tiers else self._excluded(req_context)
        if exclude is None:
            return self._primary_answer(k, rid)
        if self._no_tiers or slot_state(self.engine, k) is InPrimary.READY:
            # a hit, or any answer with no tier to ask: on this thread (nothing to await)
            answer, tier = self.engine.lookup(k, _request(rid), exclude_tier=exclude or None), None
        else:
            answer, tier = self.engine.portal.call(self._lookup_on_loop, k, rid, exclude or None)
        if answer is TierAnswer.HIT:
            return self._hit
        if answer is TierAnswer.MISS:
            return self._miss
        if tier is not None and rid:
            with self._lock:
                self._request_state(rid).sources[k] = tier
        state = slot_state(self.engine, k)
        if state is InPrimary.PROMOTING or state is InPrimary.STORING:
            return self._hit_pending
        if state is InPrimary.READY:
            # its promotion landed meanwhile, or bytes on their way down were put back: either
            # may have evicted a block an earlier lookup of this scan answered HIT, so the
            # scheduler asks again (a HIT then) rather than loading a prefix no longer all there
            return self._hit_pending
        return self._retry

    def get_load_source(self, key: OffloadKey | bytes, req_context: Any = None) -> Any:
        """Where a hit came from: the tier its promotion read (``HOST`` for memory, ``DISK``
        for an SSD, ``EXTERNAL_UNSPECIFIED`` for Redis or an object store), else ``HOST``."""
        k = to_tier_key(key)
        with self._lock:
            state = self._requests.get(_req_id(req_context))
            tier = None if state is None else state.sources.get(k)
        return self._tiers.source[tier] if tier is not None else self.types.cache_hit_source.HOST

    def count_hits(self, keys: Iterable[OffloadKey | bytes], req_context: Any = None) -> int | None:
        """How many leading blocks are ready to load, as vLLM's ``lookup(keys)`` answered
        before PR #46363: a block whose store is in flight ends the count; ``None`` when a block
        before the first miss is being promoted or a tier has not answered (later blocks'
        promotions start in the same call)."""
        ks = _tier_keys(keys)
        rid = _req_id(req_context)
        exclude = self._excluded(req_context)
        if exclude == "":
            n = self.engine.lookup_prefix(ks, _request(rid))
            if n is not None:
                return n
        elif exclude is not None:  # one tier left out: ask key by key
            for k in ks:
                if self.lookup(k, req_context) is not self._hit:
                    break
        n = 0
        for k in ks:
            state = slot_state(self.engine, k)
            if state is InPrimary.READY:
                n += 1
            elif state is InPrimary.STORING:
                return n
            elif state is InPrimary.PROMOTING or exclude == "":
                return None  # on its way, or a tier has not answered
            else:
                return n
        return n

    def _excluded(self, req_context: Any) -> str | None:
        """The tier a lookup leaves out ("" none); None when only the primary may answer (after
        a reset, or a request's tier filter leaves out more than one tier)."""
        if self._promotions_held:
            return None
        return self._tiers.excluded(getattr(req_context, "load_tier_filter", None))

    def _primary_answer(self, k: bytes, rid: str) -> LookupResult:
        state = slot_state(self.engine, k)
        if state is InPrimary.READY:
            if self.engine.lookup(k, _request(rid)) is TierAnswer.HIT:
                return self._hit
            return self._miss
        if state is None:
            return self._miss
        return self._hit_pending

    async def _lookup_on_loop(
        self, k: bytes, rid: str, exclude: str | None
    ) -> tuple[TierAnswer, str | None]:
        """The engine's lookup and, for a RETRY, the tier its promotion reads, taken on the
        loop before that promotion can land (from this thread it may have landed already)."""
        answer = await self.engine.engine.lookup(k, _request(rid), exclude_tier=exclude)
        return answer, promoting_tier(self.engine, k) if answer is TierAnswer.RETRY else None

    # -- loads ---------------------------------------------------------------------------------

    def prepare_load(
        self, keys: Collection[OffloadKey | bytes], req_context: Any = None
    ) -> LoadStoreSpec:
        """Pin the blocks (each must be a HIT; else ``BlockNotReadyError``, nothing pinned) and
        return their slots and read-only views, in the order of ``keys``."""
        ks = _tier_keys(keys)
        rid = _req_id(req_context)
        spec = self.engine.prepare_load(ks, _request(rid))
        with self._lock:
            state = self._request_state(rid, req_context)
            add_one(state.loads, ks)
            if rid:
                state.access.saw(ks, reused=ks)
        return self._spec(spec)

    def touch(self, keys: Collection[OffloadKey | bytes], req_context: Any = None) -> None:
        """Mark the blocks recently used, the first one the most recent (vLLM's policies walk
        them in reverse: the head of a prefix is evicted last); keys not in the primary are
        ignored. vLLM 0.32 and later do not call it: see :meth:`on_request_finished`."""
        self.engine.touch(list(reversed(_tier_keys(keys))))

    def complete_load(self, keys: Collection[OffloadKey | bytes], req_context: Any = None) -> None:
        """Unpin blocks loaded with :meth:`prepare_load` by the same request."""
        ks = _tier_keys(keys)
        rid = _req_id(req_context)
        self.engine.complete_load(ks, _request(rid))
        with self._lock:
            state = self._requests.get(rid)
            if state is not None:
                remove_one(state.loads, ks)
                self._settle(rid, state)

    # -- stores --------------------------------------------------------------------------------

    def prepare_store(
        self, keys: Collection[OffloadKey | bytes], req_context: Any = None
    ) -> PrepareStoreOutput | None:
        """Allocate primary blocks for the keys not present yet (the others are kept from
        eviction); ``None``, with nothing changed, when every block is pinned."""
        ks = _tier_keys(keys)
        rid = _req_id(req_context)
        states = slot_states(self.engine, ks)  # before the store changes them
        out = self.engine.prepare_store(ks, _request(rid))
        absent = states.count(None)
        with self._lock:
            if absent:
                self._allocation_sizes.append(
                    len({k for k, s in zip(ks, states, strict=True) if s is None})
                    if out is None
                    else len(out.keys_to_store)
                )
            state = self._request_state(rid, req_context)
            if rid:
                inserted = () if out is None else out.keys_to_store
                if absent == len(ks):
                    state.access.saw(ks, inserted=inserted)
                else:
                    ready = [k for k, s in zip(ks, states, strict=True) if s is InPrimary.READY]
                    seen = [k for k, s in zip(ks, states, strict=True)
                            if s is None or s is InPrimary.READY]  # fmt: skip
                    state.access.saw(seen, inserted=inserted, reused=ready)
            if out is None:
                self._settle(rid, state)
                return None
            add_one(state.stores, out.keys_to_store)
            add_one(self._storing, out.keys_to_store)
        output: PrepareStoreOutput = self.types.prepare_store_output(
            keys_to_store=list(out.keys_to_store),
            store_spec=self._spec(out.store_spec),
            evicted_keys=list(out.evicted_keys),
        )
        return output

    def complete_store(
        self,
        keys: Collection[OffloadKey | bytes],
        req_context: Any = None,
        success: bool = True,
    ) -> None:
        """Make the blocks this request's :meth:`prepare_store` allocated loadable, or free them
        (``success=False``); keys it did not allocate (present before) are left as they are."""
        ks = _tier_keys(keys)
        rid = _req_id(req_context)
        with self._lock:
            state = self._requests.get(rid)
            mine = [] if state is None else list(filter(state.stores.__contains__,
                                                        dict.fromkeys(ks)))  # fmt: skip
        if not mine:
            return
        freed = (
            [] if success else [k for k in mine if slot_state(self.engine, k) is InPrimary.STORING]
        )
        if freed and self.types.failed_store_events:
            self._hold_engine_events()
        self.engine.complete_store(mine, _request(rid), success=success)
        with self._lock:
            if freed and self.types.failed_store_events and self.enable_events:
                self._events.append(
                    self.types.event(
                        keys=freed,
                        medium=self._media[self._primary_name],
                        removed=True,
                        metadata_only=True,
                    )
                )
            assert state is not None
            remove_one(state.stores, mine)
            remove_one(self._storing, mine)
            self._settle(rid, state)

    # -- request lifecycle and the step boundary ----------------------------------------------

    def on_new_request(self, req_context: Any) -> RequestOffloadingContext:
        """A request is first seen: its chunks are offloaded as they are computed."""
        _req_id(req_context)
        context: RequestOffloadingContext = self.types.request_offloading_context()
        return context

    def on_request_finished(self, req_context: Any) -> None:
        """The request issues no more prepares. Once its last outstanding load or store
        completes, what it used becomes recent (tail to head: the head of its prefix is evicted
        last; what it loaded counts as a further use), and at the next :meth:`on_schedule_end`
        its pins go and its delays are observed."""
        rid = _req_id(req_context)
        if not rid:
            return
        with self._lock:
            self._request_state(rid, req_context).finished = True
            self._settle(rid, self._requests[rid])

    def on_schedule_end(self, context: Any = None) -> None:
        """The end of a scheduler step: aiotier's ``end_step``. Requests scheduled for the first
        time (``context.new_req_ids``) have their lookup delays observed; finished ones let go
        of their pins; the step's metrics go to OpenTelemetry."""
        new = [rid for rid in getattr(context, "new_req_ids", None) or () if rid]
        with self._lock:
            finished, self._finished = self._finished, []
        self.engine.end_step(new_req_ids=new, finished_req_ids=finished)

    def has_pending_work(self) -> bool:
        """True while a finished request waits for the next :meth:`on_schedule_end`.

        Promotions and write-backs are asyncio tasks that progress without scheduler steps.
        """
        with self._lock:
            return bool(self._finished)

    def take_events(self) -> list[OffloadingEvent]:
        """Stored and removed events of every tier since the last call, in order (an eviction
        comes before the store that reuses its slot). A failed store's slot is announced as a
        ``metadata_only`` removal (vLLM 0.33), unless the key was stored again since."""
        self._hold_engine_events()
        with self._lock:
            events, self._events = self._events, []
        out = []
        for ev in events:
            if getattr(ev, "metadata_only", False):
                keys = [k for k in ev.keys if slot_state(self.engine, k) is None]
                if not keys:
                    continue
                ev.keys = keys
            out.append(ev)
        return out

    def reset_cache(self) -> None:
        """vLLM's KV went invalid at once (new weights, sleep): empty the primary, as vLLM's own
        managers do; the secondary tiers keep their blocks. Every load and store prepared before
        is dropped (vLLM never completes them): their pins go at :meth:`on_reset_flushed`
        (vLLM 0.33), at once under vLLM 0.32. Until then blocks are not promoted. The reset
        itself announces no events."""
        self._hold_engine_events()
        with self._lock:
            for rid, state in self._requests.items():
                if state.finished:
                    self._finished.append(rid)
            self._requests.clear()
            self._storing.clear()
        self.engine.clear_primary()
        self.engine.take_events()  # the primary's removals: vLLM resets its own view instead
        if not self.types.reset_fence:
            self.engine.release_cleared()
        else:
            self._promotions_held = bool(self._tiers.names)

    def on_reset_flushed(self) -> None:
        """vLLM's workers reported every job in flight at the last reset: the slots those jobs
        held are released, and promotions start again."""
        self.engine.release_cleared()
        self._promotions_held = False

    def get_stats(self) -> Any:
        """What vLLM's CPU manager reports (cache usage, allocation sizes) and aiotier's tiers'
        figures since the last call, as vLLM's ``OffloadingConnectorStats``
        (:mod:`aiotier.integrations.vllm.stats` names them)."""
        snap = self.engine.stats()
        with self._lock:
            sizes, self._allocation_sizes = self._allocation_sizes, []
            storing = sum(self._storing.values())
        return self._stats.take(
            self.types.connector_stats(),
            snap,
            self.engine.engine.primary.num_blocks,
            storing,
            sizes,
            promotions_by_tier(self.engine),
        )

    def config_info(self) -> list[dict[str, Any]]:
        """One series per tier, the primary first, labelled as :data:`CONFIG_INFO_KEYS` says."""
        engine = self.engine.engine
        primary = engine.primary
        out: list[dict[str, Any]] = [
            {
                "tier": "0:primary",
                "kind": "primary",
                "num_blocks": primary.num_blocks,
                "block_size": primary.block_size,
                "capacity_bytes": primary.num_blocks * primary.block_size,
                "policy": primary.policy_name,
            }
        ]
        for i, tier in enumerate(engine.tiers, 1):
            capacity = tier.usage().capacity_bytes
            out.append(
                {
                    "tier": f"{i}:{tier.name}",
                    "kind": type(tier).__name__,
                    "capacity_bytes": "None" if capacity is None else capacity,
                }
            )
        return out

    def shutdown(self) -> None:
        """Close the engine if this manager owns it (:meth:`create`); otherwise nothing."""
        if self.owns_engine:
            self.engine.close()

    # -- bookkeeping ---------------------------------------------------------------------------

    def _hold_engine_events(self) -> None:
        """Move the engine's events so far into the queue, as vLLM's events, in order."""
        events = self.engine.take_events()
        if not events or not self.enable_events:
            return
        converted = [self._event(ev) for ev in events]
        with self._lock:
            self._events.extend(converted)

    def _event(self, ev: BlockEvent) -> Any:
        if ev.tier == self._primary_name:  # fields every vLLM's event has: no filtering
            medium = self._media[ev.tier]
            event = self.types.offloading_event
            return event(keys=list(ev.keys), medium=medium, removed=ev.removed)
        return self.types.event(
            keys=list(ev.keys),
            medium=self._media.get(ev.tier, ev.tier),
            removed=ev.removed,
            locality=self._tiers.locality.get(ev.tier),
            ownership=ev.tier,
        )

    def _spec(self, spec: LoadSpec | StoreSpec) -> LoadStoreSpec:
        """vLLM's spec of aiotier's: the stand-in's views are made when its ``buffers`` is
        read (vLLM's workers address slots by id and never read them)."""
        make: Any = self.types.load_store_spec
        out: LoadStoreSpec = make(spec.block_ids, spec if self._lazy_views else spec.buffers)
        return out

    def _request_state(self, rid: str, req_context: Any = None) -> _Request:
        """(Under the lock.) The request's record, made at its first prepare."""
        state = self._requests.get(rid)
        if state is None:
            state = self._requests[rid] = _Request()
        if state.position is None and req_context is not None:
            state.position = getattr(req_context, "get_offload_key_position", None)
        return state

    def _settle(self, rid: str, state: _Request) -> None:
        """(Under the lock.) A finished request with nothing outstanding: its recency is applied
        and its finish queued for the next step; an idle anonymous record is forgotten."""
        if not state.idle() or self._requests.get(rid) is not state:
            return
        if state.finished:
            del self._requests[rid]
            walk_tail_to_head(state.access, state.position, self._touch)
            self._finished.append(rid)
        elif not rid:
            del self._requests[rid]

    def _touch(self, keys: Sequence[bytes], first_use: bool) -> None:
        self.engine.touch(keys, first_use=first_use)
