"""The manifest of a value over several blocks, without an event loop: round trips, and every
way pieces can fail to add up gives None rather than wrong bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiotier._core.values import (
    HEAD2_BYTES,
    MANIFEST_BYTES,
    assemble,
    block_expiry,
    encode_inline,
    needs_pieces,
    parse_manifest,
    piece_expiry,
    read_inline,
    split_value,
    verified,
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


# -- format 2: values with a TTL carry their expiry ------------------------------------------


@given(data=st.binary(max_size=300), expires_at=st.floats(0, 4e9))
def test_an_inline_value_carries_its_expiry_and_gives_the_value_back(
    data: bytes, expires_at: float
) -> None:
    block = encode_inline(memoryview(data), expires_at)
    assert len(block) == HEAD2_BYTES + len(data)
    head = parse_manifest(block)
    assert head is not None and head.pieces == 0 and head.expires_at == expires_at
    assert verified(head, block[HEAD2_BYTES:]) == data
    assert read_inline(block) == (expires_at, data)  # the hits' path, without a Manifest
    assert block_expiry(b"any key", block) == expires_at
    assert head.expired(expires_at) and not head.expired(expires_at - 1)
    assert parse_manifest(block + b"x") is None  # the length is part of the head
    assert parse_manifest(block[:-1] if data else block + b"x") is None


@given(pos=st.integers(0, HEAD2_BYTES - 1))
def test_a_damaged_format_2_head_is_no_head(pos: int) -> None:
    block = bytearray(encode_inline(memoryview(b"value"), 1234.0))
    block[pos] ^= 0x40
    assert parse_manifest(bytes(block)) is None
    assert read_inline(bytes(block)) is None
    assert block_expiry(b"k", bytes(block)) is None


@given(data=st.binary(min_size=300, max_size=3000))
def test_a_large_value_with_a_ttl_names_pieces_that_carry_it(data: bytes) -> None:
    manifest, pieces = split_value(memoryview(data), 256, expires_at=2e9)
    head = manifest.encode()
    assert len(head) == HEAD2_BYTES
    assert parse_manifest(head) == manifest
    assert read_inline(head) is None  # pieces to fetch: not inline
    assert all(piece_expiry(k) == 2e9 and block_expiry(k, v) == 2e9 for k, v in pieces)
    assert assemble(manifest, [bytes(v) for _, v in pieces]) == data
    plain, plain_pieces = split_value(memoryview(data), 256)  # format 1: no expiry anywhere
    assert len(plain.encode()) == MANIFEST_BYTES and parse_manifest(plain.encode()) == plain
    assert all(piece_expiry(k) is None for k, _ in plain_pieces)
    assert block_expiry(b"k", plain.encode()) is None


def test_a_block_without_a_head_has_no_expiry() -> None:
    assert block_expiry(b"k", b"\x89aiotval but not a head") is None
    assert block_expiry(b"k", b"") is None
    assert piece_expiry(b"\x00aiotier-piece/" + bytes(20)) is None  # format 1's length
