"""Where each tier's copies come from, under a write policy per tier.

Each secondary tier has a policy: ``"write_back"`` (it receives the blocks the tier above it
lets go of), ``"write_through"`` (it receives every block when it is stored, before a ``put``
returns) or ``"none"`` (the engine never writes to it; it is read, and older copies there are
still removed). "The tier above" of a write-back tier is the nearest one above it that the
engine writes to (the primary for the first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

__all__ = ["WRITE_POLICIES", "WriteRoutes"]

WRITE_POLICIES: Final = ("write_back", "write_through", "none")


class WriteRoutes:
    """The routes of one engine's copies between its tiers (``policies``: one per tier)."""

    __slots__ = ("below", "from_primary", "policies", "through")

    def __init__(self, policies: Sequence[str]) -> None:
        for p in policies:
            if p not in WRITE_POLICIES:
                raise ValueError(f"write policy must be one of {WRITE_POLICIES}, got {p!r}")
        self.policies = tuple(policies)
        #: the tiers every stored block is written to at once
        self.through = tuple(i for i, p in enumerate(self.policies) if p == "write_through")
        #: the tier the primary's evictions go to (None: they go nowhere)
        self.from_primary = self._fed_by(-1)
        #: per tier, the tier its evictions go to (None: they go nowhere)
        self.below = tuple(self._fed_by(i) for i in range(len(self.policies)))

    @classmethod
    def of(cls, policy: str | Sequence[str], tiers: int) -> WriteRoutes:
        """Routes for ``tiers`` tiers from one policy for all, or one per tier."""
        if isinstance(policy, str):
            return cls([policy] * tiers)
        if len(policy) != tiers:
            raise ValueError(f"{len(policy)} write policies for {tiers} tiers")
        return cls(policy)

    def _fed_by(self, ti: int) -> int | None:
        """The write-back tier that receives what tier ``ti`` (-1: the primary) lets go of: the
        next tier below that the engine writes to, when that one is write-back (a tier the
        engine never writes to feeds none)."""
        if ti >= 0 and self.policies[ti] == "none":
            return None
        for j in range(ti + 1, len(self.policies)):
            if self.policies[j] != "none":
                return j if self.policies[j] == "write_back" else None
        return None

    def write_down_to(self, persistent: Sequence[bool]) -> int | None:
        """The tier that gets the primary's blocks at close, so a restart keeps them: the first
        persistent tier the engine writes to, when it is write-back (a write-through one holds
        them already). With no persistent tier, the first tier the engine writes to."""
        written = [ti for ti, p in enumerate(self.policies) if p != "none"]
        ti = next((ti for ti in written if persistent[ti]), written[0] if written else None)
        return ti if ti is not None and self.policies[ti] == "write_back" else None
