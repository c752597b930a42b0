"""The SSD tier's index, sans-IO: which key lives in which slot, and what each slot is doing.

Every change of the index is a plain method call here, with no awaits, threads or files: a
*plan* says what disk work an operation needs (which slot to read, which to write and which
block that evicts, which to clear), and a *completion* applies its outcome. The tier
(:class:`~aiotier.tiers.ssd.SSDTier`) performs the plans on its threads and reports back;
``tests/tiers/test_ssd_index.py`` drives the transitions by hand.

The rules the states keep:

- A block is written to a slot no one reads (:attr:`DiskSlot.WRITING`), never over the live
  copy of its key; the key points at the new slot only when the write completed
  (:meth:`SSDIndex.write_landed`), and the old slot is cleared after.
- A slot leaves the index before it is reused: a removed, replaced or damaged block's slot is
  :attr:`DiskSlot.RETIRING` until its reads have ended and its header has been cleared on
  disk; only then is it :attr:`DiskSlot.FREE` again. So a read never meets another block than
  the one it planned for, and a restart never finds a removed block.
- Eviction takes the least recently used block no read holds; its slot is the new block's.
  A block whose key has a newer write under way goes last and is never handed down (its bytes
  are older than that write's: no tier may get them).
- Writes and removes of one key never overlap (the tier takes turns per key); reads of a key
  may overlap its write and see the old copy.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from enum import IntEnum
from itertools import repeat

__all__ = ["DiskSlot", "SSDIndex", "Victim", "WritePlan"]


class DiskSlot(IntEnum):
    """What a slot is doing (stored as ``SSDIndex.state[slot]``)."""

    #: Holds nothing: its header on disk is cleared (unless marked ``dirty``).
    FREE = 0
    #: A write is filling it: not readable, never evicted.
    WRITING = 1
    #: Holds the current block of one key (in :attr:`SSDIndex.lru`).
    LIVE = 2
    #: Out of the index; waits for its reads to end and its header to be cleared.
    RETIRING = 3


FREE, WRITING, LIVE, RETIRING = (int(s) for s in DiskSlot)


class Victim:
    """A block evicted to make room: its slot is the new block's, so its bytes, if wanted,
    are read before the write (the tier hands them to the tier below)."""

    __slots__ = ("key", "length", "seq", "slot")

    def __init__(self, key: bytes, slot: int, seq: int, length: int) -> None:
        self.key = key
        self.slot = slot
        self.seq = seq
        self.length = length


class WritePlan:
    """What one write needs: the slot, its sequence number, whether the slot's header on disk
    may still be valid (``dirty``: clear it before writing the payload), what it evicts, and
    whether the key had a copy when it was planned (``replaces``: a failed write leaves none)."""

    __slots__ = ("dirty", "key", "length", "replaces", "seq", "slot", "victim")

    def __init__(
        self,
        key: bytes,
        slot: int,
        seq: int,
        length: int,
        dirty: bool,
        victim: Victim | None,
        *,
        replaces: bool = False,
    ) -> None:
        self.key = key
        self.slot = slot
        self.seq = seq
        self.length = length
        self.dirty = dirty
        self.victim = victim
        self.replaces = replaces


class SSDIndex:
    """``slots`` slots and the keys in them, in least-recently-used order.

    Per slot (indexed by slot number): :attr:`state`, the sequence number :attr:`seq`
    and payload :attr:`length` of the block it holds, :attr:`holds` (reads under way, plus one
    while its header is being cleared) and :attr:`dirty`. Per key: :attr:`lru`, key -> slot,
    least recent first.
    """

    __slots__ = (
        "dirty", "free", "holds", "length", "lru", "next_seq", "seq", "slots", "state", "writing"
    )

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.lru: OrderedDict[bytes, int] = OrderedDict()
        self.state = bytearray(slots)
        self.seq = array("Q", bytes(8 * slots))
        self.length = array("Q", bytes(8 * slots))
        #: A list, not an array: a read's pins are a Python pass per slot on the event loop,
        #: and a list's item (a small int, shared) is read and set at half an array's cost.
        self.holds = [0] * slots
        #: 1 for a slot whose header on disk may still be valid although the index holds no
        #: block there (a failed write or clearing): cleared before it is written again.
        self.dirty = bytearray(slots)
        #: FREE slots, the next one to use last (an array: 8 bytes a slot, not a list's 36).
        self.free = array("Q")
        #: The sequence number the next write gets (each write's is larger than any on disk).
        self.next_seq = 1
        #: Keys with a planned write that has not landed or failed yet.
        self.writing: set[bytes] = set()

    def __len__(self) -> int:
        return len(self.lru)

    def __contains__(self, key: object) -> bool:
        return key in self.lru

    # -- building it at open --------------------------------------------------------------------

    def load(self, key: bytes, slot: int, seq: int, length: int) -> None:
        """Add a block found on disk as the most recent (call in LRU order, oldest first)."""
        self.lru[key] = slot
        self.state[slot] = LIVE
        self.seq[slot] = seq
        self.length[slot] = length
        if seq >= self.next_seq:
            self.next_seq = seq + 1

    def load_many(
        self, keys: list[bytes], slots: Sequence[int], seqs: Sequence[int], lengths: Sequence[int]
    ) -> None:
        """:meth:`load` of each block, in order (a checkpoint's thousands at once)."""
        lru, state, seq, length = self.lru, self.state, self.seq, self.length
        top = self.next_seq - 1
        for key, slot, q, n in zip(keys, slots, seqs, lengths, strict=True):
            lru[key] = slot
            state[slot] = LIVE
            seq[slot] = q
            length[slot] = n
            if q > top:
                top = q
        self.next_seq = top + 1

    def loaded(self, dirty: set[int] | frozenset[int] = frozenset()) -> None:
        """Every slot not loaded is free; ``dirty`` names those whose header may be valid."""
        state = self.state
        self.free = array("Q", (s for s in range(self.slots - 1, -1, -1) if state[s] == FREE))
        for s in dirty:
            if state[s] == FREE:
                self.dirty[s] = 1

    def entries(self) -> Iterator[tuple[bytes, int, int, int]]:
        """``(key, slot, seq, length)`` of every block, least recent first."""
        seq, length = self.seq, self.length
        for key, slot in self.lru.items():
            yield key, slot, seq[slot], length[slot]

    def dirty_free(self) -> list[int]:
        """FREE slots whose header may still be valid (saved with a checkpoint)."""
        dirty = self.dirty
        return [s for s in self.free if dirty[s]]

    # -- reads ----------------------------------------------------------------------------------

    def pin(self, key: bytes) -> int:
        """Plan a read of ``key``: its slot, held until :meth:`read_ended`, and the key made
        the most recent; -1 when the index has no block of ``key``."""
        slot = self.lru.get(key)
        if slot is None:
            return -1
        self.holds[slot] += 1
        self.lru.move_to_end(key)
        return slot

    def pin_many(self, keys: Sequence[bytes]) -> list[int]:
        """:meth:`pin` of each key (a promotion's batch in one call)."""
        lru, holds = self.lru, self.holds
        found: list[int] = list(map(lru.get, keys, repeat(-1)))
        held = found
        if -1 in found:
            keys = [k for k, slot in zip(keys, found, strict=True) if slot >= 0]
            held = [slot for slot in found if slot >= 0]
        deque(map(lru.move_to_end, keys), 0)  # each made the most recent, in order
        for slot in held:
            holds[slot] += 1
        return found

    def read_ended(self, slot: int) -> None:
        """A read of ``slot`` (planned by :meth:`pin`) is over, whatever it found."""
        holds = self.holds[slot] - 1
        self.holds[slot] = holds
        if holds == 0 and self.state[slot] == RETIRING:
            self._free(slot)

    def reads_ended(self, slots: Sequence[int]) -> None:
        """:meth:`read_ended` of each slot (a read op's end in one call)."""
        holds, state = self.holds, self.state
        for slot in slots:
            left = holds[slot] - 1
            holds[slot] = left
            if left == 0 and state[slot] == RETIRING:
                self._free(slot)

    def read_failed(self, key: bytes, slot: int, seq: int) -> int:
        """The block a read found at ``slot`` does not verify: drop it from the index if it is
        still there (no write replaced it meanwhile). The slot to clear, else -1."""
        if self.lru.get(key) != slot or self.seq[slot] != seq:
            return -1
        del self.lru[key]
        self._retire(slot)
        return slot

    # -- writes ---------------------------------------------------------------------------------

    def plan_write(self, key: bytes, length: int) -> WritePlan | None:
        """Plan a write of ``length`` bytes under ``key``: a free slot, else the slot of the
        least recently used block no read holds (evicted now). A copy about to be replaced (the
        key's own, or one whose key has a write under way) goes only when nothing else can, and
        is not a victim: its bytes are superseded, so nothing hands them down.
        None when every slot is being written or read: ask again once some work ended."""
        victim: Victim | None = None
        replaces = key in self.lru
        if self.free:
            slot = self.free.pop()
            dirty = bool(self.dirty[slot])
        else:
            found = self._evictable(key)
            if found is None:
                return None
            vkey, slot = found
            del self.lru[vkey]
            if vkey != key and vkey not in self.writing:
                victim = Victim(vkey, slot, self.seq[slot], self.length[slot])
            dirty = True
        self.writing.add(key)
        self.state[slot] = WRITING
        seq = self.next_seq
        self.next_seq = seq + 1
        return WritePlan(key, slot, seq, length, dirty, victim, replaces=replaces)

    def _evictable(self, key: bytes) -> tuple[bytes, int] | None:
        """The least recent block no read holds, preferring one no write is replacing."""
        holds, writing = self.holds, self.writing
        replaced: tuple[bytes, int] | None = None
        for k, s in self.lru.items():
            if holds[s] == 0:
                if k != key and k not in writing:
                    return k, s
                if replaced is None:
                    replaced = (k, s)
        return replaced

    def write_landed(self, plan: WritePlan) -> int:
        """The write (and its ``fdatasync``) completed: the key points at the new slot, the
        most recent. The slot of the copy it replaced, to clear, else -1."""
        slot = plan.slot
        self.writing.discard(plan.key)
        old = self.lru.pop(plan.key, None)
        self.lru[plan.key] = slot
        self.state[slot] = LIVE
        self.seq[slot] = plan.seq
        self.length[slot] = plan.length
        self.dirty[slot] = 0
        if old is None:
            return -1
        self._retire(old)
        return old

    def write_failed(self, plan: WritePlan) -> list[int]:
        """The write failed: the slot may hold part of it, and the key's older copy goes too
        (no tier may serve older bytes once a newer write was accepted). The slots to clear."""
        slot = plan.slot
        self.writing.discard(plan.key)
        self.state[slot] = RETIRING
        self.holds[slot] += 1
        out = [slot]
        old = self.lru.pop(plan.key, None)
        if old is not None:
            self._retire(old)
            out.append(old)
        return out

    # -- removes and clearing -------------------------------------------------------------------

    def plan_remove(self, key: bytes) -> int:
        """Drop ``key`` from the index: the slot to clear, else -1 (the key was absent)."""
        slot = self.lru.pop(key, None)
        if slot is None:
            return -1
        self._retire(slot)
        return slot

    def cleared(self, slot: int, ok: bool) -> None:
        """The clearing of ``slot``'s header ended (``ok``: it reached the file)."""
        self.dirty[slot] = 0 if ok else 1
        holds = self.holds[slot] - 1
        self.holds[slot] = holds
        if holds == 0:
            self._free(slot)

    def _retire(self, slot: int) -> None:
        """Out of the index; held for its clearing (and any reads) before it is free."""
        self.state[slot] = RETIRING
        self.holds[slot] += 1

    def _free(self, slot: int) -> None:
        self.state[slot] = FREE
        self.free.append(slot)
