"""The pytest plugin, as a user meets it: loaded through its entry point, in a fresh pytest run."""

from __future__ import annotations

import re
import textwrap
from importlib.metadata import entry_points
from typing import Any

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = textwrap.dedent(
    """
    import pytest

    from aiotier import LookupResult, PrimaryTier, SSDTier, TieringEngine, TieringError
    from aiotier.testing import FaultyTier

    engines = []

    @pytest.mark.asyncio
    async def test_engine_is_open_and_small(aiotier_engine, tmp_path):
        engines.append(aiotier_engine)
        assert await aiotier_engine.put("k", b"value")
        assert await aiotier_engine.get("k") == b"value"
        assert await aiotier_engine.lookup("k") is LookupResult.HIT
        assert aiotier_engine.primary.num_blocks == 64
        assert [t.name for t in aiotier_engine.tiers] == ["memory", "ssd"]
        ssd = aiotier_engine.tiers[1]
        assert isinstance(ssd, SSDTier)
        assert ssd.path.startswith(str(tmp_path))

    @pytest.mark.asyncio
    async def test_engine_was_closed_after_the_test():
        (engine,) = engines
        with pytest.raises(TieringError):
            await engine.put("k", b"again")
        assert engine.stats().promotions_in_flight == 0

    @pytest.mark.asyncio
    async def test_engine_metrics_go_to_the_probe(aiotier_engine, aiotier_metrics):
        assert await aiotier_engine.lookup("absent") is LookupResult.MISS
        aiotier_engine.end_step()
        probe = aiotier_metrics.probe
        assert probe.value("aiotier_lookups_total", tier="primary", result="miss") == 1
        assert probe.value("aiotier_lookups_total", tier="ssd", result="miss") == 1

    @pytest.mark.asyncio
    async def test_faulty_tier_turns_reads_into_misses(aiotier_faulty_tier, aiotier_metrics):
        tier = aiotier_faulty_tier
        assert isinstance(tier, FaultyTier)
        await tier.write_many([(b"k", b"v")])
        tier.fail("read")
        provider, probe = aiotier_metrics
        async with TieringEngine(PrimaryTier(4, 16), [tier], meter_provider=provider) as e:
            assert await e.get("k") is None
            e.end_step()
        assert tier.calls["read"] == 1
        assert probe.value("aiotier_promotions_total", tier="faulty", outcome="error") == 1
    """
)

USER_OVERRIDE = textwrap.dedent(
    """
    import pytest

    @pytest.fixture
    def aiotier_engine_options(aiotier_engine_options):
        return {**aiotier_engine_options, "num_blocks": 4, "write_policy": "write_through"}

    @pytest.mark.asyncio
    async def test_options_can_be_overridden(aiotier_engine):
        assert aiotier_engine.primary.num_blocks == 4
        assert aiotier_engine.options.write_policy == "write_through"
    """
)


def test_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert found.get("aiotier") == "aiotier.pytest_plugin"


def test_user_suite_runs_with_the_fixtures(pytester: pytest.Pytester) -> None:
    """A user's suite in pytest-asyncio's default (strict) mode, the plugin found by entry point."""
    pytester.makepyfile(test_user=USER_TESTS, test_override=USER_OVERRIDE)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=5)


def test_every_fixture_is_prefixed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest("--fixtures", "-p", "no:cacheprovider")
    lines = result.stdout.str().splitlines()
    start = next(i for i, line in enumerate(lines) if "defined from aiotier.pytest_plugin" in line)
    names = []
    for line in lines[start + 1 :]:
        if line.startswith("--") or line.startswith("=="):
            break
        match = re.match(r"([a-z_][a-z0-9_]*)( \[[a-z ]+\])? -- ", line)
        if match:
            names.append(match.group(1))
    assert {"aiotier_engine", "aiotier_faulty_tier", "aiotier_metrics"} <= set(names), names
    assert all(n.startswith("aiotier_") for n in names), names


async def test_the_fixtures_work_in_auto_mode_under_blockbuster(
    aiotier_engine: Any, aiotier_metrics: Any, aiotier_faulty_tier: Any
) -> None:
    """This suite runs pytest-asyncio in auto mode, with blockbuster watching aiotier's frames."""
    assert await aiotier_engine.put(b"k", b"v")
    for i in range(80):  # more than the 64-block primary: some go down to memory and the SSD
        assert await aiotier_engine.put(b"fill-%d" % i, b"x" * 100)
    assert await aiotier_engine.get(b"k") == b"v"
    aiotier_engine.end_step()
    assert aiotier_metrics.probe.value("aiotier_evictions_total", tier="primary") > 0
    assert aiotier_faulty_tier.calls["read"] == 0
