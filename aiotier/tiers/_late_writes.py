"""Writes a networked tier gave up on, which the server may still carry out later.

A write cut short by the tier's timeout or a lost connection is not known to have failed: its
request may sit in the server's socket buffer (a stalled server, a paused VM) and land after a
later write or remove of the same key, bringing older bytes back. The engine stops reading a
key from a tier whose write failed until a later one succeeds, so only the tier can tell a
late copy from a good one: it remembers the checksums of the payloads whose writes were cut
short, and once a later write or remove of the key was acknowledged, a copy with one of those
checksums (and not the acknowledged write's) is a late write: reported absent. Any other copy
is served: the tier's own acknowledged write, or another engine's.

Plain synchronous code, no I/O: the tier calls it around its round trips. A key stays doubted
until the tier is garbage-collected, as the server gives no sign that a dead connection's
requests are all done; at most :data:`MAX_DOUBTED` keys are kept (the oldest doubt is
forgotten first, with a warning), a bound a server that stalls now and then never comes near.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from .._types import Buffer
from .framing import checksum

__all__ = ["MAX_DOUBTED", "LateWriteGuard"]

#: Keys doubted at most (a few hundred bytes each).
MAX_DOUBTED = 1 << 18


class _Doubt:
    """The payloads of one key whose writes were cut short."""

    __slots__ = ("pending", "superseded")

    def __init__(self) -> None:
        #: Checksums of writes cut short since the last acknowledged write or remove: any of
        #: them may be the newest bytes tried, so a copy of them is served.
        self.pending: set[int] = set()
        #: Checksums of writes cut short before a later write or remove was acknowledged: a
        #: copy of them landed late, and is never served.
        self.superseded: set[int] = set()

    def acknowledged(self, written: int | None) -> None:
        """A write (of the payload whose checksum is ``written``) or a remove (None)."""
        # bytes cut short before and now acknowledged are right, until a later write or
        # remove: then a late copy of them is late too
        again = written in self.pending or written in self.superseded
        self.superseded |= self.pending
        self.pending.clear()
        if again:
            self.superseded.discard(written)
            self.pending.add(written)  # type: ignore[arg-type]


class LateWriteGuard:
    """Server keys whose writes were cut short, and which copies of them never to read."""

    __slots__ = ("_doubts", "forgotten", "log", "what")

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self.log = log
        self._doubts: dict[bytes, _Doubt] = {}
        #: Doubts dropped to stay within :data:`MAX_DOUBTED`.
        self.forgotten = 0

    def __bool__(self) -> bool:
        return bool(self._doubts)

    def __len__(self) -> int:
        return len(self._doubts)

    def cut_short(self, items: Iterable[tuple[bytes, Buffer]]) -> None:
        """Writes of these ``(key, payload)`` may have been sent and were never answered: any
        of them may land later."""
        doubts = self._doubts
        for key, payload in items:
            doubt = doubts.pop(key, None) or _Doubt()
            doubts[key] = doubt  # the most recent doubt goes last
            c = checksum(payload)
            doubt.pending.add(c)
            doubt.superseded.discard(c)  # the newest bytes tried again
        over = len(doubts) - MAX_DOUBTED
        if over > 0:
            for key in list(doubts)[:over]:
                del doubts[key]
            if not self.forgotten:
                self.log.warning(
                    "%s: more than %d keys with a write cut short; the oldest are trusted "
                    "again (a late write of them could bring older bytes back)",
                    self.what, MAX_DOUBTED,
                )  # fmt: skip
            self.forgotten += over

    def written(self, key: bytes, payload: Buffer) -> None:
        """A write of ``key`` was acknowledged: writes of it cut short before are late now."""
        doubt = self._doubts.get(key)
        if doubt is not None:
            doubt.acknowledged(checksum(payload))

    def removed(self, key: bytes) -> None:
        """A remove of ``key`` was acknowledged: writes of it cut short before are late now."""
        doubt = self._doubts.get(key)
        if doubt is not None:
            doubt.acknowledged(None)

    def cleared(self) -> None:
        """Every key was deleted: writes cut short before are late now."""
        for doubt in self._doubts.values():
            doubt.acknowledged(None)

    def screen(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview], outcomes: list[int | Exception]
    ) -> int:
        """Reads of ``keys`` landed in ``bufs`` (per key its length, -1 or an error): each copy
        that is a late write becomes -1 in ``outcomes``. How many there were."""
        doubts = self._doubts
        late = 0
        for i, key in enumerate(keys):
            n = outcomes[i]
            doubt = doubts.get(key)
            if (
                doubt is not None
                and doubt.superseded
                and type(n) is int
                and n >= 0
                and checksum(bufs[i][:n]) in doubt.superseded
            ):
                outcomes[i] = -1
                late += 1
        return late
