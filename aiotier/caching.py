"""``cached``: an async function's results kept in an engine, through ``get_or_load``.

Values that are not bytes go through a :class:`Codec` the caller chooses; aiotier ships codecs
for bytes, text and JSON and never pickles (unpickling bytes that a shared tier handed back
would run whatever code someone stored there).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from ._validate import check_ttl

if TYPE_CHECKING:
    from .engine import TieringEngine

__all__ = ["BYTES", "JSON", "TEXT", "Codec", "cached"]

_T = TypeVar("_T")
_P = ParamSpec("_P")


@dataclass(frozen=True, slots=True)
class Codec(Generic[_T]):
    """How a cached value becomes bytes and back. ``decode(encode(v))`` must equal ``v``."""

    name: str
    encode: Callable[[_T], bytes]
    decode: Callable[[bytes], _T]


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(
        f"cached: the function returned {type(value).__name__}, not bytes-like: pass a codec "
        "(codec=aiotier.JSON, aiotier.TEXT or a Codec of your own)"
    )


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


#: Bytes-like values as they are (the default).
BYTES: Codec[bytes] = Codec("bytes", _as_bytes, bytes)
#: ``str`` values as UTF-8.
TEXT: Codec[str] = Codec("text", str.encode, bytes.decode)
#: Values JSON can hold (dicts, lists, str, numbers, bools, None), compact UTF-8 JSON.
JSON: Codec[Any] = Codec("json", _json_bytes, json.loads)


def _default_key(fn: Callable[..., object], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``module.qualname:`` and a digest of the arguments as canonical JSON: equal arguments give
    equal keys across processes and restarts (``repr`` and ``hash`` would not)."""
    try:
        canonical = json.dumps([args, kwargs], sort_keys=True, separators=(",", ":"))
    except TypeError as exc:
        raise TypeError(
            f"cached: the arguments of {fn.__qualname__} are not JSON values ({exc}); pass "
            "key=lambda *args, **kwargs: ... to name the cache key yourself"
        ) from None
    digest = hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()
    return f"{fn.__module__}.{fn.__qualname__}:{digest}"


def cached(
    engine: TieringEngine,
    *,
    key: Callable[..., str | bytes] | None = None,
    codec: Codec[Any] = BYTES,
    ttl: float | None = None,
) -> Callable[[Callable[_P, Awaitable[_T]]], Callable[_P, Awaitable[_T]]]:
    """Decorate an async function so its results are kept in ``engine``.

    A call looks its key up with :meth:`~aiotier.TieringEngine.get_or_load`: concurrent calls
    with equal arguments run the function once, a failure reaches every caller waiting on it
    and is not cached. The key is ``key(*args, **kwargs)`` when given, else the function's
    module and name and a digest of its arguments (which must then be JSON values). Results
    go through ``codec`` (default: bytes-like results as they are). ``ttl``: seconds a result
    is served (default: the engine's ``default_ttl``), checked here, when decorating.
    """
    check_ttl(ttl)

    def decorate(fn: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
        @functools.wraps(fn)
        async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
            k = key(*args, **kwargs) if key is not None else _default_key(fn, args, kwargs)

            async def load() -> bytes:
                return codec.encode(await fn(*args, **kwargs))

            value = await engine.get_or_load(k, load, ttl=ttl)
            return codec.decode(value)  # type: ignore[no-any-return]

        return wrapper

    return decorate
