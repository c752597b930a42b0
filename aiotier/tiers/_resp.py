"""A zero-copy ``MGET`` reader for :class:`~aiotier.tiers.redis.RedisTier` (plain TCP and unix).

redis-py moves a value through five buffers before it is a ``bytes`` (socket, StreamReader,
hiredis, the reply object, then our copy into the arena), and profiling showed the client CPU,
not the server, bounding promotions. This reader is an :class:`asyncio.BufferedProtocol` that
parses the RESP2 reply of one ``MGET`` of framed values as it arrives and points the kernel at
the destination memoryview for each payload, so the payload bytes are copied exactly once,
by ``recv_into``, straight into the primary arena; the checksum is then verified in place.

Only what the tier needs is spoken: ``AUTH``/``SELECT`` at connect, then ``MGET``. Anything
unexpected closes the connection; the caller falls back to redis-py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, Final

from ..errors import BlockCorruptedError
from .framing import FORMAT_VERSION, HEADER, MAGIC, checksum

__all__ = ["RawReply", "RespReaderPool"]

_SCRATCH: Final = 256 * 1024
_BIG: Final = 32 * 1024  # elements at least this long are read straight into their buffer
_BETWEEN: Final = 24  # CRLF after a value (or "*<n>") plus the next "$<length>" line

# Per-element outcomes besides a length.
RawReply = int | Exception  # length read, -1 absent, or the per-key failure


class _RespError(Exception):
    """The server answered with an error reply."""


class _MgetProtocol(asyncio.BufferedProtocol):
    """Parses replies on one connection; payloads of MGET elements go straight to their views."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._scratch = bytearray(_SCRATCH)
        self._sview = memoryview(self._scratch)
        self._start = 0  # unparsed bytes are scratch[start:end]
        self._end = 0
        self._waiter: asyncio.Future[Any] | None = None
        # simple replies (handshake)
        self._simple_left = 0
        self._simple: list[bytes | Exception] = []
        # the MGET in flight
        self._keys: Sequence[bytes] = ()
        self._bufs: Sequence[memoryview] = ()
        self._out: list[RawReply] = []
        self._state = 0  # 0 idle, 1 simple, 2 top, 3 bulk header, 4 frame header, 5 key,
        #                  6 payload, 7 skip, 8 crlf
        self._i = 0
        self._n = 0
        self._left = 0  # bytes left of the current element part
        self._elem_left = 0  # bytes left of the element (frame) itself
        self._dest: memoryview | None = None
        self._dpos = 0
        self._hdr: tuple[bytes, int, int, int, int, int] | None = None
        self._big = True  # the last element was large: read headers in small windows

    # -- transport callbacks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self._fail(exc or ConnectionError("connection closed by the server"))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._state == 6 and self._dest is not None and self._start == self._end:
            # The payload goes straight to its destination, never past its end.
            return self._dest[self._dpos : self._dpos + self._left]
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end > _SCRATCH // 2:
            n = self._end - self._start
            self._scratch[:n] = self._scratch[self._start : self._end]
            self._start, self._end = 0, n
        st = self._state
        if self._big and st in (2, 3, 4, 5, 8):
            # Between large payloads, read only up to the next payload's first byte, so that
            # the payload itself goes to its destination rather than through scratch.
            have = self._end - self._start
            want = max(1, (self._left if st in (4, 5) else _BETWEEN) - have)
            return self._sview[self._end : self._end + want]
        return self._sview[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._state == 6 and self._dest is not None and self._start == self._end:
            self._dpos += nbytes
            self._left -= nbytes
            self._elem_left -= nbytes
            if self._left == 0:
                self._payload_done()
        else:
            self._end += nbytes
        try:
            self._parse()
        except Exception as exc:  # a protocol violation: this connection is unusable
            self._fail(exc)
            if self.transport is not None:
                self.transport.abort()

    def eof_received(self) -> bool:
        return False

    # -- requests --------------------------------------------------------------------------------

    async def simple(self, payload: bytes, count: int) -> list[bytes | Exception]:
        """Send commands answered by simple replies (``+OK``) and return the replies."""
        assert self.transport is not None
        assert self._state == 0
        self._state, self._simple_left, self._simple = 1, count, []
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        result: list[bytes | Exception] = await self._waiter
        return result

    async def mget(
        self, payload: bytes, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[RawReply]:
        assert self.transport is not None
        assert self._state == 0
        self._keys, self._bufs, self._out, self._i = keys, bufs, [], 0
        self._state = 2
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        result: list[RawReply] = await self._waiter
        return result

    def abort(self) -> None:
        """Stop at once: no byte is written to any destination after this returns."""
        self._dest = None
        self._state = 7
        if self.transport is not None:
            self.transport.abort()

    # -- parsing ---------------------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        self._dest = None
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_exception(exc)

    def _finish(self, value: Any) -> None:
        self._state = 0
        self._dest = None
        self._keys = self._bufs = ()
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_result(value)

    def _line(self) -> bytes | None:
        i = self._scratch.find(b"\r\n", self._start, self._end)
        if i < 0:
            if self._end - self._start > 4096:
                raise ConnectionError("RESP line too long")
            return None
        line = bytes(self._scratch[self._start : i])
        self._start = i + 2
        return line

    def _take(self, n: int) -> memoryview | None:
        if self._end - self._start < n:
            return None
        mv = self._sview[self._start : self._start + n]
        self._start += n
        return mv

    def _parse(self) -> None:
        while True:
            st = self._state
            if st == 1:
                line = self._line()
                if line is None:
                    return
                self._simple.append(_RespError(line[1:].decode()) if line[:1] == b"-" else line)
                self._simple_left -= 1
                if self._simple_left == 0:
                    self._finish(self._simple)
            elif st == 2:
                line = self._line()
                if line is None:
                    return
                if line[:1] == b"-":
                    self._state = 0
                    self._fail(_RespError(line[1:].decode(errors="replace")))
                    return
                if line[:1] != b"*":
                    raise ConnectionError(f"unexpected MGET reply {line[:32]!r}")
                self._n = int(line[1:])
                if self._n != len(self._keys):
                    raise ConnectionError("MGET reply has the wrong number of elements")
                self._next_element()
            elif st == 3:
                line = self._line()
                if line is None:
                    return
                if line[:1] != b"$":
                    raise ConnectionError(f"unexpected MGET element {line[:32]!r}")
                length = int(line[1:])
                self._big = length >= _BIG
                if length < 0:
                    self._out.append(-1)
                    self._i += 1
                    self._next_element()
                    continue
                self._elem_left = length
                if length < HEADER.size:
                    self._corrupt(f"value of {length} bytes is shorter than a frame header")
                else:
                    self._state, self._left = 4, HEADER.size
            elif st == 4:
                mv = self._take(HEADER.size)
                if mv is None:
                    return
                self._elem_left -= HEADER.size
                magic, version, _f, key_len, payload_len, digest = HEADER.unpack_from(mv)
                key = self._keys[self._i]
                if magic != MAGIC:
                    self._corrupt(f"bad magic {bytes(magic)!r}, not an aiotier block")
                elif version != FORMAT_VERSION:
                    self._corrupt(f"unsupported block format version {version}")
                elif key_len + payload_len != self._elem_left:
                    self._corrupt(
                        f"key {key[:64]!r}: value holds {self._elem_left} bytes after its "
                        f"header, header says {key_len} + {payload_len}"
                    )
                elif key_len != len(key):
                    self._corrupt(f"frame holds a key of {key_len} bytes, not {key[:64]!r}")
                else:
                    self._hdr = (key, key_len, payload_len, digest, 0, 0)
                    self._state, self._left = 5, key_len
            elif st == 5:
                mv = self._take(self._left)
                if mv is None:
                    return
                assert self._hdr is not None
                key, key_len, payload_len, _d, _a, _b = self._hdr
                self._elem_left -= key_len
                if mv != key:
                    self._corrupt(f"frame holds key {bytes(mv[:64])!r}, not {key[:64]!r}")
                    continue
                dest = self._bufs[self._i]
                if payload_len > len(dest):
                    self._skip_element(
                        ValueError(
                            f"block {key[:64]!r} is {payload_len} bytes, buffer holds {len(dest)}"
                        )
                    )
                    continue
                self._state, self._dest, self._dpos, self._left = 6, dest, 0, payload_len
                # Bytes of the payload that already arrived in scratch: the one extra copy.
                avail = min(self._end - self._start, payload_len)
                if avail:
                    dest[:avail] = self._sview[self._start : self._start + avail]
                    self._start += avail
                    self._dpos = avail
                    self._left -= avail
                    self._elem_left -= avail
                if self._left == 0:
                    self._payload_done()
                else:
                    return  # get_buffer now points at dest (scratch is drained)
            elif st == 6:
                return  # waiting for the kernel to fill dest
            elif st == 7:
                n = min(self._end - self._start, self._elem_left)
                self._start += n
                self._elem_left -= n
                if self._elem_left:
                    return
                self._state, self._left = 8, 2
            elif st == 8:
                if self._take(2) is None:
                    return
                self._i += 1
                self._next_element()
            else:
                return

    def _next_element(self) -> None:
        if self._i == self._n:
            self._finish(self._out)
        else:
            self._state = 3

    def _payload_done(self) -> None:
        assert self._hdr is not None
        assert self._dest is not None
        key, _kl, payload_len, digest, _a, _b = self._hdr
        dest, self._dest = self._dest, None
        if checksum(dest[:payload_len]) != digest:
            self._out.append(BlockCorruptedError(f"key {key[:64]!r}: payload checksum mismatch"))
        else:
            self._out.append(payload_len)
        self._state, self._left = 8, 2

    def _corrupt(self, why: str) -> None:
        self._skip_element(BlockCorruptedError(why))

    def _skip_element(self, exc: Exception) -> None:
        self._out.append(exc)
        self._state = 7


def _pack(*args: bytes) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        parts.append(b"$%d\r\n" % len(a))
        parts.append(a)
        parts.append(b"\r\n")
    return b"".join(parts)


class RespReaderPool:
    """Idle raw connections for MGET; a connection is reused only after a clean reply."""

    def __init__(
        self,
        *,
        host: str | None = None,
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        max_idle: int = 8,
        max_connections: int = 32,
    ) -> None:
        self._host, self._port, self._path = host, port, path
        self._handshake: list[bytes] = []
        if password is not None:
            auth = (b"AUTH", username.encode(), password.encode()) if username else (
                b"AUTH", password.encode())  # fmt: skip
            self._handshake.append(_pack(*auth))
        if db:
            self._handshake.append(_pack(b"SELECT", str(db).encode()))
        self._idle: list[_MgetProtocol] = []
        self._max_idle = max_idle
        # Bounds this tier's raw connections (a fleet must stay under the server's maxclients);
        # callers beyond it wait, within their own timeout.
        self._slots = asyncio.Semaphore(max_connections)

    async def _connect(self) -> _MgetProtocol:
        loop = asyncio.get_running_loop()
        proto: _MgetProtocol
        if self._path is not None:
            _t, proto = await loop.create_unix_connection(_MgetProtocol, self._path)
        else:
            _t, proto = await loop.create_connection(
                _MgetProtocol, self._host or "localhost", self._port
            )
        try:
            if self._handshake:
                replies = await proto.simple(b"".join(self._handshake), len(self._handshake))
                for r in replies:
                    if isinstance(r, Exception):
                        raise r
        except BaseException:
            proto.abort()
            raise
        return proto

    async def mget_into(
        self, rkeys: Sequence[bytes], keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[RawReply]:
        """One MGET; payloads land in ``bufs`` and are verified there."""
        async with self._slots:
            return await self._mget_into(rkeys, keys, bufs)

    async def _mget_into(
        self, rkeys: Sequence[bytes], keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[RawReply]:
        proto = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed.done():
                proto = candidate
                break
        if proto is None:
            proto = await self._connect()
        ok = False
        try:
            result = await proto.mget(_pack(b"MGET", *rkeys), keys, bufs)
            ok = True
            return result
        except _RespError as exc:
            ok = True  # the connection is in a clean state after an error reply
            if str(exc).startswith(("LOADING", "MASTERDOWN", "BUSY ")):
                # a server that cannot serve yet, as redis-py sees it: unavailable, not refused
                raise ConnectionError(f"server busy: {exc}") from None
            raise RespServerError(str(exc)) from None
        finally:
            if ok and len(self._idle) < self._max_idle and not proto.closed.done():
                self._idle.append(proto)
            else:
                proto.abort()

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for proto in idle:
            with contextlib.suppress(Exception):
                proto.abort()


class RespServerError(Exception):
    """An error reply (``-ERR``/``-NOPERM``...) to the fast reader's command."""
