"""Eviction policies for the primary arena, behind one small slot-based interface.

``evict(n, evictable)`` is atomic: it returns exactly ``n`` victims (already removed from the
policy) or ``None`` with nothing changed, so a failed allocation never disturbs recency.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from itertools import islice, pairwise

from .gather import gather

__all__ = ["ARCPolicy", "Evictable", "EvictionPolicy", "LRUPolicy"]

#: Whether a slot may be evicted now. It may also have ``all(slots) -> bool`` and
#: ``among(slots) -> list[int]`` (the evictable ones, in order), faster answers for a run of
#: slots (the block table's has them: C-level gathers), which policies may use.
Evictable = Callable[[int], bool]


def _all_evictable(evictable: Evictable, slots: Sequence[int]) -> bool:
    check: Callable[[Sequence[int]], bool] | None = getattr(evictable, "all", None)
    if check is not None:
        return check(slots)
    return all(evictable(s) for s in slots)


def _consume(calls: Iterator[object]) -> None:
    """Run an iterator of calls to the end at C speed (their results dropped)."""
    deque(calls, maxlen=0)


def _among(evictable: Evictable) -> Callable[[Sequence[int]], list[int]]:
    """``evictable.among`` (the evictable ones of a run of slots, in order), or the same answer
    from ``all`` and per-slot calls."""
    among: Callable[[Sequence[int]], list[int]] | None = getattr(evictable, "among", None)
    if among is not None:
        return among

    def one_by_one(slots: Sequence[int]) -> list[int]:
        if _all_evictable(evictable, slots):
            return list(slots)
        return list(filter(evictable, slots))

    return one_by_one


def _evictable_run(slots: Iterator[int], n: int, evictable: Evictable) -> list[int]:
    """The next ``n`` evictable slots of ``slots`` (fewer when it runs out), a run of them
    checked at once."""
    among = _among(evictable)
    out: list[int] = []
    while len(out) < n:
        run = list(islice(slots, n - len(out)))
        if not run:
            break
        out += among(run)
    return out


class EvictionPolicy(ABC):
    """Orders resident slots for eviction."""

    @abstractmethod
    def insert(self, slot: int, key: bytes) -> None:
        """``slot`` now holds ``key`` (most recently used)."""

    def insert_many(self, slots: list[int], keys: list[bytes]) -> None:
        """:meth:`insert` of each pair, in order."""
        for slot, key in zip(slots, keys, strict=True):
            self.insert(slot, key)

    @abstractmethod
    def touch(self, slot: int) -> None:
        """``slot`` was used (again)."""

    def touch_many(self, slots: list[int]) -> None:
        """:meth:`touch` of each slot, in order (the last one the most recent)."""
        for slot in slots:
            self.touch(slot)

    def refresh(self, slot: int) -> None:  # noqa: B027 - optional hook
        """The first use of ``slot``'s block completes now (its store finished): the most
        recent in its place, without counting as a further use (ARC keeps it in T1)."""

    def refresh_many(self, slots: list[int]) -> None:
        """:meth:`refresh` of each slot, in order (the last one the most recent)."""
        for slot in slots:
            self.refresh(slot)

    @abstractmethod
    def remove(self, slot: int) -> None:
        """``slot`` left the arena other than by eviction (deleted, failed, replaced)."""

    @abstractmethod
    def evict(self, n: int, evictable: Evictable) -> list[int] | None:
        """Choose and remove ``n`` victims among slots for which ``evictable`` is true."""

    def recycle(self, keys: list[bytes], evictable: Evictable) -> list[int] | None:
        """:meth:`evict` ``len(keys)`` victims and :meth:`insert_many` them again for ``keys``
        (slot ``i`` for key ``i``): a full arena's allocation, which reuses every victim at
        once. A policy may do both in one move."""
        victims = self.evict(len(keys), evictable)
        if victims is not None:
            self.insert_many(victims, keys)
        return victims

    @abstractmethod
    def candidates(self, n: int, evictable: Evictable) -> list[int]:
        """The victims :meth:`evict` would choose now, in order, without removing them (fewer
        than ``n`` when not enough are evictable): what an admission policy weighs."""

    @abstractmethod
    def order(self) -> list[int]:
        """Resident slots, next victim first (for tests and inspection)."""


class LRUPolicy(EvictionPolicy):
    """Least recently used, as an intrusive doubly linked list over slot numbers.

    Two lists of ``num_blocks + 1`` slot numbers (the last is the sentinel): 16 bytes per block,
    the numbers themselves shared with the table's; lists, not arrays, because the interpreter
    indexes them on its fast path (the per-slot loops of eviction and insertion cost half).
    """

    __slots__ = ("_next", "_nil", "_prev", "_sentinel")

    def __init__(self, num_blocks: int) -> None:
        self._sentinel = s = num_blocks
        self._nil = nil = num_blocks + 1  # the link of a slot that is not in the list
        self._next = [nil] * (num_blocks + 1)
        self._prev = [nil] * (num_blocks + 1)
        self._next[s] = s
        self._prev[s] = s

    def _link_mru(self, slot: int) -> None:
        s = self._sentinel
        last = self._prev[s]
        self._next[last] = slot
        self._prev[slot] = last
        self._next[slot] = s
        self._prev[s] = slot

    def _unlink(self, slot: int) -> None:
        p = self._prev[slot]
        n = self._next[slot]
        self._next[p] = n
        self._prev[n] = p
        self._next[slot] = self._nil
        self._prev[slot] = self._nil

    def insert(self, slot: int, key: bytes) -> None:
        if self._next[slot] != self._nil:
            self._unlink(slot)
        self._link_mru(slot)

    def insert_many(self, slots: list[int], keys: list[bytes]) -> None:
        nxt, prv, s, nil = self._next, self._prev, self._sentinel, self._nil
        if not slots:
            return
        if len(slots) == 1:  # (a put's block: insert inlined)
            slot = slots[0]
            if nxt[slot] != nil:
                self._unlink(slot)
            tail = prv[s]
            nxt[tail] = slot
            prv[slot] = tail
            nxt[slot] = s
            prv[s] = slot
            return
        if gather(nxt, slots).count(nil) != len(slots) or len(
            set(slots)
        ) != len(slots):
            super().insert_many(slots, keys)  # some are linked already: one at a time
            return
        # none is linked: chain them, then splice the chain in before the sentinel
        for a, b in pairwise(slots):
            nxt[a] = b
            prv[b] = a
        first, last, tail = slots[0], slots[-1], prv[s]
        nxt[tail] = first
        prv[first] = tail
        nxt[last] = s
        prv[s] = last

    def touch(self, slot: int) -> None:
        if self._next[slot] != self._nil and self._prev[self._sentinel] != slot:
            self._unlink(slot)
            self._link_mru(slot)

    refresh = touch  # recency is all LRU knows

    def refresh_many(self, slots: list[int]) -> None:
        nxt, prv, s, nil = self._next, self._prev, self._sentinel, self._nil
        if len(slots) > 1 and gather(nxt, slots[:-1]) == tuple(slots[1:]):
            # a run already linked in this order (as insert_many links a batch): moved whole
            if nxt[slots[-1]] != s:
                self._move_run_to_tail(slots[0], slots[-1])
            return
        for slot in slots:  # touch, inlined: a completed store refreshes every block it wrote
            if nxt[slot] == nil or prv[s] == slot:
                continue
            p, n = prv[slot], nxt[slot]
            nxt[p] = n
            prv[n] = p
            last = prv[s]
            nxt[last] = slot
            prv[slot] = last
            nxt[slot] = s
            prv[s] = slot

    touch_many = refresh_many  # touch is refresh: recency is all LRU knows

    def remove(self, slot: int) -> None:
        if self._next[slot] != self._nil:
            self._unlink(slot)

    def evict(self, n: int, evictable: Evictable) -> list[int] | None:
        s = self._sentinel
        nxt, prv, nil = self._next, self._prev, self._nil
        # the common case: the n least recent are all evictable, a run cut out whole
        run: list[int] = []
        take = run.append
        cur = nxt[s]
        for _ in range(n):
            if cur == s:
                return None  # fewer than n resident
            take(cur)
            cur = nxt[cur]
        if n and (evictable(run[0]) if n == 1 else _all_evictable(evictable, run)):
            nxt[s] = cur
            prv[cur] = s
            for v in run:
                nxt[v] = nil
            return run
        victims: list[int] = []
        cur = nxt[s]
        while cur != s and len(victims) < n:
            if evictable(cur):
                victims.append(cur)
            cur = nxt[cur]
        if len(victims) < n:
            return None
        for v in victims:
            p, q = prv[v], nxt[v]
            nxt[p] = q
            prv[q] = p
            nxt[v] = prv[v] = nil
        return victims

    def recycle(self, keys: list[bytes], evictable: Evictable) -> list[int] | None:
        s, nxt = self._sentinel, self._next
        # the common case: the n least recent are all evictable, a run moved whole to the tail
        run: list[int] = []
        take = run.append
        cur = nxt[s]
        for _ in range(len(keys)):
            if cur == s:
                return None  # fewer than n resident
            take(cur)
            cur = nxt[cur]
        if not run or not (evictable(run[0]) if len(run) == 1 else _all_evictable(evictable, run)):
            return super().recycle(keys, evictable)
        if cur != s:  # else the run is the whole list, in order already
            self._move_run_to_tail(run[0], run[-1])
        return run

    def _move_run_to_tail(self, first: int, last: int) -> None:
        """Move the linked run ``first`` … ``last`` (not at the tail) to the most recent end."""
        nxt, prv, s = self._next, self._prev, self._sentinel
        before, after, tail = prv[first], nxt[last], prv[s]
        nxt[before] = after
        prv[after] = before
        nxt[tail] = first
        prv[first] = tail
        nxt[last] = s
        prv[s] = last

    def candidates(self, n: int, evictable: Evictable) -> list[int]:
        out: list[int] = []
        s, nxt = self._sentinel, self._next
        cur = nxt[s]
        while cur != s and len(out) < n:
            if evictable(cur):
                out.append(cur)
            cur = nxt[cur]
        return out

    def order(self) -> list[int]:
        out = []
        s = self._sentinel
        cur = self._next[s]
        while cur != s:
            out.append(cur)
            cur = self._next[cur]
        return out


class ARCPolicy(EvictionPolicy):
    """Adaptive Replacement Cache (Megiddo & Modha, FAST 2003) over slots.

    ``T1`` holds blocks seen once recently, ``T2`` blocks seen at least twice; the ghost lists
    ``B1``/``B2`` remember keys recently evicted from each. A re-insert of a ghost key moves the
    target size ``p`` of ``T1`` towards recency (B1 hit) or frequency (B2 hit), so a scan cannot
    flush a frequently used working set the way it flushes LRU.
    """

    __slots__ = ("_b1", "_b2", "_c", "_t1", "_t2", "p")

    def __init__(self, num_blocks: int) -> None:
        self._c = num_blocks
        self.p = 0.0
        self._t1: OrderedDict[int, bytes] = OrderedDict()
        self._t2: OrderedDict[int, bytes] = OrderedDict()
        self._b1: OrderedDict[bytes, None] = OrderedDict()
        self._b2: OrderedDict[bytes, None] = OrderedDict()

    def insert(self, slot: int, key: bytes) -> None:
        self.remove(slot)
        if key in self._b1:
            self.p = min(float(self._c), self.p + max(len(self._b2) / len(self._b1), 1.0))
            del self._b1[key]
            self._t2[slot] = key
        elif key in self._b2:
            self.p = max(0.0, self.p - max(len(self._b1) / len(self._b2), 1.0))
            del self._b2[key]
            self._t2[slot] = key
        else:
            self._t1[slot] = key
        self._trim_ghosts()

    def insert_many(self, slots: list[int], keys: list[bytes]) -> None:
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        if len(slots) != len(keys):
            raise ValueError(f"{len(keys)} keys for {len(slots)} slots")
        if (
            t1.keys().isdisjoint(slots)
            and t2.keys().isdisjoint(slots)
            and b1.keys().isdisjoint(keys)
            and b2.keys().isdisjoint(keys)
            and len(set(slots)) == len(slots)
        ):  # the common case: new slots, no ghost key. Each insert appends to T1 and trims the
            # ghosts from their oldest end down to bounds that only tighten as T1 grows, so
            # appending them all then trimming once leaves the same lists
            t1.update(zip(slots, keys, strict=True))
            self._trim_ghosts()
            return
        for slot, key in zip(slots, keys, strict=True):
            self.insert(slot, key)

    def _trim_ghosts(self) -> None:
        """Drop the oldest ghosts until ``|T1| + |B1| <= c`` and all four lists hold at most
        ``2c`` (B1 first: its trim is part of the total)."""
        t1, b1, b2, c = self._t1, self._b1, self._b2, self._c
        over = min(len(b1), len(t1) + len(b1) - c)
        if over > 0:
            for key in list(islice(b1, over)):
                del b1[key]
        over = min(len(b2), len(t1) + len(self._t2) + len(b1) + len(b2) - 2 * c)
        if over > 0:
            for key in list(islice(b2, over)):
                del b2[key]

    def touch(self, slot: int) -> None:
        key = self._t1.pop(slot, None)
        if key is not None:
            self._t2[slot] = key
        elif slot in self._t2:
            self._t2.move_to_end(slot)

    def refresh(self, slot: int) -> None:
        if slot in self._t1:
            self._t1.move_to_end(slot)
        elif slot in self._t2:
            self._t2.move_to_end(slot)

    def refresh_many(self, slots: list[int]) -> None:
        t1, t2 = self._t1, self._t2
        try:  # the common case: stores completing, all in T1
            _consume(map(t1.move_to_end, slots))
            return
        except KeyError:  # the first slot not in T1 stopped it; the ones before it moved
            slots = slots[next(i for i, s in enumerate(slots) if s not in t1) :]
        for slot in slots:
            if slot in t1:
                t1.move_to_end(slot)
            elif slot in t2:
                t2.move_to_end(slot)

    def remove(self, slot: int) -> None:
        if self._t1.pop(slot, None) is None:
            self._t2.pop(slot, None)

    def _runs(self, n: int, evictable: Evictable) -> tuple[list[int], list[int], list[int]]:
        """REPLACE, n times: take from T1 while it is above its target size p, else from T2;
        fall back to the other list when the preferred one has nothing evictable. As p stays
        put meanwhile: T1's first len(T1) - floor(p), then T2's, then the rest of T1's."""
        it1, it2 = iter(self._t1), iter(self._t2)
        above = max(0, len(self._t1) - math.floor(self.p))
        first = _evictable_run(it1, min(n, above), evictable)
        if len(first) == n:
            return first, [], []
        second = _evictable_run(it2, n - len(first), evictable)
        third = _evictable_run(it1, n - len(first) - len(second), evictable)
        return first, second, third

    def candidates(self, n: int, evictable: Evictable) -> list[int]:
        first, second, third = self._runs(n, evictable)
        return first + second + third

    def evict(self, n: int, evictable: Evictable) -> list[int] | None:
        first, second, third = self._runs(n, evictable)
        if len(first) + len(second) + len(third) < n:
            return None
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        for v in first:  # each victim's key becomes the newest ghost of its list
            b1[t1.pop(v)] = None
        for v in second:
            b2[t2.pop(v)] = None
        for v in third:
            b1[t1.pop(v)] = None
        self._trim_ghosts()
        return first + second + third

    def order(self) -> list[int]:
        return [*self._t1, *self._t2]
