"""Counts of keys held by prepares not completed yet (a multiset as a plain dict).

A request's loads and stores are usually completed exactly as they were prepared, so both
operations take that case in C-level passes; anything else (a key prepared twice, a partial
completion, keys never prepared) goes key by key. Only positive counts are kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["add_one", "remove_one"]


def add_one(counts: dict[bytes, int], keys: Sequence[bytes]) -> None:
    """One more of each of ``keys``."""
    fresh = dict.fromkeys(keys, 1)
    if len(fresh) == len(keys) and counts.keys().isdisjoint(fresh):
        counts.update(fresh)
        return
    for k in keys:
        counts[k] = counts.get(k, 0) + 1


def remove_one(counts: dict[bytes, int], keys: Sequence[bytes]) -> None:
    """One fewer of each of ``keys``; a count reaching zero goes, keys not held are ignored."""
    try:  # each key held once and named once: all of them go
        once = sum(map(counts.__getitem__, keys)) == len(keys) == len(set(keys))
    except KeyError:
        once = False
    if once:
        if len(counts) == len(keys):  # they are all it holds
            counts.clear()
        else:
            deque(map(counts.__delitem__, keys), maxlen=0)
        return
    for k in keys:
        n = counts.get(k)
        if n is None:
            continue
        if n > 1:
            counts[k] = n - 1
        else:
            del counts[k]
