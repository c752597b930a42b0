"""The trace case's peer: vLLM's own managers replayed through the same scheduler path. Runs
where vLLM imports (the real-vLLM CI step), skips elsewhere with the reason; with
``AIOTIER_TEST_VLLM=required`` (set by scripts/vllm_ci.sh) a vLLM that does not import fails
them."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path

import pytest

from aiotier import PrimaryTier
from aiotier_bench.trace_cases import COMBINATIONS, trace_cases
from aiotier_bench.trace_optimum import optimum_hits
from aiotier_bench.trace_replay import replay
from aiotier_bench.trace_vllm import (
    VllmBackend,
    adapter_replay,
    adapter_types,
    tiering_manager,
    vllm_manager,
    vllm_unavailable,
)
from aiotier_bench.traces import Trace, TraceRequest

_missing = vllm_unavailable()
if _missing is not None and os.environ.get("AIOTIER_TEST_VLLM") == "required":
    raise RuntimeError(f"AIOTIER_TEST_VLLM=required but {_missing}")
pytestmark = pytest.mark.skipif(_missing is not None, reason=_missing or "")


def trace_of(*requests: tuple[float, list[int]]) -> Trace:
    return Trace("hand", tuple(TraceRequest(t, 1, tuple(b)) for t, b in requests))


HAND = trace_of((0, [1, 2, 3]), (1000, [1, 2, 4]), (2000, [5, 6]), (3000, [1, 2]),
                (4000, [1, 2, 4]))  # fmt: skip


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_vllms_manager_replays_the_hand_trace(policy: str) -> None:
    # vLLM ranks a finished request's blocks tail first, so its heads outlive their tails:
    # both policies keep 1 and 2 through the step that stores 5 and 6
    r = asyncio.run(replay(HAND, VllmBackend(vllm_manager(4, policy))))
    assert (r.hits, r.deferrals, r.store_failures) == (6, 0, 0)
    assert r.hits <= optimum_hits(list(HAND.references()), 4)


def test_vllm_defers_a_request_on_a_pending_store_like_aiotier() -> None:
    trace = trace_of((0, [1, 2]), (10, [1, 3]))
    r = asyncio.run(replay(trace, VllmBackend(vllm_manager(8, "lru"))))
    assert (r.hits, r.deferrals, r.steps) == (1, 1, 3)


def test_vllms_tiering_manager_promotes_from_its_example_tier() -> None:
    async def run() -> tuple[int, int]:
        manager = await asyncio.to_thread(tiering_manager, 2)
        try:
            r = await replay(trace_of((0, [1, 2]), (1000, [3, 4]), (2000, [1, 2])),
                             VllmBackend(manager))  # fmt: skip
        finally:
            await asyncio.to_thread(manager.shutdown)
        return r.hits, r.deferrals

    # 1 and 2 were pushed out of the 2-chunk primary by 3 and 4; the example tier has them
    assert asyncio.run(run()) == (2, 1)


@pytest.mark.parametrize("capacity", [3, 8, 20, 60])
def test_the_adapter_hits_what_vllms_lru_manager_hits(capacity: int) -> None:
    # both refresh a request's blocks tail first when it finishes: every replay agrees exactly
    rng = random.Random(capacity)
    requests = []
    for i in range(150):  # shared prefixes of random length, private tails, mixed lengths
        prefix = list(range(rng.choice((0, 100, 200, 300)), 0, -1))[: rng.randrange(0, 12)]
        tail = [1000 + 10 * i + j for j in range(rng.randrange(1, 6))]
        requests.append(TraceRequest(250.0 * i, rng.randrange(1, 8), tuple(prefix + tail)))
    trace = Trace("random", tuple(requests))
    base, _, label = adapter_types()
    assert label.startswith("vLLM ") and base.__name__ == "vllm.v1.kv_offload.base"
    adapter = adapter_replay(trace, PrimaryTier(capacity, 16))
    vllm = asyncio.run(replay(trace, VllmBackend(vllm_manager(capacity, "lru"))))
    assert adapter.hits > 0
    assert (adapter.hits, adapter.deferrals, adapter.store_failures, adapter.steps) == (
        vllm.hits, vllm.deferrals, vllm.store_failures, vllm.steps)  # fmt: skip


def test_the_trace_cases_carry_vllms_figures_as_the_peer(tmp_path: Path) -> None:
    f = tmp_path / "tiny.jsonl"
    f.write_text("".join(
        json.dumps({"timestamp": 1000 * i, "output_length": 2, "hash_ids": [1 + i % 5, 100 + i]})
        + "\n" for i in range(40)
    ))  # fmt: skip
    cases = asyncio.run(trace_cases(f, None))
    grid = [c for c in cases if c.name == "trace"]
    assert len(grid) == 4 * len(COMBINATIONS)
    for c in grid:
        assert set(c.extra["vllm"]) == {"lru", "arc"}
        assert c.peer is not None and c.peer.name.startswith("vLLM ")
        assert c.peer.value == max(v["hit_ratio"] for v in c.extra["vllm"].values())
        assert c.peer.value <= c.extra["optimum_hit_ratio"]
        assert c.extra["peer_us_per_request"] > 0
        adapter = c.extra["aiotier_vllm_adapter"]
        assert adapter["types"].startswith("vLLM ")
        assert adapter["hit_ratio"] == c.extra["vllm"]["lru"]["hit_ratio"]
    (tiered,) = [c for c in cases if c.name == "trace_tiered"]
    assert tiered.peer is not None and "TieringOffloadingManager" in tiered.peer.name
    assert tiered.extra["peer_us_per_request"] > 0
