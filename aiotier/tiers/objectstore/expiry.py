"""Blocks with an expiry in an object store: the expiry travels in the object's frame
(:func:`~aiotier.tiers.framing.frame_expiry`), is checked whenever a body is read, and what is
found past it is answered as a MISS and deleted.

The tier also remembers the expiry of objects it wrote or read recently (a bounded map), because
it answers lookups of those from memory without a request. A key dropped from that map is still
never served past its expiry: the engine checks the expiry the value carries when it reads it.
Deleting an expired object may race with another engine writing the key afresh (the bucket is
shared): that costs the other engine a MISS, never wrong bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from ..._types import Buffer
from ..framing import frame_expiry

__all__ = ["ObjectExpiry"]

#: Objects whose expiry is remembered at most (the oldest entries go first).
_REMEMBERED: Final = 65_536


class ObjectExpiry:
    """What one object tier knows of its objects' expiry, and the expired ones to delete."""

    __slots__ = ("_clock", "_known", "_pending", "expirations")

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._known: dict[str, float] = {}
        self._pending: set[str] = set()
        #: Objects found past their expiry (answered MISS, queued for deletion).
        self.expirations = 0

    def wrote(self, name: str, expires_at: float | None) -> None:
        """``name`` was written (or read) with this expiry (None: none)."""
        known = self._known
        known.pop(name, None)
        if expires_at is not None:
            known[name] = expires_at
            if len(known) > _REMEMBERED:
                del known[next(iter(known))]

    def past(self, name: str) -> bool:
        """Whether ``name`` is known to be past its expiry (then counted and queued)."""
        t = self._known.get(name)
        if t is None or self._clock() < t:
            return False
        self._expired(name)
        return True

    def frame_past(self, name: str, frame: Buffer) -> bool:
        """Whether the frame read for ``name`` is past its expiry (then counted and queued);
        a live one's expiry is remembered."""
        t = frame_expiry(frame)
        if t is not None and self._clock() >= t:
            self._expired(name)
            return True
        self.wrote(name, t)
        return False

    def _expired(self, name: str) -> None:
        self._known.pop(name, None)
        if name not in self._pending:
            self.expirations += 1
            self._pending.add(name)

    def take_pending(self) -> list[str]:
        """The expired objects to delete now."""
        out = sorted(self._pending)
        self._pending.clear()
        return out

    def forget(self, name: str) -> None:
        """``name`` was removed."""
        self._known.pop(name, None)
        self._pending.discard(name)

    def clear(self) -> None:
        self._known.clear()
        self._pending.clear()
