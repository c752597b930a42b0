"""The in-flight registry: keys whose answer is RETRY, and who is waiting for them.

A key is in flight while its primary slot is PROMOTING (a promotion read) or PENDING within its
store deadline (a store prepared, not completed). The table says which; this registry keeps what
hangs off an in-flight key until it **settles** (becomes HIT or MISS):

- waiters (``engine.wait``), woken by calling them;
- anonymous deferrals, whose async delay is observed when the last of their keys settles;
- the requests holding a RETRY pin on a promotion, whose pins go if it fails;
- promotion batches in flight, and pending stores' RETRY deadlines.

Every settle goes through :meth:`InflightTable.settle`, so nothing stays RETRY forever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from .requests import RequestState
from .stats import StepStats

__all__ = ["Deferral", "InflightTable", "PromotionBatch", "Waiter"]

#: Called once when the key it waits for settles (the engine wraps a future in it).
Waiter = Callable[[], None]


class Deferral:
    """An anonymous call's deferral: observed when the last of its keys settles."""

    __slots__ = ("remaining", "start")

    def __init__(self, start: float, remaining: int) -> None:
        self.start = start
        self.remaining = remaining


class PromotionBatch:
    """Keys read from one tier into their reserved slots by one task.

    ``holders`` are the requests whose lookup started it and that hold RETRY pins on its
    blocks (requests that join a promotion later are registered per key, in the in-flight
    table). ``deferrals`` are the anonymous lookups that started it: each counts the keys of the
    batch as settled when the batch is, but for the ``settled`` ones a put or delete superseded
    earlier (keys they joined elsewhere count one by one).
    """

    __slots__ = ("deferrals", "holders", "keys", "settled", "slots", "started", "tier")

    def __init__(self, tier: int, keys: list[bytes], slots: list[int], started: float) -> None:
        self.tier = tier
        self.keys = keys
        self.slots = slots
        self.started = started
        self.holders: list[RequestState] = []
        self.deferrals: list[Deferral] = []
        self.settled = 0


class InflightTable:
    """Waiters, anonymous deferrals and RETRY holders of in-flight keys; store deadlines."""

    __slots__ = ("_deferrals", "_holders", "_stats", "_waiters", "promoting", "store_deadline")

    def __init__(self, stats: StepStats) -> None:
        self._stats = stats
        self._waiters: dict[bytes, list[Waiter]] = {}
        self._deferrals: dict[bytes, list[Deferral]] = {}
        self._holders: dict[bytes, list[RequestState]] = {}
        #: pending-store slot -> the time until which it answers RETRY
        self.store_deadline: dict[int, float] = {}
        #: keys whose promotion read is in flight (bounded by ``max_inflight_promotions``)
        self.promoting = 0

    def add_waiter(self, k: bytes, waiter: Waiter) -> None:
        self._waiters.setdefault(k, []).append(waiter)

    def remove_waiter(self, k: bytes, waiter: Waiter) -> None:
        waiters = self._waiters.get(k)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del self._waiters[k]

    def defer(
        self, keys: Iterable[bytes], now: float, batches: Sequence[PromotionBatch] = ()
    ) -> None:
        """An anonymous call got RETRY for ``keys`` (those still in flight) and for every key of
        ``batches`` (promotions it started, each settled as a whole: see
        :meth:`settle_deferrals`): one deferral for all, observed once."""
        keys = list(keys)
        placed = sum(len(b.keys) for b in batches)
        if not keys and not placed:
            # nothing of it is in flight any more (bytes in transit put back in the primary, or
            # settled meanwhile): the deferral is over as it begins
            self._stats.observe("async_delay", 0.0)
            return
        d = Deferral(now, len(keys) + placed)
        for b in batches:
            b.deferrals.append(d)
        deferrals = self._deferrals
        for k in keys:
            got = deferrals.get(k)
            if got is None:
                deferrals[k] = [d]
            else:
                got.append(d)

    def settle_deferrals(self, deferrals: Iterable[Deferral], n: int, now: float) -> None:
        """``n`` keys of a promotion batch settled: each deferral that started it counts them."""
        if not n:
            return
        for d in deferrals:
            d.remaining -= n
            if d.remaining == 0:
                self._stats.observe("async_delay", now - d.start)

    def add_holder(self, k: bytes, rs: RequestState) -> None:
        self._holders.setdefault(k, []).append(rs)

    def holders(self, k: bytes) -> list[RequestState]:
        return self._holders.get(k, [])

    def settle(self, k: bytes, now: float) -> None:
        """``k`` is HIT or MISS now: wake its waiters, close the deferrals it completes."""
        waiters = self._waiters.pop(k, None)
        if waiters is not None:
            for wake in waiters:
                wake()
        deferrals = self._deferrals.pop(k, None)
        if deferrals is not None:
            for d in deferrals:
                d.remaining -= 1
                if d.remaining == 0:
                    self._stats.observe("async_delay", now - d.start)
        self._holders.pop(k, None)

    def settle_many(self, keys: Sequence[bytes], now: float) -> None:
        """:meth:`settle` of each key: one set operation per registry, not a call per key."""
        waiters, deferrals, holders = self._waiters, self._deferrals, self._holders
        if waiters:
            for k in waiters.keys() & keys:
                for wake in waiters.pop(k):
                    wake()
        if deferrals:
            observe = self._stats.observe
            for k in deferrals.keys() & keys:
                for d in deferrals.pop(k):
                    d.remaining -= 1
                    if d.remaining == 0:
                        observe("async_delay", now - d.start)
        if holders:
            for k in holders.keys() & keys:
                del holders[k]

    def waiting_keys(self) -> list[bytes]:
        """Keys someone waits for or an anonymous deferral counts on (settled at close)."""
        return list(self._waiters.keys() | self._deferrals.keys() | self._holders.keys())
