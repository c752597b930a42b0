"""The frame rules in ``framing``: one check shared by the SSD tier, redis-py reads and the
zero-copy reader, each failure named exactly."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiotier.errors import BlockCorruptedError
from aiotier.tiers.framing import (
    GIL_HELD_HASH,
    HEADER,
    block_digest,
    check_header,
    check_payload,
    checksum,
    checksum_held,
    encode_header,
    parse_header,
    verify_payload,
)

KEY = b"block-7"
PAYLOAD = b"0123456789" * 10
FRAME = encode_header(KEY, PAYLOAD) + PAYLOAD


def test_a_good_frame_passes_with_its_lengths_and_checksum() -> None:
    assert check_header(FRAME, KEY, len(FRAME)) == (len(KEY), len(PAYLOAD), checksum(PAYLOAD))
    check_payload(FRAME[HEADER.size + len(KEY) :], KEY, checksum(PAYLOAD))
    # Only the header and key are needed; the frame's length comes separately.
    head = FRAME[: HEADER.size + len(KEY)]
    assert check_header(head, KEY, len(FRAME))[1] == len(PAYLOAD)
    # Any key, and no payload length check, when neither is given.
    assert check_header(head) == (len(KEY), len(PAYLOAD), checksum(PAYLOAD))


def _with(offset: int, value: bytes) -> bytes:
    return FRAME[:offset] + value + FRAME[offset + len(value) :]


@pytest.mark.parametrize(
    ("frame", "key", "frame_len", "message"),
    [
        (FRAME[:10], KEY, 10, "frame of 10 bytes is shorter than a header"),
        (_with(0, b"XXXX"), KEY, len(FRAME), "bad magic b'XXXX', not an aiotier block"),
        (_with(4, b"\x02"), KEY, len(FRAME), "unsupported block format version 2"),
        (FRAME, b"block-77", len(FRAME), "frame holds a key of 7 bytes, not b'block-77'"),
        (FRAME[: HEADER.size + 3], KEY, HEADER.size + 3, "frame of 27 bytes is truncated inside"),
        (FRAME, b"block-8", len(FRAME), "frame holds key b'block-7', not b'block-8'"),
        (
            FRAME[:-40],
            KEY,
            len(FRAME) - 40,
            "key b'block-7': frame holds 60 payload bytes, header says 100",
        ),
        (FRAME + b"!", KEY, len(FRAME) + 1, "frame holds 101 payload bytes, header says 100"),
    ],
)
def test_each_rule_fails_with_its_own_message(
    frame: bytes, key: bytes, frame_len: int, message: str
) -> None:
    with pytest.raises(BlockCorruptedError) as info:
        check_header(frame, key, frame_len)
    assert message in str(info.value)


def test_the_frame_length_bounds_what_is_read_not_the_buffer() -> None:
    # The buffer holds a complete good frame, but the value is said to be shorter: only
    # frame_len bytes are the frame (the rest is someone else's, or padding).
    with pytest.raises(BlockCorruptedError, match="frame of 20 bytes is shorter than a header"):
        check_header(FRAME, KEY, 20)
    with pytest.raises(BlockCorruptedError, match="frame of 28 bytes is truncated inside its key"):
        check_header(FRAME, KEY, 28)
    with pytest.raises(BlockCorruptedError, match="frame holds 0 payload bytes, header says 100"):
        check_header(FRAME, KEY, HEADER.size + len(KEY))


def test_payload_checksum() -> None:
    damaged = bytearray(PAYLOAD)
    damaged[50] ^= 1
    with pytest.raises(BlockCorruptedError, match="key b'block-7': payload checksum mismatch"):
        check_payload(damaged, KEY, checksum(PAYLOAD))


def corruption(fn: Callable[[], object]) -> str:
    with pytest.raises(BlockCorruptedError) as info:
        fn()
    return str(info.value)


def test_parse_header_and_verify_payload_apply_the_same_rules_with_a_location() -> None:
    header = parse_header(FRAME, where="here")
    assert (header.key, header.payload_len, header.payload_offset) == (KEY, 100, 24 + 7)
    verify_payload(header, KEY, FRAME[header.payload_offset :], where="here")
    assert (
        corruption(lambda: parse_header(_with(0, b"XXXX"), where="here"))
        == "here: bad magic b'XXXX', not an aiotier block"
    )
    assert (
        corruption(lambda: verify_payload(header, b"b", PAYLOAD, where="here"))
        == "here: frame holds key b'block-7', not b'b'"
    )
    assert (
        corruption(lambda: verify_payload(header, KEY, PAYLOAD[:-1], where="here"))
        == "here: key b'block-7': frame holds 99 payload bytes, header says 100"
    )
    assert (
        corruption(lambda: verify_payload(header, KEY, PAYLOAD[::-1]))
        == "key b'block-7': payload checksum mismatch"
    )


def test_block_digest_is_pinned() -> None:
    """SSD file names and Redis keys derive from it: a change would orphan stored blocks."""
    assert block_digest(b"abc").hex() == "cf4ab791c62b8d2b2109c90275287816"
    assert block_digest(b"").hex() == "cae66941d9efbd404e4d88758ea67670"
    assert block_digest(b"\x00\xff" * 512).hex() == "77f807b67f703f9636a24718e47e1c50"


@settings(max_examples=60, deadline=None)
@given(
    size=st.sampled_from([0, 1, GIL_HELD_HASH - 1, GIL_HELD_HASH, GIL_HELD_HASH + 1])
    | st.integers(0, 5 * GIL_HELD_HASH),
    seed=st.integers(0, 2**32 - 1),
)
def test_checksum_held_is_the_one_shot_checksum(size: int, seed: int) -> None:
    data = random.Random(seed).randbytes(size)
    assert checksum_held(memoryview(data)) == checksum(data)
    # what an SSD slot written with it holds: the same header as without it
    assert encode_header(KEY, data, checksum_held(memoryview(data))) == encode_header(KEY, data)

