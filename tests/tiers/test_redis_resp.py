"""The fast MGET reader's protocol adapter, fed replies in arbitrary pieces (no server needed).

The parser itself is tested without an event loop in ``test_resp_parser.py``; these tests drive
it through :class:`asyncio.BufferedProtocol` callbacks, as a transport does.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiotier.errors import BlockCorruptedError
from aiotier.tiers.framing import encode_header
from aiotier.tiers.redis.parser import RespError, pack_command
from aiotier.tiers.redis.reader import _MgetProtocol


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.aborted = False

    def write(self, data: Any) -> None:
        self.sent.append(bytes(data))

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


def frame(key: bytes, payload: bytes) -> bytes:
    return encode_header(key, payload) + payload


def bulk(value: bytes | None) -> bytes:
    return b"$-1\r\n" if value is None else b"$%d\r\n%s\r\n" % (len(value), value)


def feed(proto: _MgetProtocol, data: bytes, sizes: list[int]) -> None:
    """Deliver ``data`` the way the event loop does: into whatever get_buffer offers."""
    pos, i = 0, 0
    while pos < len(data):
        want = sizes[i % len(sizes)]
        i += 1
        buf = proto.get_buffer(-1)
        assert len(buf) > 0
        n = min(len(buf), want, len(data) - pos)
        buf[:n] = data[pos : pos + n]
        pos += n
        proto.buffer_updated(n)


async def mget(
    proto: _MgetProtocol,
    keys: list[bytes],
    bufs: list[memoryview],
    reply: bytes,
    sizes: list[int],
) -> list[Any]:
    task = asyncio.ensure_future(proto.mget(pack_command(b"MGET", *keys), keys, bufs))
    await asyncio.sleep(0)
    feed(proto, reply, sizes)
    return await asyncio.wait_for(task, 5)


def connected() -> tuple[_MgetProtocol, FakeTransport]:
    proto = _MgetProtocol()
    transport = FakeTransport()
    proto.connection_made(transport)
    return proto, transport


def mixed_batch(rng: random.Random) -> tuple[list[bytes], list[bytes | None], list[Any]]:
    """Keys, stored values and the expected outcome of each (length, -1 or an error type)."""
    keys, values, expected = [], [], []

    def add(key: bytes, value: bytes | None, outcome: Any) -> None:
        keys.append(key)
        values.append(value)
        expected.append(outcome)

    for size in (0, 1, 100, 40_000, 70_000):
        payload = rng.randbytes(size)
        add(b"good-%d" % size, frame(b"good-%d" % size, payload), payload)
    add(b"absent", None, -1)
    add(b"junk", b"hello world, not a frame at all", BlockCorruptedError)
    add(b"tiny", b"ab", BlockCorruptedError)
    add(b"empty", b"", BlockCorruptedError)
    add(b"other-key", frame(b"someone-else", b"x" * 50), BlockCorruptedError)
    good = bytearray(frame(b"flipped", b"y" * 50_000))
    good[-3] ^= 0x40
    add(b"flipped", bytes(good), BlockCorruptedError)
    add(b"truncated", frame(b"truncated", b"z" * 1000)[:-10], BlockCorruptedError)
    add(b"too-big", frame(b"too-big", b"w" * 90_000), ValueError)
    add(b"after", frame(b"after", b"last one"), b"last one")
    return keys, values, expected


def check(results: list[Any], expected: list[Any], bufs: list[memoryview]) -> None:
    assert len(results) == len(expected)
    for r, e, b in zip(results, expected, bufs, strict=True):
        if isinstance(e, bytes):
            assert r == len(e)
            assert bytes(b[: len(e)]) == e
        elif isinstance(e, int):
            assert r == e
        else:
            assert isinstance(r, e), (r, e)
            if e is ValueError:
                assert not isinstance(r, BlockCorruptedError)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    sizes=st.lists(st.integers(1, 70_000), min_size=1, max_size=8),
)
def test_any_split_of_the_reply_parses_the_same(seed: int, sizes: list[int]) -> None:
    async def scenario() -> None:
        rng = random.Random(seed)
        keys, values, expected = mixed_batch(rng)
        order = list(range(len(keys)))
        rng.shuffle(order)
        keys = [keys[i] for i in order]
        values = [values[i] for i in order]
        expected = [expected[i] for i in order]
        proto, transport = connected()
        reply = b"*%d\r\n" % len(keys) + b"".join(bulk(v) for v in values)
        for _ in range(2):  # the connection stays in step for the next request
            bufs = [memoryview(bytearray(80_000)) for _ in keys]
            results = await mget(proto, keys, bufs, reply, sizes)
            check(results, expected, bufs)
        assert transport.sent[0].startswith(b"*%d\r\n$4\r\nMGET\r\n" % (len(keys) + 1))
        assert not transport.aborted

    asyncio.run(scenario())


async def test_one_byte_at_a_time() -> None:
    keys, values, expected = mixed_batch(random.Random(7))
    proto, _t = connected()
    reply = b"*%d\r\n" % len(keys) + b"".join(bulk(v) for v in values)
    bufs = [memoryview(bytearray(80_000)) for _ in keys]
    check(await mget(proto, keys, bufs, reply, [1]), expected, bufs)


async def test_error_reply_raises_and_keeps_the_connection_usable() -> None:
    proto, transport = connected()
    with pytest.raises(RespError, match="NOPERM"):
        await mget(proto, [b"k"], [memoryview(bytearray(8))], b"-NOPERM no mget\r\n", [100])
    payload = os.urandom(10)
    out = memoryview(bytearray(16))
    assert await mget(proto, [b"k"], [out], b"*1\r\n" + bulk(frame(b"k", payload)), [3]) == [10]
    assert bytes(out[:10]) == payload
    assert not transport.aborted


async def test_protocol_violation_aborts_the_connection() -> None:
    proto, transport = connected()
    task = asyncio.ensure_future(
        proto.mget(pack_command(b"MGET", b"k"), [b"k"], [memoryview(bytearray(8))])
    )
    await asyncio.sleep(0)
    feed(proto, b"+OK\r\n", [100])
    with pytest.raises(ConnectionError):
        await task
    assert transport.aborted


async def test_connection_lost_mid_reply_fails_the_request() -> None:
    proto, _t = connected()
    buf = memoryview(bytearray(100_000))
    task = asyncio.ensure_future(proto.mget(pack_command(b"MGET", b"k"), [b"k"], [buf]))
    await asyncio.sleep(0)
    feed(proto, (b"*1\r\n" + bulk(frame(b"k", b"q" * 90_000)))[:50_000], [4096])
    proto.connection_lost(None)
    with pytest.raises(ConnectionError):
        await task


async def test_abort_stops_writes_to_the_destination() -> None:
    proto, transport = connected()
    buf = memoryview(bytearray(100_000))
    task = asyncio.ensure_future(proto.mget(pack_command(b"MGET", b"k"), [b"k"], [buf]))
    await asyncio.sleep(0)
    data = b"*1\r\n" + bulk(frame(b"k", b"q" * 90_000))
    feed(proto, data[:50_000], [4096])
    task.cancel()
    proto.abort()
    assert transport.aborted
    target = proto.get_buffer(-1)
    assert target.obj is not buf.obj  # what still arrives goes to scratch, never to buf
    with pytest.raises(asyncio.CancelledError):
        await task
