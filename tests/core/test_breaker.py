"""CircuitBreaker: a state machine driven by hand, with a fake clock and no event loop."""

from __future__ import annotations

import ast
import inspect

import pytest
from helpers import FakeClock

from aiotier._core import breaker as breaker_module
from aiotier._core.breaker import BreakerPolicy, CircuitBreaker, CircuitState, TierBreakers
from aiotier.errors import ConfigError


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


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
    assert imported <= {"__future__", "time", "collections.abc", "dataclasses", "enum", "..errors"}


# -- with a cool-down: the engine's breakers ------------------------------------------------------


def test_without_a_cooldown_nothing_goes_through_until_a_success(clock: FakeClock) -> None:
    b = CircuitBreaker(1, clock=clock)
    b.failure()
    clock.now = 1e9
    assert b.allow() is False
    b.success()
    assert b.allow() is True


def test_after_the_cooldown_one_probe_goes_through(clock: FakeClock) -> None:
    b = CircuitBreaker(2, cooldown=5.0, clock=clock)
    assert b.allow() is True
    b.failure()
    assert b.allow() is True  # below the threshold: still closed
    b.failure()
    assert b.state is CircuitState.OPEN
    clock.now = 104.99
    assert b.allow() is False
    clock.now = 105.0
    assert b.allow() is True  # the probe
    assert b.state is CircuitState.HALF_OPEN
    assert b.is_open
    assert b.allow() is False  # only one probe at a time
    b.success()
    assert (b.state, b.failures, b.opened_at) == (CircuitState.CLOSED, 0, None)
    assert b.allow() is True


def test_a_failed_probe_opens_the_circuit_for_another_cooldown(clock: FakeClock) -> None:
    b = CircuitBreaker(1, cooldown=5.0, clock=clock)
    assert b.failure() is True
    clock.now = 106.0
    assert b.allow() is True
    assert b.failure() is False  # the same outage: not opened again
    assert b.state is CircuitState.OPEN
    assert b.opened_at == 100.0  # the outage started then
    clock.now = 110.9
    assert b.allow() is False
    clock.now = 111.0
    assert b.allow() is True


def test_a_probe_that_never_reports_is_replaced_after_a_cooldown(clock: FakeClock) -> None:
    b = CircuitBreaker(1, cooldown=2.0, clock=clock)
    b.failure()
    clock.now = 102.0
    assert b.allow() is True
    clock.now = 103.9
    assert b.allow() is False
    clock.now = 104.0
    assert b.allow() is True  # the first probe was lost


def test_an_abandoned_probe_lets_the_next_call_probe_at_once(clock: FakeClock) -> None:
    b = CircuitBreaker(1, cooldown=2.0, clock=clock)
    b.failure()
    clock.now = 102.0
    assert b.allow() is True
    b.abandon()
    assert b.state is CircuitState.OPEN
    assert b.allow() is True
    b.abandon()
    b.abandon()  # abandoning with no probe out changes nothing
    assert b.state is CircuitState.OPEN


def test_a_far_side_known_ready_ends_the_cooldown_but_keeps_one_probe(clock: FakeClock) -> None:
    b = CircuitBreaker(1, cooldown=60.0, clock=clock)
    b.failure()
    assert b.allow() is False
    assert b.allow(ready=True) is True  # e.g. the tier's own probe reached its server
    assert b.state is CircuitState.HALF_OPEN
    assert b.allow(ready=True) is False  # still one probe at a time
    b.failure()
    assert b.allow(ready=True) is True


def test_cooldown_must_be_positive() -> None:
    with pytest.raises(ValueError, match="cooldown"):
        CircuitBreaker(1, cooldown=0)


def test_tier_breakers_keep_one_circuit_per_tier_and_report_changes(clock: FakeClock) -> None:
    changes: list[tuple[int, bool, float]] = []
    breakers = TierBreakers(
        2,
        BreakerPolicy(failure_threshold=2, cooldown=1.0, clock=clock),
        lambda ti, opened, b: changes.append((ti, opened, b.open_for())),
    )
    for _ in range(2):
        assert breakers.allow(1)
        breakers.record(1, False)
    assert breakers.states() == [CircuitState.CLOSED, CircuitState.OPEN]
    assert changes == [(1, True, 0.0)]
    assert breakers.allow(0) and not breakers.allow(1)
    clock.now = 101.5
    assert breakers.allow(1)
    breakers.record(1, None)  # the probe was cancelled
    assert breakers.allow(1)
    breakers.record(1, True)
    assert changes == [(1, True, 0.0), (1, False, 1.5)]
    assert breakers.states() == [CircuitState.CLOSED, CircuitState.CLOSED]


def test_a_success_between_failures_keeps_the_circuit_closed(clock: FakeClock) -> None:
    breakers = TierBreakers(1, BreakerPolicy(failure_threshold=2, clock=clock))
    for ok in (False, True, False, True, False):
        breakers.record(0, ok)
    assert breakers.states() == [CircuitState.CLOSED]


def test_tier_breakers_ask_whether_the_tier_is_ready_only_while_open(clock: FakeClock) -> None:
    asked: list[int] = []

    def ready() -> bool:
        asked.append(1)
        return True

    breakers = TierBreakers(1, BreakerPolicy(failure_threshold=1, cooldown=60.0, clock=clock))
    assert breakers.allow(0, ready)
    assert asked == []  # closed: not asked (the hot path stays a state check)
    breakers.record(0, False)
    assert breakers.allow(0, ready)
    assert asked == [1]
    assert not breakers.allow(0, ready)  # half-open: the probe is out, nothing to ask
    assert asked == [1]


def test_without_a_policy_every_call_goes_through() -> None:
    breakers = TierBreakers(3, None)
    for _ in range(100):
        breakers.record(2, False)
    assert breakers.allow(2)
    assert breakers.states() == [CircuitState.CLOSED] * 3


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"failure_threshold": 0}, "failure_threshold"),
        ({"failure_threshold": True}, "failure_threshold"),
        ({"failure_threshold": 2.0}, "failure_threshold"),
        ({"cooldown": 0}, "cooldown"),
        ({"cooldown": "1"}, "cooldown"),
        ({"clock": 3}, "clock"),
    ],
)
def test_breaker_policy_names_the_bad_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"BreakerPolicy.{field}"):
        BreakerPolicy(**kwargs)  # type: ignore[arg-type]
