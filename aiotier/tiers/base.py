"""The contract every secondary tier implements: batch-first, about a dozen members.

A tier answers batches (``lookup_many``, ``read_many_into``, ``write_many``, ``remove_many``),
reports its ``usage()``, opens with a :class:`TierSetup` and closes with ``aclose()``, hands its
evictions over in one call (``take_evictions()``), and says what it can do in one attribute
(:attr:`SecondaryTier.capabilities`). A tier written key by key derives the batches from
single-key methods through :class:`SimpleTier`.

Why two breakers: the engine keeps a circuit per tier (``TierBreakers``: after repeated
failures it stops calling the tier for a cool-down, whatever the tier is), and a networked tier
may keep its own (``tiers/_net/outage.ServerGuard``: it knows its server is down, probes it, and
fails calls at once meanwhile). They meet only through :attr:`SecondaryTier.available`: the
engine's breaker closes early when the tier says it serves again, and health reports both.

Room to grow: what the engine tells a tier beyond bytes reaches it through :class:`BlockMeta`
(a write's per-key metadata, passed to ``write_many``: a block's expiry), :class:`TierSetup`
(what the engine asks of the tier) and :class:`TierCapabilities` (what the tier can honour),
each a dataclass whose new fields get defaults: tiers written earlier keep working unchanged.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from .._types import LookupResult
from ._batches import write_each

__all__ = [
    "BlockMeta",
    "Eviction",
    "SecondaryTier",
    "SimpleTier",
    "TierCapabilities",
    "TierSetup",
    "TierUsage",
]

#: Bytes a tier is given to write, or hands over: ``bytes``, or a view of a buffer it does not
#: own (copy what you keep once the call returns).
Buffer: TypeAlias = bytes | memoryview
#: One evicted block: its key, and its bytes when the engine asked for them (else ``None``).
Eviction: TypeAlias = tuple[bytes, Buffer | None]


@dataclass(frozen=True, slots=True)
class TierUsage:
    """How full a tier is. ``capacity_bytes`` is ``None`` for tiers without a local budget.

    ``started`` says how the tier last opened, for tiers that keep blocks across restarts and
    can tell (the SSD tier: ``"new"``, ``"clean"`` after a clean close, ``"crash"`` after
    anything else); ``None`` otherwise. ``evictions`` counts the blocks the tier's own budget
    evicted since it was created (monotonic; the engine reports its growth as
    ``aiotier_evictions_total``). ``expirations`` likewise counts blocks the tier dropped
    because they were past their :attr:`BlockMeta.expires_at` (``aiotier_expirations_total``).
    """

    blocks: int
    bytes_used: int
    capacity_bytes: int | None
    started: str | None = None
    evictions: int = 0
    expirations: int = 0


@dataclass(frozen=True, slots=True)
class TierCapabilities:
    """What a tier can do, read by the engine once when it is built.

    - ``persistent``: blocks outlive this process (a disk, a server). At ``aclose()`` the
      engine writes the primary's blocks to the first persistent tier, so a restart keeps them.
    - ``keeps_written_bytes``: ``write_many`` keeps the ``bytes`` objects it is given (a tier
      in process memory): the engine then hands it demoted blocks as ``bytes`` of their own.
      Otherwise data may be a view of a buffer the engine reuses once the call returns.
    - ``cheap_evictions``: the evicted blocks' bytes are in memory anyway, so handing them over
      costs nothing: the engine asks for them even with no tier below (to report the evictions
      as events from the same hand-over).
    - ``clearable``: :meth:`SecondaryTier.clear` is implemented (``TieringEngine.clear``
      checks every tier before it changes anything).
    - ``expiry``: the tier honours :attr:`BlockMeta.expires_at`: past it, ``lookup_many``
      answers MISS, ``read_many_into`` answers -1, and the block's space is reclaimed (counted
      in :attr:`TierUsage.expirations` when the tier sees it happen). Without it the engine
      still never serves an expired value: it checks the expiry a value carries in its bytes
      when it reads it, drops it and queues a remove for the tier.
    """

    persistent: bool = True
    keeps_written_bytes: bool = False
    cheap_evictions: bool = False
    clearable: bool = False
    expiry: bool = False


@dataclass(frozen=True, slots=True)
class TierSetup:
    """What the engine tells a tier when it opens it.

    - ``block_size``: the largest block written to the tier (the primary's ``block_size``);
      ``None`` for a tier opened without an engine. A tier that lays blocks out by size sizes
      them here, and raises :class:`~aiotier.errors.ConfigError` for a size it cannot hold.
    - ``evictions``: what :meth:`SecondaryTier.take_evictions` hands over: ``"bytes"`` (the
      evicted blocks with their bytes, for the tier below), ``"keys"`` (their keys only, for
      removed events) or ``"none"`` (keep nothing: a tier used on its own).
    """

    block_size: int | None = None
    evictions: Literal["none", "keys", "bytes"] = "none"


@dataclass(frozen=True, slots=True)
class BlockMeta:
    """Per-key metadata of a write, beside its bytes.

    - ``expires_at``: when the block stops being served, in unix seconds (``time.time()``:
      wall time, shared by a fleet and kept across restarts); None: never. Set for the blocks
      of values stored with a TTL, on every write of them (a put's, a demotion's, a cascade
      from the tier above), so the expiry survives evictions. A tier honours it when it sets
      :attr:`TierCapabilities.expiry`.

    The engine passes ``meta=None`` when no block of a batch has any; a tier that ignores
    ``meta`` stays correct, because the engine never relies on a capability the tier lacks.
    """

    expires_at: float | None = None


def _default_name(cls: type) -> str:
    name = cls.__name__.removesuffix("Tier") or cls.__name__
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class SecondaryTier(ABC):
    """A store below the primary arena: memory, a disk, a server, or one you write.

    Keys reach a tier as normalised ``bytes``. The engine calls a tier from the event loop and
    bounds every call with a timeout, so a tier must never block the loop (push blocking work to
    a thread) and may raise on faults: the engine turns any exception into a counted MISS or a
    counted failed write, never into an error for its caller. Every batch method answers one
    entry per key, in order; a per-key failure is returned in its place, so one bad block never
    fails its neighbours.

    Implement the four batch methods and :meth:`usage`; the rest is optional. A tier written
    key by key subclasses :class:`SimpleTier` instead.
    """

    #: What the tier can do (see :class:`TierCapabilities`); a wrapper forwards its inner's.
    capabilities: TierCapabilities = TierCapabilities()

    def __init__(self, name: str | None = None) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"tier name must be a non-empty str, got {name!r}")
        self.name: str = name if name is not None else _default_name(type(self))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self, setup: TierSetup | None = None) -> None:  # noqa: B027 - optional hook
        """Acquire resources (connections, directory locks) and keep what ``setup`` asks.

        Called once by the engine with its :class:`TierSetup`; a tier used on its own may be
        opened with none. A wrapper tier forwards the call to the tier it wraps.
        """

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Called once by the engine on close."""

    async def clear(self) -> None:
        """Drop every block this tier holds, for good: once this returns, no lookup or read
        finds a block written before the call, also after a restart (a persistent tier makes
        the clear durable). Raise if that could not be done; the engine then reads nothing
        from this tier until a later clear succeeds. The engine sends no write or remove while
        it runs; reads of blocks that are going may still be in flight, and must fail or miss
        rather than return the bytes. Optional: set ``capabilities.clearable`` when you
        implement it; tiers without it make ``TieringEngine.clear`` refuse."""
        raise NotImplementedError(f"{type(self).__name__} cannot be cleared")

    # -- the batch operations -------------------------------------------------------------------

    @abstractmethod
    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        """Per key: HIT if the tier holds it, MISS if not, RETRY if it is still fetching it."""

    @abstractmethod
    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """Copy each block's bytes into the start of its buffer; per key, their length.

        A key the tier no longer holds answers -1. A per-key failure is returned in place of
        its length: :class:`~aiotier.errors.BlockCorruptedError` when the stored bytes fail
        verification (and the tier drops them), ``ValueError`` when the block is longer than
        its buffer, anything else on a fault.

        No buffer may be written after this coroutine has finished, also when it is cancelled
        (a tier that reads in a thread waits for that thread before letting the cancellation
        through): the engine reuses the slots behind them as soon as the call ends.
        """

    @abstractmethod
    async def write_many(
        self, items: Sequence[tuple[bytes, Buffer]], meta: Sequence[BlockMeta] | None = None
    ) -> list[Exception | None]:
        """Store each ``(key, data)``, replacing what was there; per item, ``None`` or the
        failure. Of several writes of one key only the last is carried out, and each reports
        its outcome (:class:`~aiotier.tiers._batches.LastWrites` keeps that rule).

        Keep no reference to a ``memoryview`` once this returns: the engine reuses the buffer
        under it (copy it, or set ``capabilities.keeps_written_bytes``). ``meta``, when given,
        holds one :class:`BlockMeta` per item.
        """

    @abstractmethod
    async def remove_many(self, keys: Sequence[bytes]) -> list[bool | Exception]:
        """Drop each key; per key, True if it was present, or the failure."""

    @abstractmethod
    def usage(self) -> TierUsage:
        """Blocks and bytes held now, and evictions so far (cheap, synchronous: it feeds a
        gauge, and the step export reads ``evictions``)."""

    # -- what the engine learns without I/O ----------------------------------------------------

    def take_evictions(self) -> list[Eviction]:
        """Blocks the tier's budget evicted since the last call, oldest first, as ``(key,
        bytes)`` or ``(key, None)`` as :attr:`TierSetup.evictions` asked (``"none"``: nothing).

        The engine calls it after each ``write_many``: with bytes, it writes them to the tier
        below; without, it reports the keys as removed. A tier that cannot name what it evicts
        (a shared server evicting on its own) returns nothing.
        """
        return []

    def contains_hint(self, key: bytes) -> bool | None:
        """Whether the tier holds ``key``, when it knows without I/O; ``None`` when it cannot tell.

        The engine uses it to skip needless removes and write-backs; tiers with an in-memory
        index (memory, SSD) answer exactly, remote tiers return ``None``.
        """
        return None

    def contains_hints(self, keys: list[bytes]) -> list[bool | None]:
        """:meth:`contains_hint` of each of ``keys``, in order: the engine asks about the clean
        blocks a primary eviction drops, a batch at a time. Override it only to answer in one
        pass (it must agree with ``contains_hint``)."""
        return list(map(self.contains_hint, keys))

    @property
    def available(self) -> bool | None:
        """Whether the tier can serve now, when it knows; ``None`` when it cannot tell.

        A tier that watches its own backend says False while it knows calls would fail (the
        Redis and object store tiers while their own circuit is open and they probe the
        server). ``engine.health()`` and ``/readyz`` read it; the engine never calls it on a
        hot path, so it must be cheap and do no I/O.
        """
        return None

    def counters(self) -> Mapping[str, int]:
        """Cumulative counts of what happens inside the tier that the engine cannot see
        (requests retried, reads served from memory, ...), by event name: exported as
        ``aiotier_tier_events_total{tier, event}`` when metrics are collected. Cheap and
        synchronous; never decreasing. Optional (default: none)."""
        return {}


class SimpleTier(SecondaryTier):
    """A tier written key by key: implement :meth:`lookup`, :meth:`read_into`, :meth:`write`,
    :meth:`remove` and :meth:`usage`; the batch operations call them one key at a time.

    Right for a store whose client has no batch calls, or a first version of a tier; override
    a batch method once one round trip can serve many keys.
    """

    @abstractmethod
    async def lookup(self, key: bytes) -> LookupResult:
        """HIT if the tier holds ``key``, MISS if not, RETRY if it is still fetching it itself."""

    @abstractmethod
    async def read_into(self, key: bytes, buf: memoryview) -> int:
        """Copy the block's bytes into the start of ``buf`` and return their length; -1 when
        the tier no longer holds it. Raise on a failure (see
        :meth:`SecondaryTier.read_many_into`)."""

    @abstractmethod
    async def write(self, key: bytes, data: Buffer) -> None:
        """Store ``data`` under ``key``, replacing what was there (copy a ``memoryview``)."""

    @abstractmethod
    async def remove(self, key: bytes) -> bool:
        """Drop ``key``; True if it was present."""

    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        return [await self.lookup(k) for k in keys]

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        out: list[int | Exception] = []
        for k, b in zip(keys, bufs, strict=True):
            try:
                out.append(await self.read_into(k, b))
            except Exception as exc:  # one bad block must not fail its neighbours
                out.append(exc)
        return out

    async def write_many(
        self, items: Sequence[tuple[bytes, Buffer]], meta: Sequence[BlockMeta] | None = None
    ) -> list[Exception | None]:
        return await write_each(items, self.write)

    async def remove_many(self, keys: Sequence[bytes]) -> list[bool | Exception]:
        out: list[bool | Exception] = []
        for k in keys:
            try:
                out.append(await self.remove(k))
            except Exception as exc:
                out.append(exc)
        return out
