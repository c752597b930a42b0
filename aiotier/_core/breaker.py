"""A circuit breaker as a plain state machine: no I/O, no event loop, an injected clock.

Its owner reports each call's outcome and asks whether the circuit is open; what to do about
it (fail calls at once, probe the server, log) is the owner's. The clock only stamps when the
circuit opened, so that the owner can say how long an outage has lasted; tests pass a fake one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum

__all__ = ["CircuitBreaker", "CircuitState"]


class CircuitState(Enum):
    """Whether calls go through."""

    CLOSED = "closed"  #: calls go through; consecutive failures are counted
    OPEN = "open"  #: calls fail at once until a success (a probe's) closes the circuit


class CircuitBreaker:
    """Closed until ``threshold`` consecutive failures, then open until a success.

    ``failure()`` and ``trip()`` return True exactly when they open the circuit, so the owner
    starts its probe (or logs) once per outage.
    """

    __slots__ = ("_clock", "failures", "opened_at", "state", "threshold")

    def __init__(self, threshold: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if not threshold >= 1:
            raise ValueError(f"threshold must be at least 1, got {threshold!r}")
        self.threshold = threshold
        self._clock = clock
        self.state = CircuitState.CLOSED
        #: Consecutive failures since the last success.
        self.failures = 0
        #: The clock's reading when the circuit last opened; None while closed.
        self.opened_at: float | None = None

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self.state.value} failures={self.failures}/{self.threshold}>"

    @property
    def is_open(self) -> bool:
        return self.state is CircuitState.OPEN

    def open_for(self) -> float:
        """Seconds since the circuit opened (0.0 while it is closed)."""
        if self.opened_at is None:
            return 0.0
        return self._clock() - self.opened_at

    def success(self) -> None:
        """A call went through: close the circuit and forget past failures."""
        self.failures = 0
        self.state = CircuitState.CLOSED
        self.opened_at = None

    def failure(self) -> bool:
        """Count a failed call; True when this one opened the circuit."""
        self.failures += 1
        if self.state is CircuitState.CLOSED and self.failures >= self.threshold:
            self.state = CircuitState.OPEN
            self.opened_at = self._clock()
            return True
        return False

    def trip(self) -> bool:
        """Open the circuit now, whatever the count (a server unreachable at start-up); True if
        it was closed."""
        self.failures = max(self.failures, self.threshold - 1)
        return self.failure()
