"""Build an engine from a mapping, a TOML file or ``AIOTIER_*`` environment variables.

The shape (TOML shown; a dict of the same shape works)::

    [engine]
    write_policy = "write_back"
    promotion_timeout = 5.0

    [engine.admission]          # per tier: "all" (the default), "after:N" or "tinylfu"
    ssd = "after:2"

    [engine.breaker]            # the circuit breaker per tier (these are the defaults);
    failure_threshold = 5       # breaker = false turns it off
    cooldown = 1.0

    [primary]
    num_blocks = 512
    block_size = 65536
    policy = "lru"

    [[tiers]]
    type = "memory"
    capacity_bytes = 1073741824

    [[tiers]]
    type = "ssd"
    path = "/var/cache/aiotier"
    capacity_bytes = 107374182400

    [[tiers]]
    type = "redis"
    url = "redis://cache:6379/0"
    namespace = "model-a"

    [[tiers]]
    type = "s3"                  # ObjectStoreTier; credentials from AWS_* variables
    bucket = "kv-cache"
    prefix = "model-a/"
    endpoint_url = "http://127.0.0.1:8333"   # omit for AWS

Every error names the field that was wrong, e.g. ``tiers[1].capacity_bytes``. In the
environment, ``AIOTIER_ENGINE_ADMISSION="ssd=after:2,primary=tinylfu"`` gives the admission table
and ``AIOTIER_ENGINE_BREAKER="failure_threshold=3,cooldown=2"`` (or ``off``) the breaker.
"""

from __future__ import annotations

import argparse
import difflib
import os
import tomllib
from collections.abc import Mapping
from typing import Any

from ._core.admission import AdmissionPolicy, parse_admission
from ._core.breaker import BreakerPolicy
from .engine import TieringEngine
from .errors import ConfigError
from .tiers.base import SecondaryTier
from .tiers.primary import PrimaryTier

__all__ = ["engine_from_config", "engine_from_env", "load_config"]

_SECTIONS = ("engine", "primary", "demo", "tiers")
#: Variables of the test suite and the benchmarks (``AIOTIER_TEST_LOOP``), not configuration.
_TOOLING = ("test", "bench")

_ENGINE_FIELDS = {
    "write_policy": str, "promotion_timeout": float, "max_inflight_promotions": int,
    "backoff_seconds": float, "io_timeout": float, "pin_steps": int, "step_interval": float,
    "immutable_keys": bool, "max_promotion_share": float,
}  # fmt: skip
_PRIMARY_FIELDS = {"num_blocks": int, "block_size": int, "policy": str}
_TIER_FIELDS: dict[str, dict[str, type]] = {
    "memory": {"capacity_bytes": int, "name": str},
    "ssd": {"path": str, "capacity_bytes": int, "fsync": bool, "name": str, "io_threads": int},
    "redis": {"url": str, "namespace": str, "ttl": float, "cluster": bool, "name": str,
              "protocol": int, "timeout": float},
    "s3": {"bucket": str, "prefix": str, "endpoint_url": str, "region": str, "name": str,
           "max_concurrency": int, "timeout": float, "connect_timeout": float,
           "immutable_keys": bool, "failure_threshold": int, "probe_interval": float},
}  # fmt: skip


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


def _fields(where: str, table: Mapping[str, Any], allowed: Mapping[str, type]) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table, got {type(table).__name__}")
    out = {}
    for key, value in table.items():
        if key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown field; expected one of {sorted(allowed)}")
        out[key] = _typed(f"{where}.{key}", value, allowed[key])
    return out


def _tier(where: str, spec: Mapping[str, Any]) -> SecondaryTier:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a table, got {type(spec).__name__}")
    kind = spec.get("type")
    if kind not in _TIER_FIELDS:
        raise ConfigError(f"{where}.type: expected one of {sorted(_TIER_FIELDS)}, got {kind!r}")
    args = _fields(where, {k: v for k, v in spec.items() if k != "type"}, _TIER_FIELDS[kind])
    try:
        if kind == "memory":
            from .tiers.memory import MemoryTier

            return MemoryTier(**args)
        if kind == "ssd":
            from .tiers.ssd import SSDTier

            return SSDTier(**args)
        if kind == "s3":
            from .tiers.objectstore import ObjectStoreTier

            return ObjectStoreTier(**args)
        from .tiers.redis import RedisTier

        return RedisTier(**args)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _admission(where: str, spec: Any) -> dict[str, AdmissionPolicy]:
    """``{tier: policy}`` from a table of policy strings, or a ``tier=policy,...`` string."""
    if isinstance(spec, str):
        table: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            tier, sep, policy = item.partition("=")
            if not sep:
                raise ConfigError(f"{where}: expected tier=policy items, got {item!r}")
            table[tier.strip()] = policy
        spec = table
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a table of tier = policy, got {spec!r}")
    out = {}
    for tier, policy in spec.items():
        try:
            out[tier] = parse_admission(policy)
        except ConfigError as exc:
            raise ConfigError(f"{where}.{tier}: {exc}") from None
    return out


def _breaker(where: str, spec: Any) -> BreakerPolicy | None:
    """A ``BreakerPolicy`` from a table (or ``field=value,...``); ``false`` / ``off``: none."""
    if isinstance(spec, str):
        if spec.strip().lower() in ("off", "false", "no", "none", "0"):
            return None
        table: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            field, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"{where}: expected off or field=value items, got {item!r}")
            table[field.strip()] = value.strip()
        spec = table
    if spec is False:
        return None
    fields = _fields(where, spec, {"failure_threshold": int, "cooldown": float})
    try:
        return BreakerPolicy(**fields)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def engine_from_config(config: Mapping[str, Any], **overrides: Any) -> TieringEngine:
    """An engine (not yet open) from a mapping shaped like the module docstring."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"config: expected a mapping, got {type(config).__name__}")
    unknown = set(config) - {"engine", "primary", "tiers", "demo"}
    if unknown:
        raise ConfigError(f"{sorted(unknown)[0]}: unknown section")
    primary_args = _fields("primary", config.get("primary", {}), _PRIMARY_FIELDS)
    for required in ("num_blocks", "block_size"):
        if required not in primary_args:
            raise ConfigError(f"primary.{required}: required")
    tiers_spec = config.get("tiers", [])
    if not isinstance(tiers_spec, list):
        raise ConfigError("tiers: expected an array of tables")
    engine_table = config.get("engine", {})
    tables: dict[str, Any] = {}
    if isinstance(engine_table, Mapping):
        engine_table = dict(engine_table)
        if "admission" in engine_table:
            tables["admission"] = _admission("engine.admission", engine_table.pop("admission"))
        if "breaker" in engine_table:
            tables["breaker"] = _breaker("engine.breaker", engine_table.pop("breaker"))
    engine_args = _fields("engine", engine_table, _ENGINE_FIELDS)
    engine_args.update(tables)
    engine_args.update(overrides)
    primary = PrimaryTier(**primary_args)
    tiers = [_tier(f"tiers[{i}]", spec) for i, spec in enumerate(tiers_spec)]
    return TieringEngine(primary, tiers, **engine_args)


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
        section, _, rest = name[len("AIOTIER_"):].lower().partition("_")
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
    """The demo's settings: defaults, then ``[demo]`` of ``--config``, then the flags."""
    from dataclasses import fields

    from .demo import DemoConfig

    cfg = DemoConfig()
    known = {f.name: f.type for f in fields(DemoConfig)}
    if getattr(args, "config", None):
        table = load_config(args.config).get("demo", {})
        for key, value in table.items():
            if key not in known:
                raise ConfigError(f"demo.{key}: unknown field; expected one of {sorted(known)}")
            setattr(cfg, key, value)
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
