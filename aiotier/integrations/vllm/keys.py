"""vLLM's block keys and request contexts as aiotier's keys and requests."""

from __future__ import annotations

import functools
from collections.abc import Iterable

from aiotier import RequestContext

__all__ = ["req_id", "request", "tier_keys", "to_tier_key"]

_BYTES = frozenset({bytes})


def to_tier_key(key: object) -> bytes:
    """The aiotier key of a vLLM block key: the same bytes (bytes-like keys are copied)."""
    if type(key) is bytes:
        return key
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise TypeError(
        f"vLLM block keys are bytes (an OffloadKey or a BlockHash), got {type(key).__name__}"
    )


def tier_keys(keys: Iterable[object]) -> list[bytes]:
    """A collection of vLLM block keys as aiotier keys."""
    if isinstance(keys, bytes | bytearray | memoryview | str):
        raise TypeError("keys must be a collection of block keys, not a single key")
    ks = keys if type(keys) is list else list(keys)
    if _BYTES.issuperset(map(type, ks)):  # one C-level pass
        return ks  # type: ignore[return-value]  # all bytes (typing.cast is a call)
    return [to_tier_key(k) for k in ks]


def req_id(req_context: object) -> str:
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


def request(rid: str) -> RequestContext | None:
    """aiotier's request for a vLLM request id (None: an anonymous call)."""
    return _context(rid) if rid else None


#: The contexts of the requests called about lately: equal contexts are interchangeable, and a
#: request's calls come close together.
_context = functools.lru_cache(maxsize=1024)(RequestContext)
