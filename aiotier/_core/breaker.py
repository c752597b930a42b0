"""Circuit breakers as plain state machines: no I/O, no event loop, an injected clock.

Their owner reports each call's outcome and asks whether a call may go through; what to do about
it (fail calls at once, probe the server, log) is the owner's. Two owners exist:

- a networked tier's ``ServerGuard`` (``tiers/_net/outage.py``) opens its breaker until its own
  background probe reaches the server again (no cool-down: ``cooldown=None``);
- the engine keeps one breaker per secondary tier (:class:`TierBreakers`, any tier, a user's
  included): while it is open the engine does not call the tier at all, and after ``cooldown``
  seconds it lets one real call through as the probe (``HALF_OPEN``), whose outcome closes the
  circuit or opens it for another cool-down. A tier that knows its server answers again (its
  own probe closed its own circuit) ends the cool-down at once.

The clock stamps when a circuit opened (so the owner can say how long an outage has lasted) and
when a probe is due; tests pass a fake one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from ..errors import ConfigError

__all__ = ["BreakerPolicy", "CircuitBreaker", "CircuitState", "TierBreakers"]


class CircuitState(Enum):
    """Whether calls go through."""

    CLOSED = "closed"  #: calls go through; consecutive failures are counted
    OPEN = "open"  #: calls fail at once until a success (a probe's) closes the circuit
    HALF_OPEN = "half_open"  #: the cool-down passed and one call, the probe, is on its way


#: The value of the ``aiotier_tier_breaker_state`` gauge for each state: higher is worse.
STATE_LEVEL: dict[CircuitState, int] = {
    CircuitState.CLOSED: 0,
    CircuitState.HALF_OPEN: 1,
    CircuitState.OPEN: 2,
}


class CircuitBreaker:
    """Closed until ``threshold`` consecutive failures, then open.

    Without a ``cooldown`` it stays open until :meth:`success` (its owner probes by itself).
    With one, :meth:`allow` lets one call through once ``cooldown`` seconds have passed since the
    circuit opened or the last probe failed; another is let through if that probe's outcome is
    not reported within a further ``cooldown`` (a probe that was cancelled is not waited for
    forever). ``failure()`` and ``trip()`` return True exactly when they open a closed circuit,
    so the owner starts its probe (or logs) once per outage.
    """

    __slots__ = ("_clock", "_retry_at", "cooldown", "failures", "opened_at", "state", "threshold")

    def __init__(
        self,
        threshold: int,
        *,
        cooldown: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not threshold >= 1:
            raise ValueError(f"threshold must be at least 1, got {threshold!r}")
        if cooldown is not None and not cooldown > 0:
            raise ValueError(f"cooldown must be > 0 seconds, got {cooldown!r}")
        self.threshold = threshold
        self.cooldown = cooldown
        self._clock = clock
        self.state = CircuitState.CLOSED
        #: Consecutive failures since the last success.
        self.failures = 0
        #: The clock's reading when the circuit last opened; None while closed.
        self.opened_at: float | None = None
        self._retry_at = 0.0

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self.state.value} failures={self.failures}/{self.threshold}>"

    @property
    def is_open(self) -> bool:
        """True until the circuit has closed again (also while a probe is on its way)."""
        return self.state is not CircuitState.CLOSED

    def open_for(self) -> float:
        """Seconds since the circuit opened (0.0 while it is closed)."""
        if self.opened_at is None:
            return 0.0
        return self._clock() - self.opened_at

    def allow(self, *, ready: bool = False) -> bool:
        """Whether a call may go through now; past the cool-down this call is the probe.

        ``ready``: the owner knows the far side answers again (a tier whose own probe reached
        its server): the probe need not wait for the rest of the cool-down.
        """
        if self.state is CircuitState.CLOSED:
            return True
        if self.cooldown is None:
            return False
        now = self._clock()
        if now < self._retry_at and not (ready and self.state is CircuitState.OPEN):
            return False
        self.state = CircuitState.HALF_OPEN
        self._retry_at = now + self.cooldown  # the probe's outcome is awaited this long
        return True

    def success(self) -> None:
        """A call went through: close the circuit and forget past failures."""
        self.failures = 0
        self.state = CircuitState.CLOSED
        self.opened_at = None

    def failure(self) -> bool:
        """Count a failed call; True when this one opened the circuit."""
        self.failures += 1
        if self.state is CircuitState.HALF_OPEN:  # the probe failed: another cool-down
            self.state = CircuitState.OPEN
            self._retry_at = self._clock() + (self.cooldown or 0.0)
            return False
        if self.state is CircuitState.CLOSED and self.failures >= self.threshold:
            self.state = CircuitState.OPEN
            self.opened_at = now = self._clock()
            self._retry_at = now + (self.cooldown or 0.0)
            return True
        return False

    def abandon(self) -> None:
        """A call let through ended with no outcome (cancelled): if it was the probe, the next
        call may probe at once."""
        if self.state is CircuitState.HALF_OPEN:
            self.state = CircuitState.OPEN
            self._retry_at = self._clock()

    def trip(self) -> bool:
        """Open the circuit now, whatever the count (a server unreachable at start-up); True if
        it was closed."""
        self.failures = max(self.failures, self.threshold - 1)
        return self.failure()


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When the engine stops calling a secondary tier that keeps failing, and when it tries again.

    After ``failure_threshold`` consecutive failed calls to a tier (raised, timed out, or every
    key of a batch failed for a reason other than the data itself) the engine skips that tier:
    lookups answer MISS there, reads and writes fail at once, all counted as that tier's errors,
    as if the call had failed. After ``cooldown`` seconds one real call goes through as a
    probe; its success closes the circuit. ``clock`` (seconds, monotonic) is for tests.
    """

    failure_threshold: int = 5
    cooldown: float = 1.0
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        n = self.failure_threshold
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"BreakerPolicy.failure_threshold must be an int >= 1, got {n!r}")
        c = self.cooldown
        if isinstance(c, bool) or not isinstance(c, int | float) or not c > 0:
            raise ConfigError(f"BreakerPolicy.cooldown must be > 0 seconds, got {c!r}")
        if not callable(self.clock):
            raise ConfigError(f"BreakerPolicy.clock must be callable, got {self.clock!r}")


#: Called with (tier index, whether the circuit opened (True) or is closing (False), the breaker)
#: when a circuit opens or closes; on closing, before the breaker forgets how long it was open.
OnChange = Callable[[int, bool, CircuitBreaker], None]


class TierBreakers:
    """The engine's breaker per secondary tier; the shell asks :meth:`allow` before each call
    and reports its outcome. With ``policy=None`` every call is allowed and nothing is kept."""

    __slots__ = ("_count", "_on_change", "breakers", "policy")

    def __init__(
        self,
        count: int,
        policy: BreakerPolicy | None,
        on_change: OnChange = lambda ti, opened, breaker: None,
    ) -> None:
        self.policy = policy
        self._count = count
        self._on_change = on_change
        self.breakers: tuple[CircuitBreaker, ...] = (
            ()
            if policy is None
            else tuple(
                CircuitBreaker(policy.failure_threshold, cooldown=policy.cooldown,
                               clock=policy.clock)
                for _ in range(count)
            )
        )  # fmt: skip

    def allow(self, ti: int, ready: Callable[[], bool] = lambda: False) -> bool:
        """Whether tier ``ti`` may be called now (a half-open circuit lets one probe through).

        ``ready`` is asked only while the circuit is open: True when the tier itself knows it
        answers again, which ends the cool-down at once.
        """
        if not self.breakers:
            return True
        b = self.breakers[ti]
        if b.state is CircuitState.CLOSED:
            return True
        return b.allow(ready=b.state is CircuitState.OPEN and ready())

    def record(self, ti: int, ok: bool | None) -> None:
        """The outcome of a call :meth:`allow` let through: ``None`` when it has none (it was
        cancelled)."""
        if not self.breakers:
            return
        b = self.breakers[ti]
        if ok is None:
            b.abandon()
        elif ok:
            if b.state is not CircuitState.CLOSED:
                self._on_change(ti, False, b)
            b.success()
        elif b.failure():
            self._on_change(ti, True, b)

    def states(self) -> list[CircuitState]:
        """Each tier's state, in tier order (all closed when no policy is set)."""
        if not self.breakers:
            return [CircuitState.CLOSED] * self._count
        return [b.state for b in self.breakers]
