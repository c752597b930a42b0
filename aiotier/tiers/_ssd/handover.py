"""Blocks the SSD tier evicted for the tier below, from their eviction until the engine took them.

An evicted block is still found while it is on its way down, so a block in transit is never a
miss: first as *leaving* (the write that evicted it reads its slot before overwriting it), then
as *handed* bytes in memory until ``take_evictions()``, then for one more round as *taken* bytes,
for reads already under way when the engine took them. A newer write or a remove of the key
drops its bytes in transit (no tier serves older bytes than the newest).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

__all__ = ["HANDOVER_MAX_BYTES", "Handover"]

#: Evicted bytes kept for the tier below before the oldest are dropped (engine not taking).
HANDOVER_MAX_BYTES: Final = 256 << 20


class Handover:
    """Keys leaving, bytes handed and taken; the order the engine takes them in."""

    __slots__ = ("_bytes", "_queue", "handed", "leaving", "taken")

    def __init__(self) -> None:
        #: key -> futures of reads waiting for the write that reads the key's slot.
        self.leaving: dict[bytes, list[asyncio.Future[None]]] = {}
        #: key -> payload read from its slot, until :meth:`take`.
        self.handed: dict[bytes, bytes] = {}
        #: What the last :meth:`take` gave the engine (reads under way may still want it).
        self.taken: dict[bytes, bytes] = {}
        self._queue: deque[tuple[bytes, bytes]] = deque()
        self._bytes = 0

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is on its way down and not taken yet."""
        return key in self.leaving or key in self.handed

    def __bool__(self) -> bool:
        return bool(self.leaving or self.handed or self.taken)

    def leave(self, key: bytes) -> object:
        """``key`` was evicted; a write will read its bytes. The token to hand to
        :meth:`arrived` (a key may leave again before an earlier read of it arrived: reads
        waiting for the earlier bytes then wait for these, and the earlier read is ignored)."""
        waiters = [*self.leaving.get(key, ())]  # a new list (the token); the futures carry over
        self.leaving[key] = waiters
        return waiters

    def arrived(self, key: bytes, token: object, payload: bytes | None) -> None:
        """The write read the bytes of ``key`` (None: they did not verify). Wakes the reads
        that waited for them; ignored when a newer write or a remove dropped the key since."""
        waiters = self.leaving.get(key)
        if waiters is None or waiters is not token:
            return  # superseded while its slot was being read
        del self.leaving[key]
        if payload is not None:
            self.handed[key] = payload
            self._queue.append((key, payload))
            self._bytes += len(payload)
            while self._bytes > HANDOVER_MAX_BYTES and self._queue:
                old, data = self._queue.popleft()
                self._bytes -= len(data)
                if self.handed.get(old) is data:
                    del self.handed[old]
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait(self, key: bytes) -> None:
        """Until the bytes of a leaving ``key`` arrived (or were dropped)."""
        waiters = self.leaving.get(key)
        if waiters is not None:
            fut = asyncio.get_running_loop().create_future()
            waiters.append(fut)
            await fut

    def payload(self, key: bytes) -> bytes | None:
        data = self.handed.get(key)
        return self.taken.get(key) if data is None else data

    async def read_into(self, key: bytes, view: memoryview, tier_name: str) -> int:
        """The bytes of ``key`` in transit copied into ``view`` (a flat byte view) once its
        slot was read: their length, or -1 when there are none (dropped, or they did not
        verify). A ``ValueError`` when ``view`` is too short."""
        await self.wait(key)
        data = self.payload(key)
        if data is None:
            return -1
        if len(data) > view.nbytes:
            raise ValueError(
                f"ssd tier {tier_name!r}: block {key[:64]!r} is {len(data)} bytes, buffer "
                f"holds {view.nbytes}"
            )
        view[: len(data)] = data
        return len(data)

    def supersede(self, key: bytes) -> bool:
        """Forget the bytes of ``key`` in transit (a newer write or a remove); whether there
        were any."""
        had = key in self
        waiters = self.leaving.pop(key, None)
        for fut in waiters or ():
            if not fut.done():
                fut.set_result(None)
        self.taken.pop(key, None)
        if self.handed.pop(key, None) is not None:
            self._queue = deque((k, d) for k, d in self._queue if k != key)
            self._bytes = sum(len(d) for _k, d in self._queue)
        return had

    def take(self) -> list[tuple[bytes, bytes]]:
        """Everything handed since the last call, oldest first."""
        out = list(self._queue)
        self._queue.clear()
        self._bytes = 0
        self.taken, self.handed = self.handed, {}
        return out

    def clear(self) -> None:
        self.taken.clear()

    def drop_all(self) -> None:
        """Forget every block in transit (the tier is being cleared): :meth:`supersede` of
        every key at once (one key at a time would rebuild the queue once per key)."""
        for waiters in self.leaving.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        self.leaving.clear()
        self.handed.clear()
        self.taken.clear()
        self._queue.clear()
        self._bytes = 0
