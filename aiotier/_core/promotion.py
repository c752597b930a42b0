"""Lookups that reach below the primary, and the promotions they start.

A slow-path lookup is a :class:`LookupScan`: :meth:`Promotions.begin` answers what the primary
knows; the engine then asks each secondary tier in order about the keys still open
(:meth:`Promotions.ask` names them, :meth:`Promotions.answered` takes the answers); and
:meth:`Promotions.finish` reserves primary slots for what the tiers have and returns the reads
to perform as :class:`PromotionBatch` records, one per tier. The engine may read several
batches of one tier at once; when that read ends, :meth:`Promotions.completed` settles every
key of them, one pass per batch.

Slots are reserved synchronously (state PROMOTING, pinned by the read), so a second lookup of
the key, from any request, sees the promotion in flight and answers RETRY instead of starting
another.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator, Sequence
from typing import Final, cast

from .._types import LookupResult
from .answers import Answers
from .arena import Arena
from .coherence import Coherence
from .copy_policy import CopyPolicy
from .expiry import Expiry
from .gather import gather
from .inflight import InflightTable, PromotionBatch
from .pins import PinLedger
from .requests import RequestState
from .scan import LookupScan
from .stats import StepStats
from .table import PROMOTING, READY, BlockTable

__all__ = ["Outcome", "Promotions"]

#: :meth:`Promotions.asks`: yields (tier, keys to ask it), is sent its answers.
TierAsks = Generator[tuple[int, list[bytes]], Sequence[LookupResult] | None, None]

_HIT: Final = LookupResult.HIT
_MISS: Final = LookupResult.MISS
_RETRY: Final = LookupResult.RETRY


class Outcome(enum.Enum):
    """How a promotion read ended (the ``outcome`` label of ``aiotier_promotions_total``)."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


class Promotions:
    """Plans and settles promotions; part of :class:`~aiotier._core.engine_core.EngineCore`."""

    __slots__ = (
        "_answers",
        "_arena",
        "_clock",
        "_coherence",
        "_copies",
        "_inflight",
        "_pins",
        "_stats",
        "_table",
        "_tier_names",
        "closed",
        "expiry",
        "in_flight",
        "max_in_flight",
    )

    def __init__(
        self,
        table: BlockTable,
        arena: Arena,
        pins: PinLedger,
        inflight: InflightTable,
        coherence: Coherence,
        answers: Answers,
        copies: CopyPolicy,
        stats: StepStats,
        clock: Callable[[], float],
        tier_names: Sequence[str],
        max_in_flight: int,
    ) -> None:
        self._table = table
        self._arena = arena
        self._pins = pins
        self._inflight = inflight
        self._coherence = coherence
        self._answers = answers
        self._copies = copies
        self._stats = stats
        self._clock = clock
        self._tier_names = tuple(tier_names)
        self.max_in_flight = max_in_flight
        #: batches whose read has not been settled yet
        self.in_flight: set[PromotionBatch] = set()
        #: set when the engine starts closing: lookups suspended in a tier start no promotion
        self.closed = False
        #: blocks with a TTL: past their deadline, a key answers as absent; landing arms it
        self.expiry: Expiry | None = None

    # -- the lookup ------------------------------------------------------------------------------

    def begin(
        self,
        keys: list[bytes],
        rs: RequestState | None,
        exclude: int = -1,
        *,
        prefix: bool = False,
        hold: bool = True,
    ) -> LookupScan:
        """Answer from the primary; the keys it cannot answer are left ``open`` for the tiers."""
        if self.expiry is not None:
            self.expiry.check(keys)
        stats = self._stats
        scan = LookupScan(keys, rs, exclude, prefix=prefix, hold=hold)
        results, protected, need = scan.results, scan.protected, scan.need
        index, state = self._table.index, self._table.state
        in_transit = self._coherence.in_transit
        if (
            not in_transit or in_transit.keys().isdisjoint(keys)
        ) and self._answered_at_once(scan, index, state):
            return scan
        others: list[int] = []  # keys the primary holds but cannot load, or has on their way down
        for i, k in enumerate(keys):
            slot = index.get(k)
            if slot is not None and state[slot] == READY:  # loadable (the fast paths' test)
                results[i] = _HIT
                protected.append(slot)
            elif slot is not None or k in in_transit:
                others.append(i)
            else:
                need.append(i)  # the primary has nothing to say: the tiers are asked
        if others:
            answers, now = self._answers, self._clock()
            joined: list[bytes] = []  # keys whose promotion is in flight: RETRY, and held
            joined_slots: list[int] = []
            retry_keys = scan.retry_keys
            for i in others:
                k = keys[i]
                slot = index.get(k)
                if slot is None:  # on its way down: back into the primary if there is room
                    answer = answers.primary_answer(k, rs, now, protected, hold=hold)
                    if answer is None:
                        need.append(i)
                        continue
                    if k in index:  # put back: not to be evicted again by this lookup
                        protected.append(index[k])
                else:
                    answer = answers.of_slot(slot, now)
                    if answer is _RETRY:
                        if state[slot] == PROMOTING:
                            protected.append(slot)
                            joined.append(k)
                            joined_slots.append(slot)
                        else:
                            retry_keys.append(k)
                results[i] = answer
            if joined:
                if hold:
                    answers.hold(rs, joined, joined_slots)
                retry_keys += joined
            need.sort()
        hits = results.count(_HIT)
        retries = results.count(_RETRY)
        stats.primary_hit += hits
        stats.primary_retry += retries
        stats.primary_miss += len(keys) - hits - retries
        scan.open = need
        return scan

    def _answered_at_once(
        self, scan: LookupScan, index: dict[bytes, int], state: list[int]
    ) -> bool:
        """:meth:`begin` in C-level passes, when none of the keys is on its way down and each
        one the primary holds is loadable (HIT; the others are asked of the tiers). False,
        with nothing done, when some key needs a closer look."""
        keys, stats = scan.keys, self._stats
        n = len(keys)
        slots = list(map(index.get, keys))
        absent = slots.count(None)
        if absent == n:  # none is here: ask the tiers
            scan.need = scan.open = list(range(n))
            stats.primary_miss += n
            return True
        held = n - absent
        if not absent or slots.index(None) == held:  # a leading run is here (a prefix, maybe whole)
            protected = cast(list[int], slots[:held])
            if gather(state, protected).count(READY) != held:
                return False
            scan.results[:held] = [_HIT] * held
            scan.protected = protected
            scan.need = scan.open = list(range(held, n))
        else:
            protected = [s for s in slots if s is not None]
            if gather(state, protected).count(READY) != held:
                return False
            scan.results = [_HIT if s is not None else _MISS for s in slots]
            scan.protected = protected
            scan.need = scan.open = [i for i, s in enumerate(slots) if s is None]
        stats.primary_hit += held
        stats.primary_miss += absent
        return True

    def asks(self, scan: LookupScan, tiers: int) -> TierAsks:
        """The tiers asked in order, as the engine asks them: yields ``(tier, keys)`` for each
        tier with keys to ask about, and is sent that tier's answers (None: the call failed).
        Each resumption is one transition (the engine takes its lock around it)."""
        for ti in range(tiers):
            keys = self.ask(scan, ti)
            if keys:
                self.answered(scan, ti, (yield ti, keys))

    def ask(self, scan: LookupScan, ti: int) -> list[bytes]:
        """The keys to ask tier ``ti`` about (none: skip it)."""
        if not scan.open or ti == scan.exclude:
            return []
        coherence = self._coherence
        keys = scan.keys
        if coherence.all_readable(ti):
            scan.asked = scan.open
        else:
            scan.asked = [i for i in scan.open if coherence.may_read(ti, keys[i])]
        if scan.asked:
            scan.consulted = True
        scan.asked_keys = list(map(keys.__getitem__, scan.asked))
        return scan.asked_keys

    def answered(self, scan: LookupScan, ti: int, answers: Sequence[LookupResult] | None) -> None:
        """Tier ``ti``'s answers for the keys :meth:`ask` named; None when the call failed
        (counted as a tier error; every key is a MISS there)."""
        name = self._tier_names[ti]
        asked = scan.asked
        if answers is None:
            self._stats.count("tier_errors", name, "lookup")
            answers = [_MISS] * len(asked)
        hits, retries = answers.count(_HIT), answers.count(_RETRY)
        misses = len(asked) - hits - retries
        counts = self._stats.counts
        for outcome, n in (("hit", hits), ("retry", retries), ("miss", misses)):
            if n:
                counts[("lookups", name, outcome)] += n
        if hits == len(asked):  # the tier has them all
            scan.found[ti] = asked
        elif hits:
            scan.found[ti] = [i for i, a in zip(asked, answers, strict=True) if a is _HIT]
        if retries:
            results = scan.results
            for i, a in zip(asked, answers, strict=True):
                if a is _RETRY:
                    results[i] = _RETRY
        if hits + retries == len(asked) and asked is scan.open:
            scan.open = []
        elif hits or retries:
            settled = {i for i, a in zip(asked, answers, strict=True) if a is not _MISS}
            scan.open = [i for i in scan.open if i not in settled]

    def finish(
        self, scan: LookupScan, elapsed: float = 0.0, *, at_once: bool = False
    ) -> list[PromotionBatch]:
        """End a lookup: :meth:`place` its promotions, then settle its answers.

        ``elapsed`` is how long the tiers took: the caller's sync delay if any was asked. HITs
        answered before the tiers were awaited turn into MISS if a concurrent call evicted them
        meanwhile (``at_once``: the lookup began in the same transition, so none can have
        been), and the caller's deferral is armed for its RETRY keys.
        """
        batches = self.place(scan)
        results, keys = scan.results, scan.keys
        if scan.need and not at_once and _HIT in results:
            ready = self._table.ready_slot
            for i, r in enumerate(results):
                if r is _HIT and ready(keys[i]) is None:
                    results[i] = _MISS
        if scan.consulted:  # only a lookup that asked a secondary tier has a sync delay
            self._answers.add_sync_delay(scan.rs, elapsed)
        if scan.rs is not None:
            if _RETRY in results:
                self._answers.defer(scan.rs, ())
        elif _RETRY in results:
            # keys of the batches just started count as settled with their batch; the others
            # (joined promotions, pending stores, a tier's own RETRY) one by one
            placed = sum(len(b.keys) for b in batches)
            retry = scan.retry_keys
            if placed + len(retry) < results.count(_RETRY):
                started = {k for b in batches for k in b.keys}
                retry += [
                    k for i in scan.need if results[i] is _RETRY and (k := keys[i]) not in started
                ]
            self._answers.defer(None, retry, batches)
        return batches

    def place(self, scan: LookupScan) -> list[PromotionBatch]:
        """Reserve slots for what the tiers have; return the reads to start, one per tier."""
        batches: list[PromotionBatch] = []
        found = scan.found
        if found and not self.closed:
            if scan.prefix and scan.open:
                first_miss = scan.open[0]
                found = {ti: [i for i in pos if i < first_miss] for ti, pos in found.items()}
            for ti in sorted(found):
                batch = self._start(scan, ti, found[ti])
                if batch is not None:
                    batches.append(batch)
        return batches

    def _start(self, scan: LookupScan, ti: int, positions: list[int]) -> PromotionBatch | None:
        """Reserve slots for keys found in tier ``ti``; positions that get none answer MISS
        (counted as allocation failures of the promotion phase)."""
        table = self._table
        results, rs, protected = scan.results, scan.rs, scan.protected
        keys, where = self._claim(scan, ti, positions)
        share = self._pins.share
        room = min(max(self.max_in_flight - self._inflight.promoting, 0), share.room())
        slots = self._copies.allocate_prefix(keys[:room], PROMOTING, protected)
        placed = len(slots)
        for i in where[placed:]:
            results[i] = _MISS
            scan.unplaced.append((i, ti))
        if len(where) > placed:
            self._stats.count("allocation_failures", "promotion", n=len(where) - placed)
        if not placed:
            return None
        del keys[placed:]
        table.pin_many(slots)  # each read's own pin: the slot stays reserved until it stops
        share.reserve(placed)
        batch = PromotionBatch(ti, keys, slots, self._clock())
        if scan.hold:
            self._answers.hold(rs, keys, slots, batch)
        first, last = where[0], where[placed - 1]
        if last - first == placed - 1:  # a run of positions (they ascend): one slice
            results[first : last + 1] = [_RETRY] * placed
        else:
            for i in where[:placed]:
                results[i] = _RETRY
        protected.extend(slots)
        self._inflight.promoting += placed
        self.in_flight.add(batch)
        return batch

    def _claim(
        self, scan: LookupScan, ti: int, positions: list[int]
    ) -> tuple[list[bytes], list[int]]:
        """The keys at ``positions`` still to promote from tier ``ti``, and their positions.

        While the lookup awaited the tiers a concurrent call may have started the same
        promotion, put or deleted a key (its answer is now the primary's), or queued a
        remove in tier ``ti`` (the tier's answer is stale: MISS). Duplicate keys count once.
        """
        index, coherence = self._table.index, self._coherence
        in_transit = coherence.in_transit
        ks = scan.keys
        keys = scan.asked_keys if positions is scan.asked else [ks[i] for i in positions]
        if (
            coherence.all_readable(ti)
            and index.keys().isdisjoint(keys)
            and in_transit.keys().isdisjoint(keys)
            and len(set(keys)) == len(keys)
        ):
            return keys, positions
        results = scan.results
        keys, where = [], []
        taken: set[bytes] = set()
        check = not coherence.all_readable(ti)
        now = self._clock()
        for i in positions:
            k = ks[i]
            if check and not coherence.may_read(ti, k):
                results[i] = _MISS
                continue
            if k in index or k in taken or k in in_transit:
                answer = self._answers.primary_answer(
                    k, scan.rs, now, scan.protected, hold=scan.hold
                )
                results[i] = answer if answer is not None else _MISS
                continue
            keys.append(k)
            taken.add(k)
            where.append(i)
        return keys, where

    def superseded(self, k: bytes, slot: int) -> None:
        """A put, delete or clear replaced ``k`` while its read into ``slot`` is in flight: the
        key is settled now, so its holders' RETRY pins go and the deferrals of its batch count
        it (the read's end settles only the rest of the batch)."""
        holders = list(self._inflight.holders(k))
        batch = next((b for b in self.in_flight if slot in b.slots), None)
        if batch is not None:
            holders += batch.holders
            if batch.deferrals:
                batch.settled += 1
                self._inflight.settle_deferrals(batch.deferrals, 1, self._clock())
        self._pins.drop_retry_pins(k, slot, holders)

    # -- the read's end --------------------------------------------------------------------------

    def completed(
        self,
        batches: Sequence[PromotionBatch],
        outcome: Outcome,
        lengths: Sequence[int | Exception] = (),
        *,
        read_stopped: bool = True,
    ) -> list[int]:
        """One read of ``batches`` (all from one tier) ended: settle every key of them, loadable
        where the read gave a length, MISS (and a back-off from that tier) where it failed.

        ``lengths`` are the read's per-key results, in batch order, when ``outcome`` is OK.
        The read is one observation of ``promotion_duration``, from the first batch's start.
        Returns the slots of failed keys still pinned by the read when it has not stopped
        (``read_stopped=False``): release them with :meth:`release_read_pins` once it has.
        """
        live = [b for b in batches if b in self.in_flight]
        if not live:
            return []
        now = self._clock()
        name = self._tier_names[live[0].tier]
        self._stats.observe("promotion_duration", now - min(b.started for b in live), name)
        if outcome is Outcome.OK and len(lengths) != sum(len(b.keys) for b in batches):
            outcome = Outcome.ERROR
        held: list[int] = []
        offset = 0
        for batch in batches:
            n = len(batch.keys)
            part = lengths[offset : offset + n] if outcome is Outcome.OK else ()
            offset += n
            if batch in self.in_flight:
                self.in_flight.discard(batch)
                held += self._settle(batch, outcome, part, now)
                if batch.deferrals:
                    self._inflight.settle_deferrals(batch.deferrals, n - batch.settled, now)
        if read_stopped:
            self.release_read_pins(held)
            return []
        return held

    def _settle(
        self,
        batch: PromotionBatch,
        outcome: Outcome,
        lengths: Sequence[int | Exception],
        now: float,
    ) -> list[int]:
        """Settle one batch; return the slots of its failed keys (still pinned by the read)."""
        table = self._table
        stats = self._stats
        name = self._tier_names[batch.tier]
        block_size = self._arena.block_size
        index = table.index
        keys, slots = batch.keys, batch.slots
        ok = outcome is Outcome.OK
        if ok and _all_lengths(lengths, block_size) and table.owns_all(keys, slots):
            self._landed(batch, keys, slots, lengths, now)  # type: ignore[arg-type]
            return []  # the common case: every block landed
        ok_keys: list[bytes] = []
        ok_slots: list[int] = []
        ok_lengths: list[int] = []
        failed: list[int] = []
        for n, (k, slot) in enumerate(zip(keys, slots, strict=True)):
            result = lengths[n] if ok else None
            owned = index.get(k) == slot
            if owned and result.__class__ is int and 0 <= result <= block_size:
                ok_keys.append(k)
                ok_slots.append(slot)
                ok_lengths.append(result)
                continue
            failed.append(slot)
            if not owned:
                # superseded by a put or delete meanwhile: whatever the read did is moot
                stats.counts[("promotions", name, "cancelled")] += 1
                continue
            # -1 (the tier lost the block meanwhile) is a failed promotion, not a tier fault;
            # a fault, a timeout or a length past the block size is both
            if (
                outcome in (Outcome.ERROR, Outcome.TIMEOUT)
                or isinstance(result, Exception)
                or (isinstance(result, int) and result > block_size)
            ):
                stats.counts[("tier_errors", name, "read")] += 1
            label = Outcome.ERROR.value if ok else outcome.value
            stats.counts[("promotions", name, label)] += 1
            self._failed(batch, k, slot, now)
        if ok_slots:
            self._landed(batch, ok_keys, ok_slots, ok_lengths, now)
        self._inflight.promoting -= len(keys) - len(ok_slots)
        return failed

    def _landed(
        self,
        batch: PromotionBatch,
        keys: list[bytes],
        slots: list[int],
        lengths: list[int],
        now: float,
    ) -> None:
        """These blocks of ``batch`` are in their slots: loadable, counted, settled."""
        name = self._tier_names[batch.tier]
        self._arena.set_lengths(slots, lengths, checked=True)  # by _settle
        self._table.promoted(slots, clean=batch.tier == 0)
        self._pins.share.read_stopped(slots)  # RETRY pins may still hold them
        self._inflight.settle_many(keys, now)
        self._inflight.promoting -= len(slots)
        counts = self._stats.counts
        counts[("promotions", name, "ok")] += len(slots)
        counts[("read_bytes", name)] += sum(lengths)
        if self.expiry is not None:
            self.expiry.landed(batch.tier, keys, slots, self._arena)

    def release_read_pins(self, slots: Sequence[int]) -> None:
        """The reads into ``slots`` stopped: their slots may be reused."""
        unpin = self._table.unpin
        for slot in slots:
            unpin(slot)
        self._pins.share.read_stopped(slots)

    def _failed(self, batch: PromotionBatch, k: bytes, slot: int, now: float) -> None:
        """Turn the key into a MISS now, and back off from reading it from that tier."""
        holders = [*batch.holders, *self._inflight.holders(k)]
        self._pins.drop_retry_pins(k, slot, holders)
        self._table.detach(slot)  # an orphan until the read's own pin goes
        self._coherence.back_off(batch.tier, k)
        self._inflight.settle(k, now)

    def cancel_all(self) -> None:
        """The engine closed: every batch not settled yet was cancelled (its read stopped)."""
        for batch in list(self.in_flight):
            self.completed([batch], Outcome.CANCELLED)


def _all_lengths(results: Sequence[int | Exception], block_size: int) -> bool:
    """Every result is a length that fits a block (no error, no -1 for a lost block)."""
    if results.count(block_size) == len(results):  # the usual case, in one C-level pass
        return True
    if not set(map(type, results)) <= _INTS:
        return False
    return not results or (min(results) >= 0 and max(results) <= block_size)  # type: ignore[type-var, operator]


_INTS: Final = frozenset((int, bool))
