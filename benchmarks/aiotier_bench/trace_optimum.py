"""What a cache could have hit on a trace: the infinite-cache figure and the offline optimum.

**The optimum** is Belady's MIN with bypass over the trace's block references (every block of
every request, requests in arrival order, blocks in prompt order): a cache of ``capacity``
blocks that knows the future keeps, at each reference, the blocks used again soonest, and does
not admit a block whose next use is later than every resident block's (or that is never used
again). With equal-sized blocks and every miss costing the same, no policy (online or offline,
admitting on a miss or not) that holds at most ``capacity`` blocks hits more references of the
same sequence; prefetching a block before its reference never helps either.

It bounds a prefix cache, which counts a block as a hit only while every block before it in the
request hit too, and **a prefix cache reaches it** when the trace's ids chain (an id always
follows the same parent, as hashes of a whole prefix do): whenever that schedule holds a block
it holds the block's parent, so counting its hits up to each request's first miss loses none
(:func:`prefix_optimum_hits` counts them so). Whenever a block is used again, its parent is
used just before it, so the parent's next use is sooner: Belady never evicts the parent while
the child stays, never bypasses the parent and then admits the child, and frees both at their
last use. Where ids do not chain, :func:`prefix_optimum_hits` is what that schedule gets as a
prefix cache: a reachable figure below the bound. Pins and pending stores change nothing in the
bound (a replay's primary still holds at most ``capacity`` blocks). The bound is exact for the
order in which a replay looks blocks up; that order is the trace's except for requests deferred
by a RETRY, which are looked up a step later, behind requests that arrived after them in their
step (a replay reports them as ``deferrals``).

**The infinite cache** keeps everything: a block hits when it was referenced before, counted as
a prefix cache counts (up to the request's first miss).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator, Sequence

from .traces import Trace

__all__ = ["infinite_hits", "optimum_hits", "prefix_optimum_hits"]


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
    """Belady's MIN with bypass: the most references a cache of ``capacity`` blocks can hit."""
    return sum(_belady(refs, capacity))


def prefix_optimum_hits(trace: Trace, capacity: int) -> int:
    """The hits of :func:`optimum_hits`'s schedule counted up to each request's first miss, as
    a prefix cache counts them: equal to it when the trace's ids chain (see the module)."""
    hit = _belady(list(trace.references()), capacity)
    hits = 0
    for r in trace.requests:
        whole = True
        for _ in r.blocks:
            h = next(hit)
            whole = whole and h
            hits += whole
    return hits


def _belady(refs: Sequence[Hashable], capacity: int) -> Iterator[bool]:
    """Whether each reference hits under Belady's MIN with bypass.

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
    for i, b in enumerate(refs):
        nxt = next_use[i]
        hit = b in resident
        yield hit
        if not hit and (nxt == never or capacity == 0):
            continue  # never used again: admitting it cannot help
        if not hit and len(resident) >= capacity:
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
