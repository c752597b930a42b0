"""The trace replay: exact hits on hand-made traces, the optimum against a brute force, the bound
it claims against every policy, the loader's checks and ``aiotier bench --trace``."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiotier import PrimaryTier, TieringEngine
from aiotier_bench.trace_cases import ADMISSIONS, COMBINATIONS
from aiotier_bench.trace_engine import EngineBackend
from aiotier_bench.trace_optimum import infinite_hits, optimum_hits, prefix_optimum_hits
from aiotier_bench.trace_replay import ReplayResult, replay
from aiotier_bench.trace_vllm import adapter_replay
from aiotier_bench.traces import Trace, TraceError, TraceRequest, load_trace, shipped_traces


def trace_of(*requests: tuple[float, Sequence[int]], output_length: int = 1) -> Trace:
    return Trace("hand", tuple(TraceRequest(t, output_length, tuple(b)) for t, b in requests))


async def replay_engine(
    trace: Trace, capacity: int, policy: str = "lru", admission: str = "all", count: bool = False
) -> ReplayResult:
    engine = TieringEngine(
        PrimaryTier(capacity, 16, policy=policy),
        admission={"primary": ADMISSIONS[admission]()},
    )
    async with engine:
        return await replay(trace, EngineBackend(engine), count_calls=count)


# one request per step; LRU of 4 blocks (the order after each step in the comments, LRU first)
HAND = trace_of(
    (0, [1, 2, 3]),  # miss x3, stores 1 2 3            -> 1 2 3
    (1000, [1, 2, 4]),  # hits 1 2, stores 4            -> 3 1 2 4
    (2000, [5, 6]),  # misses, stores 5 6 evicting 3 1  -> 2 4 5 6
    (3000, [1, 2]),  # 1 misses (2 is resident but after the miss), stores 1 evicting 4
    (4000, [1, 2, 4]),  # hits 1 2, stores 4 evicting 5 -> 6 1 2 4
)


async def test_replay_counts_each_requests_leading_hits_exactly() -> None:
    r = await replay_engine(HAND, 4)
    assert (r.requests, r.blocks, r.hits, r.deferrals, r.store_failures) == (5, 13, 4, 0, 0)
    assert r.hit_ratio == pytest.approx(4 / 13)
    assert r.steps == 6  # five arrival steps and the last request's finish
    assert r.us_per_request > 0


async def test_counting_python_calls_leaves_the_counts_alone() -> None:
    plain, counted = await replay_engine(HAND, 4), await replay_engine(HAND, 4, count=True)
    assert plain.python_calls is None and plain.python_calls_per_request is None
    assert (counted.hits, counted.deferrals, counted.steps) == (plain.hits, 0, plain.steps)
    assert counted.python_calls_per_request is not None and counted.python_calls_per_request > 5


async def test_a_request_sharing_a_pending_store_is_deferred_a_step_then_hits() -> None:
    # both arrive in step 0: the second finds block 1 still being stored (RETRY) and waits
    trace = trace_of((0, [1, 2]), (10, [1, 3]))
    r = await replay_engine(trace, 8)
    assert (r.hits, r.deferrals, r.steps) == (1, 1, 3)


async def test_a_store_that_cannot_fit_is_counted_and_stores_nothing() -> None:
    trace = trace_of((0, [1, 2, 3]), (1000, [1, 2, 3]))
    r = await replay_engine(trace, 2)
    assert (r.hits, r.store_failures) == (0, 2)


def test_the_vllm_adapter_replays_through_vllms_calls_and_refreshes_at_finish() -> None:
    # HAND at 4 blocks as vLLM's own managers replay it (tests/bench/test_trace_vllm_peer.py):
    # a finished request's blocks are refreshed tail first, so 1 and 2 outlive 3 and 4 through
    # the step that stores 5 and 6, and both later requests hit them (the engine replay, which
    # refreshes loads at admission: 4)
    primary = PrimaryTier(4, 16)
    r = adapter_replay(HAND, primary)
    assert (r.hits, r.deferrals, r.store_failures, r.steps) == (6, 0, 0, 6)
    r = adapter_replay(trace_of((0, [1, 2]), (10, [1, 3])), PrimaryTier(8, 16))
    assert (r.hits, r.deferrals, r.steps) == (1, 1, 3)  # HIT_PENDING defers, as RETRY does
    r = adapter_replay(trace_of((0, [1, 2, 3]), (1000, [1, 2, 3])), PrimaryTier(2, 16))
    assert (r.hits, r.store_failures) == (0, 2)


async def test_the_vllm_adapter_refuses_to_replay_on_a_running_loop() -> None:
    # vLLM's scheduler has no loop; a BlockingEngine refuses to block one
    with pytest.raises(RuntimeError, match="running event loop"):
        adapter_replay(HAND, PrimaryTier(4, 16))


def test_infinite_cache_counts_up_to_each_requests_first_miss() -> None:
    assert infinite_hits(HAND) == 2 + 0 + 2 + 3
    assert infinite_hits(trace_of((0, [1, 2]), (1, [3, 2]))) == 0  # 2 comes after a miss


def test_optimum_on_the_hand_trace() -> None:
    refs = list(HAND.references())
    assert optimum_hits(refs, 0) == 0
    assert optimum_hits(refs, 4) == 7  # every re-reference: 1 and 2 three times each, 4 once
    assert optimum_hits(refs, 3) == 7  # 3, 5 and 6 are never used again: never admitted
    assert optimum_hits(refs, 1) == 3  # keep 1 from the start
    assert optimum_hits(refs, 100) == sum(1 for i, b in enumerate(refs) if b in refs[:i])


def brute_force(refs: Sequence[int], capacity: int) -> int:
    """Every choice at every miss: bypass, take a free slot, or evict any resident block."""

    @functools.cache
    def best(i: int, cache: frozenset[int]) -> int:
        if i == len(refs):
            return 0
        b = refs[i]
        if b in cache:
            return 1 + best(i + 1, cache)
        options = [best(i + 1, cache)]
        if len(cache) < capacity:
            options.append(best(i + 1, cache | {b}))
        else:
            options += [best(i + 1, (cache - {v}) | {b}) for v in cache]
        return max(options)

    return best(0, frozenset())


@given(
    refs=st.lists(st.integers(0, 5), max_size=14),
    capacity=st.integers(0, 4),
)
@settings(max_examples=300, deadline=None)
def test_optimum_matches_a_brute_force(refs: list[int], capacity: int) -> None:
    assert optimum_hits(refs, capacity) == brute_force(refs, capacity)


prefix_requests = st.lists(
    st.tuples(
        st.integers(0, 3),  # which of four prompt families
        st.integers(1, 4),  # how many of its blocks
        st.integers(0, 2),  # a private tail block or not
        st.integers(0, 3000),  # arrival (ms)
    ),
    min_size=1,
    max_size=12,
)


@given(reqs=prefix_requests, capacity=st.integers(1, 6), combo=st.sampled_from(COMBINATIONS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_policy_beats_the_optimum(
    reqs: list[tuple[int, int, int, int]], capacity: int, combo: tuple[str, str]
) -> None:
    """The documented bound: no replay of any shipped combination hits more than the optimum."""
    requests = []
    for n, (family, length, tail, at) in enumerate(reqs):
        blocks = [100 * family + i for i in range(length)] + ([1000 + n] if tail else [])
        requests.append((float(at), blocks))
    trace = trace_of(*sorted(requests, key=lambda r: r[0]))
    r = asyncio.run(replay_engine(trace, capacity, *combo))
    assert r.hits <= optimum_hits(list(trace.references()), capacity)
    assert r.hits <= infinite_hits(trace)


@given(reqs=prefix_requests, capacity=st.integers(0, 6))
@settings(max_examples=300, deadline=None)
def test_a_prefix_cache_reaches_the_optimum_when_ids_chain(
    reqs: list[tuple[int, int, int, int]], capacity: int
) -> None:
    """The optimum's schedule holds a block's parent whenever it holds the block, so counting
    its hits as a prefix cache does (up to each request's first miss) loses none."""
    trace = trace_of(*(
        (float(at), [100 * family + i for i in range(length)] + ([1000 + n] if tail else []))
        for n, (family, length, tail, at) in enumerate(reqs)
    ))  # fmt: skip
    refs = list(trace.references())
    assert prefix_optimum_hits(trace, capacity) == optimum_hits(refs, capacity)


def test_where_ids_do_not_chain_a_prefix_cache_can_fall_short_of_the_optimum() -> None:
    trace = trace_of((0, [1, 2]), (1, [3, 2]))  # block 2 after two different parents
    assert optimum_hits(list(trace.references()), 1) == 1  # keeps 2 alone
    assert prefix_optimum_hits(trace, 1) == 0  # 2 follows the miss on 3


def write_lines(path: Path, *lines: object) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_load_trace_orders_by_arrival_and_takes_string_ids(tmp_path: Path) -> None:
    f = write_lines(
        tmp_path / "mine.jsonl",
        {"timestamp": 5, "output_length": 2, "hash_ids": ["a", "b"]},
        "",
        {"timestamp": 1, "input_length": 9, "output_length": 0, "hash_ids": [7]},
    )
    trace = load_trace(f)
    assert trace.name == "mine"
    assert [r.blocks for r in trace.requests] == [(7,), ("a", "b")]
    assert load_trace(f, limit=1).requests == trace.requests[:1]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "not JSON"),
        ({"timestamp": 0, "hash_ids": [1]}, "missing field(s) output_length"),
        ({"timestamp": -1, "output_length": 1, "hash_ids": [1]}, "timestamp"),
        ({"timestamp": 0, "output_length": 1.5, "hash_ids": [1]}, "output_length"),
        ({"timestamp": 0, "output_length": 1, "hash_ids": []}, "non-empty list"),
        ({"timestamp": 0, "output_length": 1, "hash_ids": [1, None]}, "hash id"),
        ({"timestamp": 0, "output_length": 1, "hash_ids": [3, 3]}, "repeats"),
        ([1, 2], "JSON object"),
    ],
)
def test_load_trace_names_the_bad_line(tmp_path: Path, line: object, says: str) -> None:
    f = write_lines(tmp_path / "bad.jsonl", {"timestamp": 0, "output_length": 1, "hash_ids": [1]},
                    line)  # fmt: skip
    with pytest.raises(TraceError, match=rf"bad\.jsonl:2: .*{re.escape(says)}"):
        load_trace(f)


def test_the_shipped_traces_are_found_from_the_checkout() -> None:
    names = {p.name for p in shipped_traces()}
    assert names == {"conversation_trace.jsonl", "synthetic_trace.jsonl"}
    assert (shipped_traces()[0].parent / "LICENSE-APACHE").is_file()


def test_bench_trace_file_writes_the_documented_cases(tmp_path: Path) -> None:
    # one request a step: 45 unique blocks, so a 5% primary (2 blocks) holds a request's two
    lines = [{"timestamp": 1000 * i, "output_length": 3, "hash_ids": [1 + i % 5, 100 + i]}
             for i in range(40)]  # fmt: skip
    f = write_lines(tmp_path / "tiny.jsonl", *lines)
    report = tmp_path / "bench.json"
    code = (
        "import sys\nsys.modules['vllm'] = None\nfrom aiotier.cli import main\n"
        f"sys.exit(main(['bench', '--quick', '--trace', {str(f)!r}, '--json', {str(report)!r}]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "vLLM is not importable" in out.stderr
    doc = json.loads(report.read_text())
    cases = [c for c in doc["cases"] if c["name"] == "trace"]
    assert len(cases) == 4 * len(COMBINATIONS)
    for c in cases:
        assert c["params"]["trace"] == "tiny" and c["params"]["requests"] == 40
        assert {"capacity_share", "policy", "admission"} <= set(c["params"])
        assert 0 <= c["hit_ratio"] == c["aiotier"] <= c["optimum_hit_ratio"]
        assert c["optimum_hit_ratio"] <= c["infinite_hit_ratio"] == pytest.approx(
            infinite_hits(load_trace(f)) / 80
        )
        assert c["us_per_request"] > 0
        assert c["peer"] is None and "not importable" in c["vllm"]
        adapter = c["aiotier_vllm_adapter"]  # runs without vLLM, on the adapter's stand-ins
        assert (adapter["policy"], adapter["admission"]) == ("lru", "all")
        assert "stand-in" in adapter["types"] and adapter["us_per_request"] > 0
        assert 0 <= adapter["hit_ratio"] <= c["optimum_hit_ratio"]
        if c["params"]["capacity_share"] == 0.05:
            assert c["python_calls_per_request"] > 0
            assert adapter["python_calls_per_request"] > 0
    (tiered,) = [c for c in doc["cases"] if c["name"] == "trace_tiered"]
    assert tiered["tiers"]["memory"]["write_bytes"] > 0
