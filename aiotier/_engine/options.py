"""The engine's options, defined once: names, types, defaults and checks.

:class:`EngineOptions` is the one definition. ``TieringEngine(**options)`` builds it, the config
file and the environment derive their fields from it (:mod:`aiotier.config`), and
:class:`EngineArgs` is its keyword form for type checkers (a test keeps the two equal).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final, Literal, TypedDict

from .._core.admission import AdmissionPolicy
from .._core.breaker import BreakerPolicy
from .._core.engine_core import EngineCore
from .._core.write_routes import WRITE_POLICIES
from .._validate import check_bool, check_int, check_positive, check_ttl
from ..errors import ConfigError
from ..tiers.base import SecondaryTier
from ..tiers.primary import PrimaryTier

__all__ = ["EngineArgs", "EngineOptions", "WritePolicy", "build_core", "engine_options"]

WritePolicy = Literal["write_back", "write_through", "none"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOptions:
    """The options of :class:`~aiotier.TieringEngine`, checked when built.

    Attributes:
        write_policy: For every secondary tier, or per tier as a mapping of tier names
            (tiers not named: ``"write_back"``): ``"write_back"`` (the tier receives the blocks
            the tier above it evicts), ``"write_through"`` (it receives every block when it is
            stored; ``put`` returns once it holds it) or ``"none"`` (never written to).
        promotion_timeout: Seconds a promotion read (and a RETRY for it) may take before the
            key answers MISS.
        max_inflight_promotions: Promotion reads in flight at once.
        backoff_seconds: After a failed read, seconds a tier is not asked for that key.
        io_timeout: Seconds each tier call may take; None: ``promotion_timeout``.
        pin_steps: Steps a RETRY pin holds a promoted block for its request.
        step_interval: Seconds between automatic ``end_step`` calls; None: the caller steps.
        max_pending_write_bytes: Bytes queued for the tiers' writers before blocks are
            dropped; None: the primary arena's size, at least 64 MiB.
        open_timeout: Seconds a tier's ``open`` may take (it may rebuild an index).
        immutable_keys: Keys name their content (a hash of the bytes, as vLLM's prefix-cache
            block hashes): a put or store of a key never changes its bytes, so copies below
            stay valid.
        admission: Tier name -> its admission policy (tiers not named admit every block).
        max_promotion_share: At most this share of the primary's slots (rounded up) holds
            promoted blocks that no request has loaded yet: the rest stays free for stores.
        breaker: Each secondary tier's circuit (None: none); while open the engine does not
            call the tier.
        default_ttl: Seconds a value stored through the cache API (``put``,
            ``get_or_load``, ``cached``) is served when the call gives no ``ttl``; None: no
            expiry. The scheduler protocol's blocks never expire.
    """

    write_policy: WritePolicy | Mapping[str, WritePolicy] = "write_back"
    promotion_timeout: float = 5.0
    max_inflight_promotions: int = 64
    backoff_seconds: float = 1.0
    io_timeout: float | None = None
    pin_steps: int = 16
    step_interval: float | None = None
    max_pending_write_bytes: int | None = None
    open_timeout: float = 300.0
    immutable_keys: bool = False
    admission: Mapping[str, AdmissionPolicy] | None = None
    max_promotion_share: float = 0.9
    breaker: BreakerPolicy | None = BreakerPolicy()  # noqa: RUF009 - frozen, shared safely
    default_ttl: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "write_policy", _check_write_policy(self.write_policy))
        positive = ["promotion_timeout", "backoff_seconds", "open_timeout", "max_promotion_share"]
        positive += [f for f in ("io_timeout", "step_interval") if getattr(self, f) is not None]
        for name in positive:
            object.__setattr__(self, name, check_positive(name, getattr(self, name)))
        if self.max_promotion_share > 1:
            raise ConfigError(
                f"max_promotion_share must be at most 1, got {self.max_promotion_share!r}"
            )
        check_int("max_inflight_promotions", self.max_inflight_promotions)
        check_int("pin_steps", self.pin_steps)
        if self.max_pending_write_bytes is not None:
            check_int("max_pending_write_bytes", self.max_pending_write_bytes)
        check_bool("immutable_keys", self.immutable_keys)
        if self.breaker is not None and not isinstance(self.breaker, BreakerPolicy):
            raise TypeError(f"breaker must be a BreakerPolicy or None, got {self.breaker!r}")
        object.__setattr__(self, "admission", _check_admission(self.admission))
        object.__setattr__(self, "default_ttl", check_ttl(self.default_ttl, "default_ttl"))

    @property
    def tier_timeout(self) -> float:
        """Seconds each tier call may take: ``io_timeout``, else ``promotion_timeout``."""
        return self.io_timeout if self.io_timeout is not None else self.promotion_timeout

    def write_policies(self, tier_names: Sequence[str]) -> tuple[WritePolicy, ...]:
        """Each tier's write policy, in order."""
        policy = self.write_policy
        if isinstance(policy, str):
            return (policy,) * len(tier_names)
        return tuple(policy.get(name, "write_back") for name in tier_names)

    def pending_write_bytes(self, primary: PrimaryTier) -> int:
        """``max_pending_write_bytes``, else the primary arena's size (at least 64 MiB)."""
        if self.max_pending_write_bytes is not None:
            return self.max_pending_write_bytes
        return max(primary.arena.nbytes, 64 << 20)


class EngineArgs(TypedDict, total=False):
    """:class:`EngineOptions` as keyword arguments (``TieringEngine(primary, tiers, **args)``)."""

    write_policy: WritePolicy | Mapping[str, WritePolicy]
    promotion_timeout: float
    max_inflight_promotions: int
    backoff_seconds: float
    io_timeout: float | None
    pin_steps: int
    step_interval: float | None
    max_pending_write_bytes: int | None
    open_timeout: float
    immutable_keys: bool
    admission: Mapping[str, AdmissionPolicy] | None
    max_promotion_share: float
    breaker: BreakerPolicy | None
    default_ttl: float | None


OPTION_NAMES: Final = frozenset(f.name for f in fields(EngineOptions))


def engine_options(
    primary: PrimaryTier, secondary: Sequence[SecondaryTier], options: Mapping[str, Any]
) -> tuple[tuple[SecondaryTier, ...], EngineOptions]:
    """The engine's tiers and options, checked: each error names the argument and the value."""
    if not isinstance(primary, PrimaryTier):
        raise TypeError(f"primary must be a PrimaryTier, got {type(primary).__name__}")
    if isinstance(secondary, SecondaryTier):
        raise TypeError(
            f"secondary must be a sequence of tiers, e.g. [{type(secondary).__name__}(...)]; "
            f"got one {type(secondary).__name__}"
        )
    for name in options:
        if name not in OPTION_NAMES:
            near = difflib.get_close_matches(name, OPTION_NAMES, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise TypeError(f"TieringEngine got an unknown option {name!r}{hint}")
    tiers = tuple(secondary)
    names = [primary.name]
    for t in tiers:
        if not isinstance(t, SecondaryTier):
            raise TypeError(f"secondary tiers must be SecondaryTier, got {type(t).__name__}")
        if t.name in names:
            raise ConfigError(f"tier name {t.name!r} is used twice; give each tier a name")
        names.append(t.name)
    o = EngineOptions(**options)
    for name in o.admission or {}:
        if name not in names:
            raise ConfigError(f"admission names tier {name!r}; the tiers are {', '.join(names)}")
    for name in o.write_policy if not isinstance(o.write_policy, str) else ():
        if name == primary.name:
            raise ConfigError(f"write_policy names the primary {name!r}: it holds every block")
        if name not in names:
            below = ", ".join(names[1:]) or "none"
            raise ConfigError(f"write_policy names tier {name!r}; the secondary tiers are {below}")
    return tiers, o


def _check_write_policy(
    policy: object,
) -> WritePolicy | dict[str, WritePolicy]:
    """One policy for every tier, or a mapping of tier names to policies (a copy of it)."""
    choices = ", ".join(WRITE_POLICIES)
    if isinstance(policy, str):
        if policy not in WRITE_POLICIES:
            raise ConfigError(f"write_policy must be one of {choices}, got {policy!r}")
        return policy  # type: ignore[return-value]  # checked just above
    if not isinstance(policy, Mapping):
        raise TypeError(
            f"write_policy must be one of {choices}, or a mapping of tier names to them; "
            f"got {type(policy).__name__}"
        )
    for name, p in policy.items():
        if not isinstance(name, str) or p not in WRITE_POLICIES:
            raise ConfigError(f"write_policy[{name!r}] must be one of {choices}, got {p!r}")
    return dict(policy)


def _check_admission(
    admission: Mapping[str, AdmissionPolicy] | None,
) -> dict[str, AdmissionPolicy]:
    if admission is None:
        return {}
    if not isinstance(admission, Mapping):
        raise TypeError(
            f"admission must map tier names to policies, got {type(admission).__name__}"
        )
    for name, policy in admission.items():
        if not isinstance(policy, AdmissionPolicy):
            raise TypeError(
                f"admission[{name!r}] must be an AdmissionPolicy (AdmitAll, AdmitAfter, "
                f"AdmitTinyLFU), got {type(policy).__name__}"
            )
    return dict(admission)


def build_core(
    primary: PrimaryTier,
    tiers: Sequence[SecondaryTier],
    o: EngineOptions,
    notify: Callable[[int], None],
) -> EngineCore:
    """The engine's synchronous core over ``primary`` and ``tiers``; ``notify(ti)`` wakes tier
    ``ti``'s writer when the core queues work for it."""
    admission = o.admission or {}
    return EngineCore(
        primary.arena,
        primary.table,
        primary_name=primary.name,
        tier_names=[t.name for t in tiers],
        hints=[t.contains_hint for t in tiers],
        batch_hints=[t.contains_hints for t in tiers],
        write_policy=o.write_policies([t.name for t in tiers]),
        immutable_keys=o.immutable_keys,
        promotion_timeout=o.promotion_timeout,
        backoff_seconds=o.backoff_seconds,
        pin_steps=o.pin_steps,
        max_inflight_promotions=o.max_inflight_promotions,
        max_promotion_share=o.max_promotion_share,
        max_pending_write_bytes=o.pending_write_bytes(primary),
        # bytes on their way down are copied into reused buffers unless the tier keeps them
        stage_demotions=bool(tiers) and not tiers[0].capabilities.keeps_written_bytes,
        primary_admission=admission.get(primary.name),
        tier_admission=[admission.get(t.name) for t in tiers],
        notify=notify,
        tier_expiry=[t.capabilities.expiry for t in tiers],
    )
