"""Writes a networked tier gave up on, which the server may still carry out later.

A write cut short by the tier's timeout or a lost connection is not known to have failed: its
request may sit in the server's socket buffer (a stalled server, a paused VM) and land after a
later write or remove of the same key, bringing older bytes back. So may the first attempt of
a write that a client library sent again after a reset connection. The engine stops reading a
key from a tier whose write failed until a later one succeeds, so only the tier can tell a
late copy from a good one: it remembers the checksums of the payloads whose writes were cut
short, and once a later write or remove of the key was acknowledged, a copy with one of those
checksums (and not the acknowledged write's) is a late write: reported absent. A copy with
other bytes is served: the tier's own acknowledged write, or another engine's.

Plain synchronous code, no I/O: the tier calls it around its round trips. A key stays doubted
for as long as the tier lives, as the server gives no sign that a dead connection's requests
are all done; at most :data:`MAX_DOUBTED` keys are kept, and :data:`MAX_PER_KEY` checksums per
key (the oldest doubt is forgotten first, with a warning), bounds a server that stalls now and
then never comes near.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from ..._types import Buffer
from ..framing import checksum

__all__ = ["MAX_DOUBTED", "MAX_PER_KEY", "LateWriteGuard"]

#: A key on the server: a Redis key, an object's name.
_Key = bytes | str

#: Keys doubted at most (about 400 bytes each with their key: ~25 MiB at the bound).
MAX_DOUBTED = 1 << 16
#: Checksums remembered per key at most.
MAX_PER_KEY = 16


class _Doubt:
    """The payloads of one key whose writes were cut short (tuples: a doubt holds one or two
    checksums, and a tuple is a fraction of a set's size)."""

    __slots__ = ("acked", "pending", "superseded")

    def __init__(self) -> None:
        #: Checksums of writes cut short since the last acknowledged write or remove: any of
        #: them may be the newest bytes tried, so a copy of them is served.
        self.pending: tuple[int, ...] = ()
        #: Checksums of writes cut short before a later write or remove was acknowledged: a
        #: copy of them landed late, and is never served (oldest first).
        self.superseded: tuple[int, ...] = ()
        #: When the last write or remove of the key was acknowledged (the guard's count).
        self.acked = 0

    def tried(self, c: int) -> None:
        """A write of the payload whose checksum is ``c`` was cut short: the newest bytes
        tried."""
        if c not in self.pending:
            self.pending += (c,)
        if c in self.superseded:
            self.superseded = tuple(x for x in self.superseded if x != c)

    def acknowledged(self, written: int | None, when: int) -> int:
        """A write (of the payload whose checksum is ``written``) or a remove (None). Returns
        how many checksums were dropped to stay within :data:`MAX_PER_KEY`."""
        # bytes cut short before and now acknowledged are right, until a later write or
        # remove: then a late copy of them is late too
        again = written in self.pending or written in self.superseded
        late = self.superseded + tuple(c for c in self.pending if c not in self.superseded)
        self.pending = ()
        if again and written is not None:
            late = tuple(c for c in late if c != written)
            self.pending = (written,)
        over = max(len(late) - MAX_PER_KEY, 0)
        self.superseded = late[over:]
        self.acked = when
        return over


class LateWriteGuard:
    """Server keys whose writes were cut short, and which copies of them never to read."""

    __slots__ = ("_acks", "_doubts", "forgotten", "log", "what")

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self.log = log
        self._doubts: OrderedDict[_Key, _Doubt] = OrderedDict()
        self._acks = 0  # acknowledgements of doubted keys so far (orders them against a clear)
        #: Doubts dropped to stay within :data:`MAX_DOUBTED` and :data:`MAX_PER_KEY`.
        self.forgotten = 0

    def __bool__(self) -> bool:
        return bool(self._doubts)

    def __len__(self) -> int:
        return len(self._doubts)

    def cut_short(self, items: Iterable[tuple[_Key, Buffer]]) -> None:
        """Writes of these ``(key, payload)`` may have been sent and were never answered (or
        were sent again): any of them may land later."""
        doubts = self._doubts
        for key, payload in items:
            doubt = doubts.get(key)
            if doubt is None:
                doubt = doubts[key] = _Doubt()
            else:
                doubts.move_to_end(key)  # the most recent doubt goes last
            doubt.tried(checksum(payload))
        over = 0
        while len(doubts) > MAX_DOUBTED:
            doubts.popitem(last=False)
            over += 1
        self._forgot(over)

    def written(self, key: _Key, payload: Buffer) -> None:
        """A write of ``key`` was acknowledged: writes of it cut short before are late now."""
        self._acknowledged(key, payload)

    def removed(self, key: _Key) -> None:
        """A remove of ``key`` was acknowledged: writes of it cut short before are late now."""
        self._acknowledged(key, None)

    def _acknowledged(self, key: _Key, payload: Buffer | None) -> None:
        doubt = self._doubts.get(key)
        if doubt is not None:  # the checksum only for a doubted key
            self._acks += 1
            written = None if payload is None else checksum(payload)
            self._forgot(doubt.acknowledged(written, self._acks))

    def clear_started(self) -> int:
        """A clear of every key begins: the token for :meth:`cleared`."""
        return self._acks

    def cleared(self, started: int) -> None:
        """The clear that began at ``started`` deleted every key: writes cut short before it
        are late now, but for keys whose write was acknowledged while it ran."""
        self._acks += 1
        for doubt in self._doubts.values():
            if doubt.acked <= started:
                self._forgot(doubt.acknowledged(None, self._acks))

    def refuses_any(self, key: _Key) -> bool:
        """Whether some copy of ``key`` is never to be read (worth checking a lookup's hit)."""
        doubt = self._doubts.get(key)
        return doubt is not None and bool(doubt.superseded)

    def refuses(self, key: _Key, payload_checksum: int) -> bool:
        """Whether a copy of ``key`` whose payload has this checksum landed late."""
        doubt = self._doubts.get(key)
        return doubt is not None and payload_checksum in doubt.superseded

    def screen(
        self, keys: Sequence[_Key], bufs: Sequence[memoryview], outcomes: list[int | Exception]
    ) -> int:
        """Reads of ``keys`` landed in ``bufs`` (per key its length, -1 or an error): each copy
        that is a late write becomes -1 in ``outcomes``. How many there were."""
        doubts, late = self._doubts, 0
        for i, key in enumerate(keys):
            n, doubt = outcomes[i], doubts.get(key)
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

    def _forgot(self, n: int) -> None:
        if n and not self.forgotten:
            self.log.warning(
                "%s: more than %d keys (or %d payloads of one key) with a write cut short; the "
                "oldest are trusted again (a late write of them could bring older bytes back)",
                self.what, MAX_DOUBTED, MAX_PER_KEY,
            )  # fmt: skip
        self.forgotten += n
