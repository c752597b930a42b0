"""Recency as vLLM's own managers keep it: what a request used counts when it finishes.

vLLM 0.32 and 0.33's scheduler never calls ``touch``. Its CPU manager records the keys each
request loaded and offered for storing, grouped by KV-cache group in prefix order, and at
``on_request_finished`` walks them tail to head, so the head of a prefix ends up the most
recently used and is evicted last. A key the request only inserted counts as a first use (ARC
keeps it among the blocks seen once); a key it reused (loaded, or offered again while ready)
as a further use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import cast

__all__ = ["RequestAccess", "walk_tail_to_head"]

_GROUP_BYTES = itemgetter(slice(-4, None))


@dataclass(slots=True)
class RequestAccess:
    """The keys one request used, in the order first seen."""

    order: dict[bytes, None] = field(default_factory=dict)
    inserted: set[bytes] = field(default_factory=set)
    reused: set[bytes] = field(default_factory=set)

    def saw(
        self,
        keys: Iterable[bytes],
        *,
        inserted: Iterable[bytes] = (),
        reused: Iterable[bytes] = (),
    ) -> None:
        self.order.update(dict.fromkeys(keys))  # a key seen before keeps its place
        if inserted:
            self.inserted.update(inserted)
        if reused:
            # reading a block this request inserted is its own transfer, not a second use
            self.reused.update(set(reused).difference(self.inserted))

    def head_to_tail(self, position: Callable[[bytes], int | None] | None) -> list[bytes]:
        """Every key, groups in index order (each in the order first seen); by token position
        when each key has one."""
        keys = list(self.order)
        if len(set(map(_GROUP_BYTES, keys))) > 1:  # keys with one last 4 bytes: one group
            keys.sort(key=_group)  # stable: first seen first within a group
        if position is not None and keys and position(keys[0]) is not None:
            positions = list(map(position, keys))
            if None not in positions:
                by_key = dict(zip(keys, cast(list[int], positions), strict=True))
                keys.sort(key=by_key.__getitem__)
        return keys


def walk_tail_to_head(
    access: RequestAccess,
    position: Callable[[bytes], int | None] | None,
    touch: Callable[[Sequence[bytes], bool], None],
) -> None:
    """Call ``touch(run, first_use)`` over the request's keys from tail to head, one call per
    run of keys of the same kind: reused (a further use) or not (inserted, or offered while
    absent: their recency alone)."""
    keys = access.head_to_tail(position)
    keys.reverse()
    if not keys:
        return
    if not access.reused:
        touch(keys, True)
        return
    reused = list(map(access.reused.__contains__, keys))
    start, n = 0, len(keys)
    while start < n:
        kind = reused[start]
        try:
            end = reused.index(not kind, start)
        except ValueError:
            end = n
        touch(keys[start:end], not kind)
        start = end


def _group(key: bytes) -> int:
    """A key's KV-cache group: its last 4 bytes, big-endian (0 for a shorter key)."""
    return int.from_bytes(key[-4:], "big") if len(key) >= 4 else 0
