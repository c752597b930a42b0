"""The manager's per-request bookkeeping against plain reference models: the counts of keys
held by prepares (a multiset, as ``collections.Counter`` keeps it) and the order in which a
finished request's keys are refreshed (vLLM's CPU manager's walk, key by key)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from hypothesis import given
from hypothesis import strategies as st

from aiotier.integrations.vllm.held import add_one, remove_one
from aiotier.integrations.vllm.recency import RequestAccess, walk_tail_to_head

# few distinct keys, so that calls repeat and overlap them; lengths 2 to 9 bytes, so that some
# keys have no group index (shorter than 4 bytes) and groups differ
KEY_LIST = [b"ab", b"cd", b"k\x00\x00\x00\x00", b"m\x00\x00\x00\x00", b"n\x00\x00\x00\x01",
            b"p\x00\x00\x00\x01", b"q\x00\x00\x00\x02", b"long-key\x00"]  # fmt: skip
KEYS = st.sampled_from(KEY_LIST)
CALLS = st.lists(st.tuples(st.booleans(), st.lists(KEYS, max_size=6)), max_size=12)


@given(CALLS)
def test_held_counts_are_a_counter_without_non_positive_counts(
    calls: list[tuple[bool, list[bytes]]],
) -> None:
    held: dict[bytes, int] = {}
    model: Counter[bytes] = Counter()
    for add, keys in calls:
        if add:
            add_one(held, keys)
            model.update(keys)
        else:
            remove_one(held, keys)
            model.subtract(keys)
            model = +model
        assert held == dict(model)


def _reference_walk(
    calls: Sequence[tuple[list[bytes], list[bytes], list[bytes]]],
    position: Callable[[bytes], int | None] | None,
) -> list[tuple[list[bytes], bool]]:
    """vLLM 0.32's CPU manager: keys grouped by their last 4 bytes in the order first seen,
    groups in index order, by token position when each key has one, walked tail first in runs
    of reused or fresh keys."""
    groups: dict[int, list[bytes]] = {}
    seen: set[bytes] = set()
    inserted: set[bytes] = set()
    reused: set[bytes] = set()
    for keys, ins, reu in calls:
        for k in keys:
            if k not in seen:
                seen.add(k)
                groups.setdefault(int.from_bytes(k[-4:], "big") if len(k) >= 4 else 0,
                                  []).append(k)  # fmt: skip
        inserted.update(ins)
        reused.update(k for k in reu if k not in inserted)
    order = [k for g in sorted(groups) for k in groups[g]]
    if position is not None:
        positions = {k: p for k in order if (p := position(k)) is not None}
        if len(positions) == len(order):
            order.sort(key=positions.__getitem__)
    runs: list[tuple[list[bytes], bool]] = []
    for k in reversed(order):
        fresh = k not in reused
        if runs and runs[-1][1] == fresh:
            runs[-1][0].append(k)
        else:
            runs.append(([k], fresh))
    return runs


SAW = st.tuples(st.lists(KEYS, max_size=6), st.lists(KEYS, max_size=3), st.lists(KEYS, max_size=3))


@given(st.lists(SAW, max_size=6), st.sampled_from(["none", "all", "some"]))
def test_a_finished_requests_walk_is_vllms(
    calls: list[tuple[list[bytes], list[bytes], list[bytes]]], positions: str
) -> None:
    by_key = {k: -i for i, k in enumerate(KEY_LIST)}  # token positions: the reverse order
    position: Callable[[bytes], int | None] | None = {
        "none": None,
        "all": by_key.get,
        "some": lambda k: by_key[k] if k != b"ab" else None,
    }[positions]
    access = RequestAccess()
    for keys, inserted, reused in calls:
        access.saw(keys, inserted=inserted, reused=reused)
    walked: list[tuple[list[bytes], bool]] = []
    walk_tail_to_head(access, position, lambda run, fresh: walked.append((list(run), fresh)))
    assert walked == _reference_walk(calls, position)
