"""The Redis tier's side of :mod:`._late_writes`: which writes count as cut short, and the
lookups that ask a doubted key's checksum.

A write is cut short when it began (past the breaker) and got no answer (a timeout, a lost
connection, a cancellation), and also when redis-py sent it again after a failed attempt: that
first attempt may still be carried out. redis-py retries inside its ``Retry`` object, so the
tier gives it one that notes each failed attempt in a context variable the write sets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any, Final, TypeVar

from ..._types import Buffer
from ...errors import TieringError, TierUnavailableError
from .._net.late_writes import LateWriteGuard
from ..framing import HEADER

__all__ = ["guarded_write", "noting_retry", "refuse_late_copies"]

_T = TypeVar("_T")
#: The tier's call wrapper: ``call(op, fn)`` runs ``fn(client)`` within the tier's timeout.
Call = Callable[[str, Callable[[Any], Awaitable[Any]]], Awaitable[Any]]

#: Where a frame keeps its payload's xxh3-64 (``framing``: bytes 16-23, little-endian), as
#: ``GETRANGE`` bounds.
_CHECKSUM_RANGE: Final = (HEADER.size - 8, HEADER.size - 1)

#: The failed attempts redis-py sent again during the current write, else None.
_RETRIED: ContextVar[list[Exception] | None] = ContextVar("aiotier_redis_retried", default=None)


def noting_retry(retries: int) -> Any:
    """redis-py's ``Retry`` (no back-off) that notes each failed attempt of a write."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    class NotingRetry(Retry):
        async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
            noted = _RETRIED.get()
            if noted is None:
                return await super().call_with_retry(do, fail, *args, **kwargs)

            async def note(error: Exception, *rest: Any) -> Any:
                noted.append(error)
                return await fail(error, *rest)

            return await super().call_with_retry(do, note, *args, **kwargs)

    return NotingRetry(NoBackoff(), retries)


async def guarded_write(
    guard: LateWriteGuard,
    call: Call,
    op: str,
    payloads: Sequence[tuple[bytes, Buffer]],
    fn: Callable[[Any], Awaitable[_T]],
) -> _T:
    """``call(op, fn)`` for a write of ``payloads`` (server key, payload), telling ``guard``
    which of them were cut short."""
    began = False
    retried: list[Exception] = []

    async def run(client: Any) -> _T:
        nonlocal began
        began = True  # past the breaker: from here on it may reach the server
        return await fn(client)

    noting = _RETRIED.set(retried)
    try:
        result: _T = await call(op, run)
    except BaseException as exc:
        # an error reply means nothing was written (unless an earlier attempt was sent);
        # anything else may still land
        answered = isinstance(exc, TieringError) and not isinstance(exc, TierUnavailableError)
        if began and (retried or not answered):
            guard.cut_short(payloads)
        raise
    finally:
        _RETRIED.reset(noting)
    if retried:  # the failed attempt may still land, after a later write
        guard.cut_short(payloads)
    return result


async def refuse_late_copies(
    guard: LateWriteGuard, call: Call, rkeys: Sequence[bytes], flags: list[int]
) -> None:
    """Lookups found these keys (``flags[i]`` true): those whose copy may be a write landed
    late are asked for their payload checksum, in one round trip, and a late copy's flag is
    cleared."""
    if not guard:
        return
    ask = [i for i, found in enumerate(flags) if found and guard.refuses_any(rkeys[i])]
    if not ask:
        return

    async def checksums(client: Any) -> list[bytes]:
        pipe = client.pipeline(transaction=False)
        for i in ask:
            pipe.getrange(rkeys[i], *_CHECKSUM_RANGE)
        return list(await pipe.execute())

    for i, field in zip(ask, await call("lookup", checksums), strict=True):
        if len(field) == 8 and guard.refuses(rkeys[i], int.from_bytes(field, "little")):
            flags[i] = 0
