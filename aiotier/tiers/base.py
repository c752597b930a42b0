"""The contract every secondary tier implements, and the usage snapshot tiers report."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .._types import LookupResult
from ._batches import LastWrites

__all__ = ["SecondaryTier", "TierUsage"]


@dataclass(frozen=True, slots=True)
class TierUsage:
    """How full a tier is. ``capacity_bytes`` is ``None`` for tiers without a local budget.

    ``started`` says how the tier last opened, for tiers that keep blocks across restarts and
    can tell (the SSD tier: ``"new"``, ``"clean"`` after a clean close, ``"crash"`` after
    anything else); ``None`` otherwise.
    """

    blocks: int
    bytes_used: int
    capacity_bytes: int | None
    started: str | None = None


def _default_name(cls: type) -> str:
    name = cls.__name__.removesuffix("Tier") or cls.__name__
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class SecondaryTier(ABC):
    """A store below the primary arena: memory, a disk, a server, or one you write.

    Keys reach a tier as normalised ``bytes``. The engine calls a tier from the event loop and
    bounds every call with a timeout, so a tier must never block the loop (push blocking work to
    a thread) and may raise on faults: the engine turns any exception into a counted MISS or a
    counted failed write, never into an error for its caller.

    Subclasses implement the five abstract methods; the batched forms loop over them by default
    and are worth overriding where one round trip can serve many keys.
    """

    #: Blocks evicted by the tier's own budget since it was created (monotonic; the engine
    #: reports the growth as ``aiotier_evictions_total``).
    evictions: int = 0
    #: Whether evicted blocks' bytes are wanted from :meth:`take_evicted` (set through
    #: :meth:`configure_evictions`).
    handover_evicted: bool = False
    #: Whether :meth:`take_evicted` costs nothing extra (the bytes are in memory anyway): the
    #: engine then takes evictions from it even with no tier below, to report them as events.
    cheap_handover: bool = False
    #: Whether evicted keys are wanted from :meth:`take_evicted_keys` (set through
    #: :meth:`configure_evictions`).
    report_evicted: bool = False
    #: Whether :meth:`write` keeps the ``bytes`` objects it is given (a tier in process memory):
    #: the engine then hands it demoted blocks as ``bytes`` of their own. Otherwise ``data``
    #: may be a view of a buffer the engine reuses once ``write`` returns: copy what you keep.
    keeps_written_bytes: bool = False
    #: Whether blocks outlive this process (a disk, a server). At ``aclose()`` the engine
    #: writes the primary's blocks to the first persistent tier, so a restart keeps them.
    persistent: bool = True

    def __init__(self, name: str | None = None) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"tier name must be a non-empty str, got {name!r}")
        self.name: str = name if name is not None else _default_name(type(self))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"

    @property
    def available(self) -> bool | None:
        """Whether the tier can serve now, when it knows; ``None`` when it cannot tell.

        A tier that watches its own backend says False while it knows calls would fail (the
        Redis and object store tiers while their own circuit is open and they probe the
        server). ``engine.health()`` and ``/readyz`` read it; the engine never calls it on a
        hot path, so it must be cheap and do no I/O.
        """
        return None

    def configure_evictions(self, *, hand_over: bool) -> None:
        """Called by the engine when it opens: what it wants to know of this tier's evictions.

        With ``hand_over`` (a tier below can take them, or :attr:`cheap_handover`), keep the
        evicted blocks' bytes for :meth:`take_evicted`; otherwise keep only their keys, for
        :meth:`take_evicted_keys` (removed events). A wrapper tier forwards this to its inner.
        """
        self.handover_evicted = hand_over
        self.report_evicted = not hand_over

    def configure_block_size(self, block_size: int) -> None:  # noqa: B027 - optional hook
        """Called by the engine before :meth:`open`: the size of its blocks (the primary's
        ``block_size``; no block written to this tier is longer).

        A tier that lays blocks out by size (fixed-size slots) sizes them here; others need not
        implement it. Raise :class:`~aiotier.errors.ConfigError` for a size the tier cannot
        hold. A wrapper tier forwards the call to the tier it wraps.
        """

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Acquire resources (connections, directory locks). Called once by the engine."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Called once by the engine on close."""

    # -- clearing ------------------------------------------------------------------------------

    @property
    def can_clear(self) -> bool:
        """Whether :meth:`clear` is implemented (``TieringEngine.clear`` checks every tier
        before it changes anything). A wrapper tier answers for the tier it wraps."""
        return type(self).clear is not SecondaryTier.clear

    async def clear(self) -> None:
        """Drop every block this tier holds, for good: once this returns, no lookup or read
        finds a block written before the call, also after a restart (a persistent tier makes
        the clear durable). Raise if that could not be done; the engine then reads nothing
        from this tier until a later clear succeeds. The engine sends no write or remove while
        it runs; reads of blocks that are going may still be in flight, and must fail or miss
        rather than return the bytes. Optional: tiers without it make ``clear`` refuse."""
        raise NotImplementedError(f"{type(self).__name__} cannot be cleared")

    # -- the five operations ---------------------------------------------------------------------

    @abstractmethod
    async def lookup(self, key: bytes) -> LookupResult:
        """HIT if the tier holds ``key``, MISS if not, RETRY if it is still fetching it itself."""

    @abstractmethod
    async def read_into(self, key: bytes, buf: memoryview) -> int:
        """Copy the block's bytes into the start of ``buf`` and return their length.

        ``buf`` must not be written after this coroutine has finished, also when it is cancelled
        (a tier that reads in a thread waits for that thread before letting the cancellation
        through): the engine reuses the slot behind ``buf`` as soon as the call ends.

        Returns -1 when the tier no longer holds the key. Raises
        :class:`~aiotier.errors.BlockCorruptedError` when the stored bytes fail verification
        (and drops them), ``ValueError`` when the block is longer than ``buf``, and anything else
        on a fault.
        """

    @abstractmethod
    async def write(self, key: bytes, data: bytes | memoryview) -> None:
        """Store ``data`` under ``key``, replacing what was there.

        Keep no reference to a ``memoryview`` once this returns: the engine reuses the buffer
        under it (copy it, or see :attr:`keeps_written_bytes`).
        """

    @abstractmethod
    async def remove(self, key: bytes) -> bool:
        """Drop ``key``; True if it was present."""

    @abstractmethod
    def usage(self) -> TierUsage:
        """Blocks and bytes held now (cheap, synchronous: it feeds a gauge)."""

    def counters(self) -> Mapping[str, int]:
        """Cumulative counts of what happens inside the tier that the engine cannot see
        (requests retried, reads served from memory, ...), by event name: exported as
        ``aiotier_tier_events_total{tier, event}`` when metrics are collected. Cheap and
        synchronous; never decreasing. Optional (default: none)."""
        return {}

    # -- batched forms -------------------------------------------------------------------------

    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        """Answer :meth:`lookup` for each key, in order."""
        return [await self.lookup(k) for k in keys]

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """:meth:`read_into` for each pair; a per-key failure is returned in place of its length."""
        out: list[int | Exception] = []
        for k, b in zip(keys, bufs, strict=True):
            try:
                out.append(await self.read_into(k, b))
            except Exception as exc:  # one bad block must not fail its neighbours
                out.append(exc)
        return out

    async def write_many(
        self, items: Sequence[tuple[bytes, bytes | memoryview]]
    ) -> list[Exception | None]:
        """:meth:`write` for each pair; a per-key failure is returned in place of ``None``.
        Of several writes of one key only the last is carried out, and each reports its
        outcome."""
        batch = LastWrites([k if k.__class__ is bytes else None for k, _ in items])
        out: list[Exception | None] = []
        for k, d in batch.pick(items):
            try:
                await self.write(k, d)
            except Exception as exc:
                out.append(exc)
            else:
                out.append(None)
        return batch.spread(out)

    async def remove_many(self, keys: Sequence[bytes]) -> list[bool | Exception]:
        """:meth:`remove` for each key; a per-key failure is returned in place of its answer."""
        out: list[bool | Exception] = []
        for k in keys:
            try:
                out.append(await self.remove(k))
            except Exception as exc:
                out.append(exc)
        return out

    def contains_hint(self, key: bytes) -> bool | None:
        """Whether the tier holds ``key``, when it knows without I/O; ``None`` when it cannot tell.

        The engine uses it to skip needless removes and write-backs; tiers with an in-memory
        index (memory, SSD) answer exactly, remote tiers return ``None``.
        """
        return None

    def take_evicted_keys(self) -> list[bytes]:
        """Keys evicted since the last call without their bytes being handed over.

        Only while :attr:`report_evicted` is set (see :meth:`configure_evictions`); a tier
        that cannot name what it evicts (a shared server evicting on its own) returns nothing.
        """
        return []

    def take_evicted(self) -> Sequence[tuple[bytes, bytes | memoryview]]:
        """Blocks evicted since the last call, with their bytes, for the tier below.

        Only tiers that can hand bytes over return anything, and only while
        :attr:`handover_evicted` is set (see :meth:`configure_evictions`).
        """
        return []
