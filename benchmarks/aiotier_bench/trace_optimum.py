"""What a cache could have hit on a trace: the infinite-cache figure and the offline optimum.

**The optimum** is Belady's MIN with bypass over the trace's block references (every block of
every request, requests in arrival order, blocks in prompt order): a cache of ``capacity``
blocks that knows the future keeps, at each reference, the blocks used again soonest, and does
not admit a block whose next use is later than every resident block's (or that is never used
again). With equal-sized blocks and every miss costing the same, no policy (online or offline,
admitting on a miss or not) that holds at most ``capacity`` blocks hits more references of the
same sequence; prefetching a block before its reference never helps either.

It is an **upper bound** on the block hit ratio of a prefix cache of that capacity replaying the
same references: a prefix cache counts a block as a hit only while every block before it in the
request hit too, which can only lose hits against per-block residency. It is not always
reachable by a prefix cache (the optimum may keep a block whose prefix it dropped). Pins and
pending stores change nothing in the bound (a replay's primary still holds at most ``capacity``
blocks). The bound is exact for the order in which a replay looks blocks up; that order is the
trace's except for requests deferred by a RETRY, which are looked up a step later, behind
requests that arrived after them in their step (a replay reports them as ``deferrals``).

**The infinite cache** keeps everything: a block hits when it was referenced before, counted as
a prefix cache counts (up to the request's first miss).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

from .traces import Trace

__all__ = ["infinite_hits", "optimum_hits"]


def infinite_hits(trace: Trace) -> int:
    """Block references a cache that never evicts hits, counted up to each request's first miss."""
    seen: set[int | str] = set()
    hits = 0
    for r in trace.requests:
        for b in r.blocks:
            if b not in seen:
                break
            hits += 1
        seen.update(r.blocks)
    return hits


def optimum_hits(refs: Sequence[Hashable], capacity: int) -> int:
    """Belady's MIN with bypass: the most references a cache of ``capacity`` blocks can hit.

    O(n log capacity): the resident blocks sit in a max-heap on their next use, whose stale
    entries (a block re-referenced since, or evicted) are skipped when they surface.
    """
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    n = len(refs)
    never = n  # "no further use" sorts after every real position
    next_use = [never] * n
    last: dict[Hashable, int] = {}
    for i in range(n - 1, -1, -1):
        b = refs[i]
        next_use[i] = last.get(b, never)
        last[b] = i
    resident: dict[Hashable, int] = {}  # block -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, position of the reference that set it)
    hits = 0
    for i, b in enumerate(refs):
        nxt = next_use[i]
        if b in resident:
            hits += 1
        elif nxt == never or capacity == 0:
            continue  # never used again: admitting it cannot help
        elif len(resident) >= capacity:
            while True:  # the resident block used furthest in the future
                neg, at = heap[0]
                victim = refs[at]
                if resident.get(victim) == -neg:
                    break
                heapq.heappop(heap)
            if -neg <= nxt:
                continue  # bypass: every resident block is needed before this one
            heapq.heappop(heap)
            del resident[victim]
        if nxt == never:
            del resident[b]  # its last use: the slot is free from now on
        else:
            resident[b] = nxt
            heapq.heappush(heap, (-nxt, i))
    return hits
