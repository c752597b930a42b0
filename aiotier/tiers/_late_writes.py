"""Writes a networked tier gave up on, which the server may still carry out later.

A write cut short by the tier's timeout or a lost connection is not known to have failed: its
request may sit in the server's socket buffer (a stalled server, a paused VM) and land after a
later write of the same key succeeded, bringing the older bytes back. The engine stops reading
a key from a tier whose write failed until a later one succeeds, but only the tier can tell
which copy on the server is the one it last wrote. So the tier remembers, per key whose write
was cut short, the checksum of the only copy it trusts since (None: no copy, as after a cut
short write or a remove), and a read that finds any other copy reports the key absent.

Plain synchronous code, no I/O: the tier calls it around its round trips. A key stays doubted
until the tier is closed, as the server gives no sign that a dead connection's requests are
all done; at most :data:`MAX_DOUBTED` keys are kept (the oldest doubt is forgotten first, with
a warning), a bound a server that stalls now and then never comes near.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Final

from .framing import checksum

__all__ = ["MAX_DOUBTED", "LateWriteGuard"]

#: Keys doubted at most (about 200 bytes each).
MAX_DOUBTED: Final = 1 << 18


class LateWriteGuard:
    """Server keys whose last write was cut short, and the copy each may still be read as."""

    __slots__ = ("_trusted", "forgotten", "log", "what")

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self.log = log
        #: server key -> checksum of the payload this tier last wrote there, or None.
        self._trusted: dict[bytes, int | None] = {}
        #: Doubts dropped to stay within :data:`MAX_DOUBTED`.
        self.forgotten = 0

    def __bool__(self) -> bool:
        return bool(self._trusted)

    def __len__(self) -> int:
        return len(self._trusted)

    def cut_short(self, keys: Iterable[bytes]) -> None:
        """Writes of ``keys`` were sent, or may have been, and never answered: any copy of them
        on the server may be older than the engine's, until this tier writes them again."""
        trusted = self._trusted
        for key in keys:
            trusted.pop(key, None)
            trusted[key] = None
        over = len(trusted) - MAX_DOUBTED
        if over > 0:
            for key in list(trusted)[:over]:
                del trusted[key]
            if not self.forgotten:
                self.log.warning(
                    "%s: more than %d keys with a write cut short; the oldest are trusted "
                    "again (a late write of them could bring older bytes back)",
                    self.what, MAX_DOUBTED,
                )  # fmt: skip
            self.forgotten += over

    def written(self, key: bytes, payload: memoryview | bytes) -> None:
        """A write of ``key`` was acknowledged: only its copy is read from now on."""
        if key in self._trusted:
            self._trusted[key] = checksum(payload)

    def removed(self, key: bytes) -> None:
        """A remove of ``key`` was acknowledged: no copy is read from now on."""
        if key in self._trusted:
            self._trusted[key] = None

    def cleared(self) -> None:
        """Every key was deleted: a copy found later is a late write."""
        trusted = self._trusted
        for key in trusted:
            trusted[key] = None

    def trusts_none(self, key: bytes) -> bool:
        """No copy of ``key`` on the server may be read."""
        return key in self._trusted and self._trusted[key] is None

    def screen(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview], outcomes: list[int | Exception]
    ) -> list[bytes]:
        """Reads of ``keys`` that landed in ``bufs`` (per key its length, -1 or an error):
        each doubted key whose bytes are not the trusted copy becomes -1 in ``outcomes``. The
        keys so found (a late write landed: the caller deletes them)."""
        trusted = self._trusted
        late: list[bytes] = []
        for i, key in enumerate(keys):
            n = outcomes[i]
            if type(n) is int and n >= 0 and key in trusted:
                want = trusted[key]
                if want is None or checksum(bufs[i][:n]) != want:
                    outcomes[i] = -1
                    trusted[key] = None
                    late.append(key)
        return late
