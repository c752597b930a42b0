"""Test helpers for aiotier and for your own code: a tier wrapper that injects faults.

``FaultyTier`` wraps any :class:`~aiotier.SecondaryTier` and, on the operations you choose,
raises, sleeps, hangs, corrupts the bytes it reads, or fails writes with ``ENOSPC`` — each with
a probability drawn from its own seeded generator, so a failing run can be replayed. It also
counts the calls that reached it, which makes "no second read" assertions exact.
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._types import LookupResult
from .errors import BlockCorruptedError
from .telemetry import METRICS
from .tiers._batches import write_each
from .tiers.base import (
    BlockMeta,
    Buffer,
    Eviction,
    SecondaryTier,
    TierCapabilities,
    TierSetup,
    TierUsage,
)

__all__ = ["Fault", "FaultyTier", "MetricsProbe"]

OPS = ("lookup", "read", "write", "remove", "open", "close", "clear")


@dataclass(slots=True)
class Fault:
    """What to do to one operation: ``kind`` is error, delay, hang, corrupt or disk_full."""

    kind: str
    probability: float = 1.0
    seconds: float = 0.0
    exc: type[Exception] = ConnectionError


class FaultyTier(SecondaryTier):
    """Wraps ``inner`` and misbehaves on purpose; ``calls`` counts every operation."""

    def __init__(self, inner: SecondaryTier, *, seed: int = 0, name: str | None = None) -> None:
        super().__init__(name if name is not None else inner.name)
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.faults: dict[str, list[Fault]] = {}
        self._rng = random.Random(seed)
        self._hung: set[asyncio.Future[None]] = set()

    # -- configuring faults ----------------------------------------------------------------------

    def inject(self, op: str, fault: Fault) -> FaultyTier:
        if op not in OPS:
            raise ValueError(f"unknown operation {op!r}; expected one of {', '.join(OPS)}")
        if not 0.0 <= fault.probability <= 1.0:
            raise ValueError(f"probability must be in [0, 1], got {fault.probability}")
        self.faults.setdefault(op, []).append(fault)
        return self

    def fail(self, op: str, probability: float = 1.0, exc: type[Exception] = ConnectionError
             ) -> FaultyTier:  # fmt: skip
        return self.inject(op, Fault("error", probability, exc=exc))

    def delay(self, op: str, seconds: float, probability: float = 1.0) -> FaultyTier:
        return self.inject(op, Fault("delay", probability, seconds=seconds))

    def hang(self, op: str, probability: float = 1.0) -> FaultyTier:
        return self.inject(op, Fault("hang", probability))

    def corrupt(self, probability: float = 1.0) -> FaultyTier:
        """Reads return flipped bytes; like a real tier, verification turns them into errors."""
        return self.inject("read", Fault("corrupt", probability))

    def disk_full(self, probability: float = 1.0) -> FaultyTier:
        return self.inject("write", Fault("disk_full", probability))

    def heal(self) -> None:
        """Remove every fault and release every hung call."""
        self.faults.clear()
        for fut in self._hung:
            if not fut.done():
                fut.set_result(None)
        self._hung.clear()

    # -- the wrapper ---------------------------------------------------------------------------

    async def _before(self, op: str) -> Fault | None:
        """Apply error/delay/hang faults for ``op``; return a corrupt/disk_full fault to apply."""
        self.calls[op] += 1
        late: Fault | None = None
        for f in self.faults.get(op, ()):
            if self._rng.random() >= f.probability:
                continue
            if f.kind == "error":
                raise f.exc(f"injected {op} failure in tier {self.name!r}")
            if f.kind == "delay":
                await asyncio.sleep(f.seconds)
            elif f.kind == "hang":
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._hung.add(fut)
                try:
                    await fut
                finally:
                    self._hung.discard(fut)
            else:
                late = f
        return late

    async def open(self, setup: TierSetup | None = None) -> None:
        await self._before("open")
        await self.inner.open(setup)

    async def aclose(self) -> None:
        self.heal()
        await self._before("close")
        await self.inner.aclose()

    async def clear(self) -> None:
        await self._before("clear")
        await self.inner.clear()

    # Reads, writes and removes meet their faults key by key (a batch of n counts n calls),
    # each key passed on alone once its faults let it through; a lookup batch is one call.

    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        await self._before("lookup")
        return await self.inner.lookup_many(keys)

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        out: list[int | Exception] = []
        for key, buf in zip(keys, bufs, strict=True):
            try:
                late = await self._before("read")
                (n,) = await self.inner.read_many_into([key], [buf])
                if late is not None and isinstance(n, int) and n > 0:
                    buf[0] ^= 0xFF
                    n = BlockCorruptedError(
                        f"tier {self.name!r}: injected corruption of {key[:64]!r}"
                    )
            except Exception as exc:
                n = exc
            out.append(n)
        return out

    async def write_many(
        self, items: Sequence[tuple[bytes, Buffer]], meta: Sequence[BlockMeta] | None = None
    ) -> list[Exception | None]:
        async def write(key: bytes, at: int) -> None:  # the item at ``at``, faults first
            if await self._before("write") is not None:
                raise OSError(errno.ENOSPC, f"injected disk full in tier {self.name!r}")
            one = None if meta is None else [meta[at]]
            (error,) = await self.inner.write_many([items[at]], one)
            if error is not None:
                raise error

        return await write_each([(k, i) for i, (k, _) in enumerate(items)], write)

    async def remove_many(self, keys: Sequence[bytes]) -> list[bool | Exception]:
        out: list[bool | Exception] = []
        for key in keys:
            try:
                await self._before("remove")
                (found,) = await self.inner.remove_many([key])
            except Exception as exc:
                found = exc
            out.append(found)
        return out

    # -- the rest is the inner tier's ------------------------------------------------------------

    @property
    def capabilities(self) -> TierCapabilities:  # type: ignore[override]
        return self.inner.capabilities

    def usage(self) -> TierUsage:
        return self.inner.usage()

    def take_evictions(self) -> list[Eviction]:
        return self.inner.take_evictions()

    def contains_hint(self, key: bytes) -> bool | None:
        return self.inner.contains_hint(key)

    @property
    def available(self) -> bool | None:
        return self.inner.available

    def counters(self) -> Mapping[str, int]:
        return self.inner.counters()


class MetricsProbe:
    """Read aiotier metrics from an ``InMemoryMetricReader`` by their Prometheus names.

    ``probe.value("aiotier_lookups_total", tier="primary", result="hit")`` sums a counter over
    the points whose labels match; ``count``/``sum``/``buckets`` read a histogram the same way.
    Figures are cumulative since the provider started.
    """

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self._otel = {m.prometheus: m.otel_name for m in METRICS}

    def _points(self, prometheus_name: str, labels: dict[str, str]) -> list[Any]:
        try:
            otel_name = self._otel[prometheus_name]
        except KeyError:
            raise ValueError(f"{prometheus_name!r} is not an aiotier metric") from None
        data = self.reader.get_metrics_data()
        points: list[Any] = []
        for rm in getattr(data, "resource_metrics", None) or ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name != otel_name:
                        continue
                    for p in metric.data.data_points:
                        attrs = dict(p.attributes or {})
                        if all(attrs.get(k) == v for k, v in labels.items()):
                            points.append(p)
        return points

    def value(self, prometheus_name: str, **labels: str) -> float:
        return float(sum(p.value for p in self._points(prometheus_name, labels)))

    def count(self, prometheus_name: str, **labels: str) -> int:
        return int(sum(p.count for p in self._points(prometheus_name, labels)))

    def sum(self, prometheus_name: str, **labels: str) -> float:
        return float(sum(p.sum for p in self._points(prometheus_name, labels)))

    def buckets(self, prometheus_name: str) -> tuple[float, ...]:
        points = self._points(prometheus_name, {})
        if not points:
            raise AssertionError(f"no data point recorded for {prometheus_name!r}")
        return tuple(points[0].explicit_bounds)
