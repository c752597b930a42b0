"""Per-request state: pending delays to observe at the step boundary, and the pins held."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RequestState"]


@dataclass(slots=True, eq=False)
class RequestState:
    """What one request owes the metrics and the arena.

    ``sync_delay`` accumulates the duration of lookups that consulted a secondary tier;
    ``deferred_at`` is armed at the first RETRY. Both are observed (and reset) at the step
    boundary that admits or finishes the request.
    """

    req_id: str
    busy: int = 0  # lookups of this request suspended in a tier right now
    sync_delay: float = 0.0
    has_sync: bool = False
    deferred_at: float | None = None
    # key -> slot pinned because this request got RETRY for the key's promotion
    promo_pins: dict[bytes, int] = field(default_factory=dict)
    # key -> slots pinned by prepare_load (a key may be loaded twice before completion)
    load_pins: dict[bytes, list[int]] = field(default_factory=dict)
    # key -> slot prepared by prepare_store and not completed yet
    stores: dict[bytes, int] = field(default_factory=dict)
    # slots of earlier prepare_stores of a key prepared again before completing (oldest first):
    # the storer may still write them, so each stays pinned until the complete_store that
    # matches it (complete_stores of a key match its prepares in order) or the request ends
    stale_stores: dict[bytes, list[int]] = field(default_factory=dict)

    def add_sync(self, seconds: float) -> None:
        self.sync_delay += seconds
        self.has_sync = True

    def defer(self, now: float) -> None:
        if self.deferred_at is None:
            self.deferred_at = now

    def take_delays(self, now: float) -> tuple[float | None, float | None]:
        """Return and reset ``(sync, async)`` pending delays (None where nothing is pending)."""
        sync = self.sync_delay if self.has_sync else None
        deferred = None if self.deferred_at is None else now - self.deferred_at
        self.sync_delay = 0.0
        self.has_sync = False
        self.deferred_at = None
        return sync, deferred

    def holds_anything(self) -> bool:
        return bool(
            self.busy or self.promo_pins or self.load_pins or self.stores or self.stale_stores
        )
