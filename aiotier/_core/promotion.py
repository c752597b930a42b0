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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from .._types import LookupResult
from .inflight import Deferral
from .requests import RequestState
from .table import PROMOTING, READY

if TYPE_CHECKING:
    from .engine_core import EngineCore

__all__ = ["LookupScan", "Outcome", "PromotionBatch", "Promotions"]

_HIT: Final = LookupResult.HIT
_MISS: Final = LookupResult.MISS
_RETRY: Final = LookupResult.RETRY


class Outcome(enum.Enum):
    """How a promotion read ended (the ``outcome`` label of ``aiotier_promotions_total``)."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


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


class LookupScan:
    """One slow-path lookup of ``keys``: what is answered so far and what the tiers have.

    ``hold`` pins each promoted block for the caller (``rs``, or until the next step for
    anonymous calls); ``get`` passes False since it copies the bytes out at once.
    """

    __slots__ = (
        "asked",
        "asked_keys",
        "consulted",
        "exclude",
        "found",
        "hold",
        "keys",
        "need",
        "open",
        "prefix",
        "protected",
        "results",
        "retry_keys",
        "rs",
        "unplaced",
    )

    def __init__(
        self,
        keys: list[bytes],
        rs: RequestState | None,
        exclude: int,
        *,
        prefix: bool,
        hold: bool,
    ) -> None:
        self.keys = keys
        self.rs = rs
        self.exclude = exclude
        self.prefix = prefix  # keys after the first that no tier has cannot extend the prefix
        self.hold = hold
        self.results: list[LookupResult] = [_MISS] * len(keys)
        self.need: list[int] = []  # positions the primary could not answer
        self.open: list[int] = []  # positions no tier has answered yet
        self.asked: list[int] = []  # positions the tier being asked was asked about
        self.asked_keys: list[bytes] = []  # and their keys
        self.protected: list[int] = []  # slots this lookup must not evict
        self.retry_keys: list[bytes] = []
        self.found: dict[int, list[int]] = {}  # tier -> positions it will promote
        self.consulted = False  # whether a secondary tier was asked (it has a sync delay)
        self.unplaced: list[tuple[int, int]] = []  # (position, tier) the primary had no room for


class Promotions:
    """Plans and settles promotions; part of :class:`~aiotier._core.engine_core.EngineCore`."""

    __slots__ = ("_core", "in_flight", "max_in_flight")

    def __init__(self, core: EngineCore, max_in_flight: int) -> None:
        self._core = core
        self.max_in_flight = max_in_flight
        #: batches whose read has not been settled yet
        self.in_flight: set[PromotionBatch] = set()

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
        core = self._core
        stats = core.stats
        scan = LookupScan(keys, rs, exclude, prefix=prefix, hold=hold)
        results, protected, need = scan.results, scan.protected, scan.need
        index, state = core.table.index, core.table.state
        demoting = core.coherence.demoting
        if index.keys().isdisjoint(keys) and demoting.keys().isdisjoint(keys):
            scan.need = scan.open = list(range(len(keys)))  # none is here: ask the tiers
            stats.primary_miss += len(keys)
            return scan
        joined: list[bytes] = []  # keys whose promotion is in flight: RETRY, and held
        joined_slots: list[int] = []
        others: list[int] = []  # pending stores and bytes on their way down
        for i, k in enumerate(keys):
            slot = index.get(k)
            if slot is None:
                if k in demoting:
                    others.append(i)
                else:
                    need.append(i)  # the primary has nothing to say: the tiers are asked
                continue
            st = state[slot]
            if st == READY:
                results[i] = _HIT
                protected.append(slot)
            elif st == PROMOTING:
                results[i] = _RETRY
                protected.append(slot)
                joined.append(k)
                joined_slots.append(slot)
            else:
                others.append(i)
        if joined and hold:
            core.hold(rs, joined, joined_slots)
        scan.retry_keys = joined
        if others:
            now = core.clock()
            for i in others:
                k = keys[i]
                answer = core.primary_answer(k, rs, now, protected, hold=hold)
                if answer is None:
                    need.append(i)
                    continue
                results[i] = answer
                if answer is _HIT:  # re-admitted from its way down: not to be evicted again
                    protected.append(index[k])
                elif answer is _RETRY:
                    scan.retry_keys.append(k)
            need.sort()
        hits = results.count(_HIT)
        retries = results.count(_RETRY)
        stats.primary_hit += hits
        stats.primary_retry += retries
        stats.primary_miss += len(keys) - hits - retries
        scan.open = need
        return scan

    def begin_below(self, key: bytes) -> LookupScan:
        """A lookup of one key the primary does not have, for ``get`` (which pins nothing)."""
        scan = LookupScan([key], None, -1, prefix=False, hold=False)
        scan.need = scan.open = [0]
        return scan

    def ask(self, scan: LookupScan, ti: int) -> list[bytes]:
        """The keys to ask tier ``ti`` about (none: skip it)."""
        if not scan.open or ti == scan.exclude:
            return []
        coherence = self._core.coherence
        keys = scan.keys
        if coherence.all_readable(ti):
            scan.asked = scan.open
        else:
            scan.asked = [i for i in scan.open if coherence.may_read(ti, keys[i])]
        if scan.asked:
            scan.consulted = True
        scan.asked_keys = [keys[i] for i in scan.asked]
        return scan.asked_keys

    def answered(self, scan: LookupScan, ti: int, answers: Sequence[LookupResult] | None) -> None:
        """Tier ``ti``'s answers for the keys :meth:`ask` named; None when the call failed
        (counted as a tier error; every key is a MISS there)."""
        core = self._core
        name = core.tier_names[ti]
        asked = scan.asked
        if answers is None:
            core.stats.count("tier_errors", name, "lookup")
            answers = [_MISS] * len(asked)
        hits, retries = answers.count(_HIT), answers.count(_RETRY)
        misses = len(asked) - hits - retries
        counts = core.stats.counts
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

    def finish(self, scan: LookupScan, elapsed: float = 0.0) -> list[PromotionBatch]:
        """End a lookup: :meth:`place` its promotions, then settle its answers.

        ``elapsed`` is how long the tiers took: the caller's sync delay if any was asked. HITs
        answered before the tiers were awaited turn into MISS if a concurrent call evicted them
        meanwhile, and the caller's deferral is armed for its RETRY keys.
        """
        core = self._core
        batches = self.place(scan)
        results, keys = scan.results, scan.keys
        if scan.need and _HIT in results:
            ready = core.table.ready_slot
            for i, r in enumerate(results):
                if r is _HIT and ready(keys[i]) is None:
                    results[i] = _MISS
        if scan.consulted:  # only a lookup that asked a secondary tier has a sync delay
            core.add_sync_delay(scan.rs, elapsed)
        if scan.rs is not None:
            if _RETRY in results:
                core.defer(scan.rs, ())
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
            core.defer(None, retry, batches)
        return batches

    def place(self, scan: LookupScan) -> list[PromotionBatch]:
        """Reserve slots for what the tiers have; return the reads to start, one per tier."""
        batches: list[PromotionBatch] = []
        found = scan.found
        if found and not self._core.closed:
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
        core = self._core
        table = core.table
        results, rs, protected = scan.results, scan.rs, scan.protected
        keys, where = self._claim(scan, ti, positions)
        share = core.pins.share
        room = min(max(self.max_in_flight - core.inflight.promoting, 0), share.room())
        slots, evicted = table.allocate_prefix(keys[:room], PROMOTING, protected)
        placed = len(slots)
        for i in where[placed:]:
            results[i] = _MISS
            scan.unplaced.append((i, ti))
        if len(where) > placed:
            core.stats.count("allocation_failures", "promotion", n=len(where) - placed)
        if not placed:
            return None
        del keys[placed:]
        core.demotions.evicted(evicted)
        table.pin_many(slots)  # each read's own pin: the slot stays reserved until it stops
        share.reserve(placed)
        batch = PromotionBatch(ti, keys, slots, core.clock())
        if scan.hold:
            core.hold(rs, keys, slots, batch)
        for i in where[:placed]:
            results[i] = _RETRY
        protected.extend(slots)
        core.inflight.promoting += placed
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
        core = self._core
        index, coherence = core.table.index, core.coherence
        demoting = coherence.demoting
        ks = scan.keys
        keys = scan.asked_keys if positions is scan.asked else [ks[i] for i in positions]
        if (
            coherence.all_readable(ti)
            and index.keys().isdisjoint(keys)
            and demoting.keys().isdisjoint(keys)
            and len(set(keys)) == len(keys)
        ):
            return keys, positions
        results = scan.results
        keys, where = [], []
        taken: set[bytes] = set()
        check = not coherence.all_readable(ti)
        now = core.clock()
        for i in positions:
            k = ks[i]
            if check and not coherence.may_read(ti, k):
                results[i] = _MISS
                continue
            if k in index or k in taken or k in demoting:
                answer = core.primary_answer(k, scan.rs, now, scan.protected, hold=scan.hold)
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
        core = self._core
        holders = list(core.inflight.holders(k))
        batch = next((b for b in self.in_flight if slot in b.slots), None)
        if batch is not None:
            holders += batch.holders
            if batch.deferrals:
                batch.settled += 1
                core.inflight.settle_deferrals(batch.deferrals, 1, core.clock())
        core.pins.drop_retry_pins(k, slot, holders)

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
        core = self._core
        now = core.clock()
        name = core.tier_names[live[0].tier]
        core.stats.observe("promotion_duration", now - min(b.started for b in live), name)
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
                    core.inflight.settle_deferrals(batch.deferrals, n - batch.settled, now)
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
        core = self._core
        table = core.table
        stats = core.stats
        name = core.tier_names[batch.tier]
        block_size = core.arena.block_size
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
        core.inflight.promoting -= len(keys) - len(ok_slots)
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
        core = self._core
        name = core.tier_names[batch.tier]
        core.arena.set_lengths(slots, lengths)
        core.table.promoted(slots, clean=batch.tier == 0)
        core.pins.share.read_stopped(slots)  # RETRY pins may still hold them
        core.inflight.settle_many(keys, now)
        core.inflight.promoting -= len(slots)
        counts = core.stats.counts
        counts[("promotions", name, "ok")] += len(slots)
        counts[("read_bytes", name)] += sum(lengths)

    def release_read_pins(self, slots: Sequence[int]) -> None:
        """The reads into ``slots`` stopped: their slots may be reused."""
        unpin = self._core.table.unpin
        for slot in slots:
            unpin(slot)
        self._core.pins.share.read_stopped(slots)

    def _failed(self, batch: PromotionBatch, k: bytes, slot: int, now: float) -> None:
        """Turn the key into a MISS now, and back off from reading it from that tier."""
        core = self._core
        holders = [*batch.holders, *core.inflight.holders(k)]
        core.pins.drop_retry_pins(k, slot, holders)
        core.table.detach(slot)  # an orphan until the read's own pin goes
        core.coherence.back_off(batch.tier, k)
        core.inflight.settle(k, now)

    def cancel_all(self) -> None:
        """The engine closed: every batch not settled yet was cancelled (its read stopped)."""
        for batch in list(self.in_flight):
            self.completed([batch], Outcome.CANCELLED)


def _all_lengths(results: Sequence[int | Exception], block_size: int) -> bool:
    """Every result is a length that fits a block (no error, no -1 for a lost block)."""
    if not set(map(type, results)) <= _INTS:
        return False
    return not results or (min(results) >= 0 and max(results) <= block_size)  # type: ignore[type-var, operator]


_INTS: Final = frozenset((int, bool))
