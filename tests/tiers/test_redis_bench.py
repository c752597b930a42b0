"""Smoke test of the ``redis_promote`` benchmark: it runs and its record has the documented shape.

Figures are not asserted (benchmarks are never timed pytest assertions).
"""

from __future__ import annotations

import json

import pytest
from redis_fixtures import require_redis_server

from aiotier_bench import redis as redis_bench

pytestmark = pytest.mark.redis


async def test_redis_promote_quick_runs_and_reports_ratios() -> None:
    require_redis_server()  # the benchmark starts its own server; fail/skip like the others
    cases = await redis_bench.run_local(quick=True)
    assert [c.name for c in cases] == ["redis_promote"]
    record = json.loads(json.dumps(cases[0].to_json()))
    assert record["unit"] == "GB/s"
    assert record["higher_is_better"] is True
    assert record["params"]["block_size"] == 256 * 1024
    for field in ("aiotier", "ratio_to_floor", "ratio_to_peer", "loop_lag_p99_ms"):
        assert isinstance(record[field], float)
        assert record[field] > 0
    assert "MGET" in record["floor"]["name"]
    assert "aiocache" in record["peer"]["name"]
