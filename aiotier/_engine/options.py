"""The engine's arguments, checked once: each error names the argument and the value."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from .._core.admission import AdmissionPolicy
from .._core.breaker import BreakerPolicy
from .._core.engine_core import EngineCore
from .._validate import check_int, check_positive
from ..errors import ConfigError
from ..tiers.base import SecondaryTier
from ..tiers.primary import PrimaryTier

__all__ = ["EngineOptions", "WritePolicy", "build_core", "engine_options"]

WritePolicy = Literal["write_back", "write_through", "none"]
_WRITE_POLICIES: Final = ("write_back", "write_through", "none")


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """``TieringEngine``'s arguments after checking, with their defaults filled in."""

    tiers: tuple[SecondaryTier, ...]
    write_policy: WritePolicy
    promotion_timeout: float
    max_inflight_promotions: int
    backoff_seconds: float
    io_timeout: float
    pin_steps: int
    step_interval: float | None
    max_pending_write_bytes: int
    open_timeout: float
    immutable_keys: bool
    admission: dict[str, AdmissionPolicy]
    max_promotion_share: float
    breaker: BreakerPolicy | None


def engine_options(
    primary: PrimaryTier,
    secondary: Sequence[SecondaryTier],
    *,
    write_policy: WritePolicy,
    promotion_timeout: float,
    max_inflight_promotions: int,
    backoff_seconds: float,
    io_timeout: float | None,
    pin_steps: int,
    step_interval: float | None,
    max_pending_write_bytes: int | None,
    open_timeout: float,
    immutable_keys: bool,
    admission: Mapping[str, AdmissionPolicy] | None,
    max_promotion_share: float,
    breaker: BreakerPolicy | None,
) -> EngineOptions:
    if not isinstance(primary, PrimaryTier):
        raise TypeError(f"primary must be a PrimaryTier, got {type(primary).__name__}")
    if isinstance(secondary, SecondaryTier):
        raise TypeError(
            f"secondary must be a sequence of tiers, e.g. [{type(secondary).__name__}(...)]; "
            f"got one {type(secondary).__name__}"
        )
    tiers = tuple(secondary)
    names = [primary.name]
    for t in tiers:
        if not isinstance(t, SecondaryTier):
            raise TypeError(f"secondary tiers must be SecondaryTier, got {type(t).__name__}")
        if t.name in names:
            raise ConfigError(f"tier name {t.name!r} is used twice; give each tier a name")
        names.append(t.name)
    if write_policy not in _WRITE_POLICIES:
        raise ConfigError(
            f"write_policy must be one of {', '.join(_WRITE_POLICIES)}, got {write_policy!r}"
        )
    check_positive("promotion_timeout", promotion_timeout)
    check_positive("backoff_seconds", backoff_seconds)
    if io_timeout is not None:
        check_positive("io_timeout", io_timeout)
    if step_interval is not None:
        check_positive("step_interval", step_interval)
    check_positive("open_timeout", open_timeout)
    if not isinstance(immutable_keys, bool):
        raise ConfigError(f"immutable_keys must be a bool, got {immutable_keys!r}")
    if max_pending_write_bytes is None:
        max_pending_write_bytes = max(primary.arena.nbytes, 64 << 20)
    check_int("max_inflight_promotions", max_inflight_promotions)
    check_int("pin_steps", pin_steps)
    check_int("max_pending_write_bytes", max_pending_write_bytes)
    check_positive("max_promotion_share", max_promotion_share)
    if max_promotion_share > 1:
        raise ConfigError(f"max_promotion_share must be at most 1, got {max_promotion_share!r}")
    if breaker is not None and not isinstance(breaker, BreakerPolicy):
        raise TypeError(f"breaker must be a BreakerPolicy or None, got {breaker!r}")
    return EngineOptions(
        tiers=tiers,
        write_policy=write_policy,
        promotion_timeout=float(promotion_timeout),
        max_inflight_promotions=max_inflight_promotions,
        backoff_seconds=float(backoff_seconds),
        io_timeout=float(io_timeout if io_timeout is not None else promotion_timeout),
        pin_steps=pin_steps,
        step_interval=step_interval,
        max_pending_write_bytes=max_pending_write_bytes,
        open_timeout=float(open_timeout),
        immutable_keys=immutable_keys,
        admission=_check_admission(admission, names),
        max_promotion_share=float(max_promotion_share),
        breaker=breaker,
    )


def _check_admission(
    admission: Mapping[str, AdmissionPolicy] | None, names: list[str]
) -> dict[str, AdmissionPolicy]:
    if admission is None:
        return {}
    if not isinstance(admission, Mapping):
        raise TypeError(
            f"admission must map tier names to policies, got {type(admission).__name__}"
        )
    out = dict(admission)
    for name, policy in out.items():
        if name not in names:
            raise ConfigError(f"admission names tier {name!r}; the tiers are {', '.join(names)}")
        if not isinstance(policy, AdmissionPolicy):
            raise TypeError(
                f"admission[{name!r}] must be an AdmissionPolicy (AdmitAll, AdmitAfter, "
                f"AdmitTinyLFU), got {type(policy).__name__}"
            )
    return out


def build_core(primary: PrimaryTier, o: EngineOptions, notify: Callable[[int], None]) -> EngineCore:
    """The engine's synchronous core over ``primary`` and the tiers of ``o``; ``notify(ti)``
    wakes tier ``ti``'s writer when the core queues work for it."""
    tiers = o.tiers
    return EngineCore(
        primary.arena,
        primary.table,
        primary_name=primary.name,
        tier_names=[t.name for t in tiers],
        hints=[t.contains_hint for t in tiers],
        write_policy=o.write_policy,
        immutable_keys=o.immutable_keys,
        promotion_timeout=o.promotion_timeout,
        backoff_seconds=o.backoff_seconds,
        pin_steps=o.pin_steps,
        max_inflight_promotions=o.max_inflight_promotions,
        max_promotion_share=o.max_promotion_share,
        max_pending_write_bytes=o.max_pending_write_bytes,
        # bytes on their way down are copied into reused buffers unless the tier keeps them
        stage_demotions=bool(tiers) and not tiers[0].keeps_written_bytes,
        primary_admission=o.admission.get(primary.name),
        tier_admission=[o.admission.get(t.name) for t in tiers],
        notify=notify,
    )
