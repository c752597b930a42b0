"""The sans-IO MGET reply parser, driven by hand: no event loop, no socket, no server.

Every test plays the transport: it asks ``buffer_for`` where bytes go, writes some there and
reports them with ``advance``, exactly as ``asyncio.BufferedProtocol`` does with the kernel.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiotier.errors import BlockCorruptedError
from aiotier.tiers.framing import HEADER, encode_header
from aiotier.tiers.redis import parser as _resp_parser
from aiotier.tiers.redis.parser import (
    MgetParser,
    ParserState,
    Reply,
    RespError,
    RespProtocolError,
    pack_command,
)

WHOLE = [1 << 30]  # write as much as every buffer_for offers


def frame(key: bytes, payload: bytes) -> bytes:
    return encode_header(key, payload) + payload


def bulk(value: bytes | None) -> bytes:
    return b"$-1\r\n" if value is None else b"$%d\r\n%s\r\n" % (len(value), value)


@dataclass
class Fed:
    """What feeding one reply did: the replies returned and where the payload bytes went."""

    replies: list[Reply] = field(default_factory=list)
    into_dest: int = 0  # bytes written into buffers that were views of a destination
    into_scratch: int = 0


def feed(
    parser: MgetParser, data: bytes, sizes: list[int], dests: tuple[memoryview, ...] = ()
) -> Fed:
    """Deliver ``data`` in writes of ``sizes`` (cycled), each capped by what buffer_for offers."""
    fed = Fed()
    owners = {id(d.obj) for d in dests}
    pos, i = 0, 0
    while pos < len(data):
        buf = parser.buffer_for(-1)
        assert len(buf) > 0
        n = min(len(buf), sizes[i % len(sizes)], len(data) - pos)
        i += 1
        buf[:n] = data[pos : pos + n]
        pos += n
        if id(buf.obj) in owners:
            fed.into_dest += n
        else:
            fed.into_scratch += n
        reply = parser.advance(n)
        if reply is not None:
            fed.replies.append(reply)
    return fed


def mget_reply(values: list[bytes | None]) -> bytes:
    return b"*%d\r\n" % len(values) + b"".join(bulk(v) for v in values)


def outcome(x: int | Exception) -> Any:
    """A comparable form of one slot: the length, or the exception's type and message."""
    return x if isinstance(x, int) else (type(x), str(x))


# -- a model of replies for the property test ----------------------------------------------------

BUF = 80_000  # each key's destination; larger payloads are "too big"


@st.composite
def elements(draw: st.DrawFn, index: int) -> tuple[bytes, bytes | None, Any, str | None]:
    """(key, raw RESP element, expected slot, payload expected in the destination or None)."""
    key = b"key-%d-" % index + draw(st.binary(max_size=24))
    kind = draw(
        st.sampled_from(
            ["good", "good", "nil", "error", "checksum", "wrong_key", "short", "junk", "too_big"]
        )
    )
    size = draw(st.sampled_from([0, 1, 100, 4096, 32 * 1024 - 1, 32 * 1024, 50_000, BUF]))
    payload = draw(st.binary(min_size=size, max_size=size)) if size < 200 else bytes(size)
    if size >= 200:  # cheap but position-dependent bytes, so misplaced copies show
        payload = bytes((j * 7 + index) & 0xFF for j in range(size))
    if kind == "good":
        return key, bulk(frame(key, payload)), len(payload), payload.hex()
    if kind == "nil":
        return key, bulk(None), -1, None
    if kind == "error":
        return (
            key,
            b"-ERR slot %d failed\r\n" % index,
            (RespError, f"ERR slot {index} failed"),
            None,
        )
    if kind == "checksum":
        damaged = bytearray(frame(key, payload or b"!"))
        damaged[-1] ^= 0x01  # the payload's last byte
        return key, bulk(bytes(damaged)), BlockCorruptedError, None
    if kind == "wrong_key":
        other = bytes(b ^ 0x55 for b in key)
        return key, bulk(frame(other, payload)), BlockCorruptedError, None
    if kind == "short":
        return key, bulk(draw(st.binary(max_size=HEADER.size - 1))), BlockCorruptedError, None
    if kind == "junk":
        junk = b"not a frame: " + payload[:5000] + bytes(HEADER.size)
        return key, bulk(junk), BlockCorruptedError, None
    big = bytes(BUF + 1 + size % 100)
    return key, bulk(frame(key, big)), ValueError, None


@st.composite
def replies(draw: st.DrawFn) -> list[tuple[bytes, bytes | None, Any, str | None]]:
    n = draw(st.integers(1, 8))
    return [draw(elements(i)) for i in range(n)]


def check_expected(
    reply: Reply, model: list[tuple[bytes, bytes | None, Any, str | None]], bufs: list[memoryview]
) -> None:
    assert isinstance(reply, list)
    assert len(reply) == len(model)
    for slot, (_key, _raw, expected, payload_hex), buf in zip(reply, model, bufs, strict=True):
        if isinstance(expected, int):
            assert slot == expected
            if payload_hex is not None:
                assert bytes(buf[:expected]).hex() == payload_hex
        elif isinstance(expected, tuple):
            assert outcome(slot) == expected  # type: ignore[arg-type]
        else:
            assert type(slot) is expected, (slot, expected)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=replies(),
    sizes=st.lists(st.integers(1, 70_000), min_size=1, max_size=8),
    refused=st.booleans(),
)
def test_any_split_gives_the_same_results_as_the_whole_reply(
    model: list[tuple[bytes, bytes | None, Any, str | None]], sizes: list[int], refused: bool
) -> None:
    keys = [k for k, _r, _e, _p in model]
    data = b"*%d\r\n" % len(model) + b"".join(raw for _k, raw, _e, _p in model if raw is not None)
    runs: list[tuple[list[Any], list[bytes]]] = []
    for how in (WHOLE, sizes):
        parser = MgetParser()
        if refused:  # a refused MGET first: the connection must stay in step after it
            parser.expect_mget(keys, [memoryview(bytearray(BUF)) for _ in keys])
            fed = feed(parser, b"-NOPERM this user has no permissions to run 'mget'\r\n", how)
            assert len(fed.replies) == 1
            assert isinstance(fed.replies[0], RespError)
            assert str(fed.replies[0]).startswith("NOPERM")
            assert parser.state is ParserState.IDLE
        bufs = [memoryview(bytearray(BUF)) for _ in keys]
        parser.expect_mget(keys, bufs)
        fed = feed(parser, data, how, tuple(bufs))
        assert len(fed.replies) == 1
        assert parser.state is ParserState.IDLE
        check_expected(fed.replies[0], model, bufs)
        assert isinstance(fed.replies[0], list)
        runs.append(([outcome(x) for x in fed.replies[0]], [bytes(b) for b in bufs]))
    assert runs[0] == runs[1]


# -- zero copy -----------------------------------------------------------------------------------


def test_large_payloads_are_written_straight_into_their_destinations() -> None:
    keys = [b"a", b"b", b"c"]
    payloads = [bytes([i]) * (256 * 1024) for i in (1, 2, 3)]
    bufs = [memoryview(bytearray(256 * 1024)) for _ in keys]
    parser = MgetParser()
    parser.expect_mget(keys, bufs)
    reply = mget_reply([frame(k, p) for k, p in zip(keys, payloads, strict=True)])
    fed = feed(parser, reply, WHOLE, tuple(bufs))
    assert fed.replies == [[256 * 1024] * 3]
    assert [bytes(b) for b in bufs] == payloads
    # Every payload byte went to its destination; scratch saw only lines, headers and keys.
    assert fed.into_dest == 3 * 256 * 1024
    assert fed.into_scratch == len(reply) - 3 * 256 * 1024


def test_destination_buffer_never_reaches_past_the_payload() -> None:
    dest = memoryview(bytearray(100_000))
    parser = MgetParser()
    parser.expect_mget([b"k"], [dest])
    data = mget_reply([frame(b"k", b"p" * 60_000)])
    head = len(data) - 60_000 - 2
    assert feed(parser, data[:head], WHOLE).replies == []
    assert parser.state is ParserState.PAYLOAD
    offered = parser.buffer_for(-1)
    assert offered.obj is dest.obj
    assert len(offered) == 60_000
    offered[:10_000] = b"p" * 10_000
    assert parser.advance(10_000) is None
    assert len(parser.buffer_for(-1)) == 50_000
    assert feed(parser, data[head + 10_000 :], WHOLE).replies == [[60_000]]
    assert bytes(dest[60_000:]) == bytes(40_000)  # untouched past the payload


# -- states and requests -------------------------------------------------------------------------


def test_states_are_named_and_follow_the_reply() -> None:
    parser = MgetParser()
    assert parser.state is ParserState.IDLE
    parser.expect_mget([b"k", b"m"], [memoryview(bytearray(64_000)) for _ in range(2)])
    assert parser.state is ParserState.ARRAY
    seen = []
    data = mget_reply([frame(b"k", b"x" * 40_000), None])
    for i in range(len(data)):
        buf = parser.buffer_for(-1)
        buf[:1] = data[i : i + 1]
        parser.advance(1)
        if not seen or seen[-1] is not parser.state:
            seen.append(parser.state)
    assert seen == [
        ParserState.ARRAY,
        ParserState.ELEMENT,
        ParserState.FRAME_HEAD,
        ParserState.PAYLOAD,
        ParserState.CRLF,
        ParserState.ELEMENT,
        ParserState.IDLE,
    ]


def test_handshake_replies_in_order() -> None:
    parser = MgetParser()
    parser.expect_simple(2)
    assert parser.state is ParserState.SIMPLE
    fed = feed(parser, b"+OK\r\n-WRONGPASS invalid username-password pair\r\n", [3])
    assert len(fed.replies) == 1
    ok, refused = fed.replies[0]  # type: ignore[misc]
    assert ok == b"+OK"
    assert isinstance(refused, RespError)
    assert str(refused) == "WRONGPASS invalid username-password pair"
    assert parser.state is ParserState.IDLE


def test_a_second_request_while_one_is_in_flight_is_refused() -> None:
    parser = MgetParser()
    parser.expect_simple(1)
    with pytest.raises(RuntimeError, match="already in flight"):
        parser.expect_mget([b"k"], [memoryview(bytearray(8))])
    with pytest.raises(ValueError, match="1 keys but 2 buffers"):
        MgetParser().expect_mget([b"k"], [memoryview(bytearray(8))] * 2)


def test_per_element_error_reply_takes_its_slot_only() -> None:
    parser = MgetParser()
    bufs = [memoryview(bytearray(16)) for _ in range(3)]
    parser.expect_mget([b"a", b"b", b"c"], bufs)
    data = b"*3\r\n" + bulk(frame(b"a", b"1")) + b"-ERR nope\r\n" + bulk(None)
    (reply,) = feed(parser, data, [5]).replies
    assert isinstance(reply, list)
    assert [outcome(x) for x in reply] == [1, (RespError, "ERR nope"), -1]
    assert bytes(bufs[0][:1]) == b"1"


def test_abort_stops_writes_to_the_destination() -> None:
    dest = memoryview(bytearray(100_000))
    parser = MgetParser()
    parser.expect_mget([b"k"], [dest])
    data = mget_reply([frame(b"k", b"q" * 90_000)])
    feed(parser, data[:50_000], [4096])
    assert parser.buffer_for(-1).obj is dest.obj
    parser.abort()
    assert parser.state is ParserState.BROKEN
    for _ in range(3):  # whatever still arrives is dropped in scratch
        buf = parser.buffer_for(-1)
        assert buf.obj is not dest.obj
        buf[:4096] = b"z" * 4096
        assert parser.advance(4096) is None
    written = 50_000 - (len(data) - 90_000 - 2)  # payload bytes fed before the abort
    assert bytes(dest[:written]) == b"q" * written
    assert bytes(dest[written:]) == bytes(100_000 - written)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"+OK\r\n", "unexpected MGET reply"),
        (b"*2\r\n", "2 elements for 1 keys"),
        (b"*x\r\n", "bad length line"),
        (b"*1\r\n:5\r\n", "unexpected MGET element"),
        (b"*1\r\n$-1\r\n" + b"x", "no request in flight"),
        (b"*1\r\n" + bulk(frame(b"k", b"v"))[:-2] + b"!!", "not followed by CRLF"),
        (b"*1\r\n$" + b"9" * 5000, "line too long"),
    ],
)
def test_protocol_violations_break_the_parser(data: bytes, why: str) -> None:
    dest = memoryview(bytearray(64))
    parser = MgetParser()
    parser.expect_mget([b"k"], [dest])
    with pytest.raises(RespProtocolError, match=why):
        feed(parser, data, WHOLE)
    assert parser.state is ParserState.BROKEN
    assert parser.buffer_for(-1).obj is not dest.obj


def test_bytes_with_no_request_in_flight_are_a_protocol_violation() -> None:
    parser = MgetParser()
    with pytest.raises(RespProtocolError, match="no request in flight"):
        feed(parser, b"+OK\r\n", WHOLE)


def test_pack_command_is_a_resp_array_of_bulk_strings() -> None:
    assert pack_command(b"MGET", b"a", b"") == b"*3\r\n$4\r\nMGET\r\n$1\r\na\r\n$0\r\n\r\n"


def test_the_parser_does_no_io() -> None:
    tree = ast.parse(inspect.getsource(_resp_parser))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    assert imported.isdisjoint({"asyncio", "socket", "selectors", "ssl", "time", "threading"})
