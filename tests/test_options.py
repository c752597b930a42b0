"""Each constructor's options are defined once: the config file and the environment take every
parameter that is not deliberately excluded, and the engine's keyword form matches its options."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path

import pytest

from aiotier import (
    ConfigError,
    EngineOptions,
    ObjectStoreTier,
    RedisTier,
    SSDTier,
    TieringEngine,
)
from aiotier._engine.options import EngineArgs
from aiotier.config import EXCLUDED, config_fields, engine_from_config, engine_from_env
from aiotier.demo import DemoConfig
from aiotier.tiers.memory import MemoryTier
from aiotier.tiers.primary import PrimaryTier

CONSTRUCTORS = {
    "engine": EngineOptions, "primary": PrimaryTier, "demo": DemoConfig, "memory": MemoryTier,
    "ssd": SSDTier, "redis": RedisTier, "s3": ObjectStoreTier,
}  # fmt: skip
#: Engine options given as tables of their own ([engine.admission], [engine.breaker]).
TABLES = {"admission", "breaker", "write_policy"}


def _parameters(made: type) -> set[str]:
    if made is EngineOptions:  # and TieringEngine's own, besides its tiers and **options
        own = _parameters(TieringEngine) - {"primary", "secondary"}
        return own | {f.name for f in dataclasses.fields(made)}
    if dataclasses.is_dataclass(made):
        return {f.name for f in dataclasses.fields(made) if f.init}
    params = list(inspect.signature(made.__init__).parameters.values())[1:]
    return {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


@pytest.mark.parametrize("section", sorted(CONSTRUCTORS))
def test_every_constructor_parameter_is_configurable_or_deliberately_excluded(
    section: str,
) -> None:
    made = CONSTRUCTORS[section]
    fields = set(config_fields(section))
    excluded = set(EXCLUDED.get(section, {}))
    tables = TABLES if section == "engine" else set()
    missing = _parameters(made) - fields - excluded - tables
    assert not missing, (
        f"{made.__name__} parameters {sorted(missing)} are neither config fields nor in "
        f"aiotier.config.EXCLUDED[{section!r}]"
    )
    assert not (excluded - _parameters(made)), "EXCLUDED names a parameter that is gone"


def test_every_exclusion_says_why() -> None:
    assert all(reason for reasons in EXCLUDED.values() for reason in reasons.values())


def test_the_keyword_form_matches_the_options() -> None:
    hints = typing.get_type_hints(EngineOptions)
    assert typing.get_type_hints(EngineArgs) == {
        f.name: hints[f.name] for f in dataclasses.fields(EngineOptions)
    }


BASE = {"primary": {"num_blocks": 8, "block_size": 4096}}


def test_the_settings_a_file_could_not_give_before(tmp_path: Path) -> None:
    """The review found these missing from config (each a ``ConfigError: unknown field``)."""
    engine = engine_from_config({
        **BASE,
        "engine": {"open_timeout": 12, "max_pending_write_bytes": 1 << 20},
        "tiers": [
            {"type": "redis", "url": "redis://127.0.0.1:1", "failure_threshold": 7,
             "probe_interval": 0.5, "read_streams": 2, "max_read_connections": 9,
             "fast_reads": False, "connect_timeout": 0.25},
            {"type": "s3", "bucket": "b", "endpoint_url": "http://127.0.0.1:1",
             "retry_base": 0.01, "retry_cap": 0.5, "lookahead_bytes": 0, "lookahead_ttl": 2,
             "recent_ttl": 30, "recent_capacity": 10},
        ],
    })  # fmt: skip
    assert (engine.options.open_timeout, engine.options.max_pending_write_bytes) == (12.0, 1 << 20)
    redis, s3 = engine.tiers
    assert isinstance(redis, RedisTier) and isinstance(s3, ObjectStoreTier)
    assert (redis.read_streams, redis.max_read_connections, redis.connect_timeout) == (2, 9, 0.25)
    assert redis.probe_interval == 0.5
    assert (s3.retry_base, s3.retry_cap) == (0.01, 0.5)


def test_environment_variables_reach_the_same_fields() -> None:
    engine = engine_from_env({
        "AIOTIER_PRIMARY_NUM_BLOCKS": "8", "AIOTIER_PRIMARY_BLOCK_SIZE": "4096",
        "AIOTIER_ENGINE_OPEN_TIMEOUT": "7.5", "AIOTIER_ENGINE_MAX_PENDING_WRITE_BYTES": "4096",
        "AIOTIER_TIERS_0_TYPE": "redis", "AIOTIER_TIERS_0_URL": "redis://127.0.0.1:1",
        "AIOTIER_TIERS_0_READ_STREAMS": "3", "AIOTIER_TIERS_0_FAST_READS": "off",
    })  # fmt: skip
    assert (engine.options.open_timeout, engine.options.max_pending_write_bytes) == (7.5, 4096)
    tier = engine.tiers[0]
    assert isinstance(tier, RedisTier) and tier.read_streams == 3


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({**BASE, "engine": {"open_timeout": "soon"}}, "engine.open_timeout"),
        ({**BASE, "engine": {"open_timeout": -1}}, "open_timeout"),
        ({**BASE, "tiers": [{"type": "redis", "url": "redis://h", "read_streams": 0}]},
         "read_streams"),
        ({**BASE, "tiers": [{"type": "redis", "url": "redis://h", "client_kwargs": {}}]},
         "tiers[0].client_kwargs: cannot come from a config file: redis-py objects"),
        ({**BASE, "engine": {"meter_provider": "x"}}, "engine.meter_provider: cannot come"),
        ({**BASE, "tiers": [{"type": "s3", "bucket": "b", "credential_provider": "x"}]},
         "tiers[0].credential_provider"),
    ],
)  # fmt: skip
def test_bad_or_excluded_fields_are_named(config: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        engine_from_config(config)
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RedisTier("redis://h", ttl="1h"), "ttl must be a number, got str '1h'"),
        (lambda: RedisTier("redis://h", timeout=0), "timeout must be > 0, got 0"),
        (lambda: RedisTier("redis://h", namespace=""), "namespace must be a non-empty str"),
        (lambda: RedisTier("redis://h", failure_threshold="3"), "failure_threshold must be an int"),
        (lambda: RedisTier("redis://h", cluster="no"), "cluster must be a bool, got 'no'"),
        (lambda: ObjectStoreTier("b", retry_cap="1s"), "retry_cap must be a number"),
        (lambda: ObjectStoreTier("b", lookahead_bytes=-1), "lookahead_bytes must be an int >= 0"),
        (lambda: ObjectStoreTier("b", recent_ttl=-1), "recent_ttl must be > 0, got -1"),
        (lambda: SSDTier("/nonexistent", "1G"), "capacity_bytes must be an int >= 1, got '1G'"),
        (lambda: SSDTier("/nonexistent", 1 << 20, fsync="yes"), "fsync must be a bool"),
        (lambda: EngineOptions(io_timeout="5"), "io_timeout must be a number, got str '5'"),
    ],
)  # fmt: skip
def test_constructor_checks_name_the_parameter(
    make: typing.Callable[[], object], message: str
) -> None:
    with pytest.raises((TypeError, ConfigError)) as info:
        make()
    assert message in str(info.value)


def test_an_unknown_engine_option_is_named_with_a_suggestion() -> None:
    with pytest.raises(TypeError, match="unknown option 'promotion_timout'; did you mean"):
        TieringEngine(PrimaryTier(4, 64), promotion_timout=1.0)  # type: ignore[call-arg]


def test_the_documented_config_file_builds_its_engine() -> None:
    import re
    import tomllib

    page = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    section = page.split("## Configuration from a file", 1)[1]
    (toml,) = re.findall(r"```toml\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    engine = engine_from_config(tomllib.loads(toml))
    assert [type(t).__name__ for t in engine.tiers] == [
        "MemoryTier", "SSDTier", "RedisTier", "ObjectStoreTier",
    ]  # fmt: skip
    assert engine.options.breaker is not None and engine.options.breaker.failure_threshold == 5
