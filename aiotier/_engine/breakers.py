"""The engine's circuit breaker per secondary tier, as the await side uses it.

Every call the engine makes to a tier (lookups and promotion reads in ``reads``, writes and
removes in ``writers``, read-around in ``cache``) first asks :meth:`Breakers.allow` and then
reports how it went with :meth:`Breakers.record`. A call the breaker refuses is never made: it
is handled exactly as a failed one (a counted MISS, a counted failed read or write), so the
accounting of an outage does not depend on whether the breaker is open.

The breakers themselves are plain state machines (:class:`~aiotier._core.breaker.TierBreakers`);
each transition runs under the engine's lock, and this module adds only the logging.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Sequence
from functools import partial

from .._core.breaker import BreakerPolicy, CircuitBreaker, CircuitState, TierBreakers
from ..errors import BlockCorruptedError, TierUnavailableError
from ..tiers.base import SecondaryTier
from .threads import EngineLock

__all__ = ["Breakers", "answered"]

log = logging.getLogger("aiotier.engine")

# a failure that is about one block or the room on a disk, not about reaching the tier
_DATA_ERRNOS = frozenset((errno.ENOSPC, errno.EDQUOT))


def _about_the_data(exc: BaseException) -> bool:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, BlockCorruptedError | ValueError):
            return True
        if isinstance(cause, OSError) and cause.errno in _DATA_ERRNOS:
            return True
        cause = cause.__cause__
    return False


def answered(results: Sequence[object]) -> bool:
    """Whether a batched call's per-key results show a tier that works.

    It does unless every key failed, and not for a reason of the data's own (a corrupt block,
    one longer than its buffer, a full disk): a full disk must not stop reads from that disk.
    """
    return not all(isinstance(r, Exception) and not _about_the_data(r) for r in results)


def _says_available(tier: SecondaryTier) -> bool:
    try:
        return tier.available is True
    except Exception:
        return False


class Breakers:
    """One circuit breaker per tier of an engine, each transition under the engine's lock."""

    __slots__ = ("_guard", "_ready", "_tiers", "core")

    def __init__(
        self, tiers: Sequence[SecondaryTier], policy: BreakerPolicy | None, guard: EngineLock
    ) -> None:
        self._tiers = tuple(tiers)
        self._ready = [partial(_says_available, t) for t in self._tiers]
        self._guard = guard
        self.core = TierBreakers(len(self._tiers), policy, self._changed)

    def allow(self, ti: int) -> bool:
        """Whether tier ``ti`` may be called now; if it may not, handle the call as failed.

        While the circuit is open, a tier that says it is available again (a networked tier
        whose own probe reached its server) gets the probe call at once, not after the rest
        of the cool-down: the tier's own guard, not a second timer, decides when it is back.
        """
        with self._guard.lock:
            return self.core.allow(ti, self._ready[ti])

    def record(self, ti: int, ok: bool | None) -> None:
        """How a call that :meth:`allow` let through went; ``None``: it was cancelled."""
        with self._guard.lock:
            self.core.record(ti, ok)

    def states(self) -> list[CircuitState]:
        with self._guard.lock:
            return self.core.states()

    def breaker(self, ti: int) -> CircuitBreaker | None:
        """Tier ``ti``'s breaker (None when the engine has no breaker policy)."""
        return self.core.breakers[ti] if self.core.breakers else None

    def refused(self, ti: int, op: str) -> TierUnavailableError:
        """The error a call the breaker refused stands for (counted, never raised to a caller)."""
        b = self.breaker(ti)
        assert b is not None
        return TierUnavailableError(
            f"tier {self._tiers[ti].name!r}: circuit open for {b.open_for():.3g}s after "
            f"{b.failures} failed calls; {op} not attempted"
        )

    def _changed(self, ti: int, opened: bool, b: CircuitBreaker) -> None:
        name = self._tiers[ti].name
        if opened:
            log.warning(
                "tier %r: circuit opened after %d failed calls in a row; the engine skips it "
                "and lets one call through every %.3gs",
                name,
                b.failures,
                b.cooldown,
            )
        else:
            log.warning("tier %r: answers again after %.3gs; circuit closed", name, b.open_for())
