"""Admission policies and their frequency sketch, with no engine."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiotier import AdmissionPolicy, AdmitAfter, AdmitAll, AdmitTinyLFU
from aiotier._core.admission import FrequencySketch, parse_admission
from aiotier.errors import ConfigError


@given(st.lists(st.binary(max_size=8), max_size=300))
def test_the_sketch_never_counts_less_than_the_truth(keys: list[bytes]) -> None:
    sketch = FrequencySketch(64)
    sketch.add(keys)
    for k in set(keys):
        assert sketch.estimate(k) >= min(keys.count(k), 255)


def test_the_sketch_counts_exactly_without_collisions_and_ages_by_halving() -> None:
    sketch = FrequencySketch(1 << 12)
    assert sketch.width == 1 << 12
    sketch.add([b"a"] * 5 + [b"b"])
    assert (sketch.estimate(b"a"), sketch.estimate(b"b"), sketch.estimate(b"c")) == (5, 1, 0)
    small = FrequencySketch(16)  # a window of 10 x 16 sightings
    small.add([b"a"] * 159)
    assert small.estimate(b"a") == 159
    small.add([b"a"])  # the 160th: every count halves
    assert small.estimate(b"a") == 80


@given(st.lists(st.binary(max_size=2), max_size=200))
def test_increment_is_add_then_estimate(keys: list[bytes]) -> None:
    """Through a halving too (a window of 10 x 16 sightings)."""
    one, other = FrequencySketch(16), FrequencySketch(16)
    for k in keys:
        other.add([k])
        assert one.increment(k) == other.estimate(k)
    assert all(one.estimate(k) == other.estimate(k) for k in keys)


@given(st.lists(st.binary(max_size=2), min_size=33, max_size=200))
def test_increment_many_is_increment_of_each(keys: list[bytes]) -> None:
    """Through a halving too (a window of 2 x 16 sightings), in the middle of a batch."""
    one, other = FrequencySketch(16, window=2), FrequencySketch(16, window=2)
    assert one.increment_many(keys) == [other.increment(k) for k in keys]
    assert all(one.estimate(k) == other.estimate(k) for k in keys)


class CountMin:
    """The sketch's documented counts, cell by cell: four rows of ``width`` counters, a key's
    cell in row ``i`` at ``(h + i * step) mod width`` from its hash ``h`` (``step``: bits 32 and
    up of ``h``, odd), saturating at 255, every count halved once per ``window x width``
    sightings (checked after each call: ``add`` of a batch halves at most once, after it)."""

    def __init__(self, width: int, window: int) -> None:
        self.width, self.sample, self.seen = width, window * width, 0
        self.rows = [[0] * width for _ in range(4)]

    def cells(self, key: bytes) -> list[int]:
        h, w = hash(key), self.width
        step = (h >> 32) % w | 1
        return [(h + i * step) % w for i in range(4)]

    def add(self, *keys: bytes) -> None:
        """One sighting of each key; the halving, if due, after them all."""
        for key in keys:
            for row, cell in zip(self.rows, self.cells(key), strict=True):
                row[cell] = min(row[cell] + 1, 255)
        self.seen += len(keys)
        if self.seen >= self.sample:
            self.rows = [[c >> 1 for c in row] for row in self.rows]
            self.seen //= 2

    def estimate(self, key: bytes) -> int:
        return min(row[c] for row, c in zip(self.rows, self.cells(key), strict=True))


@given(st.lists(st.tuples(st.booleans(), st.lists(st.binary(max_size=2), max_size=40)),
                max_size=12))  # fmt: skip
def test_the_sketch_counts_as_a_count_min_of_four_rows(
    batches: list[tuple[bool, list[bytes]]],
) -> None:
    """Batches added or incremented, in any mix, then estimated at once (the batch itself, and
    keys of the batches before) count as the model does, through halvings (a window of 2 x 16
    sightings) and saturation."""
    sketch, model = FrequencySketch(16, window=2), CountMin(16, 2)
    seen: list[bytes] = []
    for by_increment, keys in batches:
        if by_increment:
            got = sketch.increment_many(keys)
            want = []
            for k in keys:
                model.add(k)
                want.append(model.estimate(k))
            assert got == want
        else:
            sketch.add(keys)
            model.add(*keys)
        assert sketch.estimate_many(keys) == [model.estimate(k) for k in keys]
        seen += keys
        assert sketch.estimate_many(seen) == [model.estimate(k) for k in seen]
        assert [sketch.estimate(k) for k in keys] == [model.estimate(k) for k in keys]
    saturated = FrequencySketch(1 << 12, window=1000)
    saturated.add([b"hot"] * 300)
    assert saturated.estimate_many([b"hot", b"cold"]) == [255, 0]


@given(
    st.lists(st.binary(max_size=1), max_size=60),
    st.lists(st.binary(max_size=1), max_size=20, unique=True),
    st.lists(st.binary(max_size=1), max_size=20),
    st.integers(0, 10),
)
def test_batched_admission_decides_as_one_key_at_a_time(
    seen: list[bytes], keys: list[bytes], victims: list[bytes], free: int
) -> None:
    """The policies' own ``admit_into_primary`` (estimates taken in batches) admits what the
    base class's walk of ``admit`` calls admits."""
    for policy in (AdmitAfter(2, capacity=16), AdmitTinyLFU(capacity=16)):
        policy.saw(seen)
        assert policy.sketch.estimate_many(keys) == [policy.sketch.estimate(k) for k in keys]
        walk = AdmissionPolicy.admit_into_primary(policy, keys, free, victims)
        assert policy.admit_into_primary(keys, free, victims) == walk


def test_the_sketch_keeps_its_size_whatever_it_sees() -> None:
    sketch = FrequencySketch(64)
    rng = random.Random(1)
    sketch.add(b"%d" % rng.randrange(1 << 30) for _ in range(100_000))
    assert sketch.nbytes == 4 * 64


def test_admit_after_n_sightings() -> None:
    policy = AdmitAfter(2)
    assert not policy.admit(b"k", None)
    policy.saw([b"k"])
    assert not policy.admit(b"k", None) and not policy.admit_below(b"k")
    policy.saw([b"k"])
    assert policy.admit(b"k", None) and policy.admit_below(b"k")


def test_tinylfu_weighs_a_newcomer_against_its_victim() -> None:
    policy = AdmitTinyLFU()
    policy.saw([b"victim"] * 3 + [b"new"] * 3)
    assert not policy.admit(b"new", b"victim")  # as often as the victim: it stays out
    policy.saw([b"new"])
    assert policy.admit(b"new", b"victim")
    assert policy.admit(b"stranger", None)  # a free slot takes anyone
    assert not policy.admit_below(b"stranger")  # below, a one-hit wonder stays out
    policy.saw([b"stranger"] * 2)
    assert policy.admit_below(b"stranger")


def test_admit_all_counts_nothing() -> None:
    assert AdmitAll().admit(b"k", b"v") and not AdmitAll().counts_sightings


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("all", "AdmitAll()"), ("after:3", "AdmitAfter(3)"), (" TinyLFU ", "AdmitTinyLFU()")],
)
def test_policies_parse_from_config_strings(spec: str, expected: str) -> None:
    assert repr(parse_admission(spec)) == expected


@pytest.mark.parametrize("spec", ["after", "after:x", "lfu", "all:2", ""])
def test_unknown_policies_are_refused_by_name(spec: str) -> None:
    with pytest.raises(ConfigError, match="admission policy"):
        parse_admission(spec)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigError, match="n >= 1"):
        AdmitAfter(0)
    with pytest.raises(ConfigError, match="capacity"):
        AdmitTinyLFU(capacity=0)
    with pytest.raises(ConfigError, match="window must be an int >= 1, got 0"):
        FrequencySketch(16, window=0)


def test_a_shorter_window_halves_sooner() -> None:
    sketch = FrequencySketch(16, window=2)  # 2 x 16 sightings
    sketch.add([b"a"] * 31)
    assert sketch.estimate(b"a") == 31
    assert sketch.increment(b"a") == 16  # the 32nd: every count halves
