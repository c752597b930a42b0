"""The read side of :class:`~aiotier.tiers.objectstore.ObjectStoreTier`: lookups that GET a body
and keep it for the read that follows (:mod:`.lookahead`), and reads that verify each body and
copy it into its buffer once.

A base class of the tier, beside its lifecycle and write side; it uses the attributes the tier
sets in its constructor, declared below.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

from ..._types import LookupResult
from ...errors import BlockCorruptedError
from .._net.late_writes import LateWriteGuard
from ..framing import HEADER, payload_into
from .client import ObjectTooLarge, ObstoreClient
from .expiry import ObjectExpiry
from .lookahead import LookAhead
from .memory import ObjectMemory
from .requests import ObjectRequests

__all__ = ["ObjectReads"]

_log = logging.getLogger("aiotier.objectstore")

#: The frame size lookups assume, until the engine tells the block size or a body is seen.
_FRAME_GUESS: Final = 1 << 20

#: Bytes of fetched bodies verified and copied before the loop gets a turn (about 0.5 ms).
_COPY_SLICE: Final = 4 << 20


class ObjectReads:
    """``lookup_many`` and ``read_many_into`` of the object store tier."""

    name: str
    client: ObstoreClient
    lookahead_reads: int
    _requests: ObjectRequests
    _memory: ObjectMemory
    _lookahead: LookAhead
    _expiry: ObjectExpiry
    _late: LateWriteGuard
    _block_size: int | None
    _largest_frame: int

    def object_name(self, key: bytes) -> str:
        raise NotImplementedError  # the tier's

    def _corrupted(self, name: str, etag: str) -> None:
        raise NotImplementedError  # the tier's

    async def _delete_expired(self) -> None:
        raise NotImplementedError  # the tier's

    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        """A request for each key not written or read recently, at most ``max_concurrency`` at
        once: a GET whose body is kept for the read while the look-ahead budget has room, else
        a HEAD.

        Raises only when every request failed; a key whose request failed among others that
        succeeded is a MISS.
        """
        if not keys:
            return []
        names = [self.object_name(k) for k in keys]
        out = [LookupResult.HIT] * len(keys)
        asked: list[int] = []
        for i, n in enumerate(names):
            if not self._memory.fresh(n):
                asked.append(i)
            elif self._expiry.past(n):  # known from memory: no request
                self._memory.gone(n)
                out[i] = LookupResult.MISS
        if not asked:
            await self._delete_expired()
            return out
        deadline = self._requests.deadline()
        frame = self._lookahead_frame(keys, asked)
        fetch = self._fetch_count(len(asked), frame)
        mark = self._lookahead.begin()

        async def ask(j: int) -> str | None:
            name = names[asked[j]]
            if j >= fetch:
                return await self._requests.send("lookup", lambda: self.client.head(name), deadline)
            limit = self._frame_max(keys[asked[j]]) or frame
            try:
                got = await self._requests.send(
                    "lookup", lambda: self.client.get(name, limit), deadline
                )
            except ObjectTooLarge as exc:  # not a block of this engine's size: a MISS
                if self._block_size is None:  # or maybe one: answered as a HEAD would be
                    return exc.etag
                self._corrupted(name, exc.etag)
                return None
            if got is None:
                return None
            body, etag = got
            self._largest_frame = max(self._largest_frame, len(body))
            if self._expiry.frame_past(name, body):
                return None  # a MISS, deleted below
            if not self._memory.refused(name, etag):
                self._lookahead.keep(name, body, etag, len(body), mark)
            return etag

        try:
            heads = await self._requests.each(range(len(asked)), ask)
        finally:
            self._lookahead.end(mark)
        failures = 0
        for i, etag in zip(asked, heads, strict=True):
            name = names[i]
            if isinstance(etag, Exception):
                failures += 1
                out[i] = LookupResult.MISS
            elif etag is None or self._memory.refused(name, etag):
                self._memory.gone(name)
                out[i] = LookupResult.MISS
            else:
                out[i] = LookupResult.HIT
        if failures == len(asked):
            first = next(e for e in heads if isinstance(e, Exception))
            raise first
        await self._delete_expired()
        return out

    def _fetch_count(self, asked: int, frame: int) -> int:
        """How many of ``asked`` keys a lookup GETs: as many bodies of ``frame`` bytes as the
        look-ahead has room for."""
        if not self._lookahead.enabled:
            return 0
        return min(asked, self._lookahead.room(frame))

    def _lookahead_frame(self, keys: Sequence[bytes], asked: list[int]) -> int:
        """The frame size a lookup plans its GETs for: from the engine's block size, else the
        largest seen (a GET announcing more is not read)."""
        payload = self._block_size or self._largest_frame or _FRAME_GUESS
        return HEADER.size + max(len(keys[i]) for i in asked) + payload

    def _frame_max(self, key: bytes) -> int | None:
        """The longest frame of ``key`` a block of this engine makes (None: size not known)."""
        return None if self._block_size is None else HEADER.size + len(key) + self._block_size

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """Each key's body, verified and copied into its buffer (the only copy): the body its
        lookup fetched, else a GET, at most ``max_concurrency`` at once, copied as it arrives.
        Every GET has finished, and no buffer is written any more, when this returns or is
        cancelled."""
        if len(keys) != len(bufs):
            raise ValueError(f"{len(keys)} keys but {len(bufs)} buffers")
        names = [self.object_name(k) for k in keys]
        out: list[int | Exception] = [0] * len(keys)
        fetch: list[int] = []
        copied = 0
        for i, name in enumerate(names):
            got = self._lookahead.take(name)
            if got is None:
                fetch.append(i)
                continue
            self.lookahead_reads += 1
            try:
                out[i] = self._deliver(keys[i], name, got, bufs[i])
            except Exception as exc:
                out[i] = exc
            copied += len(got[0])
            if copied >= _COPY_SLICE:  # verifying and copying is CPU work: let the loop run
                copied = 0
                await asyncio.sleep(0)
        if not fetch:
            await self._delete_expired()
            return out
        deadline = self._requests.deadline()

        async def one(i: int) -> int:
            key, name, buf = keys[i], names[i], bufs[i]
            limit = HEADER.size + len(key) + len(buf)
            try:
                got = await self._requests.send(
                    "read", lambda: self.client.get(name, limit), deadline
                )
            except ObjectTooLarge as exc:
                frame_max = self._frame_max(key)
                if frame_max is not None and exc.size > frame_max:
                    self._corrupted(name, exc.etag)
                    raise BlockCorruptedError(
                        f"object tier {self.name!r}: {name}: {exc.size} bytes, more than a "
                        f"block of {self._block_size} bytes makes; not read"
                    ) from None
                payload = exc.size - HEADER.size - len(key)
                raise ValueError(
                    f"object tier {self.name!r}: block {key[:64]!r} is {payload} bytes, buffer "
                    f"holds {len(buf)} (by its object's size: not read)"
                ) from None
            return self._deliver(key, name, got, buf)

        for i, outcome in zip(fetch, await self._requests.each(fetch, one), strict=True):
            out[i] = outcome
        await self._delete_expired()
        return out

    def _deliver(
        self, key: bytes, name: str, got: tuple[memoryview, str] | None, buf: memoryview
    ) -> int:
        """Verify a fetched body and copy its payload into ``buf``: its length, -1 when the
        object was not there; raises when its bytes fail verification."""
        if got is None:
            self._memory.gone(name)
            return -1
        frame, etag = got
        try:
            n = payload_into(frame, key, buf)
        except BlockCorruptedError as exc:
            self._corrupted(name, etag)
            raise BlockCorruptedError(f"object tier {self.name!r}: {name}: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"object tier {self.name!r}: {exc}") from None
        if self._expiry.frame_past(name, frame):
            self._memory.gone(name)
            return -1
        outcome: list[int | Exception] = [n]
        if self._late and self._late.screen((name,), (buf,), outcome):
            # an older write, cut short, landed after a later one: a MISS, remembered by ETag
            # like a corrupted object (not deleted: the bucket is shared)
            self._memory.refuse(name, etag)
            _log.warning("object tier %r: %s: a write cut short landed late", self.name, name)
            return -1
        self._memory.verified(name)
        return n
