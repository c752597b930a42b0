"""Blocks with a TTL in the core, without an event loop: the deadline heap against a model, and
the core's expiry transitions driven by hand with a clock the test moves."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiotier import LookupResult, PrimaryTier
from aiotier._core.deadlines import Deadlines
from aiotier._core.engine_core import EngineCore
from aiotier._core.promotion import Outcome
from aiotier._core.values import encode_inline, read_inline, split_value
from aiotier._core.writeback import OpKind

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


_op = st.one_of(
    st.tuples(st.just("arm"), st.integers(0, 7), st.one_of(st.none(), st.integers(0, 20))),
    st.tuples(st.just("drop"), st.integers(0, 7), st.none()),
    st.tuples(st.just("due"), st.integers(0, 20), st.integers(1, 4)),
)


@given(ops=st.lists(_op, max_size=60))
def test_due_gives_exactly_the_live_deadlines_past_now_earliest_first(
    ops: list[tuple[str, int, int | None]],
) -> None:
    d: Deadlines[int] = Deadlines()
    model: dict[int, float] = {}
    for op, a, b in ops:
        if op == "arm":
            d.arm(a, None if b is None else float(b))
            if b is None:
                model.pop(a, None)
            else:
                model[a] = float(b)
        elif op == "drop":
            d.drop(a)
            model.pop(a, None)
        else:
            assert b is not None
            now, limit = float(a), b
            want = sorted((t, s) for s, t in model.items() if t <= now)[:limit]
            got = d.due(now, limit)
            assert [(model[s], s) for s in got] == want
            for s in got:  # the caller reclaims them
                d.drop(s)
                del model[s]
        assert d.at == model
        assert all(d.expired(s, 20.0) == (t <= 20.0) for s, t in model.items())


class Harness:
    """An ``EngineCore`` over one primary of 8 blocks and one tier (``"plain"``, no expiry of
    its own), with a wall clock the test moves."""

    def __init__(self, *, tier_expiry: bool = False) -> None:
        self.wall = Clock()
        primary = PrimaryTier(8, 256)
        self.core = EngineCore(
            primary.arena,
            primary.table,
            tier_names=["plain"],
            hints=[lambda k: None],
            wall_clock=self.wall,
            tier_expiry=[tier_expiry],
        )

    def put(self, k: bytes, data: bytes, ttl: float) -> None:
        expires_at = self.wall.t + ttl
        head = encode_inline(memoryview(data), expires_at)
        assert self.core.values.put(k, head, expires_at=expires_at)
        self.queued_removes()  # the put's own (of older copies below): not the expiry's

    def count(self, tier: str) -> int:
        return self.core.stats.peek_counts()[("expirations", tier)]

    def queued_removes(self) -> list[bytes]:
        """The removes queued for the tier, taken as its writer would, and applied."""
        batch = self.core.writes.next_batch(0)
        self.core.writes.finished(0, batch)
        return [op.key for op in batch if op.kind is OpKind.REMOVE]


def test_a_slot_past_its_deadline_answers_as_absent_and_is_reclaimed() -> None:
    h = Harness()
    h.put(b"k", b"v", ttl=10)
    assert h.core.values.cached(b"k") is not None
    h.wall.t += 10
    scan = h.core.promotions.begin([b"k"], None)
    assert scan.open == [0]  # not the primary's any more: the tiers are asked
    assert b"k" not in h.core.table.index
    assert len(h.core.table.free) == 8
    assert h.count("primary") == 1
    # a tier that does not expire blocks itself gets a remove (its copy must go)
    assert h.queued_removes() == [b"k"]


def test_a_tier_that_expires_blocks_itself_gets_no_remove() -> None:
    h = Harness(tier_expiry=True)
    h.put(b"k", b"v", ttl=10)
    h.wall.t += 11
    assert h.core.values.cached(b"k") is None
    assert h.queued_removes() == []


def test_the_step_boundary_reclaims_at_most_its_bound_earliest_first() -> None:
    h = Harness()
    for i in range(6):
        h.put(b"k%d" % i, b"v", ttl=10 + i)
    h.wall.t += 12.5  # k0, k1 and k2 are due
    assert h.core.expiry.reclaim(2) == 2
    assert sorted(h.core.table.index) == [b"k2", b"k3", b"k4", b"k5"]
    h.core.end_step((), ())
    assert sorted(h.core.table.index) == [b"k3", b"k4", b"k5"]
    assert h.count("primary") == 3


def test_a_promoted_block_that_lands_expired_is_dropped_and_removed_from_its_tier() -> None:
    h = Harness(tier_expiry=True)
    promotions = h.core.promotions
    scan = promotions.begin([b"old", b"live"], None)
    promotions.answered(scan, 0, promotions.ask(scan, 0) and [HIT, HIT])
    (batch,) = promotions.finish(scan)
    views = h.core.arena.slot_views(batch.slots)
    blocks = [
        encode_inline(memoryview(b"old"), h.wall.t - 1),
        encode_inline(memoryview(b"live"), h.wall.t + 60),
    ]
    for view, data in zip(views, blocks, strict=True):
        view[: len(data)] = data
    promotions.completed([batch], Outcome.OK, [len(b) for b in blocks])
    assert h.core.answers.settled([b"old", b"live"]) == [MISS, HIT]
    assert h.count("plain") == 1
    assert h.queued_removes() == [b"old"]  # the tier it came from, capability or not
    live = h.core.table.index[b"live"]
    assert h.core.table.deadlines.at == {live: h.wall.t + 60}


def test_pieces_carry_the_expiry_in_their_keys() -> None:
    h = Harness()
    manifest, pieces = split_value(memoryview(bytes(600)), 256, expires_at=h.wall.t + 5)
    put_value = h.core.values.put_value
    assert put_value(b"big", manifest.encode(), pieces, expires_at=manifest.expires_at)
    assert len(h.core.table.deadlines) == 4
    h.wall.t += 5
    assert h.core.expiry.reclaim(100) == 4
    assert len(h.core.table.index) == 0


_step = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 5), st.one_of(st.none(), st.integers(1, 30))),
    st.tuples(st.just("tick"), st.integers(0, 12), st.none()),
    st.tuples(st.just("get"), st.integers(0, 5), st.none()),
    st.tuples(st.just("lookup"), st.integers(0, 5), st.none()),
    st.tuples(st.just("step"), st.integers(0, 0), st.none()),
)


@given(steps=st.lists(_step, max_size=80))
def test_no_value_is_ever_served_past_its_ttl(steps: list[tuple[str, int, int | None]]) -> None:
    """Puts with and without TTLs, the clock moving, reads, lookups and step boundaries in any
    order, over a primary smaller than the keys (evictions): whatever is served is the last
    value put and is not past its TTL; whatever is past it is never served."""
    h = Harness()  # 8 slots of 256 bytes
    live: dict[bytes, tuple[bytes, float | None]] = {}  # key -> (value, expiry)
    for n, (op, i, ttl) in enumerate(steps):
        k = b"k%d" % i
        if op == "put":
            value = b"v%d" % n
            expires_at = None if ttl is None else h.wall.t + ttl
            block = value if expires_at is None else encode_inline(memoryview(value), expires_at)
            assert h.core.values.put(k, block, expires_at=expires_at)
            live[k] = (value, expires_at)
        elif op == "tick":
            h.wall.t += i
        elif op == "get":
            got = h.core.values.cached(k)
            if got is not None:
                value, expires_at = live[k]
                if expires_at is None:
                    assert got == value
                else:
                    head = read_inline(got)
                    assert head is not None and head[1] == value
                    assert h.wall.t < expires_at  # never past it
        elif op == "lookup":
            scan = h.core.promotions.begin([k], None)
            if scan.results[0] is HIT:
                _value, expires_at = live[k]
                assert expires_at is None or h.wall.t < expires_at
        else:
            h.core.end_step((), ())
            at = h.core.table.deadlines.at
            assert all(t > h.wall.t for t in at.values()) or len(at) > 1024
