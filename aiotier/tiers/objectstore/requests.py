"""How an object tier sends its requests: a slot, a deadline, retries, the breaker told.

Rules:

- At most ``max_concurrency`` requests of one tier are in flight at any time.
- Each call of the tier has one deadline, ``timeout`` from its start, shared by the requests of
  a batch; waiting for a slot and every retry count against it. A request that has no slot or
  no answer by then is given up, the breaker counts it, and the call fails with
  :class:`~aiotier.errors.TierUnavailableError`.
- The kinds of failure are :mod:`.client`'s. A 5xx or throttling answer
  (:class:`ServerBusy`) is retried; the server answered, so the breaker is not told. A lost
  connection (:class:`Unreachable`) is counted by the breaker and retried. Any other 4xx
  (:class:`Refused`) is not retried: :class:`~aiotier.errors.TieringError`.
- Before a retry the call waits a random time up to ``min(retry_cap, retry_base *
  2**attempt)`` (full jitter). It fails instead when that wait would not end before the
  deadline, or once the circuit is open or the tier closed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ...errors import TieringError, TierUnavailableError
from .._net.outage import ServerGuard
from .client import Refused, ServerBusy, Unreachable

__all__ = ["ObjectRequests", "RequestingTier"]

_T = TypeVar("_T")


class ObjectRequests:
    """The slots, retry policy and counts of one tier's requests.

    ``what`` names the tier in messages (``"object tier 'object'"``), ``where`` names the
    server (called when a message is built); ``guard`` is the tier's breaker and probe.
    """

    __slots__ = (
        "_guard", "_slots", "_where", "inflight", "max_inflight", "requests", "retries",
        "retry_base", "retry_cap", "timeout", "what",
    )  # fmt: skip

    def __init__(
        self,
        what: str,
        where: Callable[[], str],
        guard: ServerGuard,
        *,
        max_concurrency: int,
        timeout: float,
        retry_base: float,
        retry_cap: float,
    ) -> None:
        self.what = what
        self._where = where
        self._guard = guard
        self._slots = asyncio.Semaphore(max_concurrency)
        self.timeout = timeout
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        # the counts the tier tells (RequestingTier)
        self.requests = 0
        self.retries = 0
        self.inflight = 0
        self.max_inflight = 0

    def deadline(self) -> float:
        """The deadline of a call that starts now, on the running loop's clock."""
        return asyncio.get_running_loop().time() + self.timeout

    async def send(self, op: str, request: Callable[[], Awaitable[_T]], deadline: float) -> _T:
        """``request()`` with a slot, before ``deadline``; 5xx and throttling answers (and lost
        connections, while the circuit stays closed) are retried after a jittered back-off
        that ends before the deadline."""
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            self._guard.check(op)
            try:
                async with asyncio.timeout_at(deadline), self._slots:
                    self.requests += 1
                    self.inflight += 1
                    self.max_inflight = max(self.max_inflight, self.inflight)
                    try:
                        result = await request()
                    finally:
                        self.inflight -= 1
            except ServerBusy as exc:
                last: TieringError = exc  # answered: the breaker is not involved
            except Unreachable as exc:
                self._guard.failure()
                last = exc
            except TimeoutError as exc:
                self._guard.failure()
                raise TierUnavailableError(
                    f"{self.what}: {op} timed out after {self.timeout}s ({self._where()})"
                ) from exc
            except Refused as exc:
                raise TieringError(f"{self.what}: {op}: {exc}") from exc
            else:
                self._guard.success()
                return result
            # Full jitter: a random sleep up to an exponentially growing cap.
            delay = random.uniform(0, min(self.retry_cap, self.retry_base * 2**attempt))
            if loop.time() + delay >= deadline or not self._guard.available:
                raise TierUnavailableError(
                    f"{self.what}: {op} failed after {attempt + 1} attempt(s) "
                    f"({self._where()}): {last}"
                ) from last
            attempt += 1
            self.retries += 1
            await asyncio.sleep(delay)

    @staticmethod
    async def each(items: Sequence[_T], one: Callable[[_T], Awaitable[Any]]) -> list[Any]:
        """``one(item)`` for every item at once (the slots bound what reaches the server); a
        failure is returned in place of its result. Returns after every call has finished."""
        if len(items) == 1:
            try:
                return [await one(items[0])]
            except Exception as exc:
                return [exc]
        return list(await asyncio.gather(*(one(i) for i in items), return_exceptions=True))


class RequestingTier:
    """What a tier with :class:`ObjectRequests` in ``_requests`` tells about its requests."""

    _requests: ObjectRequests

    @property
    def requests(self) -> int:
        """Requests sent to the server (retries included)."""
        return self._requests.requests

    @property
    def retries(self) -> int:
        """Requests sent again after a 5xx, a throttling answer or a lost connection."""
        return self._requests.retries

    @property
    def inflight(self) -> int:
        """Requests in flight now."""
        return self._requests.inflight

    @property
    def max_inflight(self) -> int:
        """The most requests ever in flight at once (never above ``max_concurrency``)."""
        return self._requests.max_inflight
