"""Building engines from mappings, TOML files and AIOTIER_* variables; errors name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiotier import ConfigError, MemoryTier, SSDTier
from aiotier.config import config_from_env, engine_from_config, engine_from_env, load_config

BASE = {"primary": {"num_blocks": 8, "block_size": 4096}}


def test_mapping_builds_the_engine_it_describes(tmp_path: Path) -> None:
    engine = engine_from_config({
        "engine": {"write_policy": "write_through", "promotion_timeout": 2},
        "primary": {"num_blocks": 8, "block_size": 4096, "policy": "arc"},
        "tiers": [
            {"type": "memory", "capacity_bytes": 1 << 20},
            {"type": "ssd", "path": str(tmp_path), "capacity_bytes": 1 << 20, "fsync": True},
        ],
    })  # fmt: skip
    assert engine.primary.num_blocks == 8 and engine.primary.policy_name == "arc"
    o = engine.options
    assert o.write_policy == "write_through" and o.promotion_timeout == 2.0
    assert isinstance(engine.tiers[0], MemoryTier) and isinstance(engine.tiers[1], SSDTier)
    assert engine.tiers[1].fsync is True


def test_every_eviction_policy_is_configurable_by_name() -> None:
    for name in ("lru", "arc", "lfuda"):
        engine = engine_from_config({"primary": {**BASE["primary"], "policy": name}})
        assert engine.primary.policy_name == name


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "aiotier.toml"
    path.write_text(
        '[engine.admission]\nprimary = "tinylfu"\nram = "after:2"\n\n'
        '[primary]\nnum_blocks = 4\nblock_size = 1024\n\n'
        '[[tiers]]\ntype = "memory"\ncapacity_bytes = 65536\nname = "ram"\n'
    )
    engine = engine_from_config(load_config(path))
    assert engine.tiers[0].name == "ram"
    assert {k: repr(v) for k, v in engine.options.admission.items()} == {
        "primary": "AdmitTinyLFU()",
        "ram": "AdmitAfter(2)",
    }


def test_environment_variables() -> None:
    env = {
        "AIOTIER_PRIMARY_NUM_BLOCKS": "16",
        "AIOTIER_PRIMARY_BLOCK_SIZE": "512",
        "AIOTIER_ENGINE_MAX_INFLIGHT_PROMOTIONS": "8",
        "AIOTIER_ENGINE_IMMUTABLE_KEYS": "true",
        "AIOTIER_ENGINE_ADMISSION": "memory=after:3, primary=all",
        "AIOTIER_ENGINE_MAX_PROMOTION_SHARE": "0.5",
        "AIOTIER_TIERS_0_TYPE": "memory",
        "AIOTIER_TIERS_0_CAPACITY_BYTES": "4096",
        "PATH": "/usr/bin",
    }
    assert config_from_env(env)["tiers"] == [{"type": "memory", "capacity_bytes": "4096"}]
    engine = engine_from_env(env)
    assert engine.primary.num_blocks == 16 and engine.options.max_inflight_promotions == 8
    assert engine.options.immutable_keys is True and engine.options.max_promotion_share == 0.5
    assert {k: repr(v) for k, v in engine.options.admission.items()} == {
        "memory": "AdmitAfter(3)",
        "primary": "AdmitAll()",
    }


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({}, "primary.num_blocks"),
        ({"primary": {"num_blocks": "many", "block_size": 8}}, "primary.num_blocks"),
        ({**BASE, "engine": {"write_policy": 3}}, "engine.write_policy"),
        ({**BASE, "engine": {"bogus": 1}}, "engine.bogus"),
        ({**BASE, "tiers": [{"type": "tape"}]}, "tiers[0].type"),
        ({**BASE, "tiers": [{"type": "memory", "capacity_bytes": True}]},
         "tiers[0].capacity_bytes"),
        ({**BASE, "tiers": [{"type": "memory"}]}, "tiers[0]"),
        ({**BASE, "tiers": {"type": "memory"}}, "tiers"),
        ({**BASE, "extra": {}}, "extra"),
        ({**BASE, "engine": {"admission": {"primary": "often"}}}, "engine.admission.primary"),
        ({**BASE, "engine": {"admission": "primary"}}, "engine.admission"),
        ({**BASE, "engine": {"admission": {"ssd": "all"}}}, "'ssd'"),
        ({**BASE, "engine": {"breaker": {"cooldown": 0}}},
         "engine.breaker: BreakerPolicy.cooldown"),
        ({**BASE, "engine": {"breaker": {"threshold": 2}}}, "engine.breaker.threshold"),
        ({**BASE, "engine": {"breaker": "sometimes"}}, "engine.breaker"),
        ({"primary": {**BASE["primary"], "policy": "fifo"}}, "primary.policy"),
    ],
)  # fmt: skip
def test_errors_name_the_bad_field(config: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        engine_from_config(config)
    assert field in str(info.value)


def test_the_circuit_breaker_is_configured_or_turned_off(tmp_path: Path) -> None:
    path = tmp_path / "aiotier.toml"
    path.write_text(
        "[engine.breaker]\nfailure_threshold = 3\ncooldown = 2\n\n"
        "[primary]\nnum_blocks = 4\nblock_size = 1024\n"
    )
    policy = engine_from_config(load_config(path)).options.breaker
    assert policy is not None
    assert (policy.failure_threshold, policy.cooldown) == (3, 2.0)
    assert engine_from_config({**BASE, "engine": {"breaker": False}}).options.breaker is None
    env = {"AIOTIER_PRIMARY_NUM_BLOCKS": "4", "AIOTIER_PRIMARY_BLOCK_SIZE": "512"}
    assert engine_from_env({**env, "AIOTIER_ENGINE_BREAKER": "off"}).options.breaker is None
    policy = engine_from_env({**env, "AIOTIER_ENGINE_BREAKER": "failure_threshold=2, cooldown=0.5"}
                             ).options.breaker  # fmt: skip
    assert policy is not None and (policy.failure_threshold, policy.cooldown) == (2, 0.5)
    default = engine_from_config(BASE).options.breaker
    assert default is not None and (default.failure_threshold, default.cooldown) == (5, 1.0)


def test_bad_env_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="AIOTIER_TIERS_X_TYPE"):
        config_from_env({"AIOTIER_TIERS_X_TYPE": "memory"})
    with pytest.raises(ConfigError, match="unknown section 'enigne'; did you mean 'engine'"):
        config_from_env({"AIOTIER_ENIGNE_IO_TIMEOUT": "1"})
    with pytest.raises(ConfigError, match="AIOTIER_PRIMARY_<FIELD>"):
        config_from_env({"AIOTIER_PRIMARY": "1"})


def test_the_test_suites_and_benchmarks_variables_are_not_configuration() -> None:
    env = {"AIOTIER_PRIMARY_NUM_BLOCKS": "4", "AIOTIER_TEST_LOOP": "1", "AIOTIER_BENCH_DIR": "."}
    assert config_from_env(env) == {"primary": {"num_blocks": "4"}}
    with pytest.raises(ConfigError, match=r"unknown section 'redis'; tiers are AIOTIER_TIERS_<N>"):
        config_from_env({"AIOTIER_REDIS_URL": "redis://cache:6379"})


def test_broken_toml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[primary\n")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_config(path)
