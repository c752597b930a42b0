"""Bad input to the public API: a clear exception of the SPEC's kinds, nothing changed.

Hypothesis throws wrong types, oversized and empty values, odd unicode, duplicate keys in one
call and huge batches at every public method of an engine that holds some state (ready blocks,
a pinned load, a pending store, a request). Each bad call must raise ``TypeError`` /
``ValueError`` (``ConfigError`` is one) / ``TieringError`` / ``BlockNotReadyError`` with a
non-empty message, leave the block table, pins, block states, requests and in-flight records
exactly as they were, and the engine must answer a ``get`` correctly right after. Valid odd
keys (empty, 1024 bytes, NUL bytes, path-like, any unicode) must work end to end, also through
an SSD tier. After ``aclose()`` every call gets a clear ``TieringError`` (or a type error).

``AIOTIER_TEST_BAD_INPUT_EXAMPLES`` (default 150 per test) sets the number of inputs per test.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from aiotier import (
    BlockNotReadyError,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    SSDTier,
    TieringEngine,
    TieringError,
)
from aiotier._core.values import PIECE_KEY_PREFIX

EXAMPLES = int(os.environ.get("AIOTIER_TEST_BAD_INPUT_EXAMPLES", "150"))
BLOCK = 64
ALLOWED = (TypeError, ValueError, TieringError, BlockNotReadyError)
HOLDER = RequestContext("holder")
FIGURES: Counter[str] = Counter()

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# ------------------------------------------------------------------------------ strategies

NOT_A_KEY = st.one_of(
    st.none(),
    st.integers(),
    st.floats(allow_nan=True),
    st.booleans(),
    st.binary(max_size=8).map(bytearray),
    st.binary(max_size=8).map(memoryview),
    st.lists(st.binary(max_size=4), max_size=3),
    st.tuples(st.binary(max_size=4)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.builds(object),
    st.just(RequestContext("not-a-key")),
)
TOO_LONG = st.one_of(
    st.binary(min_size=1025, max_size=4096),
    st.integers(1025, 5000).map(lambda n: "x" * n),
    st.integers(342, 1500).map(lambda n: "€" * n),  # 3 bytes each: > 1024 bytes from 342 on
    st.integers(257, 600).map(lambda n: "😀" * n),  # 4 bytes each
)
BAD_KEY = st.one_of(NOT_A_KEY, TOO_LONG)
GOOD_KEY = st.one_of(
    st.binary(max_size=1024),
    st.text(max_size=200),  # any unicode, lone surrogates included (UTF-8 surrogatepass)
    st.sampled_from(
        [
            "",
            b"",
            "../../etc/passwd",
            "/abs/path",
            "a\x00b",
            "x" * 1024,
            b"\xff" * 1024,
            "\u202e\u200b",
            "CON",
            "..",
            ".",
        ]
    ),
).filter(  # keys that name the pieces of values over several blocks are the engine's own
    lambda k: not (k.encode("utf-8", "surrogatepass") if isinstance(k, str) else k).startswith(
        PIECE_KEY_PREFIX
    )
)
NOT_A_REQ = st.one_of(st.text(max_size=5), st.integers(), st.just(object()), st.just(("r",)))
NOT_DATA = st.one_of(st.text(max_size=8), st.integers(), st.none(), st.lists(st.integers(0, 255)))
BAD_TIMEOUT = st.one_of(
    st.floats(max_value=-1e-9), st.just(math.nan), st.text(max_size=3), st.just(True)
)


# ------------------------------------------------------------------------------ the engine


class Harness:
    """An open engine with some state in it, driven from its own event loop."""

    def __init__(self, engine: TieringEngine) -> None:
        self.loop = asyncio.new_event_loop()
        self.engine = engine
        self.loop.run_until_complete(engine.open())
        self.values = {b"k%d" % i: b"v%d" % i for i in range(4)}
        for k, v in self.values.items():
            assert self.run(engine.put(k, v))
        engine.prepare_load([b"k0"], HOLDER)  # a pinned load
        out = engine.prepare_store([b"pending"], HOLDER)  # a pending store
        assert out is not None

    def run(self, value: Any) -> Any:
        if inspect.isawaitable(value):
            return self.loop.run_until_complete(value)
        return value

    def snapshot(self) -> tuple[Any, ...]:
        e = self.engine
        t = e.core.table
        return (
            dict(t.index),
            list(t.state),
            list(t.pins),
            e.stats().pinned_blocks,
            {
                rs.req_id: (
                    dict(rs.promo_pins),
                    {k: list(v) for k, v in rs.load_pins.items()},
                    dict(rs.stores),
                )
                for rs in e.core.requests.live()
            },
            sorted(e.core.inflight.waiting_keys()),
            dict(e.core.inflight.store_deadline),
            len(e.core.events),
        )

    def expect_rejected(self, call: Callable[[], Any], what: str) -> BaseException:
        """``call`` must raise an allowed, explained error and change nothing."""
        before = self.snapshot()
        with pytest.raises(ALLOWED) as info:
            self.run(call())
        assert str(info.value), f"{what}: {type(info.value).__name__} without a message"
        assert self.snapshot() == before, f"{what} changed the engine's state"
        FIGURES[what] += 1
        return info.value

    def still_works(self) -> None:
        assert self.run(self.engine.get(b"k1")) == b"v1"
        assert self.run(self.engine.lookup("k2")).value == "hit"

    def close(self) -> None:
        self.run(self.engine.aclose())
        self.loop.close()


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness(TieringEngine(PrimaryTier(16, BLOCK), [MemoryTier(1 << 16)]))
    try:
        yield harness
    finally:
        harness.close()


# ------------------------------------------------------------------------------ keys


@SETTINGS
@given(key=BAD_KEY, method=st.sampled_from(["lookup", "get", "put", "delete"]))
def test_a_bad_key_is_refused_by_single_key_calls(h: Harness, key: Any, method: str) -> None:
    e = h.engine
    calls: dict[str, Callable[[], Any]] = {
        "lookup": lambda: e.lookup(key),
        "get": lambda: e.get(key),
        "put": lambda: e.put(key, b"data"),
        "delete": lambda: e.delete(key),
    }
    exc = h.expect_rejected(calls[method], f"bad key to {method}")
    assert isinstance(exc, TypeError | ValueError)
    h.still_works()


@SETTINGS
@given(
    bad=BAD_KEY,
    position=st.integers(0, 3),
    method=st.sampled_from(
        [
            "lookup_prefix",
            "prepare_load",
            "complete_load",
            "prepare_store",
            "complete_store",
            "touch",
            "wait",
        ]
    ),
)
def test_one_bad_key_in_a_batch_refuses_the_whole_batch(
    h: Harness, bad: Any, position: int, method: str
) -> None:
    """The good keys around it (a HIT, a new key, a loaded one) are not touched either."""
    e = h.engine
    keys: list[Any] = [b"k1", "k2", b"brand-new"]
    keys.insert(position, bad)
    calls: dict[str, Callable[[], Any]] = {
        "lookup_prefix": lambda: e.lookup_prefix(keys, HOLDER),
        "prepare_load": lambda: e.prepare_load(keys, HOLDER),
        "complete_load": lambda: e.complete_load(keys, HOLDER),
        "prepare_store": lambda: e.prepare_store(keys, HOLDER),
        "complete_store": lambda: e.complete_store(keys, HOLDER),
        "touch": lambda: e.touch(keys),
        "wait": lambda: e.wait(keys, timeout=1.0),
    }
    h.expect_rejected(calls[method], f"bad key in a batch to {method}")
    h.still_works()


@SETTINGS
@given(n=st.integers(1000, 20000), bad=BAD_KEY)
def test_a_huge_batch_with_one_bad_key_at_its_end_changes_nothing(
    h: Harness, n: int, bad: Any
) -> None:
    e = h.engine
    keys: list[Any] = [b"huge-%d" % i for i in range(n)] + [bad]
    h.expect_rejected(lambda: e.lookup_prefix(keys), "huge batch to lookup_prefix")
    h.expect_rejected(lambda: e.prepare_store(keys), "huge batch to prepare_store")
    h.still_works()


@settings(SETTINGS, max_examples=max(EXAMPLES // 3, 10))
@given(keys=st.lists(GOOD_KEY, min_size=1, max_size=12))
def test_odd_but_valid_keys_work_end_to_end_through_an_ssd(
    ssd_harness: Harness, keys: list[bytes | str]
) -> None:
    """Empty, 1024-byte, NUL, path-like and arbitrary unicode keys: put, get, delete, and the
    SSD tier below (a 2-block primary pushes them down) keeps every file inside its directory."""
    e = ssd_harness.engine
    run = ssd_harness.run
    norm = [k.encode("utf-8", "surrogatepass") if isinstance(k, str) else k for k in keys]
    expected = {}
    for k, n in zip(keys, norm, strict=True):
        value = n[:BLOCK] or b"-"
        assert run(e.put(k, value))
        expected[n] = value
    for n, value in expected.items():
        assert run(e.get(n)) == value  # str and bytes name the same block
    for n in expected:
        run(e.delete(n))
        assert run(e.get(n)) is None
    FIGURES["odd valid keys"] += len(keys)


@pytest.fixture(scope="module")
def ssd_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bad-input") / "ssd"


@pytest.fixture
def ssd_harness(ssd_root: Path) -> Iterator[Harness]:
    tier = SSDTier(ssd_root, 1 << 20, io_threads=1)
    harness = Harness(TieringEngine(PrimaryTier(8, BLOCK), [tier]))
    try:
        yield harness
    finally:
        harness.close()
    inside = ssd_root.resolve()
    for p in ssd_root.rglob("*"):
        assert p.resolve().is_relative_to(inside), p
    outside = [p for p in ssd_root.parent.iterdir() if p != ssd_root]
    assert not outside, f"files outside the tier's directory: {outside}"


# ------------------------------------------------------------------------------ other arguments


@SETTINGS
@given(
    req=NOT_A_REQ,
    method=st.sampled_from(
        [
            "lookup",
            "lookup_prefix",
            "get",
            "prepare_load",
            "complete_load",
            "prepare_store",
            "complete_store",
        ]
    ),
)
def test_a_request_that_is_not_a_request_context_is_refused(
    h: Harness, req: Any, method: str
) -> None:
    e = h.engine
    calls: dict[str, Callable[[], Any]] = {
        "lookup": lambda: e.lookup("k1", req),
        "lookup_prefix": lambda: e.lookup_prefix(["k1", "nope"], req),
        "get": lambda: e.get("k1", req),
        "prepare_load": lambda: e.prepare_load(["k1"], req),
        "complete_load": lambda: e.complete_load(["k0"], req),
        "prepare_store": lambda: e.prepare_store(["fresh"], req),
        "complete_store": lambda: e.complete_store(["pending"], req),
    }
    exc = h.expect_rejected(calls[method], f"bad req to {method}")
    assert isinstance(exc, TypeError)
    h.still_works()


@SETTINGS
@given(data=st.one_of(NOT_DATA, st.binary(min_size=15 * BLOCK + 1, max_size=BLOCK * 64)))
def test_put_refuses_data_that_is_not_bytes_or_too_long(h: Harness, data: Any) -> None:
    """Too long: over ``max_value_bytes`` (the harness's primary: 16 blocks, 15 of them)."""
    exc = h.expect_rejected(lambda: h.engine.put("k1", data), "bad data to put")
    if isinstance(data, bytes):
        assert isinstance(exc, ValueError) and str(len(data)) in str(exc)  # names the sizes
    h.still_works()


def test_put_refuses_a_huge_value(h: Harness) -> None:
    h.expect_rejected(lambda: h.engine.put("k1", bytes(10 << 20)), "10 MiB to put")
    h.still_works()


@SETTINGS
@given(
    sizes=st.one_of(
        st.lists(st.integers(0, BLOCK), min_size=2, max_size=3),  # wrong length
        st.tuples(
            st.one_of(
                st.integers(max_value=-1),
                st.integers(min_value=BLOCK + 1),
                st.floats(),
                st.text(max_size=2),
                st.none(),
                st.just(True),
            )
        ),
    ),
)
def test_complete_store_refuses_bad_sizes(h: Harness, sizes: Any) -> None:
    h.expect_rejected(
        lambda: h.engine.complete_store(["pending"], HOLDER, sizes=sizes), "bad sizes"
    )
    h.still_works()


@SETTINGS
@given(timeout=BAD_TIMEOUT)
def test_wait_refuses_a_bad_timeout(h: Harness, timeout: Any) -> None:
    h.expect_rejected(lambda: h.engine.wait(["k1"], timeout=timeout), "bad timeout to wait")
    h.still_works()


@SETTINGS
@given(
    ids=st.one_of(
        st.text(min_size=1, max_size=4),  # a single id, not a list of them
        st.lists(st.one_of(st.integers(), st.none(), st.binary(max_size=3)), min_size=1),
    ),
    which=st.sampled_from(["new_req_ids", "finished_req_ids"]),
)
def test_end_step_refuses_bad_request_ids(h: Harness, ids: Any, which: str) -> None:
    step = h.engine.stats().step
    h.expect_rejected(lambda: h.engine.end_step(**{which: ids}), f"bad {which}")
    assert h.engine.stats().step == step
    h.still_works()


@SETTINGS
@given(
    tier=st.one_of(
        st.text(max_size=6).filter(lambda s: s != "memory"), st.integers(), st.just(MemoryTier(16))
    )
)
def test_lookup_refuses_an_exclude_tier_that_is_not_ours(h: Harness, tier: Any) -> None:
    h.expect_rejected(lambda: h.engine.lookup("k1", exclude_tier=tier), "bad exclude_tier")
    h.still_works()


@SETTINGS
@given(single=st.one_of(st.binary(max_size=8), st.text(max_size=8)))
def test_a_single_key_where_a_list_is_expected_is_refused(h: Harness, single: Any) -> None:
    """``lookup_prefix("abc")`` would otherwise look up "a", "b", "c"."""
    e = h.engine
    for name, call in [
        ("lookup_prefix", lambda: e.lookup_prefix(single)),
        ("prepare_load", lambda: e.prepare_load(single)),
        ("prepare_store", lambda: e.prepare_store(single)),
        ("wait", lambda: e.wait(single)),
        ("touch", lambda: e.touch(single)),
    ]:
        exc = h.expect_rejected(call, f"single key to {name}")
        assert isinstance(exc, TypeError)
    h.still_works()


# ------------------------------------------------------------------------------ duplicates


@SETTINGS
@given(dups=st.integers(2, 5))
def test_duplicate_keys_in_one_call(h: Harness, dups: int) -> None:
    """prepare_store counts a duplicate once; complete_store of a duplicate is refused; a
    doubled load pins twice and needs two completions; over-completing is refused."""
    e = h.engine
    out = e.prepare_store(["dup"] * dups, HOLDER)
    assert out is not None and out.keys_to_store == (b"dup",)
    h.expect_rejected(lambda: e.complete_store(["dup"] * dups, HOLDER), "duplicate complete_store")
    e.complete_store(["dup"], HOLDER, sizes=[0])
    assert h.run(e.get("dup")) == b""
    before = e.stats().pinned_blocks
    e.prepare_load(["k3"] * dups, HOLDER)
    h.expect_rejected(lambda: e.complete_load(["k3"] * (dups + 1), HOLDER), "over-complete_load")
    e.complete_load(["k3"] * dups, HOLDER)
    assert e.stats().pinned_blocks == before
    h.expect_rejected(lambda: e.prepare_load(["k1", "absent", "k1"], HOLDER), "load of a miss")
    h.run(e.delete("dup"))
    h.still_works()


# ------------------------------------------------------------------------------ after aclose


def test_every_call_after_aclose_gets_a_clear_error(tmp_path: Path) -> None:
    h = Harness(TieringEngine(PrimaryTier(16, BLOCK), [SSDTier(tmp_path / "ssd", 1 << 20)]))
    e = h.engine
    h.run(e.aclose())
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("open", lambda: e.open()),
        ("lookup", lambda: e.lookup("k1")),
        ("lookup_prefix", lambda: e.lookup_prefix(["k1", "k2"], HOLDER)),
        ("get", lambda: e.get("k1")),
        ("put", lambda: e.put("k1", b"x")),
        ("delete", lambda: e.delete("k1")),
        ("wait", lambda: e.wait(["k1"])),
        ("prepare_load", lambda: e.prepare_load(["k1"])),
        ("prepare_store", lambda: e.prepare_store(["k9"])),
        ("complete_store", lambda: e.complete_store(["pending"], HOLDER)),
        ("flush", lambda: e.flush()),
    ]
    for name, call in calls:
        with pytest.raises(TieringError, match="closed"):
            h.run(call())
        FIGURES[f"{name} after aclose"] += 1
    # bad input after close is still refused with a clear error of the allowed kinds
    with pytest.raises(ALLOWED):
        h.run(e.lookup(12345))  # type: ignore[arg-type]
    # what stays harmless: stats, events, a step boundary, a second aclose
    assert e.stats().pinned_blocks == 0
    e.take_events()
    e.end_step(finished_req_ids=["holder"])
    h.run(e.aclose())
    pending = [t for t in asyncio.all_tasks(h.loop) if not t.done()]
    assert not pending
    h.loop.close()


def test_print_figures() -> None:
    if FIGURES:
        print(f"\nbad input: {sum(FIGURES.values())} bad calls refused:", dict(FIGURES))
