"""The synchronous facade: the engine's protocol as plain calls, hits without a thread hop,
many threads at once over a slow, faulty tier, closing with calls in flight."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import write_one

from aiotier import (
    BlockingEngine,
    BlockNotReadyError,
    LookupResult,
    MemoryTier,
    PrimaryTier,
    RequestContext,
    TieringError,
)
from aiotier.testing import FaultyTier

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
R1 = RequestContext("r1")


def seeded_tier(n: int, **faults: float) -> FaultyTier:
    inner = MemoryTier(1 << 20)

    async def seed() -> None:
        for i in range(n):
            await write_one(inner, b"k%d" % i, b"v%d" % i)

    asyncio.run(seed())  # before the facade's loop exists
    tier = FaultyTier(inner)
    for op, seconds in faults.items():
        tier.delay(op, seconds)
    return tier


def test_the_scheduler_protocol_through_the_facade() -> None:
    with BlockingEngine(PrimaryTier(8, 16), [seeded_tier(4)]) as e:
        assert e.lookup("k0", R1) is RETRY
        assert e.wait(["k0"]) == [HIT]
        assert e.lookup("k0", R1) is HIT
        assert e.lookup_prefix(["k1", "k2"], R1) is None
        assert e.wait(["k1", "k2"], timeout=5) == [HIT, HIT]
        assert e.lookup_prefix(["k0", "k1", "k2", "absent"], R1) == 3
        spec = e.prepare_load(["k0", "k1"], R1)
        assert [bytes(b) for b in spec.buffers] == [b"v0", b"v1"]
        e.complete_load(["k0", "k1"], R1)
        e.touch(["k2"])
        out = e.prepare_store(["s"], R1)
        assert out is not None and out.keys_to_store == (b"s",)
        out.store_spec.buffers[0][:5] = b"store"
        e.complete_store(["s"], R1, sizes=[5])
        assert e.prefetch(["k3"], timeout=5) == 1
        e.end_step(new_req_ids=["r1"], finished_req_ids=["r1"])
        assert any(ev.keys == (b"s",) and not ev.removed for ev in e.take_events())
        assert e.stats().counters[("promotions", "memory", "ok")] == 4
        with pytest.raises(BlockNotReadyError):
            e.prepare_load(["absent"])


def test_the_cache_api_through_the_facade() -> None:
    with BlockingEngine(PrimaryTier(2, 16), [MemoryTier(1 << 20)]) as e:
        assert e.put("a", b"A") and e.put("b", b"B") and e.put("c", b"C")  # a goes down
        assert e.get("a") == b"A"  # from below (or on its way down)
        assert e.get("c") == b"C"
        assert e.delete("c") is True
        assert e.get("c") is None
        e.flush()
        assert e.engine.tiers[0].contains_hint(b"a") is True


def test_a_hit_needs_no_thread_hop() -> None:
    """With the engine's loop thread busy, a primary hit still answers at once; a call that
    needs the loop waits for it."""
    with BlockingEngine(PrimaryTier(4, 16)) as e:
        assert e.put("k", b"v")
        busy = threading.Event()

        def block_the_loop() -> None:
            busy.set()
            time.sleep(0.5)

        e.portal.start_task_soon(_run_sync, block_the_loop)
        assert busy.wait(5)
        started = time.monotonic()
        assert e.lookup("k") is HIT and e.lookup_prefix(["k"]) == 1 and e.get("k") == b"v"
        hit_took = time.monotonic() - started
        assert e.get("absent") is None  # this one needs the loop
        assert hit_took < 0.25 < time.monotonic() - started


def test_with_no_tier_below_every_lookup_answers_without_the_loop() -> None:
    """No tier to ask and no promotion to start: a miss, and a RETRY for a store in flight,
    answer in the caller's thread too, counted as the loop would count them."""
    with BlockingEngine(PrimaryTier(4, 16)) as e:
        out = e.prepare_store([b"pending"], R1)
        assert out is not None
        busy, release = threading.Event(), threading.Event()

        def block_the_loop() -> None:
            busy.set()
            release.wait(30)

        e.portal.start_task_soon(_run_sync, block_the_loop)
        assert busy.wait(5)
        answers: list[LookupResult] = []
        asking = threading.Thread(
            target=lambda: answers.extend([e.lookup(b"absent", R1), e.lookup(b"pending", R1)])
        )
        asking.start()
        asking.join(10)
        release.set()
        assert not asking.is_alive(), "a lookup waited for the engine's loop"
        assert answers == [MISS, RETRY]
        e.complete_store([b"pending"], R1)
        lookups = {k[2]: n for k, n in e.stats().counters.items() if k[0] == "lookups"}
        assert lookups == {"miss": 1, "retry": 1}
        assert e.lookup(b"pending", R1) is HIT


async def _run_sync(fn: Callable[[], None]) -> None:
    fn()


def test_a_wait_past_its_timeout_raises() -> None:
    tier = seeded_tier(1)
    tier.hang("read")
    with BlockingEngine(PrimaryTier(4, 16), [tier], promotion_timeout=30) as e:
        assert e.lookup("k0") is RETRY
        with pytest.raises(TimeoutError):
            e.wait(["k0"], timeout=0.05)
        tier.heal()
        assert e.wait(["k0"], timeout=30) == [HIT]


def test_closing_while_another_thread_waits_ends_the_wait() -> None:
    tier = seeded_tier(1)
    tier.hang("read")
    e = BlockingEngine(PrimaryTier(4, 16), [tier], promotion_timeout=30)
    assert e.lookup("k0") is RETRY
    outcome: list[object] = []

    def waiter() -> None:
        try:
            outcome.append(e.wait(["k0"]))
        except Exception as exc:
            outcome.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)  # let it reach the loop; the assertions below do not depend on it
    e.close()
    t.join(10)
    assert not t.is_alive()
    assert outcome and (outcome[0] == [MISS] or isinstance(outcome[0], TieringError))
    with pytest.raises(TieringError):
        e.get("k0")


async def test_the_facade_refuses_a_running_event_loop() -> None:
    with pytest.raises(RuntimeError, match="running event loop"):
        BlockingEngine(PrimaryTier(4, 16))


def test_many_threads_at_once_never_see_wrong_bytes() -> None:
    """Eight threads put, get, look up, load and store one shared key space over a slow tier
    that fails some reads: every value read is one some thread wrote for that key, nothing
    deadlocks, and closing with calls in flight leaves no pin."""
    tier = seeded_tier(0, read=0.001, write=0.001)
    tier.fail("read", 0.1)
    keys = [f"k{i}" for i in range(12)]
    written: dict[str, set[bytes]] = {k: set() for k in keys}
    guard = threading.Lock()
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(n: int) -> None:
        rng = random.Random(n)
        req = RequestContext(f"t{n}")
        try:
            while not stop.is_set():
                k = rng.choice(keys)
                op = rng.randrange(5)
                if op == 0:
                    value = b"%d-%d" % (n, rng.randrange(1000))
                    with guard:
                        written[k].add(value)
                    e.put(k, value)
                elif op == 1:
                    got = e.get(k)
                    assert got is None or got in written[k], (k, got)
                elif op == 2:
                    if e.lookup(k, req) is RETRY:
                        e.wait([k], timeout=10)
                elif op == 3:
                    n_hits = e.lookup_prefix([k], req)
                    if n_hits:
                        try:
                            spec = e.prepare_load([k], req)
                        except BlockNotReadyError:
                            continue  # evicted since: a snapshot, as on the loop
                        assert bytes(spec.buffers[0]) in written[k]
                        e.complete_load([k], req)
                else:
                    out = e.prepare_store([k], req)
                    if out is not None and out.keys_to_store:
                        value = b"s%d-%d" % (n, rng.randrange(1000))
                        with guard:
                            written[k].add(value)
                        out.store_spec.buffers[0][: len(value)] = value
                        e.complete_store([k], req, sizes=[len(value)])
                e.end_step(finished_req_ids=[req.req_id] if rng.random() < 0.2 else ())
        except TieringError:
            pass  # the engine closed under this call
        except BaseException as exc:
            errors.append(exc)

    def run_workers(seconds: float, then: Callable[[], None]) -> None:
        stop.clear()
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        then()
        stop.set()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a caller thread is stuck"
        assert not errors, errors[:3]

    e = BlockingEngine(PrimaryTier(6, 16), [tier], promotion_timeout=5)
    run_workers(1.0, lambda: None)
    # no lost block: every key written is still readable (write-back keeps each evicted block)
    tier.heal()
    e.flush()
    for k, values in written.items():
        if values:
            assert e.get(k) in values, k
    run_workers(0.5, e.close)  # closing with calls in flight
    assert e.stats().pinned_blocks == 0


def test_wait_wakes_when_another_thread_completes_the_store_it_waits_for() -> None:
    # a complete_store landing between wait()'s "in flight?" and its registration woke no one:
    # the wait slept to the store's RETRY deadline (promotion_timeout)
    deadline = 5.0
    slow: list[float] = []
    with BlockingEngine(PrimaryTier(1024, 64), promotion_timeout=deadline) as e:

        def pairs(n: int) -> None:
            rng = random.Random(n)
            for i in range(150):
                k = f"{n}-{i}"
                assert e.prepare_store([k]) is not None
                ready = threading.Event()

                def waiter(k: str = k, ready: threading.Event = ready) -> None:
                    ready.set()
                    t0 = time.monotonic()
                    assert e.wait([k]) == [HIT]
                    slow.extend([time.monotonic() - t0] if time.monotonic() - t0 > 1 else [])

                t = threading.Thread(target=waiter)
                t.start()
                ready.wait()
                time.sleep(rng.uniform(0, 0.0005))
                e.complete_store([k], sizes=[1])
                t.join()

        threads = [threading.Thread(target=pairs, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert slow == []


def test_close_from_the_engines_own_loop_is_refused_and_leaves_it_closable() -> None:
    e = BlockingEngine(PrimaryTier(4, 8))
    assert e.put("k", b"v")

    async def close_here() -> None:
        e.close()

    with pytest.raises(RuntimeError, match="running event loop"):
        e.portal.call(close_here)
    assert e.lookup("k") is HIT  # still open
    e.close()
    assert e.engine.core.closed
    assert not [t for t in threading.enumerate() if t is not threading.main_thread()]


def test_a_second_close_waits_for_the_first() -> None:
    tier = FaultyTier(MemoryTier(1 << 20)).delay("write", 0.5)
    e = BlockingEngine(PrimaryTier(8, 64), [tier])
    assert e.put("k", b"v")  # written down at close, slowly
    first = threading.Thread(target=e.close)
    first.start()
    time.sleep(0.1)
    e.close()
    assert not first.is_alive()  # the second returned once the first had ended
    assert tier.inner.contains_hint(b"k")
    first.join()


def test_health_is_the_engines() -> None:
    with BlockingEngine(PrimaryTier(4, 8), [MemoryTier(1 << 10)]) as e:
        assert set(e.health()) == {"primary", "memory"}
        assert all(h.open for h in e.health().values())


_NEVER_CLOSED = """
import sys
from aiotier import BlockingEngine, PrimaryTier
from aiotier.tiers.ssd import SSDTier

engine = BlockingEngine(PrimaryTier(4, 64), [SSDTier(sys.argv[1], 1 << 20)])
assert engine.put("k", b"kept")
print("exiting with an engine never closed")
"""

_READ_BACK = """
import sys
from aiotier import BlockingEngine, PrimaryTier
from aiotier.tiers.ssd import SSDTier

with BlockingEngine(PrimaryTier(4, 64), [SSDTier(sys.argv[1], 1 << 20)]) as engine:
    print(engine.get("k"))
"""


def test_an_engine_never_closed_is_closed_at_exit_and_its_blocks_written_down(
    tmp_path: Path,
) -> None:
    where = str(tmp_path / "ssd")
    run = [sys.executable, "-c", _NEVER_CLOSED, where]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr  # the exit is not held up by the loop's thread
    back = subprocess.run(
        [sys.executable, "-c", _READ_BACK, where], capture_output=True, text=True, timeout=60
    )
    assert back.stdout.strip() == "b'kept'", back.stderr


def test_inside_a_running_loop_every_waiting_call_is_refused_hit_or_miss() -> None:
    """Code that only hits in tests must fail there too: a stored key and a missing one get the
    same error from a running loop (here a loop in another thread, as a web server's)."""
    e = BlockingEngine(PrimaryTier(4, 8))
    try:
        assert e.put("stored", b"v")
        calls: dict[str, Callable[[], object]] = {
            "get hit": lambda: e.get("stored"),
            "get miss": lambda: e.get("missing"),
            "lookup hit": lambda: e.lookup("stored"),
            "lookup miss": lambda: e.lookup("missing"),
            "prefix hit": lambda: e.lookup_prefix(["stored"]),
            "prefix miss": lambda: e.lookup_prefix(["missing"]),
        }
        errors: dict[str, str] = {}

        async def in_a_loop() -> None:
            for name, call in calls.items():
                try:
                    call()
                except RuntimeError as exc:
                    errors[name] = str(exc).split(" was called")[1]

        asyncio.run(in_a_loop())
        assert set(errors) == set(calls)
        assert len(set(errors.values())) == 1  # one error, whatever the answer would have been
        assert "running event loop" in next(iter(errors.values()))
        assert e.get("stored") == b"v"  # outside a loop the hit path answers as before
    finally:
        e.close()
