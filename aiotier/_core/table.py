"""The block table: which key lives in which slot, in what state, pinned by how many users.

Per-slot state lives in flat arrays (one byte of state, one int of pins) and the only per-block
Python objects are the index entry and the key itself, so a million-block table stays small.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from .policy import EvictionPolicy

__all__ = ["FREE", "ORPHAN", "PENDING", "PROMOTING", "READY", "BlockTable"]

FREE = 0
PENDING = 1  # prepared by prepare_store/put, not completed yet
PROMOTING = 2  # reserved for a promotion whose read is in flight
READY = 3  # loadable
ORPHAN = 4  # replaced or deleted while pinned; freed when the last pin goes


class BlockTable:
    """Slot allocation, block states and pins for one primary arena."""

    __slots__ = ("clean", "free", "index", "keys", "pins", "policy", "state")

    def __init__(self, num_blocks: int, policy: EvictionPolicy) -> None:
        self.index: dict[bytes, int] = {}
        self.keys: list[bytes | None] = [None] * num_blocks
        self.state = bytearray(num_blocks)
        self.pins = array("i", [0]) * num_blocks
        # 1 when the slot's bytes are known to be in the first secondary tier unchanged, so a
        # write-back eviction can skip the write.
        self.clean = bytearray(num_blocks)
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.policy = policy

    def __len__(self) -> int:
        return len(self.index)

    def evictable(self, slot: int) -> bool:
        return self.state[slot] == READY and self.pins[slot] == 0

    def allocate(
        self, keys: list[bytes], state: int, protected: Iterable[int] = ()
    ) -> tuple[list[int], list[tuple[bytes, int, int]]] | None:
        """Give each key (none present in the index) a slot in ``state``, evicting by policy.

        Returns ``(slots, evicted)`` where ``evicted`` lists ``(key, slot, clean)`` of the victims
        (their bytes are still in the arena until the new owner writes: copy them before
        awaiting), or
        ``None`` with nothing changed when not enough unpinned blocks exist.
        """
        need = len(keys) - len(self.free)
        evicted: list[tuple[bytes, int, int]] = []
        if need > 0:
            guard = frozenset(protected)
            ok = self.evictable
            victims = self.policy.evict(need, (lambda s: ok(s) and s not in guard) if guard else ok)
            if victims is None:
                return None
            for s in victims:
                k = self.keys[s]
                assert k is not None
                del self.index[k]
                self.keys[s] = None
                self.state[s] = FREE
                self.free.append(s)
                evicted.append((k, s, self.clean[s]))
        slots: list[int] = []
        for k in keys:
            s = self.free.pop()
            self.index[k] = s
            self.keys[s] = k
            self.state[s] = state
            self.pins[s] = 0
            self.clean[s] = 0
            self.policy.insert(s, k)
            slots.append(s)
        return slots, evicted

    def release(self, slot: int) -> None:
        """Return ``slot`` to the free list now (failed promotion, aborted store, delete)."""
        k = self.keys[slot]
        if k is not None and self.index.get(k) == slot:
            del self.index[k]
        self.keys[slot] = None
        self.policy.remove(slot)
        self.state[slot] = FREE
        self.pins[slot] = 0
        self.free.append(slot)

    def detach(self, slot: int) -> None:
        """Take ``slot`` out of the index: freed now if unpinned, else when its last pin goes."""
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

    def unpin(self, slot: int) -> None:
        n = self.pins[slot] - 1
        if n < 0:
            raise RuntimeError(f"slot {slot} unpinned more often than pinned")
        self.pins[slot] = n
        if n == 0 and self.state[slot] == ORPHAN:
            self.release(slot)

    def unpin_all(self) -> None:
        """Drop every pin (the engine closed: nobody can complete a load or store any more)."""
        self.pins = array("i", bytes(self.pins.itemsize * len(self.pins)))
