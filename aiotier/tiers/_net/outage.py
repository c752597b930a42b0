"""How a networked tier lives through its server going away: a circuit breaker, a probe task.

The breaker (``_core.breaker``) counts consecutive connectivity failures; once it opens, calls
fail at once with :class:`~aiotier.errors.TierUnavailableError` (the engine counts them as MISSes
or failed writes) instead of each waiting for a dead server, while one background task probes
the server every ``probe_interval`` seconds and closes the circuit when it answers. Every
networked tier (Redis, object stores) shares this class, so the rules exist once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextvars import Context

from ..._core.breaker import CircuitBreaker
from ...errors import TierUnavailableError

__all__ = ["GuardedTier", "ServerGuard"]


class ServerGuard:
    """The breaker and probe of one tier's server.

    ``what`` names the tier in messages (``"redis tier 'redis'"``), ``where`` names the server
    without secrets (called when a message is built), ``probe`` is one cheap request that
    raises unless the server answers; it runs bounded by ``timeout``.
    """

    def __init__(
        self,
        what: str,
        where: Callable[[], str],
        probe: Callable[[], Awaitable[object]],
        *,
        failure_threshold: int,
        probe_interval: float,
        timeout: float,
        log: logging.Logger,
    ) -> None:
        self.what = what
        self._where = where
        self._probe = probe
        self.breaker = CircuitBreaker(failure_threshold)
        self.probe_interval = probe_interval
        self.timeout = timeout
        self._log = log
        self._task: asyncio.Task[None] | None = None
        self.closed = False
        #: Calls that failed for connectivity (timeouts, lost connections, open circuit).
        self.errors = 0

    @property
    def probe_task(self) -> asyncio.Task[None] | None:
        """The running probe, if the circuit is open (tests wait on it)."""
        return self._task

    @property
    def available(self) -> bool:
        """False while the circuit is open (calls fail at once) or the tier is closed."""
        return not self.closed and not self.breaker.is_open

    def check(self, op: str) -> None:
        """Raise :class:`TierUnavailableError` unless ``op`` may go to the server now."""
        if self.closed:
            raise TierUnavailableError(f"{self.what} is closed ({op})")
        if self.breaker.is_open:
            self.errors += 1
            raise TierUnavailableError(
                f"{self.what}: circuit open for {self.breaker.open_for():.3g}s after "
                f"{self.breaker.failures} failed calls to {self._where()}; {op} not attempted"
            )

    def success(self) -> None:
        self.breaker.success()

    def failure(self) -> None:
        """A call failed for connectivity: count it; the failure that opens the circuit starts
        the probe."""
        self.errors += 1
        if self.breaker.failure():
            self._log.warning(
                "%s: circuit opened after %d failures; probing every %.3gs",
                self.what,
                self.breaker.failures,
                self.probe_interval,
            )
            self._start_probe()

    def trip(self) -> None:
        """The server did not answer at start-up: open the circuit now and probe."""
        self.errors += 1
        if self.breaker.trip():
            self._start_probe()

    def _start_probe(self) -> None:
        if self._task is None or self._task.done():
            # a context of its own: it outlives the call that opened the circuit, whose
            # context variables (a write's bookkeeping) must not see its requests
            self._task = asyncio.get_running_loop().create_task(
                self._probe_loop(), name=f"aiotier-probe-{self.what}", context=Context()
            )

    async def _probe_loop(self) -> None:
        """Probe until the server answers, then close the circuit."""
        while self.breaker.is_open and not self.closed:
            await asyncio.sleep(self.probe_interval)
            try:
                async with asyncio.timeout(self.timeout):
                    await self._probe()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # still down: try again later
                self._log.debug("%s: probe failed: %s", self.what, exc)
                continue
            self._log.warning(
                "%s: server answers again after %.3gs; circuit closed",
                self.what,
                self.breaker.open_for(),
            )
            self.breaker.success()

    async def aclose(self) -> None:
        """Stop the probe; calls fail from now on until :meth:`reopen`."""
        self.closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def reopen(self) -> None:
        self.closed = False


class GuardedTier:
    """What a tier with a :class:`ServerGuard` in ``_guard`` tells about its server."""

    _guard: ServerGuard

    @property
    def available(self) -> bool:
        """False while the circuit is open (calls fail at once) or the tier is closed."""
        return self._guard.available

    @property
    def errors(self) -> int:
        """Calls that failed for connectivity (timeouts, lost connections, open circuit)."""
        return self._guard.errors

    def counters(self) -> dict[str, int]:
        return {"connectivity_errors": self._guard.errors}
