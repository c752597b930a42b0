"""The block table: which key lives in which slot, in what state, pinned by how many users.

Per-slot state lives in lists of small ints (state, pins, clean flags), which the interpreter
indexes and stores into on its fast paths (an ``array`` or ``bytearray`` item goes through the
generic protocol, about twice the cost in a per-slot loop; a list costs 8 bytes a slot). The only
per-block Python objects are the index entry and the key itself. Every write to those lists
happens in a method of this class: the lifecycle of a slot is

    FREE -> PENDING (a store in progress) -> READY
    FREE -> PROMOTING (a promotion read in flight) -> READY
    any state -> ORPHAN (replaced or deleted while pinned) -> FREE at its last unpin
    READY -> FREE (evicted by policy)
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from .deadlines import Deadlines
from .gather import gather
from .policy import EvictionPolicy

__all__ = [
    "FREE",
    "NO_EVICTIONS",
    "ORPHAN",
    "PENDING",
    "PROMOTING",
    "READY",
    "BlockTable",
    "Evictions",
    "SlotState",
]


class SlotState(enum.IntEnum):
    """The state of one primary slot (stored as a plain int per slot: the module's constants
    below)."""

    FREE = 0
    PENDING = 1
    """Prepared by ``prepare_store``, not completed yet."""
    PROMOTING = 2
    """Reserved for a promotion whose read is in flight."""
    READY = 3
    """Loadable."""
    ORPHAN = 4
    """Replaced or deleted while pinned; freed when the last pin goes."""


# plain ints, as the state list holds: comparisons of two exact ints take the interpreter's
# fast path, an IntEnum member does not
FREE: Final = int(SlotState.FREE)
PENDING: Final = int(SlotState.PENDING)
PROMOTING: Final = int(SlotState.PROMOTING)
READY: Final = int(SlotState.READY)
ORPHAN: Final = int(SlotState.ORPHAN)

class Evictions:
    """The victims of one allocation, as parallel sequences: their keys, their slots and whether
    each one's bytes were clean (1) or not (0). The bytes are still in the arena until the new
    owners write: copy them before awaiting."""

    __slots__ = ("clean", "keys", "slots")

    def __init__(
        self, keys: Sequence[bytes], slots: Sequence[int], clean: Sequence[int]
    ) -> None:
        self.keys = keys
        self.slots = slots
        self.clean = clean

    def __iter__(self) -> Iterator[tuple[bytes, int, bool]]:
        """Each victim as ``(key, slot, clean)``."""
        return zip(self.keys, self.slots, map(bool, self.clean), strict=True)


NO_EVICTIONS: Final = Evictions((), (), ())


class BlockTable:
    """Slot allocation, block states and pins for one primary arena.

    ``index``, ``state``, ``pins``, ``step_holds`` and ``deadlines.at`` are read directly on hot
    paths; they are never replaced, so an alias taken once stays valid. A slot's deadline (a
    block with a TTL) goes when the slot is freed or reused.

    A slot is pinned while its ``pins`` count is above zero or it is in ``step_holds``: the
    holds that all go at the next step boundary (anonymous callers' RETRY pins), at most one per
    slot, kept as a set so that taking and dropping a batch of them is one C-level call each. A
    hold keeps a block for a caller coming back to load it by key: detaching the block drops its
    hold, so an orphan is never held.
    """

    __slots__ = (
        "_clean",
        "_evictable",
        "deadlines",
        "free",
        "index",
        "keys",
        "pins",
        "policy",
        "state",
        "step_holds",
    )

    def __init__(self, num_blocks: int, policy: EvictionPolicy) -> None:
        self.index: dict[bytes, int] = {}
        self.keys: list[bytes | None] = [None] * num_blocks
        self.state = [0] * num_blocks
        self.pins = [0] * num_blocks
        self.step_holds: set[int] = set()
        # 1 when the slot's bytes are known to be in the first secondary tier unchanged, so a
        # write-back eviction can skip the write.
        self._clean = [0] * num_blocks
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.policy = policy
        self.deadlines: Deadlines[int] = Deadlines()
        self._evictable = _Evictable(self.state, self.pins, self.step_holds, frozenset())

    def __len__(self) -> int:
        return len(self.index)

    # -- questions -----------------------------------------------------------------------------

    def ready_slot(self, key: bytes) -> int | None:
        """The slot of ``key`` if it is loadable now."""
        slot = self.index.get(key)
        return slot if slot is not None and self.state[slot] == READY else None

    def all_ready(self, keys: Sequence[bytes]) -> bool:
        """Whether every key is loadable now (two C-level gathers: cheap for a whole batch)."""
        try:
            return gather(self.state, gather(self.index, keys)).count(READY) == len(keys)
        except (KeyError, TypeError):  # absent, or not a key at all
            return False

    def live_ready(self, keys: Sequence[bytes]) -> bool:
        """:meth:`all_ready`, and none of them holds a block with a TTL (whose deadline the
        slow path checks): one more C-level test, only while some slot has a deadline."""
        try:
            slots = gather(self.index, keys)
            if gather(self.state, slots).count(READY) != len(keys):
                return False
        except (KeyError, TypeError):  # absent, or not a key at all
            return False
        at = self.deadlines.at
        return not at or at.keys().isdisjoint(slots)

    def owns_all(self, keys: Sequence[bytes], slots: Sequence[int]) -> bool:
        """Whether each slot is still the current slot of its key."""
        try:
            return gather(self.index, keys) == tuple(slots)
        except (KeyError, TypeError):
            return False

    def owns(self, key: bytes, slot: int) -> bool:
        """Whether ``slot`` is still the current slot of ``key`` (not replaced or deleted)."""
        return self.index.get(key) == slot

    def is_clean(self, slot: int) -> bool:
        return bool(self._clean[slot])

    def pinned(self) -> int:
        """How many slots hold at least one pin (or a step hold)."""
        pins = self.pins
        return len(pins) - pins.count(0) + sum(1 for s in self.step_holds if not pins[s])

    # -- transitions ---------------------------------------------------------------------------

    def allocate(
        self, keys: list[bytes], state: int, protected: Iterable[int] = ()
    ) -> tuple[list[int], Evictions] | None:
        """Give each key a slot in ``state``, evicting by policy. A key present in the index is
        pointed at its new slot (the caller then detaches the old one: a replacement).

        Returns ``(slots, evicted)`` where ``evicted`` names the victims (their bytes are still
        in the arena until the new owner writes: copy them before awaiting), or ``None`` with
        nothing changed when not enough unpinned blocks exist.
        """
        n = len(keys)
        if not n:
            return [], NO_EVICTIONS
        free, index, owners, states = self.free, self.index, self.keys, self.state
        clean = self._clean
        need = n - len(free)
        evicted = NO_EVICTIONS
        # a full arena: every slot is a victim, evicted and inserted again by one policy move
        recycled = need == n
        if need > 0:
            evictable = self._evictable_except(protected)
            if recycled:
                victims = self.policy.recycle(keys, evictable)
            else:
                victims = self.policy.evict(need, evictable)
            if victims is None:
                return None
            if len(victims) == 1:  # (a put's one victim: no gather calls)
                v = victims[0]
                key = owners[v]
                assert key is not None  # a resident slot holds its key
                gone: Sequence[bytes] = (key,)
                flags: Sequence[int] = (clean[v],)
            else:
                gone, flags = gather(owners, victims), gather(clean, victims)
            evicted = Evictions(gone, victims, flags)
            for k in gone:
                del index[k]
            if self.deadlines.at:
                for v in victims:
                    self.deadlines.drop(v)
        if recycled:
            slots = list(evicted.slots)
        else:
            free += evicted.slots  # each victim is reused below: it is never seen free
            slots = free[-n:]
            slots.reverse()
            del free[-n:]
        # free slots and evicted ones have no pins: only the owner, state and flag change
        index.update(zip(keys, slots, strict=True))
        st = int(state)  # a plain int in the list, never an IntEnum member
        for k, s in zip(keys, slots, strict=True):
            owners[s] = k
            states[s] = st
        if st == READY:  # (a pending or promoting block's flag is set when it becomes READY)
            for s in slots:
                clean[s] = 0
        if not recycled:
            self.policy.insert_many(slots, keys)
        return slots, evicted

    def _evictable_except(self, protected: Iterable[int]) -> _Evictable:
        if not protected:
            return self._evictable  # (the common case: kept, not built per allocation)
        return _Evictable(self.state, self.pins, self.step_holds, frozenset(protected))

    def eviction_candidates(self, n: int, protected: Iterable[int] = ()) -> list[bytes]:
        """The keys :meth:`allocate` would evict now to place ``n`` more keys (maybe fewer)."""
        need = n - len(self.free)
        if need <= 0:
            return []
        slots = self.policy.candidates(need, self._evictable_except(protected))
        return [self.keys[s] for s in slots]  # type: ignore[misc]

    def allocate_prefix(
        self, keys: list[bytes], state: int, protected: Iterable[int] = ()
    ) -> tuple[list[int], Evictions]:
        """:meth:`allocate` for the longest leading run of ``keys`` that fits (maybe none)."""
        got = self.allocate(keys, state, protected)
        if got is None:
            ok = self._evictable_except(protected)
            room = len(self.free) + sum(1 for s in self.policy.order() if ok(s))
            got = self.allocate(keys[:room], state, protected)
            assert got is not None, "the evictable slots were counted just now"
        return got

    def promoted(self, slots: list[int], *, clean: bool) -> None:
        """Promotion reads landed in ``slots``: READY, and each read's own pin released."""
        states, pins, flags = self.state, self.pins, self._clean
        if gather(states, slots).count(PROMOTING) != len(slots):
            slot = next(s for s in slots if states[s] != PROMOTING)
            raise RuntimeError(f"slot {slot} is {SlotState(states[slot]).name}, not promoting")
        flag = 1 if clean else 0
        ready = int(READY)
        for slot in slots:
            states[slot] = ready
            flags[slot] = flag
            pins[slot] -= 1

    def mark_ready(self, slot: int, *, clean: bool) -> None:
        """A pending store completed or a promotion landed: the block is loadable."""
        st = self.state[slot]
        if st != PENDING and st != PROMOTING:
            raise RuntimeError(f"slot {slot} is {SlotState(st).name}, not pending or promoting")
        self.state[slot] = READY
        self._clean[slot] = 1 if clean else 0

    def mark_ready_many(self, slots: list[int], *, clean: bool) -> None:
        """:meth:`mark_ready` of each slot (all of them pending or promoting, else none)."""
        state = self.state
        states = gather(state, slots)
        if states.count(PENDING) + states.count(PROMOTING) != len(slots):
            slot = next(s for s in slots if state[s] != PENDING and state[s] != PROMOTING)
            name = SlotState(state[slot]).name
            raise RuntimeError(f"slot {slot} is {name}, not pending or promoting")
        flags, flag = self._clean, 1 if clean else 0
        for slot in slots:
            state[slot] = READY
            flags[slot] = flag

    def stores_landed(self, slots: list[int]) -> None:
        """Pending stores into ``slots`` completed (every one PENDING, which the caller checked
        in one pass): loadable, and not known to any tier."""
        state, flags = self.state, self._clean
        ready = int(READY)
        for slot in slots:
            state[slot] = ready
            flags[slot] = 0

    def set_clean(self, slot: int, clean: bool) -> None:
        """Whether the first secondary tier holds exactly this slot's bytes."""
        self._clean[slot] = 1 if clean else 0

    def set_clean_many(self, slots: Iterable[int], clean: bool) -> None:
        """:meth:`set_clean` of each slot."""
        flags, flag = self._clean, 1 if clean else 0
        for slot in slots:
            flags[slot] = flag

    def touch(self, slot: int) -> None:
        """The block in ``slot`` was used (for the eviction policy)."""
        self.policy.touch(slot)

    def touch_many(self, slots: list[int]) -> None:
        """:meth:`touch` of each slot, in order."""
        self.policy.touch_many(slots)

    def refresh(self, slot: int) -> None:
        """The block in ``slot`` was just stored: its first use, not a further one."""
        self.policy.refresh(slot)

    def refresh_many(self, slots: list[int]) -> None:
        """:meth:`refresh` of each slot, in order."""
        self.policy.refresh_many(slots)

    def release(self, slot: int) -> None:
        """Return ``slot`` to the free list now."""
        k = self.keys[slot]
        if k is not None and self.index.get(k) == slot:
            del self.index[k]
        self.keys[slot] = None
        self.policy.remove(slot)
        self.deadlines.at.pop(slot, None)
        self.state[slot] = FREE
        self.pins[slot] = 0
        self.free.append(slot)

    def detach(self, slot: int) -> None:
        """Take ``slot`` out of the index, and its step hold with it: freed now if unpinned,
        else when its last pin goes."""
        self.step_holds.discard(slot)
        if self.pins[slot] > 0:
            k = self.keys[slot]
            if k is not None and self.index.get(k) == slot:
                del self.index[k]
            self.policy.remove(slot)
            self.state[slot] = ORPHAN
        else:
            self.release(slot)

    def pin(self, slot: int) -> None:
        self.pins[slot] += 1

    def pin_many(self, slots: Iterable[int]) -> None:
        pins = self.pins
        for slot in slots:
            pins[slot] += 1

    def unpin_many(self, slots: Iterable[int]) -> None:
        pins, states = self.pins, self.state
        for slot in slots:
            n = pins[slot] - 1
            if n < 0:
                raise RuntimeError(f"slot {slot} unpinned more often than pinned")
            pins[slot] = n
            if not n and states[slot] == ORPHAN:
                self.release(slot)

    def unpin(self, slot: int) -> None:
        n = self.pins[slot] - 1
        if n < 0:
            raise RuntimeError(f"slot {slot} unpinned more often than pinned")
        self.pins[slot] = n
        if n == 0 and self.state[slot] == ORPHAN:
            self.release(slot)

    def hold_until_step(self, slots: Iterable[int]) -> None:
        """A hold on each of ``slots`` until the next step boundary (one per slot: a slot held
        already stays held once)."""
        self.step_holds.update(slots)

    def drop_step_hold(self, slot: int) -> None:
        """The hold on ``slot`` goes before the step boundary."""
        self.step_holds.discard(slot)

    def end_step_holds(self) -> None:
        """The step boundary: every step hold goes (none is on an orphan: :meth:`detach`)."""
        self.step_holds.clear()


class _Evictable:
    """READY, unpinned (no pin, no step hold) and not protected: one slot by call, a run of
    them by ``all``."""

    __slots__ = ("_guard", "_holds", "_pins", "_states")

    def __init__(
        self, states: list[int], pins: list[int], holds: set[int], guard: frozenset[int]
    ) -> None:
        self._states = states
        self._pins = pins
        self._holds = holds
        self._guard = guard

    def __call__(self, s: int) -> bool:
        return (
            self._states[s] == READY
            and self._pins[s] == 0
            and s not in self._guard
            and s not in self._holds
        )

    def all(self, slots: Sequence[int]) -> bool:
        n = len(slots)
        return (
            gather(self._states, slots).count(READY) == n
            and gather(self._pins, slots).count(0) == n
            and self._guard.isdisjoint(slots)
            and self._holds.isdisjoint(slots)
        )

    def among(self, slots: Sequence[int]) -> list[int]:
        """The evictable ones of ``slots``, in order, from C-level gathers (a run still pending
        is turned down after one)."""
        states = gather(self._states, slots)
        ready = states.count(READY)
        if not ready:
            return []
        pins, n, guard, holds = gather(self._pins, slots), len(slots), self._guard, self._holds
        if (
            ready == n
            and pins.count(0) == n
            and (not guard or guard.isdisjoint(slots))
            and (not holds or holds.isdisjoint(slots))
        ):
            return list(slots)
        return [s for s, st, pn in zip(slots, states, pins, strict=True)
                if st == READY and not pn and s not in guard and s not in holds]  # fmt: skip
