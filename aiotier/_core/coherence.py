"""Tier readability: which tier may serve which key, so that no tier ever serves older bytes.

A put, store or delete of a key changes its newest bytes in the primary at once, while the tiers
below catch up through queued writes and removes. Until they do, a tier may hold an older copy,
and reading it would resurrect old bytes. :meth:`Coherence.may_read` is the one question every
read path asks; a tier is not read for a key while:

- a remove of the key is queued for it (a put or delete superseded its copy);
- its last write or remove of the key failed (``stale``: it may still hold an older copy);
- a promotion of the key from it failed moments ago (back-off, cleared by a put or delete);
- the whole tier is being cleared, or its last clear failed (``unread``: any key).

Bytes on their way down (``in_transit``: copied out of the primary, write not finished) are the
newest copy below the primary and are served from memory before any tier is asked. They may
sit in a staging buffer the engine reuses once their write is over: whatever leaves the engine
is a copy (:meth:`Coherence.down_copy`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from .stats import StepStats

__all__ = ["Coherence", "Hint"]

_K = TypeVar("_K", bound=Hashable)

#: A tier's ``contains_hint``: whether it holds a key, known without I/O, or None.
Hint = Callable[[bytes], "bool | None"]
#: a tier's ``contains_hints``: the hint of each key at once
BatchHint = Callable[[list[bytes]], "list[bool | None]"]


class Coherence:
    """Per tier: keys with queued writes and removes, stale keys, back-offs; bytes going down."""

    __slots__ = (
        "_backoff",
        "_batch_hints",
        "_clearing",
        "_clock",
        "_failed",
        "_hints",
        "_names",
        "_removing",
        "_stale",
        "_stats",
        "_writing",
        "backoff_seconds",
        "in_transit",
    )

    def __init__(
        self,
        names: Sequence[str],
        hints: Sequence[Hint],
        stats: StepStats,
        clock: Callable[[], float],
        backoff_seconds: float,
        batch_hints: Sequence[BatchHint] = (),
    ) -> None:
        n = len(names)
        self._names = tuple(names)
        self._hints = tuple(hints)
        self._batch_hints = tuple(batch_hints) or tuple(map(_key_by_key, hints))
        self._stats = stats
        self._clock = clock
        self.backoff_seconds = backoff_seconds
        self._writing: list[Counter[bytes]] = [Counter() for _ in range(n)]
        self._removing: list[Counter[bytes]] = [Counter() for _ in range(n)]
        self._stale: list[set[bytes]] = [set() for _ in range(n)]
        self._backoff: dict[tuple[int, bytes], float] = {}  # (tier, key) -> until
        # a tier with a clear under way, or whose last clear failed, is not read at all
        self._clearing: Counter[int] = Counter()  # tier -> clears under way
        self._failed: set[int] = set()  # tiers whose last clear failed
        #: key -> its newest bytes, copied out of the primary and on their way down
        self.in_transit: dict[bytes, bytes | memoryview] = {}

    # -- questions -------------------------------------------------------------------------------

    def may_read(self, ti: int, k: bytes) -> bool:
        """Whether tier ``ti`` may serve ``k`` now."""
        if k in self._removing[ti] or k in self._stale[ti] or not self.readable_tier(ti):
            return False
        until = self._backoff.get((ti, k))
        if until is None:
            return True
        if self._clock() < until:
            return False
        del self._backoff[(ti, k)]
        return True

    def all_readable(self, ti: int) -> bool:
        """True when no key can be unreadable in tier ``ti`` (one check per batch, not per key)."""
        return not (
            self._removing[ti] or self._stale[ti] or self._backoff or self._clearing or self._failed
        )

    def holds(self, ti: int, k: bytes) -> bool | None:
        """Whether tier ``ti`` holds the newest bytes of ``k``, as far as known without I/O.

        None when it cannot tell (a remote tier) or its copy may be stale. A hint that raises
        is counted as a tier error and means "cannot tell".
        """
        if k in self._stale[ti] or not self.readable_tier(ti):
            return None
        try:
            return self._hints[ti](k)
        except Exception:
            self._stats.count("tier_errors", self._names[ti], "hint")
            return None

    def writing(self, ti: int, k: bytes) -> bool:
        """A write of ``k`` to tier ``ti`` is queued or running."""
        return k in self._writing[ti]

    def removing(self, ti: int, k: bytes) -> bool:
        """A remove of ``k`` from tier ``ti`` is queued or running."""
        return k in self._removing[ti]

    def kept(self, ti: int, keys: list[bytes]) -> set[bytes]:
        """Of ``keys``, those whose copy tier ``ti`` was known to hold is still there: no
        remove of it is queued, it is not stale, and the tier does not say it lost it."""
        removing, stale, hint = self._removing[ti], self._stale[ti], self._hints[ti]
        out: set[bytes] = set()
        if not self.readable_tier(ti):
            return out
        if not removing and not stale:
            try:
                held = self._batch_hints[ti](keys)
            except Exception:
                pass  # counted below, key by key
            else:
                if False not in held:
                    return set(keys)
                return {k for k, h in zip(keys, held, strict=True) if h is not False}
        for k in keys:
            if k in removing or k in stale:
                continue
            try:
                if hint(k) is False:
                    continue
            except Exception:
                self._stats.count("tier_errors", self._names[ti], "hint")
            out.add(k)  # held, or cannot tell: the copy is presumed where it was
        return out

    def older_copies(self, ti: int, keys: Iterable[bytes]) -> list[bytes]:
        """Of ``keys``, those tier ``ti`` may hold an older copy of: a write of it is queued or
        running, or the tier does not say it has none (:meth:`holds` is not False). One call
        for a put's keys, not three per key."""
        if not self.readable_tier(ti):
            return list(keys)
        writing, stale, hint = self._writing[ti], self._stale[ti], self._hints[ti]
        out: list[bytes] = []
        for k in keys:
            if k not in writing and k not in stale:
                try:
                    if hint(k) is False:
                        continue
                except Exception:
                    self._stats.count("tier_errors", self._names[ti], "hint")
            out.append(k)
        return out

    def is_stale(self, ti: int, k: bytes) -> bool:
        """The last write or remove of ``k`` in tier ``ti`` failed."""
        return k in self._stale[ti]

    def stale_keys(self, ti: int) -> list[bytes]:
        return list(self._stale[ti])

    # -- transitions -----------------------------------------------------------------------------

    def back_off(self, ti: int, k: bytes) -> None:
        """A promotion of ``k`` from tier ``ti`` failed: do not read it there for a while."""
        self._backoff[(ti, k)] = self._clock() + self.backoff_seconds

    def replaced(self, k: bytes) -> None:
        """A put, store or delete made new bytes (or none) the newest: every back-off and
        every older copy on its way down is moot."""
        if self._backoff:
            for ti in range(len(self._names)):
                self._backoff.pop((ti, k), None)
        self.in_transit.pop(k, None)

    def replaced_many(self, keys: Iterable[bytes]) -> None:
        """:meth:`replaced` of each key."""
        if self._backoff:
            for k in keys:
                self.replaced(k)
        elif self.in_transit:
            pop = self.in_transit.pop
            for k in keys:
                pop(k, None)

    def clearing(self, ti: int) -> None:
        """Tier ``ti`` is about to drop every block: read nothing from it until it has (and
        until every other clear under way has too)."""
        self._clearing[ti] += 1

    def cleared(self, ti: int, *, ok: bool) -> None:
        """A clear of tier ``ti`` finished: empty, every stale key and back-off there is moot.
        After a failed one the tier may hold anything older: it stays unread until a clear
        succeeds."""
        _decrement(self._clearing, ti)
        if ok:
            self._failed.discard(ti)
            self._stale[ti].clear()
            for key in [key for key in self._backoff if key[0] == ti]:
                del self._backoff[key]
        else:
            self._failed.add(ti)

    def readable_tier(self, ti: int) -> bool:
        """Tier ``ti`` is not being cleared, and its last clear (if any) succeeded."""
        return ti not in self._clearing and ti not in self._failed

    def unread_tiers(self) -> list[int]:
        """Tiers not read at all (being cleared, or their last clear failed)."""
        return sorted(self._failed.union(self._clearing))

    def prune_backoff(self) -> None:
        """Forget back-offs that ran out (called at step boundaries; cheap when few)."""
        if len(self._backoff) > 4096:
            now = self._clock()
            self._backoff = {key: u for key, u in self._backoff.items() if u > now}

    def write_queued(self, ti: int, k: bytes) -> None:
        writing = self._writing[ti]
        writing[k] = writing.get(k, 0) + 1  # (no Counter.__missing__ call)

    def remove_queued(self, ti: int, k: bytes) -> None:
        self._removing[ti][k] += 1

    def writes_done(self, ti: int, keys: Iterable[bytes]) -> None:
        """Writes of ``keys`` to tier ``ti`` ended (applied, failed or dropped)."""
        writing = self._writing[ti]
        for k in keys:
            n = writing[k] - 1
            if n > 0:
                writing[k] = n
            else:
                writing.pop(k, None)

    def remove_done(self, ti: int, k: bytes) -> None:
        _decrement(self._removing[ti], k)

    def outcome(self, ti: int, k: bytes, *, ok: bool) -> None:
        """A write or remove of ``k`` reached tier ``ti`` (``ok``) or failed: after a failure
        the tier may hold an older copy, so it is not read until a later one succeeds."""
        if ok:
            self._stale[ti].discard(k)
        else:
            self._stale[ti].add(k)

    def outcomes_ok(self, ti: int, keys: Iterable[bytes]) -> None:
        """:meth:`outcome` ``ok`` of each key (one call for a batch)."""
        stale = self._stale[ti]
        if stale:
            stale.difference_update(keys)

    def down_copy(self, k: bytes) -> bytes | None:
        """The bytes of ``k`` on their way down, as a copy the caller may keep; None if none."""
        data = self.in_transit.get(k)
        return None if data is None else bytes(data)

    def landed_many(self, writes: Iterable[tuple[bytes, bytes | memoryview]]) -> None:
        """Demotion writes of ``(key, data)`` finished: once no tier still writes a key, its
        bytes are below and no longer served from memory (unless newer bytes replaced them)."""
        in_transit, writing = self.in_transit, self._writing
        for k, data in writes:
            if in_transit.get(k) is data:
                for w in writing:
                    if k in w:
                        break
                else:
                    del in_transit[k]

    def busy(self) -> bool:
        """Writes or removes are queued or running somewhere."""
        return any(self._writing) or any(self._removing)


def _decrement(counter: Counter[_K], k: _K) -> None:
    n = counter[k] - 1
    if n <= 0:
        del counter[k]
    else:
        counter[k] = n


def _key_by_key(hint: Hint) -> BatchHint:
    """The batch form of a per-key hint."""
    return lambda keys: list(map(hint, keys))
