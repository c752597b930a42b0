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

__all__ = ["RequestAccess", "walk_tail_to_head"]


@dataclass(slots=True)
class RequestAccess:
    """The keys one request used, in the order first seen, per KV-cache group."""

    groups: dict[int, list[bytes]] = field(default_factory=dict)
    seen: set[bytes] = field(default_factory=set)
    inserted: set[bytes] = field(default_factory=set)
    reused: set[bytes] = field(default_factory=set)

    def saw(
        self, keys: Iterable[bytes], *, inserted: Iterable[bytes] = (), reused: Iterable[bytes] = ()
    ) -> None:
        for k in keys:
            if k not in self.seen:
                self.seen.add(k)
                self.groups.setdefault(_group(k), []).append(k)
        self.inserted.update(inserted)
        # reading a block this request inserted is its own transfer, not a second use
        self.reused.update(k for k in reused if k not in self.inserted)

    def head_to_tail(self, position: Callable[[bytes], int | None] | None) -> list[bytes]:
        """Every key, groups in index order; by token position when each key has one."""
        keys = [k for g in sorted(self.groups) for k in self.groups[g]]
        if position is not None:
            positions = {k: p for k in keys if (p := position(k)) is not None}
            if len(positions) == len(keys):
                keys.sort(key=positions.__getitem__)
        return keys


def walk_tail_to_head(
    access: RequestAccess,
    position: Callable[[bytes], int | None] | None,
    touch: Callable[[Sequence[bytes], bool], None],
) -> None:
    """Call ``touch(run, first_use)`` over the request's keys from tail to head, one call per
    run of keys of the same kind: reused (a further use) or not (inserted, or offered while
    absent: their recency alone)."""
    run: list[bytes] = []
    first_use = False
    for k in reversed(access.head_to_tail(position)):
        fresh = k not in access.reused
        if run and fresh != first_use:
            touch(run, first_use)
            run = []
        first_use = fresh
        run.append(k)
    if run:
        touch(run, first_use)


def _group(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big") if len(key) >= 4 else 0
