"""The pin ledger: who holds which pin on which primary slot, so each is released exactly once.

Four kinds of pins keep a block from being evicted or reused:

- a **RETRY pin**: a request got RETRY for a promotion; the promoted block waits for it until
  it loads the block (``complete_load``), finishes, or ``pin_steps`` steps pass. Anonymous
  lookups hold theirs until the next step boundary (the table's step holds).
- a **load pin**: ``prepare_load`` until ``complete_load``.
- a **store pin**: ``prepare_store`` until ``complete_store`` (the storer holds a writable view).
- a **read pin**: a promotion's own, until its read stops writing into the slot (kept by the
  promotion, not here).

A clear cancels the loads and stores handed out before it (:meth:`PinLedger.cancel`): their
pins stay (the caller may still read or write the slots) until they complete, the request
ends, or the caller says that they never will (:meth:`PinLedger.release_cancelled`). A
completion prefers what was handed out after the clear: a scheduler that drops its jobs at a
reset completes only those.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Iterable, Sequence
from typing import cast

from .gather import gather
from .requests import RequestState
from .table import PROMOTING, BlockTable

__all__ = ["PinLedger", "PromotionShare"]

_NONE: frozenset[int] = frozenset()


class PromotionShare:
    """Primary slots taken by promoted blocks that no request has loaded yet: a block counts
    while its read is in flight or a RETRY pin holds it, so promotions for queued requests
    cannot fill the slots the running requests store into.

    Reads are counted per batch (:meth:`reserve`, :meth:`read_stopped`); requests' RETRY pins
    per slot; anonymous callers' RETRY pins are the table's step holds (one per slot), read
    from its set. RETRY pins are only taken on slots whose read is in flight (PROMOTING): a
    slot whose read stopped while RETRY pins still held it counts on its own until the last of
    them goes.
    """

    __slots__ = ("_held", "_holds", "_reading", "_retry", "_retry_total", "_state", "limit")

    def __init__(self, limit: int, state: list[int], holds: set[int]) -> None:
        self.limit = limit
        self._state = state  # the table's slot states
        self._holds = holds  # the table's step holds: anonymous RETRY pins
        self._retry = [0] * len(state)  # per slot: requests' RETRY pins on it
        self._retry_total = 0  # requests' RETRY pins on all slots
        self._reading = 0  # slots whose promotion read has not stopped
        self._held = 0  # slots whose read stopped, still held by RETRY pins

    def __len__(self) -> int:
        return self._reading + self._held

    def room(self) -> int:
        """How many more promoted blocks fit."""
        return max(self.limit - self._reading - self._held, 0)

    def reserve(self, n: int) -> None:
        """Reads into ``n`` fresh slots start."""
        self._reading += n

    def read_stopped(self, slots: Sequence[int]) -> None:
        """The reads into ``slots`` stopped (landed or not): a slot still held by RETRY pins
        now counts on its own."""
        self._reading -= len(slots)
        if not slots:
            return
        holds = self._holds
        if not holds or holds.isdisjoint(slots):
            if self._retry_total:
                self._held += len(slots) - gather(self._retry, slots).count(0)
        elif holds.issuperset(slots):
            self._held += len(slots)
        else:
            retry = self._retry
            self._held += sum(1 for s in slots if retry[s] or s in holds)

    def take(self, slots: Sequence[int]) -> None:
        """A request's RETRY pin on each of ``slots`` (all promoting: their reads count them
        already)."""
        retry = self._retry
        for slot in slots:
            retry[slot] += 1
        self._retry_total += len(slots)

    def give_back(self, slots: Collection[int]) -> None:
        """A request's RETRY pin on each of ``slots`` lets go (a slot with none is left as it
        is)."""
        retry, state = self._retry, self._state
        # a slot an anonymous caller holds too still counts
        holds = self._holds if self._holds and not self._holds.isdisjoint(slots) else _NONE
        gone = kept = 0
        for slot in slots:
            n = retry[slot]
            if n:
                retry[slot] = n - 1
                if n == 1 and state[slot] != PROMOTING and slot not in holds:
                    gone += 1
            else:
                kept += 1
        self._held -= gone
        self._retry_total -= len(slots) - kept

    def hold_dropping(self, slot: int) -> None:
        """The step hold on ``slot`` is about to go (before the table drops it)."""
        if not self._retry[slot] and self._state[slot] != PROMOTING:
            self._held -= 1

    def holds_ending(self) -> None:
        """Every step hold is about to go (before the table drops them)."""
        holds = list(self._holds)
        if not self._retry_total:  # the usual case: no request pins any slot
            self._held -= len(holds) - gather(self._state, holds).count(PROMOTING)
        else:
            retry, state = self._retry, self._state
            self._held -= sum(1 for s in holds if not retry[s] and state[s] != PROMOTING)


class PinLedger:
    """Pins taken on behalf of requests (and of anonymous calls), and their release."""

    __slots__ = ("_expiry", "_table", "pin_steps", "share", "step")

    def __init__(self, table: BlockTable, pin_steps: int, share: PromotionShare) -> None:
        self._table = table
        self.pin_steps = pin_steps
        #: step boundaries passed (:meth:`next_step`): RETRY pins last ``pin_steps`` of them
        self.step = 0
        #: RETRY pins count against the promotion share while they hold a block
        self.share = share
        # (step at which they expire, request, keys, slots) of RETRY pins taken together
        self._expiry: deque[tuple[int, RequestState, list[bytes], list[int]]] = deque()

    # -- RETRY pins ------------------------------------------------------------------------------

    def hold_retry(
        self, rs: RequestState | None, keys: list[bytes], slots: list[int]
    ) -> bool:
        """Pin promoting blocks for the caller that got RETRY for them: once per request and
        key, or for anonymous callers once per slot until the step boundary. Returns True when
        a request took a new pin: it is then one of the blocks' holders, whose pins go if a
        promotion fails."""
        if rs is None:  # held until the step boundary: the table's step holds
            self._table.hold_until_step(slots)
            return False
        pins = self._table.pins
        held = rs.promo_pins
        fresh = dict(zip(keys, slots, strict=True))  # a key named twice is pinned once
        for k in held.keys() & fresh.keys():
            del fresh[k]
        if not fresh:
            return False
        keys, slots = list(fresh), list(fresh.values())
        for k, slot in zip(keys, slots, strict=True):
            held[k] = slot
            pins[slot] += 1
        self.share.take(slots)
        self._expiry.append((self.step + self.pin_steps, rs, keys, slots))
        return True

    def drop_retry_pins(self, k: bytes, slot: int, holders: Iterable[RequestState]) -> None:
        """A promotion failed or was superseded: its holders' RETRY pins on ``slot`` go now."""
        unpin = self._table.unpin
        for holder in holders:
            if holder.promo_pins.get(k) == slot:
                del holder.promo_pins[k]
                unpin(slot)
                self.share.give_back((slot,))
        self.drop_step_hold(slot)

    def drop_step_hold(self, slot: int) -> None:
        """An anonymous caller's hold on ``slot`` goes now: its promotion failed, or its block
        is about to be detached (deleted or replaced: :meth:`BlockTable.detach` drops the hold,
        this counts it out of the share first)."""
        if slot in self._table.step_holds:
            self.share.hold_dropping(slot)
            self._table.drop_step_hold(slot)

    def release_retry(self, rs: RequestState, k: bytes) -> None:
        slot = rs.promo_pins.pop(k, None)
        if slot is not None:
            self._table.unpin(slot)
            self.share.give_back((slot,))

    def next_step(self) -> None:
        """A step boundary: RETRY pins past their steps, and every anonymous one, go."""
        self.step += 1
        self._expire(self.step)

    def release_all(self) -> None:
        """The engine is closing: every RETRY pin goes."""
        self._expire(self.step + self.pin_steps + 1)

    def _expire(self, step: int) -> None:
        expiry = self._expiry
        while expiry and expiry[0][0] <= step:
            _, rs, keys, slots = expiry.popleft()
            if not rs.promo_pins:
                continue  # released already (loaded, or the request finished)
            for k, slot in zip(keys, slots, strict=True):
                if rs.promo_pins.get(k) == slot:
                    self.release_retry(rs, k)
        if self._table.step_holds:  # anonymous callers' RETRY pins
            self.share.holds_ending()
            self._table.end_step_holds()

    # -- load pins -----------------------------------------------------------------------------

    def pin_loads(self, rs: RequestState, keys: Sequence[bytes], slots: Sequence[int]) -> None:
        pin = self._table.pin
        for k, slot in zip(keys, slots, strict=True):
            pin(slot)
            rs.load_pins.setdefault(k, []).append(slot)

    def unpin_loads(self, rs: RequestState, keys: Sequence[bytes]) -> None:
        """Release one load pin per key, and the request's RETRY pin on it; ``ValueError`` (with
        nothing released) names a key the request did not ``prepare_load``."""
        distinct = set(keys)
        if len(distinct) < len(keys) or not rs.load_pins.keys() >= distinct:  # else: all loads
            for k, n in Counter(keys).items():
                if len(rs.load_pins.get(k, ())) + len(rs.cleared_loads.get(k, ())) < n:
                    raise ValueError(
                        f"complete_load of block {k[:64]!r} that request "
                        f"{rs.req_id!r} did not prepare_load"
                    )
        promo = rs.promo_pins
        for k in keys:
            pins = rs.load_pins if k in rs.load_pins else rs.cleared_loads
            slots = pins[k]
            self._table.unpin(slots.pop())
            if not slots:
                del pins[k]
            if k in promo:
                self.release_retry(rs, k)

    # -- store pins ----------------------------------------------------------------------------

    def pin_store(self, rs: RequestState, k: bytes, slot: int) -> None:
        """The storer holds a writable view: the slot stays its own until ``complete_store``,
        even if a put or delete of the key replaces it meanwhile."""
        self._table.pin(slot)
        old = rs.stores.get(k)
        if old is not None:  # prepared again after a put/delete replaced the first one
            rs.stale_stores.setdefault(k, []).append(old)
        rs.stores[k] = slot

    def pin_stores(self, rs: RequestState, keys: Sequence[bytes], slots: Sequence[int]) -> None:
        """:meth:`pin_store` of each pair."""
        self._table.pin_many(slots)
        stores = rs.stores
        if stores.keys().isdisjoint(keys):  # the common case: no earlier prepare of any
            stores.update(zip(keys, slots, strict=True))
            return
        for k, slot in zip(keys, slots, strict=True):
            old = stores.get(k)
            if old is not None:
                rs.stale_stores.setdefault(k, []).append(old)
            stores[k] = slot

    def check_stores(self, rs: RequestState, keys: Sequence[bytes]) -> None:
        """``ValueError`` naming a key the request has no store prepared for."""
        if len(set(keys)) != len(keys):
            raise ValueError("complete_store was given the same key twice")
        for k in keys:
            if k not in rs.stores and not rs.stale_stores.get(k) and k not in rs.cleared_stores:
                raise ValueError(
                    f"complete_store of block {k[:64]!r} that request {rs.req_id!r} "
                    "did not prepare (or already completed)"
                )

    def take_store(self, rs: RequestState, k: bytes) -> int | None:
        """Release the store pin matching a ``complete_store`` of ``k``.

        Stores of a key complete in the order they were prepared: an earlier prepare that a
        put or delete superseded is completed first, and None says so (nothing to make ready).
        Otherwise returns the slot of the current prepare, unpinned; without one, a prepare a
        clear cancelled is completed (None: nothing to make ready).
        """
        stale = rs.stale_stores.get(k)
        if stale:
            self._table.unpin(stale.pop(0))
            if not stale:
                del rs.stale_stores[k]
            return None
        slot = rs.stores.pop(k, None)
        if slot is not None:
            self._table.unpin(slot)
            return slot
        cancelled = rs.cleared_stores[k]
        self._table.unpin(cancelled.pop(0))
        if not cancelled:
            del rs.cleared_stores[k]
        return None

    def take_stores(self, rs: RequestState, keys: Sequence[bytes]) -> list[int | None]:
        """:meth:`take_store` of each key, after :meth:`check_stores` (which raises with
        nothing released): the current prepares' slots are unpinned together."""
        stale, stores = rs.stale_stores, rs.stores
        distinct = set(keys)
        if len(distinct) != len(keys) or not stores.keys() >= distinct:
            self.check_stores(rs, keys)
        elif not stale:  # the common case, at C speed: each key a current prepare
            slots: list[int | None] = list(map(stores.pop, keys))
            self._table.unpin_many(cast(list[int], slots))
            return slots
        out: list[int | None] = []
        current: list[int] = []
        for k in keys:
            if k in stale or k not in stores:
                out.append(self.take_store(rs, k))
            else:
                slot = stores.pop(k)
                current.append(slot)
                out.append(slot)
        self._table.unpin_many(current)
        return out

    # -- a clear ---------------------------------------------------------------------------------

    def cancel(self, rs: RequestState) -> None:
        """A clear dropped every block: the request's loads and stores handed out so far are
        cancelled (a store of them makes nothing visible), their slots stay pinned."""
        for k, slots in rs.load_pins.items():
            rs.cleared_loads.setdefault(k, []).extend(slots)
        rs.load_pins.clear()
        for k, slots in rs.stale_stores.items():
            rs.cleared_stores.setdefault(k, []).extend(slots)
        rs.stale_stores.clear()
        for k, slot in rs.stores.items():
            rs.cleared_stores.setdefault(k, []).append(slot)
        rs.stores.clear()

    def release_cancelled(self, rs: RequestState) -> None:
        """The loads and stores a clear cancelled will never complete: their pins go."""
        unpin = self._table.unpin
        for pins in (rs.cleared_loads, rs.cleared_stores):
            for slots in pins.values():
                for slot in slots:
                    unpin(slot)
            pins.clear()

    # -- requests --------------------------------------------------------------------------------

    def release_request(self, rs: RequestState) -> list[tuple[bytes, int]]:
        """A finished request lets go of everything it held.

        Returns its uncompleted stores ``(key, slot)``: the caller aborts those still pending.
        """
        self._table.unpin_many(rs.promo_pins.values())
        self.share.give_back(rs.promo_pins.values())
        rs.promo_pins.clear()
        unpin = self._table.unpin
        for slots in rs.load_pins.values():
            for slot in slots:
                unpin(slot)
        rs.load_pins.clear()
        abandoned = list(rs.stores.items())
        for _, slot in abandoned:
            unpin(slot)  # an orphan (replaced meanwhile) is freed with its last pin
        rs.stores.clear()
        for slots in rs.stale_stores.values():
            for slot in slots:
                unpin(slot)
        rs.stale_stores.clear()
        self.release_cancelled(rs)
        return abandoned
