"""Public value types: keys, lookup answers, request identity, load/store specs, events."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

__all__ = [
    "MAX_KEY_BYTES",
    "BlockEvent",
    "Buffer",
    "LoadSpec",
    "LookupResult",
    "PrepareStoreOutput",
    "RequestContext",
    "StoreSpec",
    "normalize_key",
    "normalize_keys",
]

MAX_KEY_BYTES = 1024

#: Bytes of a block as they move between the engine and the tiers.
Buffer: TypeAlias = bytes | bytearray | memoryview
_BYTES = frozenset({bytes})
_ONE_KEY = (str, bytes)


class _Views(Protocol):
    """Views made on first use (:class:`aiotier._core.views.ViewBatch`)."""

    def buffers(self) -> tuple[memoryview, ...]: ...


class LookupResult(enum.Enum):
    """The answer to "is this block here?"."""

    HIT = "hit"
    """In the primary tier, ready to load now."""
    MISS = "miss"
    """In no tier (or not reachable in time)."""
    RETRY = "retry"
    """On its way: ask again at the next step, or ``await engine.wait(keys)``."""


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Identifies the request on whose behalf a call is made (pins and delays are per request)."""

    req_id: str

    def __post_init__(self) -> None:
        if not isinstance(self.req_id, str):
            raise TypeError(f"RequestContext.req_id must be str, got {type(self.req_id).__name__}")


class _BlockSpec:
    """Slot ids and views of them; the views are made when ``buffers`` is first read (a
    caller that addresses blocks by id never pays for them). Both are read-only, as the
    fields of a frozen dataclass would be."""

    __slots__ = ("_ids", "_views")

    def __init__(
        self, block_ids: tuple[int, ...], buffers: tuple[memoryview, ...] | _Views
    ) -> None:
        self._ids = block_ids
        self._views = buffers

    @property
    def block_ids(self) -> tuple[int, ...]:
        return self._ids

    @property
    def buffers(self) -> tuple[memoryview, ...]:
        views = self._views
        return views if isinstance(views, tuple) else views.buffers()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, _BlockSpec)
        return self._ids == other._ids and self.buffers == other.buffers

    def __hash__(self) -> int:
        return hash((self._ids, self.buffers))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(block_ids={self._ids!r}, buffers={self.buffers!r})"


class LoadSpec(_BlockSpec):
    """Where loadable blocks live: slot ids and read-only views of exactly their stored bytes."""

    __slots__ = ()


class StoreSpec(_BlockSpec):
    """Where to write blocks being stored: slot ids and writable views of ``block_size`` bytes."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class PrepareStoreOutput:
    """What ``prepare_store`` allocated, and which blocks it evicted to make room."""

    keys_to_store: tuple[bytes, ...]
    store_spec: StoreSpec
    evicted_keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class BlockEvent:
    """Blocks stored into (``removed=False``) or removed from (``removed=True``) a tier."""

    keys: tuple[bytes, ...]
    tier: str
    removed: bool


def normalize_key(key: object) -> bytes:
    """Return the canonical ``bytes`` form of a key (a ``str`` is its UTF-8 bytes)."""
    if type(key) is bytes:
        k = key
    elif isinstance(key, str):
        k = key.encode("utf-8", "surrogatepass")
    elif isinstance(key, bytes):
        k = bytes(key)
    else:
        raise TypeError(f"block key must be bytes or str, got {type(key).__name__}")
    if len(k) > MAX_KEY_BYTES:
        raise ValueError(f"block key is {len(k)} bytes, more than the {MAX_KEY_BYTES}-byte limit")
    return k


def normalize_keys(keys: Iterable[object]) -> list[bytes]:
    """Normalise every key, or raise before anything is done with any of them."""
    cls = keys.__class__
    if cls is list or cls is tuple:
        seq: Sequence[bytes] = keys  # type: ignore[assignment]  # (a cast costs a call)
        if _BYTES.issuperset(map(type, seq)) and (not seq or max(map(len, seq)) <= MAX_KEY_BYTES):
            return list(seq)  # every key is a short bytes (checked in C): nothing to convert
    elif isinstance(keys, _ONE_KEY):
        raise TypeError("keys must be an iterable of keys, not a single str or bytes key")
    limit = MAX_KEY_BYTES
    return [
        k if k.__class__ is bytes and len(k) <= limit else normalize_key(k)
        for k in keys
    ]
