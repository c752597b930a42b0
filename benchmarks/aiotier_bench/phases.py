"""Where a promotion batch's time goes in the engine's core: ``memory_promote``'s breakdown.

The engine's calls into its synchronous core for one ``lookup_prefix`` + ``wait`` +
``end_step`` of 64 keys promoted from a ``MemoryTier`` are made here in the engine's order
(``Promotions.begin``, the tiers asked through ``Promotions.asks`` as ``TierReads.consult``
asks them, ``finish``, the read, ``completed``), with no await between them, so each phase is timed
alone and without the loop's noise (the minimum over rounds). The await side (tasks, timers,
loop turns) is what ``memory_promote`` measures beyond their sum. This reaches into
``engine.core`` and a tier's own copy (``MemoryTier._copy_into``): a tool for whoever changes
the core, not an API.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from aiotier import LookupResult, MemoryTier, PrimaryTier, TieringEngine
from aiotier._core.promotion import Outcome

__all__ = ["PHASES", "promotion_phases"]

#: The phases, in the order one batch goes through them.
PHASES = ("begin", "tier_lookup", "finish", "read", "completed", "end_step")


async def promotion_phases(
    keys: Sequence[bytes],
    values: Sequence[bytes],
    *,
    block_size: int,
    primary_blocks: int,
    batch: int,
    rounds: int,
) -> dict[str, float]:
    """µs per batch of each phase (the minimum over ``rounds`` rounds of every batch), and
    their ``total``. The engine is never opened: only its core is driven (nothing awaits)."""
    tier = MemoryTier(2 * len(keys) * block_size)
    await tier.write_many(list(zip(keys, values, strict=True)))
    engine = TieringEngine(PrimaryTier(primary_blocks, block_size), [tier], max_promotion_share=1)
    core = engine.core
    promotions = core.promotions
    hit, miss = LookupResult.HIT, LookupResult.MISS
    batches = [list(keys[i : i + batch]) for i in range(0, len(keys), batch)]
    now = time.perf_counter
    best = dict.fromkeys((*PHASES, "total"), float("inf"))
    for r in range(rounds + 1):
        spent = dict.fromkeys(PHASES, 0.0)
        for b in batches:
            t0 = now()
            scan = promotions.begin(b, None, -1, prefix=True)
            t1 = now()
            asks = promotions.asks(scan, 1)  # the tiers asked as the engine asks them
            with contextlib.suppress(StopIteration):
                _, asked = next(asks)
                while True:
                    _, asked = asks.send([hit if tier.contains_hint(k) else miss for k in asked])
            t2 = now()
            started = promotions.finish(scan, 0.0)
            t3 = now()
            lengths = [
                tier._copy_into(p.keys, core.arena.slot_views(p.slots))
                for p in started
            ]
            t4 = now()
            for p, got in zip(started, lengths, strict=True):
                promotions.completed([p], Outcome.OK, got)
            t5 = now()
            core.table.all_ready(b)  # wait()'s answer once the batch landed
            core.end_step((), ())
            core.take_step([0])
            t6 = now()
            for phase, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5),
                                 strict=True):  # fmt: skip
                spent[phase] += dt
        if r:  # the first round warms up
            for phase, total in spent.items():
                best[phase] = min(best[phase], total / len(batches) * 1e6)
            best["total"] = min(best["total"], sum(spent.values()) / len(batches) * 1e6)
    promoted = engine.stats().counters.get(("promotions", tier.name, "ok"), 0)
    if promoted != (rounds + 1) * len(keys):
        raise RuntimeError(
            f"promotion_phases: {promoted} promotions, expected {(rounds + 1) * len(keys)}"
        )
    return best
