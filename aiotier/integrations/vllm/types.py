"""Stand-ins for vLLM's offloading types, and :class:`VllmTypes`: which classes the manager answers
with (these, or vLLM's own taken from its module at run time).

The stand-ins have vLLM 0.33's names, fields and members (``vllm/v1/kv_offload/base.py``), so
code and tests run without vLLM. aiotier imports nothing from vLLM: inside vLLM pass
``VllmTypes.from_module(vllm.v1.kv_offload.base)``, and the manager answers with vLLM's classes
(its scheduler compares enum members by identity) and follows that version's contract where
vLLM 0.32 and 0.33 differ.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto
from types import ModuleType
from typing import Any, ClassVar, NamedTuple, NewType, Protocol, TypeVar

from aiotier._types import _BlockSpec

__all__ = [
    "CacheHitSource",
    "LoadStoreSpec",
    "Locality",
    "LookupResult",
    "Medium",
    "OffloadKey",
    "OffloadPolicy",
    "OffloadingConnectorStats",
    "OffloadingEvent",
    "PrepareStoreOutput",
    "PrimaryLoadStoreSpec",
    "ReqContext",
    "RequestOffloadingContext",
    "ScheduleEndContext",
    "TierFilter",
    "TierMatcher",
    "VllmTypes",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
]

_T = TypeVar("_T")

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


class Medium(Enum):
    """Where a tier keeps its blocks."""

    CPU = "CPU"
    STORAGE = "STORAGE"


class Locality(Enum):
    """Whether a tier's storage is this machine's or shared with others."""

    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


class TierMatcher(NamedTuple):
    """Matches tiers by medium and locality (None matches any)."""

    medium: Medium | None = None
    locality: Locality | None = None

    def matches(self, medium: Medium | None, locality: Locality | None) -> bool:
        return (self.medium is None or medium is None or self.medium == medium) and (
            self.locality is None or locality is None or self.locality == locality
        )


@dataclass(frozen=True)
class TierFilter:
    """Which secondary tiers a request may load from (vLLM PR #48123); the primary always."""

    matchers: tuple[TierMatcher, ...] = ()

    ALL: ClassVar[TierFilter]

    def allows(self, medium: Medium | None, locality: Locality | None) -> bool:
        if self is TierFilter.ALL:
            return True
        return any(m.matches(medium, locality) for m in self.matchers)


TierFilter.ALL = TierFilter(matchers=(TierMatcher(),))


@dataclass
class ReqContext:
    """vLLM's per-request context: its id, its transfer parameters, the tiers it may load
    from, and the token position of each of its keys (the head of a prefix comes first)."""

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    kv_hints: Any = None
    load_tier_filter: TierFilter = TierFilter.ALL
    _state: dict[type, Any] = field(default_factory=dict, repr=False, init=False)
    _offload_key_positions: dict[OffloadKey, int] = field(
        default_factory=dict, repr=False, init=False
    )

    def set_state(self, val: Any) -> None:
        self._state[type(val)] = val

    def get_state(self, cls: type[_T]) -> _T | None:
        return self._state.get(cls)

    def set_offload_key_position(self, key: OffloadKey, end_token: int) -> None:
        self._offload_key_positions[key] = end_token

    def get_offload_key_position(self, key: OffloadKey) -> int | None:
        return self._offload_key_positions.get(key)


class LookupResult(Enum):
    """vLLM's answer to ``lookup`` (not aiotier's ``LookupResult``, which has no HIT_PENDING)."""

    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    """In the offloaded medium or on its way there (a store or a promotion in flight)."""
    RETRY = auto()
    """A tier has not answered yet: ask again next step."""


class OffloadPolicy(Enum):
    """Which of a request's chunks vLLM offers to ``prepare_store``."""

    CHUNK_LEVEL = "chunk_level"
    BLOCK_LEVEL = "chunk_level"  # its name before vLLM 0.32 (an alias)
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    """What ``on_new_request`` answers: how the request's chunks should be offloaded."""

    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


class ScheduleEndContext(NamedTuple):
    """What vLLM passes to ``on_schedule_end``: requests scheduled for the first time and
    requests preempted in this step."""

    new_req_ids: Any
    preempted_req_ids: Any = ()


class CacheHitSource(str, Enum):  # noqa: UP042 - as vLLM's
    """Where a hit's KV came from (``get_load_source``)."""

    DEVICE = "device"
    HOST = "host"
    P2P = "p2p"
    DISK = "disk"
    EXTERNAL_UNSPECIFIED = "external_unspecified"


class LoadStoreSpec:
    """vLLM's base class of the metadata a worker needs to move blocks."""


class _MadeOnRead(Protocol):
    """aiotier's ``LoadSpec``/``StoreSpec``: views made when ``buffers`` is first read."""

    @property
    def buffers(self) -> tuple[memoryview, ...]: ...


class PrimaryLoadStoreSpec(LoadStoreSpec, _BlockSpec):
    """Blocks in aiotier's primary arena: slot ids and zero-copy views of their bytes.

    From ``prepare_load`` the views are read-only and hold exactly the stored bytes; from
    ``prepare_store`` they are writable and ``block_size`` bytes long. The views live in the
    scheduler's process, and are made when ``buffers`` is first read (a worker that addresses
    slots by id never pays for them): a worker in the same process copies through them.
    Pickled (to a worker process) a spec keeps its ``block_ids`` alone (``buffers`` is empty
    there): the worker reaches the slots through :class:`~aiotier.SharedArena`. Read-only, and
    equal to a spec of the same class with the same ids and views.
    """

    __slots__ = ()
    #: vLLM's ``LoadStoreSpec`` when this class also derives from it (``VllmTypes.from_module``)
    _vllm_base: ClassVar[type | None] = None

    def __init__(
        self, block_ids: tuple[int, ...], buffers: tuple[memoryview, ...] | _MadeOnRead
    ) -> None:
        _BlockSpec.__init__(self, tuple(block_ids), buffers)  # type: ignore[arg-type]

    @property
    def buffers(self) -> tuple[memoryview, ...]:
        views: tuple[memoryview, ...] | _MadeOnRead = self._views  # type: ignore[assignment]
        return views if isinstance(views, tuple) else views.buffers

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
    """Blocks stored into (``removed=False``) or removed from (``removed=True``) a medium.

    ``ownership`` names the secondary tier the event is about (None: the primary);
    ``metadata_only`` marks a failed store's slot given back, not an eviction vLLM announces.
    """

    keys: list[OffloadKey]
    medium: Any
    removed: bool
    locality: Any = None
    ownership: str | None = None
    removal_expected: bool = False
    metadata_only: bool = False


class OffloadingConnectorStats:
    """vLLM's stats payload (``OffloadingConnectorStats``): counters, gauges and histogram
    samples by metric name and label values, the shape ``get_stats`` answers with."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.data: dict[str, Any] = data or {"types": {}, "data": {}, "info": None}

    def _put(self, name: str, kind: str, labelvalues: tuple[str, ...]) -> dict[Any, Any]:
        self.data["types"].setdefault(name, kind)
        values: dict[Any, Any] = self.data["data"].setdefault(name, {})
        return values

    def increase_counter(
        self, name: str, value: float = 1, labelvalues: tuple[str, ...] = ()
    ) -> None:
        values = self._put(name, "counter", labelvalues)
        values[labelvalues] = values.get(labelvalues, 0) + value

    def set_gauge(self, name: str, value: float, labelvalues: tuple[str, ...] = ()) -> None:
        self._put(name, "gauge", labelvalues)[labelvalues] = value

    def observe_histogram(self, name: str, value: float, labelvalues: tuple[str, ...] = ()) -> None:
        self._put(name, "histogram", labelvalues).setdefault(labelvalues, []).append(value)

    def is_empty(self) -> bool:
        return not self.data["data"] and self.data.get("info") is None

    def reduce(self) -> dict[str, float]:
        """Counters and gauges as they are, histograms as ``_count`` and ``_sum`` (vLLM's)."""
        out: dict[str, float] = {}
        for name, by_labels in self.data["data"].items():
            for labels, value in by_labels.items():
                key = f"{name}:{labels}" if labels else name
                if self.data["types"][name] == "histogram":
                    out[f"{key}_count"] = len(value)
                    out[f"{key}_sum"] = sum(value)
                else:
                    out[key] = value
        return out


_STATS_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics"


@dataclass(frozen=True, slots=True)
class VllmTypes:
    """The classes the manager answers with, and the contract version it follows.

    The defaults are this module's stand-ins and vLLM 0.33's contract.
    ``VllmTypes.from_module(vllm.v1.kv_offload.base)`` takes vLLM's classes from the module you
    pass and reads from them which contract that vLLM has: ``reset_fence`` (0.33: the scheduler
    calls ``on_reset_flushed`` once its workers reported every job of a reset) and
    ``failed_store_events`` (0.33: a failed store's slot is announced as a ``metadata_only``
    removal). ``secondary_medium`` is every secondary tier's event medium; None gives each the
    medium of its kind (``CPU`` for a memory tier, ``STORAGE`` for the others).
    """

    lookup_result: Any = LookupResult
    prepare_store_output: Callable[..., Any] = PrepareStoreOutput
    offloading_event: Callable[..., Any] = OffloadingEvent
    request_offloading_context: Callable[[], Any] = RequestOffloadingContext
    load_store_spec: Callable[[tuple[int, ...], tuple[memoryview, ...]], Any] = PrimaryLoadStoreSpec
    connector_stats: Callable[[], Any] = OffloadingConnectorStats
    medium: Any = Medium
    locality: Any = Locality
    cache_hit_source: Any = CacheHitSource
    primary_medium: Any = Medium.CPU
    secondary_medium: Any = None
    reset_fence: bool = True
    failed_store_events: bool = True
    event_fields: frozenset[str] = frozenset(f.name for f in dataclasses.fields(OffloadingEvent))

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
        event = base.OffloadingEvent
        fields = (
            frozenset(f.name for f in dataclasses.fields(event))
            if dataclasses.is_dataclass(event)
            else frozenset({"keys", "medium", "removed"})
        )
        manager = getattr(base, "OffloadingManager", None)
        return cls(
            lookup_result=result,
            prepare_store_output=base.PrepareStoreOutput,
            offloading_event=event,
            request_offloading_context=base.RequestOffloadingContext,
            load_store_spec=spec,
            connector_stats=_stats_class(base),
            medium=medium if medium is not None else Medium,
            locality=getattr(base, "Locality", Locality),
            cache_hit_source=getattr(base, "CacheHitSource", CacheHitSource),
            primary_medium=medium.CPU if medium is not None else "CPU",
            reset_fence=manager is not None and hasattr(manager, "on_reset_flushed"),
            failed_store_events="metadata_only" in fields,
            event_fields=fields,
        )

    def event(self, **kwargs: Any) -> Any:
        """An ``OffloadingEvent`` with the fields this vLLM has (the others are left out)."""
        return self.offloading_event(**{k: v for k, v in kwargs.items() if k in self.event_fields})


def _stats_class(base: ModuleType | Any) -> Callable[[], Any]:
    """vLLM's ``OffloadingConnectorStats``, beside the base module it came with (the stand-in
    for a module that is not vLLM's)."""
    stats = getattr(base, "OffloadingConnectorStats", None)
    if stats is not None:
        return stats  # type: ignore[no-any-return]
    if str(getattr(base, "__name__", "")).startswith("vllm."):
        try:
            return importlib.import_module(_STATS_MODULE).OffloadingConnectorStats  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            pass
    return OffloadingConnectorStats
