"""Build an engine from a mapping, a TOML file or ``AIOTIER_*`` environment variables.

The fields of each section are the parameters of the constructor it feeds (:func:`config_fields`
derives them; :data:`EXCLUDED` lists, with the reason, what a file cannot give). The file's shape,
the environment's names and every field: ``docs/operations.md``, "Configuration from a file or
the environment".
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import inspect
import os
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

from ._core.admission import AdmissionPolicy, parse_admission
from ._core.breaker import BreakerPolicy
from ._core.eviction import POLICIES
from ._core.write_routes import WRITE_POLICIES
from .engine import EngineOptions, TieringEngine
from .errors import ConfigError
from .tiers.base import SecondaryTier
from .tiers.memory import MemoryTier
from .tiers.objectstore import ObjectStoreTier  # obstore is imported when one is created
from .tiers.primary import PrimaryTier
from .tiers.redis import RedisTier  # redis-py is imported when one is created
from .tiers.ssd import SSDTier

__all__ = [
    "EXCLUDED", "config_fields", "engine_from_config", "engine_from_env", "engine_parts",
    "load_config",
]  # fmt: skip

_SECTIONS = ("engine", "primary", "demo", "tiers")
#: Variables of the test suite and the benchmarks (``AIOTIER_TEST_LOOP``), not configuration.
_TOOLING = ("test", "bench")

#: ``type = ...`` of a ``[[tiers]]`` table -> the tier it builds.
_TIER_TYPES: Final[Mapping[str, type[SecondaryTier]]] = {
    "memory": MemoryTier, "ssd": SSDTier, "redis": RedisTier, "s3": ObjectStoreTier,
}  # fmt: skip

#: Constructor parameters a file cannot give, per section, and why. Every other parameter of
#: ``EngineOptions``, ``PrimaryTier``, the tiers and ``DemoConfig`` is a field of its section.
EXCLUDED: Final[Mapping[str, Mapping[str, str]]] = {
    "engine": {
        "meter_provider": "an OpenTelemetry object: engine_from_config(..., meter_provider=...)",
    },
    "redis": {"client_kwargs": "redis-py objects (SSL contexts, retries): build it in code"},
    "s3": {
        "credential_provider": "a callable: build the ObjectStoreTier in code",
        "client_options": "obstore's client options: build the ObjectStoreTier in code",
        "config": "obstore's store settings: build the ObjectStoreTier in code",
    },
    "demo": {"engine_options": "the [engine] table of the same file"},
}


def _constructor(section: str) -> Callable[..., Any]:
    if section == "engine":
        return EngineOptions
    if section == "primary":
        return PrimaryTier
    if section == "demo":
        from .demo import DemoConfig

        return DemoConfig
    return _TIER_TYPES[section]


def _scalar(hint: Any) -> type | None:
    """The one TOML scalar type (bool, int, float, str) an annotation takes, else None."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = set()
    for arg in typing.get_args(hint) if union else (hint,):
        if arg is type(None):
            continue
        if arg in (bool, int, float, str):
            kinds.add(arg)
        elif typing.get_origin(arg) is Literal:
            kinds.update(type(v) for v in typing.get_args(arg))
        elif arg is os.PathLike or typing.get_origin(arg) is os.PathLike:
            kinds.add(str)
        else:
            return None
    return kinds.pop() if len(kinds) == 1 else None


@functools.cache
def config_fields(section: str) -> Mapping[str, type]:
    """The fields of ``section`` ("engine", "primary", "demo" or a tier type) and their types.

    Derived from the constructor's own parameters: each one is a field unless it is in
    :data:`EXCLUDED` or is a table of its own (``engine.admission``, ``engine.breaker``). A
    parameter whose type a file cannot hold raises ``TypeError`` naming it, so a constructor
    cannot grow a parameter that is neither configurable nor deliberately left out.
    """
    made = _constructor(section)
    if dataclasses.is_dataclass(made):
        hints = typing.get_type_hints(made)
        names = [f.name for f in dataclasses.fields(made) if f.init]
    else:
        init = made.__init__
        hints = typing.get_type_hints(init)
        names = [
            p.name
            for p in list(inspect.signature(init).parameters.values())[1:]
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    excluded = EXCLUDED.get(section, {})
    out = {}
    for name in names:
        if name in excluded or (section == "engine" and name in _ENGINE_TABLES):
            continue
        kind = _scalar(hints[name])
        if kind is None:
            raise TypeError(
                f"{made.__name__}'s parameter {name!r} ({hints[name]}) cannot come from a "
                "config file: give it a scalar type, or a parser in config._ENGINE_TABLES, "
                f"or an entry in aiotier.config.EXCLUDED[{section!r}] saying why"
            )
        out[name] = kind
    return out


def _typed(where: str, value: Any, kind: type) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is bool and isinstance(value, str):
        low = value.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
    if kind in (int, float) and isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            raise ConfigError(f"{where}: expected {kind.__name__}, got {value!r}") from None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {kind.__name__}, got {value!r}")
    return value


def _fields(
    where: str,
    table: Mapping[str, Any],
    allowed: Mapping[str, type],
    excluded: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table, got {type(table).__name__}")
    out = {}
    for key, value in table.items():
        if excluded and key in excluded:
            raise ConfigError(f"{where}.{key}: cannot come from a config file: {excluded[key]}")
        if key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown field; expected one of {sorted(allowed)}")
        out[key] = _typed(f"{where}.{key}", value, allowed[key])
    return out


def _tier(where: str, spec: Mapping[str, Any]) -> SecondaryTier:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a table, got {type(spec).__name__}")
    kind = spec.get("type")
    if not isinstance(kind, str) or kind not in _TIER_TYPES:
        raise ConfigError(f"{where}.type: expected one of {sorted(_TIER_TYPES)}, got {kind!r}")
    fields = {k: v for k, v in spec.items() if k != "type"}
    args = _fields(where, fields, config_fields(kind), EXCLUDED.get(kind))
    try:
        return _TIER_TYPES[kind](**args)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _pairs(where: str, spec: str, expected: str) -> dict[str, str]:
    """``{"a": "1", "b": "2"}`` from ``"a=1, b=2"`` (a table given in one variable)."""
    table = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"{where}: expected {expected} items, got {item!r}")
        table[name.strip()] = value.strip()
    return table


def _admission(where: str, spec: Any) -> dict[str, AdmissionPolicy]:
    """``{tier: policy}`` from a table of policy strings, or a ``tier=policy,...`` string."""
    if isinstance(spec, str):
        spec = _pairs(where, spec, "tier=policy")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a table of tier = policy, got {spec!r}")
    out = {}
    for tier, policy in spec.items():
        try:
            out[tier] = parse_admission(policy)
        except ConfigError as exc:
            raise ConfigError(f"{where}.{tier}: {exc}") from None
    return out


def _write_policy(where: str, spec: Any) -> str | dict[str, str]:
    """One policy for every tier (``"write_through"``), or per tier: a table of tier = policy,
    or a ``tier=policy,...`` string."""
    if isinstance(spec, str) and "=" not in spec:
        return spec  # checked by EngineOptions
    if isinstance(spec, str):
        spec = _pairs(where, spec, "tier=policy")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a policy or a table of tier = policy, got {spec!r}")
    for tier, policy in spec.items():
        if policy not in WRITE_POLICIES:
            raise ConfigError(
                f"{where}.{tier}: expected one of {', '.join(WRITE_POLICIES)}, got {policy!r}"
            )
    return dict(spec)


def _breaker(where: str, spec: Any) -> BreakerPolicy | None:
    """A ``BreakerPolicy`` from a table (or ``field=value,...``); ``false`` / ``off``: none."""
    if isinstance(spec, str):
        if spec.strip().lower() in ("off", "false", "no", "none", "0"):
            return None
        spec = _pairs(where, spec, "off or field=value")
    if spec is False:
        return None
    fields = _fields(where, spec, {"failure_threshold": int, "cooldown": float})
    try:
        return BreakerPolicy(**fields)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


#: Engine options given as tables of their own, and their parsers.
_ENGINE_TABLES: Final[Mapping[str, Callable[[str, Any], Any]]] = {
    "admission": _admission,
    "breaker": _breaker,
    "write_policy": _write_policy,
}


def engine_arguments(table: Any, where: str = "engine") -> dict[str, Any]:
    """``TieringEngine``'s options from an ``[engine]`` table (each value checked)."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table, got {type(table).__name__}")
    plain = {k: v for k, v in table.items() if k not in _ENGINE_TABLES}
    args = _fields(where, plain, config_fields("engine"), EXCLUDED["engine"])
    for name, parse in _ENGINE_TABLES.items():
        if name in table:
            args[name] = parse(f"{where}.{name}", table[name])
    return args


def engine_from_config(config: Mapping[str, Any], **overrides: Any) -> TieringEngine:
    """An engine (not yet open) from a mapping shaped like ``docs/operations.md`` shows."""
    primary_args, tiers, engine_args = engine_parts(config, **overrides)
    primary = PrimaryTier(**primary_args)
    try:
        return TieringEngine(primary, tiers, **engine_args)
    except ConfigError as exc:
        raise ConfigError(f"engine: {exc}") from exc


def engine_parts(
    config: Mapping[str, Any], **overrides: Any
) -> tuple[dict[str, Any], list[SecondaryTier], dict[str, Any]]:
    """What :func:`engine_from_config` builds the engine from: the primary's arguments (checked,
    the tier not made: a caller may add its own, such as ``shared_memory``), the secondary tiers
    (not open) and the engine's keyword arguments."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"config: expected a mapping, got {type(config).__name__}")
    unknown = set(config) - set(_SECTIONS)
    if unknown:
        raise ConfigError(f"{sorted(unknown)[0]}: unknown section")
    primary_args = _fields("primary", config.get("primary", {}), config_fields("primary"))
    for required in ("num_blocks", "block_size"):
        if required not in primary_args:
            raise ConfigError(f"primary.{required}: required")
    policy = primary_args.get("policy", "lru")
    if policy not in POLICIES:
        expected = ", ".join(repr(n) for n in POLICIES)
        raise ConfigError(f"primary.policy: expected one of {expected}, got {policy!r}")
    tiers_spec = config.get("tiers", [])
    if not isinstance(tiers_spec, list):
        raise ConfigError("tiers: expected an array of tables")
    engine_args = engine_arguments(config.get("engine", {}))
    engine_args.update(overrides)
    tiers = [_tier(f"tiers[{i}]", spec) for i, spec in enumerate(tiers_spec)]
    return primary_args, tiers, engine_args


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML file (synchronously: call it at start-up, not on the event loop)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{os.fspath(path)}: {exc}") from exc


def config_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The mapping described by ``AIOTIER_*`` variables.

    ``AIOTIER_PRIMARY_NUM_BLOCKS``, ``AIOTIER_PRIMARY_BLOCK_SIZE``, ``AIOTIER_PRIMARY_POLICY``,
    ``AIOTIER_ENGINE_<FIELD>`` and ``AIOTIER_TIERS_<N>_<FIELD>`` (``AIOTIER_TIERS_0_TYPE=ssd``).
    ``AIOTIER_TEST_*`` and ``AIOTIER_BENCH_*`` belong to the test suite and the benchmarks and
    are left alone; any other section is an error (a misspelt one is named).
    """
    env = os.environ if environ is None else environ
    config: dict[str, Any] = {}
    tiers: dict[int, dict[str, Any]] = {}
    for name, value in env.items():
        if not name.startswith("AIOTIER_"):
            continue
        section, _, rest = name[len("AIOTIER_") :].lower().partition("_")
        if section in _TOOLING:
            continue
        if section not in _SECTIONS:
            near = difflib.get_close_matches(section, _SECTIONS, n=1, cutoff=0.75)
            hint = (
                f"did you mean {near[0]!r}?" if near
                else "tiers are AIOTIER_TIERS_<N>_<FIELD> (AIOTIER_TIERS_0_TYPE=redis)"
            )  # fmt: skip
            raise ConfigError(f"{name}: unknown section {section!r}; {hint}")
        if not rest:
            raise ConfigError(f"{name}: expected AIOTIER_{section.upper()}_<FIELD>")
        if section in ("engine", "primary", "demo"):
            config.setdefault(section, {})[rest] = value
        elif section == "tiers":
            index, _, field = rest.partition("_")
            if not index.isdigit() or not field:
                raise ConfigError(f"{name}: expected AIOTIER_TIERS_<N>_<FIELD>")
            tiers.setdefault(int(index), {})[field] = value
    if tiers:
        config["tiers"] = [tiers[i] for i in sorted(tiers)]
    return config


def engine_from_env(environ: Mapping[str, str] | None = None, **overrides: Any) -> TieringEngine:
    return engine_from_config(config_from_env(environ), **overrides)


def load_demo_config(args: argparse.Namespace) -> Any:
    """The demo's settings: defaults, then ``[demo]`` and ``[engine]`` of ``--config``, then the
    flags. The demo builds its own primary and tiers: a file with ``[primary]`` or ``[[tiers]]``
    is refused rather than half-used."""
    from .demo import DemoConfig

    cfg = DemoConfig()
    if getattr(args, "config", None):
        config = load_config(args.config)
        unknown = set(config) - set(_SECTIONS)
        if unknown:
            raise ConfigError(f"{sorted(unknown)[0]}: unknown section")
        for section in ("primary", "tiers"):
            if section in config:
                raise ConfigError(
                    f"{section}: the demo builds its own primary and tiers (--primary-mib, "
                    f"--ssd-dir, --redis, --s3); remove [{section}] from {args.config}, or build "
                    "the engine it describes with aiotier.config.engine_from_config"
                )
        table = config.get("demo", {})
        for key, value in _fields("demo", table, config_fields("demo"), EXCLUDED["demo"]).items():
            setattr(cfg, key, value)
        cfg.engine_options = engine_arguments(config.get("engine", {}))
    given = set()
    for key in (
        "steps", "requests", "primary_mib", "ssd_dir", "redis_url", "s3_url", "metrics_port",
        "duration", "rate",
    ):  # fmt: skip
        value = getattr(args, key, None)
        if value is not None:
            setattr(cfg, key, value)
            given.add(key)
    for key in ("steps", "requests", "primary_mib", "rate"):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"demo.{key}: must be > 0, got {getattr(cfg, key)}")
    if cfg.duration is not None and not cfg.duration > 0:
        raise ConfigError(f"demo.duration: must be > 0 seconds, got {cfg.duration}")
    if cfg.duration is not None and given & {"steps", "requests"}:
        raise ConfigError(
            "demo.duration: give either --duration (with --rate) or --steps/--requests"
        )
    # serving metrics with nothing to bound the run: a steady load to scrape, until Ctrl-C
    if "metrics_port" in given and cfg.duration is None and not given & {"steps", "requests"}:
        cfg.forever = True
    return cfg
