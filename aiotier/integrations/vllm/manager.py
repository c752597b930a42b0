"""vLLM's ``OffloadingManager`` over a :class:`~aiotier.BlockingEngine`, without importing vLLM.

vLLM's offloading connector drives a manager from its scheduler, in plain synchronous Python,
once per request per step. :class:`AiotierOffloadingManager` presents that manager's methods and
return shapes — those of ``vllm/v1/kv_offload/base.py`` (the file that replaced ``abstract.py``)
as they stood at vLLM's tiering-metrics PRs #45958 and #47679 (July 2026) — over aiotier's
engine, so aiotier's primary arena becomes the manager's offloaded medium and its secondary
tiers (memory, SSD, Redis, object store) sit below it.

The module defines stand-ins for vLLM's types, with vLLM's names and field names, so code and
tests run without vLLM: :data:`OffloadKey`, :class:`ReqContext`, :class:`LookupResult`,
:class:`OffloadPolicy`, :class:`RequestOffloadingContext`, :class:`ScheduleEndContext`,
:class:`LoadStoreSpec`, :class:`PrepareStoreOutput`, :class:`OffloadingEvent`. Inside vLLM, pass
``types=VllmTypes.from_module(vllm.v1.kv_offload.base)`` and the manager answers with vLLM's own
classes instead (vLLM's scheduler compares enum members by identity).

Where vLLM's contract and aiotier's differ, the manager bridges them:

- **Keys.** vLLM names a block by an ``OffloadKey`` (``bytes``: a block hash and a 4-byte group
  index). Any bytes-like key is used as the aiotier key as is (``bytearray``/``memoryview`` are
  copied to ``bytes``), so the keys in outputs and events compare equal to the ones vLLM passed.
- **HIT_PENDING.** aiotier answers ``RETRY`` for a pending store and for a promotion alike.
  The manager answers ``HIT_PENDING`` for keys whose store it prepared and for keys already
  answered ``RETRY`` while their promotion is in flight; the lookup that starts a promotion gets
  ``RETRY``, as in vLLM's tiering manager.
- **complete_store.** vLLM passes every key it handed to ``prepare_store``; aiotier accepts only
  the keys that call allocated. The manager remembers, per request, which keys it allocated and
  completes (or with ``success=False`` frees) exactly those.
- **Finishing.** aiotier releases a finished request's pins and aborts its pending stores, but
  vLLM may still deliver ``complete_load``/``complete_store`` after ``on_request_finished``. The
  manager holds the finish back until the request has no load or store outstanding, and passes
  it to the engine at the next ``on_schedule_end`` (which is aiotier's ``end_step``).
"""

from __future__ import annotations

import functools
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, auto
from types import ModuleType
from typing import Any, ClassVar, NamedTuple, NewType, cast

from aiotier import BlockingEngine, PrimaryTier, RequestContext, SecondaryTier
from aiotier import LookupResult as TierAnswer

__all__ = [
    "AiotierOffloadingManager",
    "LoadStoreSpec",
    "LookupResult",
    "OffloadKey",
    "OffloadPolicy",
    "OffloadingEvent",
    "PrepareStoreOutput",
    "PrimaryLoadStoreSpec",
    "ReqContext",
    "RequestOffloadingContext",
    "ScheduleEndContext",
    "VllmTypes",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
    "to_tier_key",
]

# ---------------------------------------------------------------------------------------------
# Stand-ins for vLLM's types (vllm/v1/kv_offload/base.py): the same names and fields.

OffloadKey = NewType("OffloadKey", bytes)
"""vLLM's block key: a block hash followed by its KV-cache group index (4 bytes, big-endian)."""


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """vLLM's ``make_offload_key``: pack a block hash and a group index into one key."""
    return OffloadKey(bytes(block_hash) + group_idx.to_bytes(4, "big", signed=False))


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """The block hash part of an ``OffloadKey``."""
    return key[:-4]


def get_offload_group_idx(key: OffloadKey) -> int:
    """The group index part of an ``OffloadKey``."""
    return int.from_bytes(key[-4:], "big", signed=False)


@dataclass
class ReqContext:
    """vLLM's per-request context; only ``req_id`` matters to aiotier (its ``RequestContext``)."""

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None


class LookupResult(Enum):
    """vLLM's answer to ``lookup`` (not aiotier's ``LookupResult``, which has no HIT_PENDING)."""

    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    """In the offloaded medium, but its write (a store or a promotion) is still in flight."""
    RETRY = auto()
    """Found below (a promotion started) or not known yet: ask again next step."""


class OffloadPolicy(Enum):
    """Which of a request's blocks vLLM offers to ``prepare_store``."""

    BLOCK_LEVEL = "block_level"
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    """What ``on_new_request`` answers: how the request's blocks should be offloaded."""

    policy: OffloadPolicy = OffloadPolicy.BLOCK_LEVEL


class ScheduleEndContext(NamedTuple):
    """What vLLM passes to ``on_schedule_end``: requests scheduled for the first time and
    requests preempted in this step."""

    new_req_ids: Collection[str]
    preempted_req_ids: Collection[str] = ()


class LoadStoreSpec:
    """vLLM's base class of the metadata a worker needs to move blocks."""


@dataclass(frozen=True)
class PrimaryLoadStoreSpec(LoadStoreSpec):
    """Blocks in aiotier's primary arena: slot ids and zero-copy views of their bytes.

    From ``prepare_load`` the views are read-only and hold exactly the stored bytes; from
    ``prepare_store`` they are writable and ``block_size`` bytes long. The views live in the
    scheduler's process: a worker in the same process copies through them. Pickled (to a worker
    process) a spec keeps its ``block_ids`` alone (``buffers`` is empty there): the worker
    reaches the slots through :class:`~aiotier.SharedArena`.
    """

    block_ids: tuple[int, ...]
    buffers: tuple[memoryview, ...]
    #: vLLM's ``LoadStoreSpec`` when this class also derives from it (``VllmTypes.from_module``)
    _vllm_base: ClassVar[type | None] = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuilt_spec, (self._vllm_base, self.block_ids))

    @staticmethod
    def medium() -> str:
        """The medium the blocks are in (vLLM's ``LoadStoreSpec.medium()`` before June 2026)."""
        return "CPU"


@functools.cache
def _spec_class(vllm_spec: type) -> type[PrimaryLoadStoreSpec]:
    """``PrimaryLoadStoreSpec`` that is also a vLLM ``LoadStoreSpec``: one class per base, made
    again the same way in a worker that unpickles a spec."""
    return type(
        "PrimaryLoadStoreSpec", (PrimaryLoadStoreSpec, vllm_spec),
        {"_vllm_base": vllm_spec, "__module__": __name__},
    )  # fmt: skip


def _rebuilt_spec(vllm_spec: type | None, block_ids: tuple[int, ...]) -> PrimaryLoadStoreSpec:
    """A spec unpickled in another process: its slot ids, no views."""
    cls = PrimaryLoadStoreSpec if vllm_spec is None else _spec_class(vllm_spec)
    return cls(block_ids, ())


@dataclass
class PrepareStoreOutput:
    """What ``prepare_store`` allocated, where to write it, and which blocks it evicted."""

    keys_to_store: list[OffloadKey]
    store_spec: LoadStoreSpec
    evicted_keys: list[OffloadKey]


@dataclass
class OffloadingEvent:
    """Blocks stored into (``removed=False``) or removed from (``removed=True``) a medium."""

    keys: list[OffloadKey]
    medium: Any
    removed: bool


@dataclass(frozen=True, slots=True)
class VllmTypes:
    """The classes the manager answers with: these stand-ins by default, or vLLM's own.

    ``VllmTypes.from_module(vllm.v1.kv_offload.base)`` takes vLLM's classes from the module you
    pass (aiotier imports nothing from vLLM). ``secondary_medium`` None names each secondary
    tier's events by the tier's own name.
    """

    lookup_result: Any = LookupResult
    prepare_store_output: Callable[..., Any] = PrepareStoreOutput
    offloading_event: Callable[..., Any] = OffloadingEvent
    request_offloading_context: Callable[[], Any] = RequestOffloadingContext
    load_store_spec: Callable[[tuple[int, ...], tuple[memoryview, ...]], Any] = (
        PrimaryLoadStoreSpec
    )
    primary_medium: Any = "CPU"
    secondary_medium: Any = None

    @classmethod
    def from_module(cls, base: ModuleType | Any) -> VllmTypes:
        """vLLM's classes from its ``vllm.v1.kv_offload.base`` module (or any object with the
        same attributes). Needs vLLM's ``LookupResult`` enum (PR #46363, June 2026, or later).
        """
        result = getattr(base, "LookupResult", None)
        members = getattr(result, "__members__", {})
        if not {"MISS", "HIT", "HIT_PENDING", "RETRY"} <= set(members):
            raise TypeError(
                f"{getattr(base, '__name__', base)!r} has no LookupResult enum with MISS, HIT, "
                "HIT_PENDING and RETRY: the manager presents vLLM's contract from PR #46363 on"
            )
        spec: type = PrimaryLoadStoreSpec
        vllm_spec = getattr(base, "LoadStoreSpec", None)
        if isinstance(vllm_spec, type):  # so isinstance(spec, vllm's LoadStoreSpec) holds
            spec = _spec_class(vllm_spec)
        medium = getattr(base, "Medium", None)  # an enum from July 2026 on, plain str before
        return cls(
            lookup_result=result,
            prepare_store_output=base.PrepareStoreOutput,
            offloading_event=base.OffloadingEvent,
            request_offloading_context=base.RequestOffloadingContext,
            load_store_spec=spec,
            primary_medium=medium.CPU if medium is not None else "CPU",
            secondary_medium=medium.STORAGE if medium is not None else None,
        )


# ---------------------------------------------------------------------------------------------
# Keys and requests


def to_tier_key(key: object) -> bytes:
    """The aiotier key of a vLLM block key: the same bytes (bytes-like keys are copied)."""
    if type(key) is bytes:
        return key
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise TypeError(
        f"vLLM block keys are bytes (an OffloadKey or a BlockHash), got {type(key).__name__}"
    )


def _tier_keys(keys: Iterable[object]) -> list[bytes]:
    if isinstance(keys, bytes | bytearray | memoryview | str):
        raise TypeError("keys must be a collection of block keys, not a single key")
    ks = keys if type(keys) is list else list(keys)
    if all(type(k) is bytes for k in ks):
        return cast(list[bytes], ks)
    return [to_tier_key(k) for k in ks]


def _req_id(req_context: object) -> str:
    """vLLM's request id ("" for none: vLLM's tests use ``ReqContext(req_id="")``)."""
    if req_context is None:
        return ""
    rid = getattr(req_context, "req_id", None)
    if not isinstance(rid, str):
        raise TypeError(
            f"req_context must have a str req_id (vLLM's ReqContext), got "
            f"{type(req_context).__name__}"
        )
    return rid


def _request(rid: str) -> RequestContext | None:
    return RequestContext(rid) if rid else None


@dataclass(slots=True)
class _Outstanding:
    """One request's loads and stores that vLLM has prepared but not completed yet."""

    loads: Counter[bytes] = field(default_factory=Counter)
    stores: Counter[bytes] = field(default_factory=Counter)  # keys its prepare_store allocated
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
    at a time (as vLLM's scheduler does).

    ``media`` maps aiotier tier names to the ``medium`` of their events (default: the primary is
    ``types.primary_medium``, "CPU"). ``owns_engine=True`` makes :meth:`shutdown` close the
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
        self.types = types if types is not None else VllmTypes()
        primary = engine.engine.primary
        self._media: dict[str, Any] = {primary.name: self.types.primary_medium}
        if self.types.secondary_medium is not None:
            for tier in engine.engine.tiers:
                self._media[tier.name] = self.types.secondary_medium
        self._media.update(media or {})
        self.enable_events = enable_events
        self.owns_engine = owns_engine
        result = self.types.lookup_result
        self._miss, self._hit = result.MISS, result.HIT
        self._hit_pending, self._retry = result.HIT_PENDING, result.RETRY
        self._lock = threading.Lock()
        self._requests: dict[str, _Outstanding] = {}
        self._storing: Counter[bytes] = Counter()  # keys with a store prepared, not completed
        # keys answered RETRY whose promotion may still be in flight; at most one per primary
        # slot can be, so the oldest entries beyond that are stale and dropped
        self._promoting: OrderedDict[bytes, None] = OrderedDict()
        self._promoting_cap = primary.num_blocks
        self._finished: list[str] = []  # finished and idle: told to the engine at the next step

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

    # -- lookups -------------------------------------------------------------------------------

    def lookup(self, key: OffloadKey | bytes, req_context: Any = None) -> LookupResult:
        """Whether one block is ready to load: HIT, MISS, HIT_PENDING (on its way into the
        primary) or RETRY (a promotion started now, or a tier has not answered yet)."""
        k = to_tier_key(key)
        answer = self.engine.lookup(k, _request(_req_id(req_context)))
        if answer is not TierAnswer.RETRY:
            if self._promoting:
                with self._lock:
                    self._promoting.pop(k, None)
            return cast(LookupResult, self._hit if answer is TierAnswer.HIT else self._miss)
        with self._lock:
            if k in self._storing or k in self._promoting:
                return cast(LookupResult, self._hit_pending)
            self._promoting[k] = None
            if len(self._promoting) > self._promoting_cap:
                self._promoting.popitem(last=False)
        return cast(LookupResult, self._retry)

    def count_hits(self, keys: Iterable[OffloadKey | bytes], req_context: Any = None) -> int | None:
        """How many leading blocks are ready to load, or ``None`` when one is on its way before
        the first miss: the prefix scan vLLM's scheduler makes from :meth:`lookup`, in one call
        (later blocks' promotions start in the same call)."""
        return self.engine.lookup_prefix(_tier_keys(keys), _request(_req_id(req_context)))

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
            self._outstanding(rid).loads.update(ks)
        return cast(LoadStoreSpec, self.types.load_store_spec(spec.block_ids, spec.buffers))

    def touch(self, keys: Collection[OffloadKey | bytes], req_context: Any = None) -> None:
        """Mark the blocks recently used (keys not in the primary are ignored)."""
        self.engine.touch(_tier_keys(keys))

    def complete_load(self, keys: Collection[OffloadKey | bytes], req_context: Any = None) -> None:
        """Unpin blocks loaded with :meth:`prepare_load` by the same request."""
        ks = _tier_keys(keys)
        rid = _req_id(req_context)
        self.engine.complete_load(ks, _request(rid))
        with self._lock:
            state = self._requests.get(rid)
            if state is not None:
                state.loads.subtract(ks)
                state.loads = +state.loads
                self._settle(rid, state)

    # -- stores --------------------------------------------------------------------------------

    def prepare_store(
        self, keys: Collection[OffloadKey | bytes], req_context: Any = None
    ) -> PrepareStoreOutput | None:
        """Allocate primary blocks for the keys not present yet (the others are kept from
        eviction); ``None``, with nothing changed, when every block is pinned."""
        ks = _tier_keys(keys)
        rid = _req_id(req_context)
        out = self.engine.prepare_store(ks, _request(rid))
        if out is None:
            return None
        with self._lock:
            self._outstanding(rid).stores.update(out.keys_to_store)
            self._storing.update(out.keys_to_store)
            for k in out.evicted_keys:
                self._promoting.pop(k, None)
        spec = self.types.load_store_spec(out.store_spec.block_ids, out.store_spec.buffers)
        return cast(
            PrepareStoreOutput,
            self.types.prepare_store_output(
                keys_to_store=list(out.keys_to_store),
                store_spec=spec,
                evicted_keys=list(out.evicted_keys),
            ),
        )

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
            mine = [k for k in dict.fromkeys(ks) if state is not None and state.stores[k] > 0]
        if mine:
            self.engine.complete_store(mine, _request(rid), success=success)
        if state is None:
            return
        with self._lock:
            state.stores.subtract(mine)
            state.stores = +state.stores
            self._storing.subtract(mine)
            self._storing = +self._storing
            self._settle(rid, state)

    # -- request lifecycle and the step boundary ----------------------------------------------

    def on_new_request(self, req_context: Any) -> RequestOffloadingContext:
        """A request is first seen: its blocks are offloaded as they are computed."""
        _req_id(req_context)
        return cast(RequestOffloadingContext, self.types.request_offloading_context())

    def on_request_finished(self, req_context: Any) -> None:
        """The request issues no more prepares. Its pins and delays are released and observed
        at the next :meth:`on_schedule_end` after its last outstanding load or store completes."""
        rid = _req_id(req_context)
        if not rid:
            return
        with self._lock:
            state = self._requests.get(rid)
            if state is None:
                self._finished.append(rid)
            else:
                state.finished = True
                self._settle(rid, state)

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
        comes before the store that reuses its slot)."""
        events = self.engine.take_events()
        if not self.enable_events:
            return []
        make, media = self.types.offloading_event, self._media
        return [
            make(keys=list(ev.keys), medium=media.get(ev.tier, ev.tier), removed=ev.removed)
            for ev in events
        ]

    def reset_cache(self) -> None:
        """Drop every offloaded block, from every tier (:meth:`TieringEngine.clear`): vLLM
        calls this when cached KV went invalid at once (new weights). Raises when a tier could
        not be cleared; that tier is not read until a later reset succeeds."""
        self.engine.clear()

    def get_stats(self) -> None:
        """None: aiotier exports its metrics through OpenTelemetry at each step boundary
        (``aiotier_lookup_sync_delay_seconds``, ``aiotier_allocation_failures_total``, ...)."""
        return None

    def shutdown(self) -> None:
        """Close the engine if this manager owns it (:meth:`create`); otherwise nothing."""
        if self.owns_engine:
            self.engine.close()

    # -- bookkeeping (under the lock) ----------------------------------------------------------

    def _outstanding(self, rid: str) -> _Outstanding:
        state = self._requests.get(rid)
        if state is None:
            state = self._requests[rid] = _Outstanding()
        return state

    def _settle(self, rid: str, state: _Outstanding) -> None:
        """Forget a request with nothing outstanding; queue its finish if it finished."""
        if state.idle() and self._requests.get(rid) is state:
            del self._requests[rid]
            if state.finished:
                self._finished.append(rid)
