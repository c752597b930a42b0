"""What the manager reads of the engine's primary beyond its public calls, in one place.

vLLM's answers need a little more than aiotier's: whether a RETRY is a block on its way into the
primary (vLLM: HIT_PENDING) or a tier that has not answered yet (RETRY), and which tier a
promotion reads from (``get_load_source``). These read the engine's core (``TieringEngine.core``,
documented as safe to read) and change nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from enum import Enum

from aiotier import BlockingEngine
from aiotier._core.table import PENDING, PROMOTING, READY

__all__ = ["InPrimary", "promoting_tier", "promotions_by_tier", "slot_state", "slot_states"]


class InPrimary(Enum):
    READY = "ready"
    STORING = "storing"  # a store in flight
    PROMOTING = "promoting"  # a promotion read in flight


_STATES: dict[int, InPrimary] = {
    READY: InPrimary.READY,
    PENDING: InPrimary.STORING,
    PROMOTING: InPrimary.PROMOTING,
}


def slot_state(engine: BlockingEngine, key: bytes) -> InPrimary | None:
    """The state of ``key``'s block in the primary, or None when the primary has none."""
    table = engine.engine.core.table
    slot = table.index.get(key)
    return None if slot is None else _STATES.get(table.state[slot])


def slot_states(engine: BlockingEngine, keys: Sequence[bytes]) -> list[InPrimary | None]:
    """:func:`slot_state` of each of ``keys`` (none in the primary: one C-level pass)."""
    table = engine.engine.core.table
    slots = list(map(table.index.get, keys))
    if slots.count(None) == len(slots):
        return slots  # type: ignore[return-value]  # all None
    state = table.state
    return [None if s is None else _STATES.get(state[s]) for s in slots]


def promoting_tier(engine: BlockingEngine, key: bytes) -> str | None:
    """The name of the tier a promotion of ``key`` reads from, or None."""
    core = engine.engine.core
    slot = core.table.index.get(key)
    if slot is None:
        return None
    for batch in list(core.promotions.in_flight):
        if slot in batch.slots:
            return core.tier_names[batch.tier]
    return None


def promotions_by_tier(engine: BlockingEngine) -> Counter[str]:
    """Promotion reads in flight, by tier name."""
    core = engine.engine.core
    return Counter(core.tier_names[b.tier] for b in list(core.promotions.in_flight))
