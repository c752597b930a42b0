"""CircuitBreaker: a state machine driven by hand, with a fake clock and no event loop."""

from __future__ import annotations

import ast
import inspect

import pytest

from aiotier._core import breaker as breaker_module
from aiotier._core.breaker import CircuitBreaker, CircuitState


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_opens_on_the_threshold_th_consecutive_failure(clock: FakeClock) -> None:
    b = CircuitBreaker(3, clock=clock)
    assert b.state is CircuitState.CLOSED
    assert [b.failure(), b.failure()] == [False, False]
    assert not b.is_open
    clock.now = 107.5
    assert b.failure() is True
    assert b.state is CircuitState.OPEN
    assert b.is_open
    assert b.opened_at == 107.5
    assert b.failures == 3


def test_a_success_resets_the_count_and_closes(clock: FakeClock) -> None:
    b = CircuitBreaker(2, clock=clock)
    b.failure()
    b.success()
    assert b.failure() is False  # the count started again
    assert b.failure() is True
    b.success()
    assert (b.state, b.failures, b.opened_at) == (CircuitState.CLOSED, 0, None)


def test_failures_while_open_do_not_reopen(clock: FakeClock) -> None:
    b = CircuitBreaker(1, clock=clock)
    assert b.failure() is True
    clock.now = 200.0
    assert [b.failure(), b.failure()] == [False, False]
    assert b.opened_at == 100.0  # still the moment it opened
    assert b.failures == 3


def test_trip_opens_at_once_and_only_once(clock: FakeClock) -> None:
    b = CircuitBreaker(5, clock=clock)
    assert b.trip() is True
    assert b.is_open
    assert b.failures == 5
    assert b.trip() is False
    assert b.failures == 6


def test_open_for_reads_the_injected_clock(clock: FakeClock) -> None:
    b = CircuitBreaker(1, clock=clock)
    assert b.open_for() == 0.0
    b.failure()
    clock.now = 102.25
    assert b.open_for() == 2.25
    b.success()
    assert b.open_for() == 0.0


def test_repr_names_the_state(clock: FakeClock) -> None:
    b = CircuitBreaker(2, clock=clock)
    b.failure()
    assert repr(b) == "<CircuitBreaker closed failures=1/2>"
    b.failure()
    assert repr(b) == "<CircuitBreaker open failures=2/2>"


def test_threshold_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        CircuitBreaker(0)


def test_the_breaker_does_no_io() -> None:
    tree = ast.parse(inspect.getsource(breaker_module))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add("." * node.level + (node.module or ""))
    assert imported <= {"__future__", "time", "collections.abc", "enum"}
