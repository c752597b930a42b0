"""Argument checks shared by the public entry points: each names the argument and the value."""

from __future__ import annotations

from collections.abc import Iterable

from ._types import RequestContext
from .errors import ConfigError

__all__ = [
    "check_bool",
    "check_int",
    "check_positive",
    "check_req",
    "check_str",
    "check_ttl",
    "str_ids",
    "value_data",
]


def check_positive(field: str, value: object, *, allow_zero: bool = False) -> float:
    """A number > 0 (or >= 0): ``TypeError`` for a non-number, ``ConfigError`` out of range."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{field} must be a number, got {type(value).__name__} {value!r}")
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        raise ConfigError(f"{field} must be > 0, got {value!r}")
    return float(value)


def check_ttl(value: object, field: str = "ttl") -> float | None:
    """A TTL: None (none) or a finite number of seconds > 0; ``TypeError`` / ``ValueError``
    (``ConfigError``) naming ``field`` otherwise."""
    if value is None:
        return None
    ttl = check_positive(field, value)
    if ttl == float("inf"):
        raise ConfigError(f"{field} must be a finite number of seconds, got {value!r}")
    return ttl


def check_int(field: str, value: object, *, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{field} must be an int >= {minimum}, got {value!r}")
    return value


def check_bool(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{field} must be a bool, got {value!r}")
    return value


def check_str(field: str, value: object, *, what: str = "a non-empty str") -> str:
    """A non-empty ``str``; ``what`` says what was expected (e.g. "a redis:// URL")."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{field} must be {what}, got {value!r}")
    return value


def check_req(req: object) -> None:
    if req is not None and not isinstance(req, RequestContext):
        raise TypeError(f"req must be a RequestContext or None, got {type(req).__name__}")


def str_ids(field: str, ids: Iterable[str]) -> tuple[str, ...]:
    if isinstance(ids, str):
        raise TypeError(f"{field} must be an iterable of request ids, not a single str")
    out = tuple(ids)
    for rid in out:
        if not isinstance(rid, str):
            raise TypeError(f"{field} must hold str request ids, got {type(rid).__name__}")
    return out


def value_data(key: bytes, data: object) -> memoryview:
    """``data`` for ``key`` as its raw bytes (any item size or shape): ``TypeError`` for what
    is not bytes-like or not C-contiguous."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"data must be bytes-like, got {type(data).__name__}")
    try:
        return memoryview(data).cast("B")
    except TypeError:
        raise TypeError(f"data for block {key[:64]!r} must be C-contiguous") from None
