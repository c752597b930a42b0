"""The RESP2 replies of the fast ``MGET`` reader, parsed without any I/O (the h11 pattern).

:class:`MgetParser` never touches a socket, a loop or a clock. Its caller (the
:class:`asyncio.BufferedProtocol` in ``_resp``, or a test) asks :meth:`MgetParser.buffer_for`
where the next bytes must go, writes up to that many bytes there, and reports them with
:meth:`MgetParser.advance`, which returns the reply once it is complete. Because every state
transition lives here, the parser can be fed any reply split at any byte boundary in a test.

Zero copy: while a payload is due and nothing of it waits in scratch, :meth:`buffer_for`
returns the rest of the caller's own destination view, so ``recv_into`` writes the payload
there and it is never copied again; the checksum is then verified in place. Between large
payloads the parser asks for small windows only (up to the next payload's first byte), so that
the next payload is not pulled into scratch.

Only what the reader needs is understood: simple replies (``+OK``/``-ERR``) answering the
handshake, and one array of bulk strings (or nils, or per-element errors) answering ``MGET``.
Anything else is a :class:`RespProtocolError`, after which the parser is :attr:`BROKEN
<ParserState.BROKEN>` and writes to no destination again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Final, TypeAlias

from ...errors import BlockCorruptedError
from ..framing import HEADER, check_header, check_payload

__all__ = [
    "MgetParser",
    "ParserState",
    "Reply",
    "RespError",
    "RespProtocolError",
    "pack_command",
]

#: Scratch space for everything but payloads (lines, frame headers, small values).
_SCRATCH: Final = 256 * 1024
#: Elements at least this long are read straight into their buffer, their headers in windows.
_BIG: Final = 32 * 1024
#: Bytes from the end of one payload to the next frame header: its CRLF (or the "*<n>" line)
#: plus the next "$<length>" line.
_BETWEEN: Final = 24
#: A line (length, status, error) longer than this is not a reply we asked for.
_MAX_LINE: Final = 4096


class RespError(Exception):
    """The server answered with an error reply (``-ERR ...``, ``-NOPERM ...``)."""


class RespProtocolError(ConnectionError):
    """The bytes on the connection are not the reply that was asked for; drop the connection."""


class ParserState(IntEnum):
    """Where the parser is in the reply it expects."""

    IDLE = 0  #: no request in flight; any byte that arrives is a protocol violation
    SIMPLE = 1  #: status or error lines answering the handshake (``AUTH``, ``SELECT``)
    ARRAY = 2  #: the ``*<n>`` line that opens the ``MGET`` reply, or a top-level error
    ELEMENT = 3  #: the ``$<length>``, ``$-1`` or ``-error`` line of the next element
    FRAME_HEAD = 4  #: an element's fixed frame header and stored key, gathered in scratch
    PAYLOAD = 5  #: the element's payload, landing in the caller's destination view
    SKIP = 6  #: the rest of an element that was rejected (corrupt, or too big for its view)
    CRLF = 7  #: the CRLF that ends an element
    BROKEN = 8  #: after a protocol violation or :meth:`MgetParser.abort`: bytes are dropped


_IDLE, _SIMPLE, _ARRAY, _ELEMENT, _FRAME_HEAD, _PAYLOAD, _SKIP, _CRLF, _BROKEN = ParserState
#: By state: whether its bytes go to scratch in small windows after a large payload (see
#: buffer_for). Tables here are lists indexed by state: hashing an enum member calls Python.
_WINDOWED: Final = [s in (_ARRAY, _ELEMENT, _FRAME_HEAD, _CRLF) for s in ParserState]

#: Per key of an ``MGET``: the payload length, -1 when absent, or that key's failure.
MgetReply: TypeAlias = list[int | Exception]
#: Per command of a handshake: the status line, or the server's error.
SimpleReply: TypeAlias = list[bytes | RespError]
#: What :meth:`MgetParser.advance` returns once a reply is complete; a :class:`RespError` is
#: the server refusing the whole ``MGET`` (the connection stays in step).
Reply: TypeAlias = MgetReply | SimpleReply | RespError


def pack_command(*args: bytes) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        parts.append(b"$%d\r\n" % len(a))
        parts.append(a)
        parts.append(b"\r\n")
    return b"".join(parts)


def _error(line: bytes) -> RespError:
    return RespError(line[1:].decode(errors="replace"))


def _length(line: bytes) -> int:
    try:
        return int(line[1:])
    except ValueError:
        raise RespProtocolError(f"bad length line {line[:32]!r}") from None


class MgetParser:
    """One connection's reply parser: simple replies for the handshake, then ``MGET`` replies.

    One request at a time: :meth:`expect_simple` or :meth:`expect_mget` arms it, the reply
    comes back from :meth:`advance`, and the parser is :attr:`~ParserState.IDLE` again.
    """

    def __init__(self) -> None:
        self._scratch = bytearray(_SCRATCH)
        self._sview = memoryview(self._scratch)
        self._start = 0  # unparsed bytes are scratch[start:end]
        self._end = 0
        self.state = _IDLE
        self._reply: Reply | None = None
        # the handshake in flight
        self._simple_left = 0
        self._simple: SimpleReply = []
        # the MGET in flight
        self._keys: Sequence[bytes] = ()
        self._bufs: Sequence[memoryview] = ()
        self._out: MgetReply = []
        self._i = 0  # index of the element being parsed
        self._n = 0  # elements in the reply
        # the element being parsed
        self._key = b""  # the key it must hold
        self._frame_len = 0  # the element's length (a whole frame)
        self._elem_left = 0  # bytes of the element not consumed yet
        self._left = 0  # bytes left of the current part (frame head, payload, CRLF)
        self._payload_len = 0
        self._digest = 0
        self._dest: memoryview | None = None
        self._dpos = 0
        self._into_dest = False  # the last buffer_for handed out the destination
        self._big = True  # the last element was large: read headers in small windows
        # One step per state, in ParserState order (indexed by state).
        self._steps: list[Callable[[], bool]] = [
            self._idle,  # IDLE
            self._simple_line,  # SIMPLE
            self._array,  # ARRAY
            self._element,  # ELEMENT
            self._frame_head,  # FRAME_HEAD
            self._wait,  # PAYLOAD
            self._skip,  # SKIP
            self._crlf,  # CRLF
            self._wait,  # BROKEN
        ]

    # -- requests ------------------------------------------------------------------------------

    def expect_simple(self, count: int) -> None:
        """The next ``count`` replies are simple ones (the handshake's)."""
        self._arm()
        self.state, self._simple_left, self._simple = _SIMPLE, count, []

    def expect_mget(self, keys: Sequence[bytes], bufs: Sequence[memoryview]) -> None:
        """The next reply answers an ``MGET`` of the frames of ``keys``; payloads go to ``bufs``.

        Each payload is written only into its own view, never past ``len(view)`` bytes; a value
        longer than its view is skipped and reported as a ``ValueError`` in its slot.
        """
        if len(keys) != len(bufs):
            raise ValueError(f"{len(keys)} keys but {len(bufs)} buffers")
        self._arm()
        self._keys, self._bufs, self._out, self._i = keys, bufs, [], 0
        self.state = _ARRAY

    def abort(self) -> None:
        """Stop at once: no byte is written to any destination after this returns."""
        self._dest = None
        self._into_dest = False
        self._keys = self._bufs = ()
        self.state = _BROKEN

    def _arm(self) -> None:
        if self.state is not _IDLE:
            raise RuntimeError(f"a request is already in flight ({self.state.name})")

    # -- bytes in --------------------------------------------------------------------------------

    def buffer_for(self, sizehint: int = -1) -> memoryview:
        """Where the next bytes must be written (never empty); report them with :meth:`advance`.

        ``sizehint`` is accepted for :meth:`asyncio.BufferedProtocol.get_buffer` and ignored.
        """
        if self.state is _PAYLOAD and self._start == self._end:
            # The payload goes straight to its destination, never past its end.
            dest = self._dest
            assert dest is not None
            self._into_dest = True
            return dest[self._dpos : self._dpos + self._left]
        self._into_dest = False
        if self._start == self._end or self.state is _BROKEN:
            self._start = self._end = 0
        elif self._end > _SCRATCH // 2:
            n = self._end - self._start
            self._scratch[:n] = self._scratch[self._start : self._end]
            self._start, self._end = 0, n
        if self._big and _WINDOWED[self.state]:
            # Between large payloads, read only up to the next payload's first byte, so that
            # the payload itself goes to its destination rather than through scratch.
            have = self._end - self._start
            want = max(1, (self._left if self.state is _FRAME_HEAD else _BETWEEN) - have)
            return self._sview[self._end : self._end + want]
        return self._sview[self._end :]

    def advance(self, nbytes: int) -> Reply | None:
        """``nbytes`` were written into the last :meth:`buffer_for`; the reply once complete.

        Raises :class:`RespProtocolError` (and stays :attr:`~ParserState.BROKEN`) when the bytes
        are not the expected reply.
        """
        if self._into_dest:
            self._into_dest = False
            self._dpos += nbytes
            self._left -= nbytes
            self._elem_left -= nbytes
            if self._left == 0:
                self._payload_done()
        else:
            self._end += nbytes
        try:
            steps = self._steps
            while steps[self.state]():
                pass
        except Exception as exc:
            self.abort()
            if isinstance(exc, RespProtocolError):
                raise
            raise RespProtocolError(f"unreadable reply: {exc!r}") from exc
        reply, self._reply = self._reply, None
        return reply

    # -- the states: each returns True when it made progress and parsing should go on ----------

    def _wait(self) -> bool:
        return False  # PAYLOAD: the bytes go to the destination; BROKEN: they are dropped

    def _idle(self) -> bool:
        if self._start != self._end:
            raise RespProtocolError("bytes arrived with no request in flight")
        return False

    def _simple_line(self) -> bool:
        line = self._line()
        if line is None:
            return False
        self._simple.append(_error(line) if line[:1] == b"-" else line)
        self._simple_left -= 1
        if self._simple_left == 0:
            self._finish(self._simple)
        return True

    def _array(self) -> bool:
        line = self._line()
        if line is None:
            return False
        if line[:1] == b"-":
            self._finish(_error(line))  # the server refused the command; still in step
            return True
        if line[:1] != b"*":
            raise RespProtocolError(f"unexpected MGET reply {line[:32]!r}")
        self._n = _length(line)
        if self._n != len(self._keys):
            raise RespProtocolError(f"MGET reply has {self._n} elements for {len(self._keys)} keys")
        self._next_element()
        return True

    def _element(self) -> bool:
        line = self._line()
        if line is None:
            return False
        kind = line[:1]
        if kind == b"-":
            self._out.append(_error(line))
            self._i += 1
            self._next_element()
            return True
        if kind != b"$":
            raise RespProtocolError(f"unexpected MGET element {line[:32]!r}")
        length = _length(line)
        self._big = length >= _BIG
        if length < 0:
            self._out.append(-1)
            self._i += 1
            self._next_element()
            return True
        self._key = key = self._keys[self._i]
        self._frame_len = self._elem_left = length
        # The header and the key it must hold, or the whole value if it is shorter than that
        # (check_header then says what is wrong with it).
        self.state, self._left = _FRAME_HEAD, min(length, HEADER.size + len(key))
        return True

    def _frame_head(self) -> bool:
        head = self._take(self._left)
        if head is None:
            return False
        self._elem_left -= len(head)
        key = self._key
        try:
            _key_len, payload_len, digest = check_header(head, key, self._frame_len)
        except BlockCorruptedError as exc:
            self._skip_element(exc)
            return True
        dest = self._bufs[self._i]
        if payload_len > len(dest):
            self._skip_element(
                ValueError(f"block {key[:64]!r} is {payload_len} bytes, buffer holds {len(dest)}")
            )
        else:
            self._start_payload(dest, payload_len, digest)
        return True

    def _start_payload(self, dest: memoryview, payload_len: int, digest: int) -> None:
        self.state, self._dest, self._dpos, self._left = _PAYLOAD, dest, 0, payload_len
        self._payload_len, self._digest = payload_len, digest
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
        # else buffer_for now points at dest (scratch is drained)

    def _payload_done(self) -> None:
        dest, self._dest = self._dest, None
        assert dest is not None
        n = self._payload_len
        try:
            check_payload(dest[:n], self._key, self._digest)
        except BlockCorruptedError as exc:
            self._out.append(exc)
        else:
            self._out.append(n)
        self.state, self._left = _CRLF, 2

    def _skip(self) -> bool:
        n = min(self._end - self._start, self._elem_left)
        self._start += n
        self._elem_left -= n
        if self._elem_left:
            return False
        self.state, self._left = _CRLF, 2
        return True

    def _crlf(self) -> bool:
        if self._end - self._start < 2:
            return False
        if not self._scratch.startswith(b"\r\n", self._start):
            raise RespProtocolError(f"element {self._i} is not followed by CRLF")
        self._start += 2
        self._i += 1
        self._next_element()
        return True

    # -- helpers ---------------------------------------------------------------------------------

    def _next_element(self) -> None:
        if self._i == self._n:
            self._finish(self._out)
        else:
            self.state = _ELEMENT

    def _finish(self, reply: Reply) -> None:
        self.state = _IDLE
        self._dest = None
        self._keys = self._bufs = ()
        self._reply = reply

    def _skip_element(self, exc: Exception) -> None:
        self._out.append(exc)
        self.state = _SKIP

    def _line(self) -> bytes | None:
        i = self._scratch.find(b"\r\n", self._start, self._end)
        if i < 0:
            if self._end - self._start > _MAX_LINE:
                raise RespProtocolError("RESP line too long")
            return None
        line = bytes(self._scratch[self._start : i])
        self._start = i + 2
        return line

    def _take(self, n: int) -> bytes | None:
        """The next ``n`` bytes of scratch, or None until they are there.

        A copy, and a deliberate one: the frame checks compare the stored key, and comparing
        ``bytes`` with ``bytes`` costs less than comparing memoryview slices.
        """
        if self._end - self._start < n:
            return None
        head = bytes(self._sview[self._start : self._start + n])
        self._start += n
        return head
