"""What a key answers now, and what a caller that got RETRY is owed.

The one definition of a key's answer from the primary's side (HIT, RETRY, MISS, or "ask the
tiers"): every flow asks it here — a lookup's scan, a promotion's claim, ``wait``, ``get`` and
the answers other threads read. A caller that got RETRY is owed pins on the promoting blocks
(:meth:`Answers.hold`) and the clock of its async delay (:meth:`Answers.defer`). Part of
:class:`~aiotier._core.engine_core.EngineCore`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final

from .._types import LookupResult
from .coherence import Coherence
from .copy_policy import CopyPolicy
from .inflight import InflightTable, PromotionBatch
from .pins import PinLedger
from .requests import RequestBook, RequestState
from .stats import StepStats
from .table import PROMOTING, READY, BlockTable

__all__ = ["Answers"]

_HIT: Final = LookupResult.HIT
_MISS: Final = LookupResult.MISS
_RETRY: Final = LookupResult.RETRY


class Answers:
    """Answers for keys from the primary's state, and the RETRY bookkeeping of their callers."""

    __slots__ = (
        "_clock",
        "_coherence",
        "_copies",
        "_inflight",
        "_pins",
        "_requests",
        "_stats",
        "_table",
        "promotion_timeout",
    )

    def __init__(
        self,
        table: BlockTable,
        inflight: InflightTable,
        coherence: Coherence,
        pins: PinLedger,
        requests: RequestBook,
        copies: CopyPolicy,
        stats: StepStats,
        clock: Callable[[], float],
        promotion_timeout: float,
    ) -> None:
        self._table = table
        self._inflight = inflight
        self._coherence = coherence
        self._pins = pins
        self._requests = requests
        self._copies = copies
        self._stats = stats
        self._clock = clock
        self.promotion_timeout = promotion_timeout

    # -- answers ---------------------------------------------------------------------------------

    def of_slot(self, slot: int, now: float) -> LookupResult:
        """What a key held in ``slot`` answers: HIT when loadable, RETRY while promoting or
        while a pending store is within its window, MISS after it."""
        st = self._table.state[slot]
        if st == READY:
            return _HIT
        if st == PROMOTING:
            return _RETRY
        return _RETRY if now < self._inflight.store_deadline.get(slot, 0.0) else _MISS

    def primary_answer(
        self,
        k: bytes,
        rs: RequestState | None,
        now: float,
        protected: list[int],
        *,
        hold: bool = True,
    ) -> LookupResult | None:
        """The primary's answer for ``k``, or None when the tiers must be asked.

        Bytes on their way down are put back into the primary if there is room: HIT, or RETRY
        when that evicted a block (ask again: it is a HIT then). A caller that gets RETRY for a
        promotion is held (``hold``).
        """
        slot = self._table.index.get(k)
        if slot is not None:
            answer = self.of_slot(slot, now)
            if hold and answer is _RETRY and self._table.state[slot] == PROMOTING:
                self.hold(rs, [k], [slot])
            return answer
        data = self._coherence.in_transit.get(k)
        if data is not None:
            evicted = self._copies.readmit(k, data, protected)
            if evicted is None:
                return _MISS
            # a block evicted to make room may be one this caller was told was a HIT by an
            # earlier call (a scheduler that looks keys up one by one): the caller looks again
            # (a HIT now) rather than loading a prefix that is no longer all there
            return _RETRY if evicted else _HIT
        return None

    def ready_prefix(self, ks: Iterable[bytes]) -> int:
        """How many leading keys are loadable now."""
        ready = self._table.ready_slot
        n = 0
        for k in ks:
            if ready(k) is None:
                break
            n += 1
        return n

    def settled(self, ks: Iterable[bytes]) -> list[LookupResult]:
        """HIT for each key loadable now, MISS for the others (keys no longer in flight)."""
        ready = self._table.ready_slot
        return [_MISS if ready(k) is None else _HIT for k in ks]

    def in_flight(self, k: bytes) -> tuple[int, float] | None:
        """``(slot, seconds it may stay in flight)`` while ``k`` answers RETRY, else None.

        A pending store whose RETRY window ran out settles here (it answers MISS now).
        """
        slot = self._table.index.get(k)
        if slot is None:
            return None
        now = self._clock()
        promoting = self._table.state[slot] == PROMOTING
        if self.of_slot(slot, now) is _RETRY:
            window = self._inflight.store_deadline.get(slot, now) - now
            return slot, self.promotion_timeout if promoting else window
        if self._inflight.store_deadline.pop(slot, None) is not None:  # its window ran out
            self._inflight.settle(k, now)
        return None

    # -- what a caller that got RETRY is owed ---------------------------------------------------

    def hold(
        self,
        rs: RequestState | None,
        keys: list[bytes],
        slots: list[int],
        batch: PromotionBatch | None = None,
    ) -> None:
        """Pin promoting blocks for the caller that got RETRY for them, until it loads them.

        A request that starts ``batch`` is its holder; one that joins a promotion in flight is
        a holder of each key it joined.
        """
        if rs is not None and not self._requests.is_live(rs):
            return  # the request finished while its lookup awaited a tier: it holds nothing
        if self._pins.hold_retry(rs, keys, slots):
            assert rs is not None
            if batch is not None:
                batch.holders.append(rs)
            else:
                for k in keys:
                    self._inflight.add_holder(k, rs)

    def defer(
        self,
        rs: RequestState | None,
        keys: Iterable[bytes],
        batches: Sequence[PromotionBatch] = (),
    ) -> None:
        """Arm the async delay: per request at its first RETRY, per anonymous call until the
        last of its keys in flight settles (every key of ``batches``, which it just started,
        settles with its batch)."""
        now = self._clock()
        if rs is not None:
            rs.defer(now)
            return
        keys = list(keys)
        index, state = self._table.index, self._table.state
        flying = [k for k in keys if (s := index.get(k)) is not None and state[s] == PROMOTING]
        if len(flying) < len(keys):  # a pending store's window, or settled meanwhile: ask each
            flying = [k for k in keys if self.in_flight(k) is not None]
        self._inflight.defer(flying, now, batches)

    def add_sync_delay(self, rs: RequestState | None, seconds: float) -> None:
        if rs is not None:
            rs.add_sync(seconds)
        else:  # anonymous calls are observed at once, as their own requests
            self._stats.observe("sync_delay", seconds)
