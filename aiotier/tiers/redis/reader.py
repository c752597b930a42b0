"""A zero-copy ``MGET`` reader for :class:`~aiotier.tiers.redis.RedisTier` (plain TCP and unix).

redis-py moves a value through five buffers before it is a ``bytes`` (socket, StreamReader,
hiredis, the reply object, then our copy into the arena), and profiling showed the client CPU,
not the server, bounding promotions. This reader is an :class:`asyncio.BufferedProtocol` that
hands the kernel whatever buffer the sans-IO :class:`~aiotier.tiers.redis.parser.MgetParser`
asks for: for each payload, the caller's destination memoryview, so the payload bytes are
copied exactly once, by ``recv_into``, straight into the primary arena, and verified there.
The parsing (every state and check) lives in ``parser.py``; this module holds the transport
adapter and the connection pool.

Only what the tier needs is spoken: ``AUTH``/``SELECT`` at connect, then ``MGET``. Anything
unexpected closes the connection; the caller falls back to redis-py. Any event loop whose
transports call ``get_buffer``/``buffer_updated`` works (asyncio's own and uvloop's).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol, cast

from .parser import MgetParser, Reply, RespError, RespProtocolError, pack_command

__all__ = ["RespReaderPool", "RespServerError", "fast_reader_target"]

#: A batched read is split over several connections only when each part moves this much.
SPLIT_BYTES: Final = 2 << 20
#: ``client_kwargs`` of redis-py that only redis-py's own connections can honour.
_REDIS_PY_ONLY: Final = frozenset({
    "credential_provider", "connection_pool", "connection_class", "ssl", "host", "port", "path",
    "unix_socket_path", "redis_connect_func",
})  # fmt: skip


def fast_reader_target(url: str, client_kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The :class:`RespReaderPool` arguments that reach the server ``url`` (with the ``db``,
    ``username`` and ``password`` of ``client_kwargs``), or None where only redis-py will do
    (TLS, a custom connection). ``ValueError`` for a URL redis-py cannot parse."""
    from redis.asyncio.connection import parse_url

    scheme = url.partition("://")[0].lower()
    if scheme not in ("redis", "unix") or _REDIS_PY_ONLY & client_kwargs.keys():
        return None
    parsed: dict[str, Any] = dict(parse_url(url))
    parsed.update({k: v for k, v in client_kwargs.items() if k in ("db", "username", "password")})
    return {
        "host": parsed.get("host", "localhost"),
        "port": int(parsed.get("port", 6379)),
        "path": parsed.get("path") if scheme == "unix" else None,
        "db": int(parsed.get("db", 0) or 0),
        "username": parsed.get("username"),
        "password": parsed.get("password"),
    }


class _Transport(Protocol):
    """What the reader uses of its transport.

    uvloop's transports implement this but do not subclass :class:`asyncio.Transport`, so the
    reader relies on the methods, never on the class.
    """

    def write(self, data: bytes) -> None: ...

    def abort(self) -> None: ...


class _MgetProtocol(asyncio.BufferedProtocol):
    """Drives one connection's :class:`MgetParser`: it owns the transport and the waiter.

    Every parsing decision, including which buffer the kernel writes into, is the parser's;
    this class only moves bytes and wakes the request's awaiter.
    """

    def __init__(self) -> None:
        self.transport: _Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.parser = MgetParser()
        self._waiter: asyncio.Future[Any] | None = None

    # -- transport callbacks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(_Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self.parser.abort()
        self._fail(exc or ConnectionError("connection closed by the server"))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.parser.buffer_for(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            reply = self.parser.advance(nbytes)
        except RespProtocolError as exc:  # this connection is out of step for good
            self._fail(exc)
            if self.transport is not None:
                self.transport.abort()
            return
        if reply is not None:
            self._settle(reply)

    def eof_received(self) -> bool:
        return False

    # -- requests --------------------------------------------------------------------------------

    async def simple(self, payload: bytes, count: int) -> list[bytes | RespError]:
        """Send commands answered by simple replies (``+OK``) and return the replies."""
        self.parser.expect_simple(count)
        result: list[bytes | RespError] = await self._request(payload)
        return result

    async def mget(
        self, payload: bytes, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """Send ``payload`` (an ``MGET`` of ``keys``); per key, its length, -1 or its failure."""
        self.parser.expect_mget(keys, bufs)
        result: list[int | Exception] = await self._request(payload)
        return result

    async def _request(self, payload: bytes) -> Any:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return await self._waiter

    def abort(self) -> None:
        """Stop at once: no byte is written to any destination after this returns."""
        self.parser.abort()
        if self.transport is not None:
            self.transport.abort()

    def _settle(self, reply: Reply) -> None:
        w, self._waiter = self._waiter, None
        if w is None or w.done():
            return
        if isinstance(reply, RespError):
            w.set_exception(reply)
        else:
            w.set_result(reply)

    def _fail(self, exc: BaseException) -> None:
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_exception(exc)


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
            self._handshake.append(pack_command(*auth))
        if db:
            self._handshake.append(pack_command(b"SELECT", str(db).encode()))
        self._idle: list[_MgetProtocol] = []
        self._open: set[_MgetProtocol] = set()  # every connection not closed yet
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
        self._open.add(proto)
        proto.closed.add_done_callback(lambda _: self._open.discard(proto))
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

    async def mget_striped(
        self,
        rkeys: Sequence[bytes],
        keys: Sequence[bytes],
        bufs: Sequence[memoryview],
        streams: int,
    ) -> list[int | Exception]:
        """The keys read over up to ``streams`` connections at once (a part moves at least
        :data:`SPLIT_BYTES`); per-key outcomes in order, or the first part's failure."""
        total = sum(len(b) for b in bufs)
        streams = max(1, min(streams, len(keys), total // SPLIT_BYTES))
        step = -(-len(keys) // streams)
        parts = await asyncio.gather(
            *(
                self.mget_into(rkeys[a : a + step], keys[a : a + step], bufs[a : a + step])
                for a in range(0, len(keys), step)
            ),
            return_exceptions=True,  # every part has finished (and let go of bufs) on return
        )
        out: list[int | Exception] = []
        for part in parts:
            if isinstance(part, BaseException):
                raise part
            out.extend(part)
        return out

    async def mget_into(
        self, rkeys: Sequence[bytes], keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """One MGET; payloads land in ``bufs`` and are verified there."""
        async with self._slots:
            return await self._mget_into(rkeys, keys, bufs)

    async def _mget_into(
        self, rkeys: Sequence[bytes], keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        proto = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed.done():
                proto = candidate
                break
        if proto is None:
            try:
                proto = await self._connect()
            except RespError as exc:  # AUTH or SELECT refused: the server's answer, as below
                raise RespServerError(str(exc)) from None
        ok = False
        try:
            result = await proto.mget(pack_command(b"MGET", *rkeys), keys, bufs)
            ok = True
            return result
        except RespError as exc:
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
        """Drop the idle connections (ones in use come back to the pool after their reply)."""
        idle, self._idle = self._idle, []
        for proto in idle:
            with contextlib.suppress(Exception):
                proto.abort()

    async def aclose(self, timeout: float) -> None:
        """Drop every connection and wait (at most ``timeout``) until each socket is closed: an
        aborted transport closes its socket a loop turn later, which a loop about to stop may
        never run."""
        self._idle = []
        for proto in list(self._open):  # the idle ones among them
            with contextlib.suppress(Exception):
                proto.abort()
        if self._open:
            await asyncio.wait([p.closed for p in self._open], timeout=timeout)


class RespServerError(Exception):
    """An error reply (``-ERR``/``-NOPERM``...) to the fast reader's command."""
