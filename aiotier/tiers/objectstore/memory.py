"""What an object tier knows of its objects without asking the bucket, by object name.

A request costs milliseconds and the bucket is shared, so the tier keeps three things it
learned from its own requests (sans-IO: the tier does the requests and reports what they
found here):

- Names it wrote or read soundly within the last ``recent_ttl`` seconds (at most
  ``recent_capacity``, the oldest forgotten first) are there: lookups and ``contains_hint``
  answer them without a request, and ``immutable_keys`` writes skip them. A name that may be
  gone (a remove was sent, a request found nothing) is forgotten at once.
- Objects it refused (bytes that failed verification, a write cut short that landed late) are
  remembered by ETag: lookups answer MISS for that ETag without another GET, until a sound copy
  is read or the tier writes the key. They are not deleted: the bucket is shared, and a DELETE
  could race with another engine's fresh write of the key. At most :data:`REFUSED_CAPACITY`,
  the oldest forgotten first.
- Objects it wrote and has not seen gone, with their frame sizes: the tier's ``usage``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final

__all__ = ["REFUSED_CAPACITY", "ObjectMemory"]

#: Refused objects remembered at most.
REFUSED_CAPACITY: Final = 4096


class _Recent:
    """Object names seen within the last ``ttl`` seconds (at most ``capacity`` of them)."""

    __slots__ = ("_clock", "_names", "capacity", "ttl")

    def __init__(self, capacity: int, ttl: float, clock: Callable[[], float]) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self._clock = clock
        self._names: OrderedDict[str, float] = OrderedDict()

    def add(self, name: str) -> None:
        if self.capacity <= 0:
            return
        names = self._names
        names[name] = self._clock() + self.ttl
        names.move_to_end(name)
        while len(names) > self.capacity:
            names.popitem(last=False)

    def fresh(self, name: str) -> bool:
        until = self._names.get(name)
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._names[name]
        return False

    def drop(self, name: str) -> None:
        self._names.pop(name, None)

    def clear(self) -> None:
        self._names.clear()


class ObjectMemory:
    """Recent names, refused ETags and written sizes of one tier's objects."""

    __slots__ = ("_recent", "_refused", "_sizes", "written_bytes")

    def __init__(self, recent_capacity: int, recent_ttl: float, clock: Callable[[], float]) -> None:
        self._recent = _Recent(recent_capacity, recent_ttl, clock)
        self._refused: OrderedDict[str, str] = OrderedDict()  # name -> ETag, oldest first
        self._sizes: dict[str, int] = {}  # name -> frame size, of objects this tier wrote
        #: The frame sizes of :attr:`written_objects`, summed.
        self.written_bytes = 0

    @property
    def written_objects(self) -> int:
        """Objects this tier wrote and has not seen gone."""
        return len(self._sizes)

    def fresh(self, name: str) -> bool:
        """Whether ``name`` was written or read within the last ``recent_ttl`` seconds."""
        return self._recent.fresh(name)

    def refused(self, name: str, etag: str) -> bool:
        """Whether the object ``name`` with this ETag was refused."""
        return self._refused.get(name) == etag

    def seen(self, name: str) -> None:
        """``name`` is there now (the bucket already held an immutable key)."""
        self._recent.add(name)

    def verified(self, name: str) -> None:
        """A copy of ``name`` passed verification: whatever was refused of it is gone."""
        self._refused.pop(name, None)
        self._recent.add(name)

    def written(self, name: str, size: int) -> None:
        """This tier's write of a ``size``-byte frame to ``name`` was acknowledged."""
        self._refused.pop(name, None)
        self._recent.add(name)
        self.written_bytes += size - self._sizes.get(name, 0)
        self._sizes[name] = size

    def removing(self, name: str) -> None:
        """A remove of ``name`` is under way: the bucket is asked about it again."""
        self._recent.drop(name)

    def gone(self, name: str) -> None:
        """``name`` is not there (a request found nothing, or a remove was acknowledged)."""
        self._recent.drop(name)
        size = self._sizes.pop(name, None)
        if size is not None:
            self.written_bytes -= size

    def refuse(self, name: str, etag: str) -> None:
        """The object ``name`` with this ETag is never to be served: answered as gone while
        its ETag stays ``etag`` (the newest :data:`REFUSED_CAPACITY` refusals)."""
        self.gone(name)
        refused = self._refused
        refused[name] = etag
        refused.move_to_end(name)
        while len(refused) > REFUSED_CAPACITY:
            refused.popitem(last=False)

    def clear(self) -> None:
        """Every object may be gone (the tier cleared the prefix)."""
        self._recent.clear()
        self._refused.clear()
        self._sizes.clear()
        self.written_bytes = 0
