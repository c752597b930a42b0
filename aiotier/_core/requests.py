"""Per-request state and the book of live requests: delays owed to the metrics, pins held.

A request is known from its first call until the step boundary that finishes it (or that
admits it while it holds nothing). At each boundary its pending delays are observed once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .views import HandedViews

__all__ = ["RequestBook", "RequestState", "StepDelays"]


@dataclass(slots=True, eq=False, init=False)
class RequestState:
    """What one request owes the metrics and the arena.

    ``sync_delay`` accumulates the duration of lookups that consulted a secondary tier;
    ``deferred_at`` is armed at the first RETRY. Both are observed (and reset) at the step
    boundary that admits or finishes the request. The pin fields are the
    :class:`~aiotier._core.pins.PinLedger`'s records of this request.
    """

    req_id: str
    busy: int  # lookups of this request suspended in a tier right now
    sync_delay: float
    has_sync: bool
    deferred_at: float | None
    # key -> slot pinned because this request got RETRY for the key's promotion
    promo_pins: dict[bytes, int]
    # key -> slots pinned by prepare_load (a key may be loaded twice before completion)
    load_pins: dict[bytes, list[int]]
    # key -> slot prepared by prepare_store and not completed yet
    stores: dict[bytes, int]
    # slots of earlier prepare_stores of a key prepared again before completing (oldest first):
    # the storer may still write them, so each stays pinned until the complete_store that
    # matches it (complete_stores of a key match its prepares in order) or the request ends
    stale_stores: dict[bytes, list[int]]
    # slots of loads and stores handed out before a clear (key -> slots): still pinned, since
    # the caller may still read or write them, until completed, released, or the request ends
    cleared_loads: dict[bytes, list[int]]
    cleared_stores: dict[bytes, list[int]]
    # the views handed out by prepare_load / prepare_store, released at complete_*
    load_views: HandedViews
    store_views: HandedViews

    def __init__(self, req_id: str) -> None:  # written out: literals cost less than factories
        self.req_id = req_id
        self.busy = 0
        self.sync_delay = 0.0
        self.has_sync = False
        self.deferred_at = None
        self.promo_pins = {}
        self.load_pins = {}
        self.stores = {}
        self.stale_stores = {}
        self.cleared_loads = {}
        self.cleared_stores = {}
        self.load_views = HandedViews()
        self.store_views = HandedViews()

    def add_sync(self, seconds: float) -> None:
        self.sync_delay += seconds
        self.has_sync = True

    def defer(self, now: float) -> None:
        if self.deferred_at is None:
            self.deferred_at = now

    def take_delays(self, now: float) -> tuple[float | None, float | None]:
        """Return and reset ``(sync, async)`` pending delays (None where nothing is pending)."""
        sync = self.sync_delay if self.has_sync else None
        deferred = None if self.deferred_at is None else now - self.deferred_at
        self.sync_delay = 0.0
        self.has_sync = False
        self.deferred_at = None
        return sync, deferred

    def holds_anything(self) -> bool:
        return bool(
            self.busy
            or self.promo_pins
            or self.load_pins
            or self.stores
            or self.stale_stores
            or self.cleared_loads
            or self.cleared_stores
        )


@dataclass(slots=True)
class StepDelays:
    """What a step boundary observed, and the requests it finished (their pins to release)."""

    sync: list[float] = field(default_factory=list)
    deferred: list[float] = field(default_factory=list)
    finished: list[RequestState] = field(default_factory=list)


class RequestBook:
    """The live requests by id, and the one state shared by calls made without a request."""

    __slots__ = ("_live", "anonymous")

    def __init__(self) -> None:
        self._live: dict[str, RequestState] = {}
        #: loads and stores of calls without a request
        self.anonymous = RequestState("<anonymous>")

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._live

    def live(self) -> list[RequestState]:
        return list(self._live.values())

    def get(self, req_id: str) -> RequestState | None:
        return self._live.get(req_id)

    def open(self, req_id: str) -> RequestState:
        """The state of ``req_id``, created at its first call."""
        rs = self._live.get(req_id)
        if rs is None:
            rs = self._live[req_id] = RequestState(req_id)
        return rs

    def known(self, req_id: str) -> RequestState:
        """The state of a request that prepared something (an empty one if it never did)."""
        return self._live.get(req_id) or RequestState(req_id)

    def is_live(self, rs: RequestState) -> bool:
        """False once the request finished (a lookup may still be suspended on its behalf)."""
        return self._live.get(rs.req_id) is rs

    def step(self, new: Iterable[str], finished: Iterable[str], now: float) -> StepDelays:
        """Observe admitted and finished requests' delays; forget finished ones (and admitted
        ones that hold nothing)."""
        out = StepDelays()
        for rid in new:
            rs = self._live.get(rid)
            if rs is not None:
                self._observe(rs, now, out)
                if not rs.holds_anything():
                    del self._live[rid]
        for rid in finished:
            rs = self._live.pop(rid, None)
            if rs is not None:
                self._observe(rs, now, out)
                out.finished.append(rs)
        return out

    def finish_all(self) -> list[RequestState]:
        """Every live request ends (the engine closes); their delays are not observed."""
        out = list(self._live.values())
        self._live.clear()
        return out

    @staticmethod
    def _observe(rs: RequestState, now: float, out: StepDelays) -> None:
        sync, deferred = rs.take_delays(now)
        if sync is not None:
            out.sync.append(sync)
        if deferred is not None:
            out.deferred.append(deferred)
