"""The manifest of a value over several blocks, without an event loop: round trips, and every
way pieces can fail to add up gives None rather than wrong bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiotier._core.values import (
    MANIFEST_BYTES,
    assemble,
    needs_pieces,
    parse_manifest,
    split_value,
)


@given(data=st.binary(max_size=5000), block_size=st.integers(64, 1024))
def test_split_then_assemble_gives_the_value_back(data: bytes, block_size: int) -> None:
    manifest, pieces = split_value(memoryview(data), block_size)
    head = manifest.encode()
    assert len(head) == MANIFEST_BYTES
    assert parse_manifest(head) == manifest
    assert [k for k, _ in pieces] == manifest.piece_keys()
    assert all(len(v) <= block_size for _, v in pieces)
    assert assemble(manifest, [bytes(v) for _, v in pieces]) == data


@given(
    data=st.binary(min_size=300, max_size=3000),
    flip=st.integers(0, 10_000),
)
def test_a_missing_short_swapped_or_changed_piece_gives_none(data: bytes, flip: int) -> None:
    manifest, pieces = split_value(memoryview(data), 128)
    parts = [bytes(v) for _, v in pieces]
    assert assemble(manifest, [*parts[:-1], None]) is None
    assert assemble(manifest, parts[:-1]) is None
    assert assemble(manifest, [*parts[:-1], parts[-1][:-1]]) is None  # a prefix
    assert assemble(manifest, [parts[1], parts[0], *parts[2:]]) in (None, data)
    changed = bytearray(parts[flip % len(parts)])
    changed[flip % len(changed)] ^= 1
    mixed = list(parts)
    mixed[flip % len(parts)] = bytes(changed)
    assert assemble(manifest, mixed) is None
    other, _ = split_value(memoryview(bytes(reversed(data))), 128)
    assert other.piece_keys() != manifest.piece_keys()  # versions never share piece keys


@given(pos=st.integers(0, MANIFEST_BYTES - 1))
def test_a_damaged_manifest_is_not_a_manifest(pos: int) -> None:
    manifest, _ = split_value(memoryview(bytes(1000)), 256)
    head = bytearray(manifest.encode())
    head[pos] ^= 0x40
    assert parse_manifest(bytes(head)) is None
    assert parse_manifest(manifest.encode() + b"x") is None


def test_only_large_values_and_lookalikes_need_pieces() -> None:
    assert not needs_pieces(memoryview(b"x" * 64), 64)
    assert needs_pieces(memoryview(b"x" * 65), 64)
    assert needs_pieces(memoryview(b"\x89aiotval!"), 64)
    # blocks too small for a manifest never hold one: a lookalike is stored as it is
    assert not needs_pieces(memoryview(b"\x89aiotval"), 16)
