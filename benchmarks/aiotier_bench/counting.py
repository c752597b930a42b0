"""Noise-free figures for the benchmarks: Python calls per unit of work, OpenTelemetry SDK calls.

Timings on a shared 2-CPU machine move 10-30% between runs; call counts do not. They track a
refactor's progress between runs where the medians cannot:

- :class:`CallCounter` counts the interpreter's profile events (``sys.setprofile``) while it is
  active: ``calls`` are Python frames entered (a coroutine resumed after an ``await`` counts as a
  call too, as the interpreter reports it), ``c_calls`` built-in functions called.
- :class:`CountingMeterProvider` wraps any OpenTelemetry ``MeterProvider`` (the SDK's with a
  Prometheus reader in the benchmarks): its meters hand out the real instruments wrapped in
  counters of ``add`` / ``record`` calls, so the number of SDK calls a step costs is visible.

Both are built from public APIs only (the interpreter's and OpenTelemetry's): nothing of the
engine's internals is reached.
"""

from __future__ import annotations

import sys
from collections import Counter as _Tally
from collections.abc import Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any

from opentelemetry import metrics
from opentelemetry.context import Context

__all__ = ["CallCounter", "CountingMeterProvider"]

Attributes = Mapping[str, Any] | None


class CallCounter:
    """``with CallCounter() as c: ...`` then ``c.calls`` / ``c.c_calls`` (this thread only)."""

    def __init__(self) -> None:
        self.calls = 0
        self.c_calls = 0
        self._previous: Any = None

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            self.calls += 1
        elif event == "c_call":
            self.c_calls += 1

    def __enter__(self) -> CallCounter:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        sys.setprofile(self._previous)
        # the setprofile call itself was reported as a c_call on the way out
        self.c_calls = max(0, self.c_calls - 1)


class _CountingCounter(metrics.Counter):
    def __init__(self, inner: metrics.Counter, tally: _Tally[str]) -> None:
        self._key: str = getattr(inner, "name", "counter")
        self._inner = inner
        self._tally = tally

    def add(
        self, amount: float, attributes: Attributes = None, context: Context | None = None
    ) -> None:
        self._tally[self._key] += 1
        self._inner.add(amount, attributes, context)


class _CountingHistogram(metrics.Histogram):
    def __init__(self, inner: metrics.Histogram, tally: _Tally[str]) -> None:
        self._key: str = getattr(inner, "name", "histogram")
        self._inner = inner
        self._tally = tally

    def record(
        self, amount: float, attributes: Attributes = None, context: Context | None = None
    ) -> None:
        self._tally[self._key] += 1
        self._inner.record(amount, attributes, context)


_Callbacks = Sequence[metrics.CallbackT] | None


class _CountingMeter(metrics.Meter):
    """Delegates to a real meter; counters and histograms come back wrapped in tallies."""

    def __init__(self, inner: metrics.Meter, tally: _Tally[str]) -> None:
        super().__init__(inner.name, inner.version, inner.schema_url)
        self._inner = inner
        self._tally = tally

    def create_counter(self, name: str, unit: str = "", description: str = "") -> metrics.Counter:
        return _CountingCounter(self._inner.create_counter(name, unit, description), self._tally)

    def create_histogram(
        self,
        name: str,
        unit: str = "",
        description: str = "",
        *,
        explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
    ) -> metrics.Histogram:
        inner = self._inner.create_histogram(
            name, unit, description,
            explicit_bucket_boundaries_advisory=explicit_bucket_boundaries_advisory,
        )  # fmt: skip
        return _CountingHistogram(inner, self._tally)

    def create_up_down_counter(
        self, name: str, unit: str = "", description: str = ""
    ) -> metrics.UpDownCounter:
        return self._inner.create_up_down_counter(name, unit, description)

    def create_observable_counter(
        self, name: str, callbacks: _Callbacks = None, unit: str = "", description: str = ""
    ) -> metrics.ObservableCounter:
        return self._inner.create_observable_counter(name, callbacks, unit, description)

    def create_observable_gauge(
        self, name: str, callbacks: _Callbacks = None, unit: str = "", description: str = ""
    ) -> metrics.ObservableGauge:
        return self._inner.create_observable_gauge(name, callbacks, unit, description)

    def create_observable_up_down_counter(
        self, name: str, callbacks: _Callbacks = None, unit: str = "", description: str = ""
    ) -> metrics.ObservableUpDownCounter:
        return self._inner.create_observable_up_down_counter(name, callbacks, unit, description)


class CountingMeterProvider(metrics.MeterProvider):
    """A ``MeterProvider`` over ``inner`` that counts its instruments' ``add``/``record`` calls.

    ``calls`` maps each instrument's name to its number of calls since the last :meth:`reset`.
    Observable instruments are passed through uncounted (their callbacks run at collection).
    """

    def __init__(self, inner: metrics.MeterProvider) -> None:
        self.inner = inner
        self.calls: _Tally[str] = _Tally()

    def get_meter(
        self,
        name: str,
        version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> metrics.Meter:
        return _CountingMeter(
            self.inner.get_meter(name, version, schema_url, attributes), self.calls
        )

    def reset(self) -> None:
        self.calls.clear()

    @property
    def total(self) -> int:
        return sum(self.calls.values())
