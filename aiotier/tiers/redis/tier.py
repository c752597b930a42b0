"""A secondary tier on a Redis or Valkey server (or a Redis Cluster) shared by a fleet of engines.

Values are the same self-describing frames as SSD files (header, key, xxh3-64 checksum), so a
value written by another program, truncated or corrupted is detected and never handed out, and
nothing is ever unpickled. Keys are ``namespace:`` plus a hash of the block key, so any block
key (up to 1024 bytes, any bytes) maps to a short, safe Redis key.

Batches cost one round trip: lookups run one small Lua script (pipelined ``EXISTS`` on a
cluster or where scripts are not allowed), writes one non-transactional pipeline of ``SET``.
On plain TCP and unix sockets a batched read is an ``MGET`` that bypasses redis-py's parser
(see ``reader.py``): the kernel copies each payload straight into the caller's buffer, and a
large batch is split over a few connections at once. Other reads are one pipeline of
``GETRANGE`` (per node on a cluster), each bounded by its buffer, so a huge value planted under
a block's key is never read whole (``reads.py``).

A server that goes away must not slow the engine down: every call is bounded by ``timeout``,
and after ``failure_threshold`` consecutive connection failures a circuit opens, so calls fail
at once with :class:`~aiotier.errors.TierUnavailableError` (the engine counts them as MISSes)
while a background probe PINGs the server every ``probe_interval`` seconds and closes the
circuit when it answers. redis-py reconnects its pooled connections by itself.

redis-py is an optional dependency (the ``redis`` extra); it is imported when a tier is created,
so ``import aiotier`` works without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ..._types import LookupResult
from ..._validate import check_bool, check_int, check_positive, check_str
from ...errors import (
    BlockCorruptedError,
    ConfigError,
    TieringError,
    TierUnavailableError,
)
from .._batches import LastWrites
from .._net.late_writes import LateWriteGuard
from .._net.outage import GuardedTier, ServerGuard
from ..base import BlockMeta, Buffer, SecondaryTier, TierCapabilities, TierSetup, TierUsage
from ..framing import block_digest, encode_frame
from .late import guarded_write, noting_retry, refuse_late_copies
from .reader import RespReaderPool, RespServerError, fast_reader_target
from .reads import bounded_payload_into, frame_limit, get_ranges

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["RedisTier"]

_log = logging.getLogger("aiotier.redis")
_T = TypeVar("_T")

_MISSING_EXTRA: Final = (
    "RedisTier needs redis-py, which is not installed: install the 'redis' extra, "
    "e.g. pip install 'aiotier[redis]'"
)

# One round trip for any number of keys: EXISTS of each, answered as one array of 0/1.
_LOOKUP_SCRIPT: Final = b"""
local out = {}
for i = 1, #KEYS do out[i] = redis.call('EXISTS', KEYS[i]) end
return out
"""
_LOOKUP_SHA: Final = hashlib.sha1(_LOOKUP_SCRIPT).hexdigest()


def _import_redis() -> tuple[ModuleType, ModuleType]:
    """``redis.asyncio`` and ``redis.exceptions``, or an ImportError that names the extra."""
    try:
        import redis.asyncio as redis_asyncio
        import redis.exceptions as redis_exceptions
    except ImportError as exc:
        raise ImportError(_MISSING_EXTRA) from exc
    return redis_asyncio, redis_exceptions


def _pipeline(client: Any) -> Any:
    """A non-transactional pipeline: a plain server's default wraps it in MULTI/EXEC, which a
    batch of independent blocks does not need (a cluster has no transactions at all)."""
    return client.pipeline(transaction=False)


class _SingleServer:
    """How batches reach one server: multi-key commands (``MGET``, ``DEL k...``) and a Lua
    script for lookups; the zero-copy reader can serve reads. Chosen once, at construction,
    so no operation asks which kind of deployment it talks to."""

    lookup_script = True
    fast_reads = True

    def connect(self, redis_asyncio: ModuleType, url: str, kwargs: dict[str, Any]) -> Any:
        return redis_asyncio.Redis.from_url(url, **kwargs)

    async def delete_many(self, client: Any, keys: list[bytes]) -> int:
        return int(await client.delete(*keys))


class _Cluster(_SingleServer):
    """How batches reach a Redis Cluster: hashed keys land in many slots, which no multi-key
    command or script may span, so every batch is a pipeline (redis-py sends one per node)."""

    lookup_script = False
    fast_reads = False

    def connect(self, redis_asyncio: ModuleType, url: str, kwargs: dict[str, Any]) -> Any:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(url, **kwargs)

    async def delete_many(self, client: Any, keys: list[bytes]) -> int:
        pipe = _pipeline(client)
        for rkey in keys:
            pipe.delete(rkey)
        return sum(int(x) for x in await pipe.execute())


class RedisTier(GuardedTier, SecondaryTier):
    """Blocks in a Redis/Valkey server or Redis Cluster, shared by every engine that uses it.

    ``url`` is handed to redis-py unchanged, so ``redis://user:password@host:6379/0``,
    ``rediss://`` (TLS, with ``?ssl_cert_reqs=...`` and friends) and ``unix://`` all work.
    ``namespace`` separates fleets, models or tenants on one server; ``ttl`` (seconds) makes
    every written block expire. A block written with a
    :attr:`~aiotier.tiers.base.BlockMeta.expires_at` expires then (``SET ... PXAT``, Redis 6.2
    or later), or at ``ttl`` if that comes first: the server reclaims it and answers MISS.
    ``cluster=True`` talks to a Redis Cluster through any of its nodes. ``protocol=2`` is for
    servers older than Redis 6 (redis-py 8 speaks RESP3 by default). ``client_kwargs`` go to
    the redis-py client as they are.

    ``fast_reads`` (plain ``redis://`` and ``unix://`` only) lets batched reads skip redis-py's
    reply parser and land in the caller's buffers directly; batches of more than a few MiB are
    split over up to ``read_streams`` connections read at once, and the fast reader keeps at
    most ``max_read_connections`` connections open.
    """

    capabilities = TierCapabilities(clearable=True, expiry=True)

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "aiotier",
        ttl: float | None = None,
        cluster: bool = False,
        name: str = "redis",
        protocol: int | None = None,
        timeout: float = 2.0,
        connect_timeout: float | None = None,
        failure_threshold: int = 3,
        probe_interval: float = 1.0,
        fast_reads: bool = True,
        read_streams: int = 4,
        max_read_connections: int = 32,
        client_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name)
        schemes = ("redis://", "rediss://", "unix://")
        if not isinstance(url, str) or not url.lower().startswith(schemes):
            raise ConfigError(f"url must be a redis://, rediss:// or unix:// URL, got {url!r}")
        check_str("namespace", namespace)
        if ttl is not None:
            check_positive("ttl", ttl)
        if protocol not in (None, 2, 3):
            raise ConfigError(f"protocol must be 2, 3 or None, got {protocol!r}")
        check_positive("timeout", timeout)
        if connect_timeout is not None:
            check_positive("connect_timeout", connect_timeout)
        check_int("failure_threshold", failure_threshold)
        check_positive("probe_interval", probe_interval)
        check_int("read_streams", read_streams)
        check_int("max_read_connections", max_read_connections)
        check_bool("cluster", cluster)
        check_bool("fast_reads", fast_reads)
        self._redis, self._exc = _import_redis()
        self.url = url
        self.namespace = namespace
        self.ttl = ttl
        self.cluster = cluster
        self.protocol = protocol
        self.timeout = timeout
        self.connect_timeout = connect_timeout if connect_timeout is not None else timeout
        self.probe_interval = probe_interval
        self._client_kwargs = dict(client_kwargs or {})
        self.read_streams = read_streams
        self.max_read_connections = max_read_connections
        self._deployment = _Cluster() if cluster else _SingleServer()
        self._fast_target: dict[str, Any] | None = None
        if fast_reads and self._deployment.fast_reads:
            try:
                self._fast_target = fast_reader_target(self.url, self._client_kwargs)
            except ValueError as exc:
                raise ConfigError(f"RedisTier url {self._safe_url()!r}: {exc}") from None
        self._fast: RespReaderPool | None = None
        self._prefix = namespace.encode("utf-8") + b":"
        self._px = None if ttl is None else max(1, round(ttl * 1000))
        self._client: Any = None
        self._guard = ServerGuard(
            f"redis tier {name!r}",
            self._safe_url,
            self._ping,
            failure_threshold=failure_threshold,
            probe_interval=probe_interval,
            timeout=timeout,
            log=_log,
        )
        self._use_script = self._deployment.lookup_script
        # What this tier instance wrote and has not seen disappear: redis key -> frame size.
        self._written: dict[bytes, int] = {}
        self._bytes_written = 0
        self._late = LateWriteGuard(f"redis tier {name!r}", _log)

    def __repr__(self) -> str:
        state = self._guard.breaker.state.value
        return f"<RedisTier name={self.name!r} namespace={self.namespace!r} circuit={state}>"

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self, setup: TierSetup | None = None) -> None:
        """Create the client and check the server once.

        A server that does not answer is not fatal (the circuit opens and the probe reconnects
        later), but one that refuses our credentials or protocol is a configuration error.
        """
        self._guard.reopen()
        self._ensure_client()
        try:
            async with asyncio.timeout(self.timeout):
                await self._client.ping()
        except (self._exc.AuthenticationError, self._exc.AuthorizationError) as exc:
            await self.aclose()
            raise ConfigError(
                f"redis tier {self.name!r}: the server refused the login: {exc}"
            ) from exc
        except self._exc.ResponseError as exc:
            await self.aclose()
            hint = " (servers older than Redis 6 need protocol=2)" if "HELLO" in str(exc) else ""
            raise ConfigError(f"redis tier {self.name!r}: {exc}{hint}") from exc
        except (self._exc.RedisError, OSError, TimeoutError) as exc:
            _log.warning("redis tier %r: server not reachable at open: %s", self.name, exc)
            # Open the circuit at once: there is no point waiting for more failures.
            self._guard.trip()
        else:
            self._guard.success()

    async def aclose(self) -> None:
        """Stop the probe and close every pooled connection."""
        await self._guard.aclose()
        fast, self._fast = self._fast, None
        if fast is not None:
            await fast.aclose(self.timeout)
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    def _ensure_client(self) -> Any:
        if self._client is not None:
            return self._client
        kwargs: dict[str, Any] = {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.connect_timeout,
            # One immediate retry re-dials a pooled connection the server dropped (a restart);
            # anything more would make callers wait on a dead server. The breaker does the rest.
            "retry": noting_retry(1),
        }
        if self.protocol is not None:
            kwargs["protocol"] = self.protocol
        driver_info = _driver_info()
        if driver_info is not None:
            # Given explicitly, so redis-py does not look its own version up in the package
            # metadata (file system calls on the event loop) for every new connection.
            kwargs["driver_info"] = driver_info
        kwargs.update(self._client_kwargs)
        self._client = self._deployment.connect(self._redis, self.url, kwargs)
        if self._fast_target is not None and self._fast is None:
            self._fast = RespReaderPool(
                **self._fast_target,
                max_idle=max(8, self.read_streams),
                max_connections=self.max_read_connections,
            )
        return self._client

    # -- keys and frames -------------------------------------------------------------------------

    def redis_key(self, key: bytes) -> bytes:
        """The Redis key that holds ``key``: ``namespace:`` and 32 hex digits of BLAKE2b."""
        return self._prefix + block_digest(key).hex().encode("ascii")

    # -- the call wrapper and the breaker --------------------------------------------------------

    def _safe_url(self) -> str:
        """The URL without its password or query string, for messages."""
        head, sep, tail = self.url.partition("?")[0].partition("://")
        if "@" in tail:
            tail = "***@" + tail.rsplit("@", 1)[1]
        return head + sep + tail

    def _record_failure(self) -> None:
        if self._fast is not None:
            self._fast.close()  # idle raw connections may be dead too; dial afresh later
        self._guard.failure()

    async def _ping(self) -> None:
        """The probe: one PING (fails while the tier is closed)."""
        client = self._client
        if client is None:
            raise TierUnavailableError(f"redis tier {self.name!r} is closed")
        await client.ping()

    async def _call(self, op: str, fn: Callable[[Any], Awaitable[_T]]) -> _T:
        """Run ``fn(client)`` within the timeout; translate and count failures."""
        self._guard.check(op)
        client = self._ensure_client()
        exc_mod = self._exc
        try:
            async with asyncio.timeout(self.timeout):
                result = await fn(client)
        except (exc_mod.ConnectionError, exc_mod.TimeoutError, TimeoutError, OSError) as exc:
            self._record_failure()
            kind = "timed out" if isinstance(exc, TimeoutError | exc_mod.TimeoutError) else "failed"
            raise TierUnavailableError(
                f"redis tier {self.name!r}: {op} {kind} after at most {self.timeout}s "
                f"({self._safe_url()}): {exc!r}"
            ) from exc
        except (exc_mod.RedisError, RespServerError) as exc:
            # The server answered, with an error: it is reachable, so the breaker is not involved.
            raise TieringError(f"redis tier {self.name!r}: {op}: {exc}") from exc
        self._guard.success()
        return result

    # -- the batch operations ---------------------------------------------------------------------

    async def remove_many(self, keys: Sequence[bytes]) -> list[bool | Exception]:
        """One pipelined round trip of DELs (the engine batches the removes a put queues)."""
        rkeys = [self.redis_key(k) for k in keys]

        async def run(client: Any) -> list[Any]:
            pipe = _pipeline(client)
            for rkey in rkeys:
                pipe.delete(rkey)
            return list(await pipe.execute(raise_on_error=False))

        replies = await self._call("remove", run)
        out: list[bool | Exception] = []
        for rkey, reply in zip(rkeys, replies, strict=True):
            if isinstance(reply, Exception):
                out.append(reply)
            else:
                self._forget(rkey)
                self._late.removed(rkey)
                out.append(bool(reply))
        return out

    async def clear(self) -> None:
        """Delete every block under this tier's namespace, whoever wrote it (the whole
        fleet's; keys that are not block keys are left alone): ``SCAN`` pages (every primary
        of a cluster), each followed by a delete of what it found; every page and every delete
        is one call within ``timeout``."""
        pattern = _glob_escape(self._prefix) + b"[0-9a-f]" * 32
        started = self._late.clear_started()
        pages = self._ensure_client().scan_iter(match=pattern, count=_CLEAR_PAGE)
        deployment = self._deployment
        try:
            while rkeys := await self._call("clear", lambda _c: _next_page(pages, _CLEAR_PAGE)):
                await self._call("clear", partial(deployment.delete_many, keys=rkeys))
        finally:
            await pages.aclose()
        self._written.clear()
        self._bytes_written = 0
        self._late.cleared(started)

    def usage(self) -> TierUsage:
        """What this tier instance wrote and has not seen removed or expired.

        The server is shared and may evict or expire blocks on its own, so this is this
        engine's view, not the server's; capacity is the server's business (``maxmemory``).
        """
        return TierUsage(len(self._written), self._bytes_written, None)

    # -- batched forms ---------------------------------------------------------------------------

    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        """All keys in one round trip."""
        if not keys:
            return []
        rkeys = [self.redis_key(k) for k in keys]
        flags = await self._call("lookup_many", lambda c: self._exists_many(c, rkeys))
        await refuse_late_copies(self._late, self._call, rkeys, flags)
        out: list[LookupResult] = []
        for rkey, flag in zip(rkeys, flags, strict=True):
            if flag:
                out.append(LookupResult.HIT)
            else:
                self._forget(rkey)
                out.append(LookupResult.MISS)
        return out

    async def _exists_many(self, client: Any, rkeys: list[bytes]) -> list[int]:
        if self._use_script:
            exc_mod = self._exc
            try:
                try:
                    return list(await client.evalsha(_LOOKUP_SHA, len(rkeys), *rkeys))
                except exc_mod.NoScriptError:  # a new or restarted server: load it once
                    await client.script_load(_LOOKUP_SCRIPT)
                    return list(await client.evalsha(_LOOKUP_SHA, len(rkeys), *rkeys))
            except exc_mod.ResponseError as exc:
                if not _script_refused(exc):
                    raise
                _log.info(
                    "redis tier %r: scripts not allowed (%s); pipelining EXISTS", self.name, exc
                )
                self._use_script = False
        pipe = _pipeline(client)
        for rkey in rkeys:
            pipe.exists(rkey)
        return [int(x) for x in await pipe.execute()]

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """All keys in one round trip (see the module doc)."""
        if len(keys) != len(bufs):
            raise ValueError(f"{len(keys)} keys but {len(bufs)} buffers")
        if not keys:
            return []
        rkeys = [self.redis_key(k) for k in keys]
        read = self._read_pooled if self._fast_target is None else self._read_fast
        try:
            outcomes = await self._call("read_many", lambda c: read(c, keys, rkeys, bufs))
        except TieringError as exc:
            return [exc] * len(keys)
        return await self._settle_reads(rkeys, bufs, outcomes)

    async def _read_pooled(
        self, client: Any, keys: Sequence[bytes], rkeys: list[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """redis-py's pipeline of bounded ``GETRANGE`` (:mod:`.reads`), each value
        verified and copied into its buffer."""
        values = await get_ranges(client, rkeys, list(map(frame_limit, keys, bufs)))
        return list(map(bounded_payload_into, values, keys, bufs))

    async def _read_fast(
        self, _client: Any, keys: Sequence[bytes], rkeys: list[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        """MGETs whose payloads the kernel writes straight into ``bufs``, a few at once."""
        fast = self._fast
        if fast is None:
            raise TierUnavailableError(f"redis tier {self.name!r} is closed")
        return await fast.mget_striped(rkeys, keys, bufs, self.read_streams)

    async def _settle_reads(
        self,
        rkeys: Sequence[bytes],
        bufs: Sequence[memoryview],
        outcomes: list[int | Exception],
    ) -> list[int | Exception]:
        """What every read path reports, from per-key outcomes (a length, -1, or a failure
        that does not name the tier yet): failures name this tier, keys found absent leave the
        usage figures, values that failed verification are deleted from the server, and
        copies a write cut short brought back (:class:`~._late_writes.LateWriteGuard`) are
        absent."""
        if self._late and self._late.screen(rkeys, bufs, outcomes):
            _log.info("redis tier %r: a write cut short had landed late: not read", self.name)
        where = f"redis tier {self.name!r}"
        out: list[int | Exception] = []
        corrupted: list[bytes] = []
        for rkey, r in zip(rkeys, outcomes, strict=True):
            if isinstance(r, int):
                if r == -1:
                    self._forget(rkey)
                out.append(r)
            elif isinstance(r, BlockCorruptedError):
                corrupted.append(rkey)
                out.append(BlockCorruptedError(f"{where}: {r}"))
            elif isinstance(r, ValueError):
                out.append(ValueError(f"{where}: {r}"))
            else:  # the server's error reply for this one key
                out.append(TieringError(f"{where}: read: {r}"))
        if corrupted:
            await self._drop_corrupted(corrupted)
        return out

    async def write_many(
        self, items: Sequence[tuple[bytes, Buffer]], meta: Sequence[BlockMeta] | None = None
    ) -> list[Exception | None]:
        """All blocks in one non-transactional pipeline of ``SET`` (of several writes of one
        key only the last is sent; each reports its outcome), each with its expiry."""
        if not items:
            return []
        batch = LastWrites([k for k, _ in items])
        if len(batch.kept) < len(items):
            kept_meta = None if meta is None else batch.pick(meta)
            return batch.spread(await self.write_many(batch.pick(items), kept_meta))
        rkeys = [self.redis_key(k) for k, _ in items]
        frames = [encode_frame(k, d) for k, d in items]
        expiry = self._expiry_ms(meta)

        async def run(client: Any) -> list[Any]:
            pipe = _pipeline(client)
            for i, (rkey, frame) in enumerate(zip(rkeys, frames, strict=True)):
                at = None if expiry is None else expiry[i]
                if at is None:
                    pipe.set(rkey, frame, px=self._px)
                else:
                    pipe.set(rkey, frame, pxat=at)
            return list(await pipe.execute(raise_on_error=False))

        payloads = [(rkey, data) for rkey, (_k, data) in zip(rkeys, items, strict=True)]
        try:
            replies = await guarded_write(self._late, self._call, "write_many", payloads, run)
        except TieringError as exc:
            return [exc] * len(items)
        late = self._late
        unanswered = (self._exc.ConnectionError, self._exc.TimeoutError)
        out: list[Exception | None] = []
        for (_key, data), rkey, frame, reply in zip(items, rkeys, frames, replies, strict=True):
            if isinstance(reply, unanswered):
                # a cluster pipeline reports a lost node per command: sent, never answered
                late.cut_short([(rkey, data)])
                self._record_failure()
                out.append(TierUnavailableError(f"redis tier {self.name!r}: write: {reply!r}"))
            elif isinstance(reply, Exception):
                out.append(TieringError(f"redis tier {self.name!r}: write: {reply}"))
            else:
                self._remember(rkey, len(frame))
                if late:
                    late.written(rkey, data)
                out.append(None)
        return out

    # -- helpers ---------------------------------------------------------------------------------

    def _expiry_ms(self, meta: Sequence[BlockMeta] | None) -> list[int | None] | None:
        """Per block, the unix time in ms its value expires (``PXAT``): its ``expires_at``, or
        ``ttl`` from now when that comes first; None for a block without ``expires_at``."""
        if meta is None or all(m.expires_at is None for m in meta):
            return None
        cap = None if self._px is None else int(time.time() * 1000) + self._px
        out: list[int | None] = []
        for m in meta:
            if m.expires_at is None:
                out.append(None)
                continue
            at = max(1, math.ceil(m.expires_at * 1000))
            out.append(at if cap is None else min(at, cap))
        return out

    def _remember(self, rkey: bytes, size: int) -> None:
        old = self._written.get(rkey, 0)
        self._written[rkey] = size
        self._bytes_written += size - old

    def _forget(self, rkey: bytes) -> None:
        size = self._written.pop(rkey, None)
        if size is not None:
            self._bytes_written -= size

    async def _drop_corrupted(self, rkeys: list[bytes]) -> None:
        """Delete values that failed verification, so nobody reads them again (best effort)."""
        for rkey in rkeys:
            self._forget(rkey)
        with contextlib.suppress(TieringError):
            await self._call("drop_corrupted", lambda c: self._deployment.delete_many(c, rkeys))
        _log.warning(
            "redis tier %r: dropped %d value(s) that failed verification", self.name, len(rkeys)
        )


#: Keys asked of each SCAN and deleted at once by ``clear``.
_CLEAR_PAGE: Final = 512


def _glob_escape(literal: bytes) -> bytes:
    """``literal`` as a ``SCAN MATCH`` pattern that matches only itself."""
    return re.sub(rb"([*?\[\]\\])", rb"\\\1", literal)


async def _next_page(keys: AsyncIterator[bytes], n: int) -> list[bytes]:
    """Up to ``n`` more keys from a ``scan_iter`` (empty: the scan is over)."""
    page: list[bytes] = []
    async for rkey in keys:
        page.append(rkey)
        if len(page) >= n:
            break
    return page


def _driver_info() -> Any:
    """What redis-py reports in ``CLIENT SETINFO``: itself, used by aiotier (None if too old)."""
    try:
        import redis
        from redis.driver_info import DriverInfo
    except ImportError:
        return None
    from ... import __version__

    return DriverInfo(name="redis-py", lib_version=redis.__version__).add_upstream_driver(
        "aiotier", __version__
    )


def _script_refused(exc: BaseException) -> bool:
    """True when the server forbids or lacks scripting (ACL, managed service, old fork)."""
    msg = str(exc).lower()
    return "noperm" in msg or "unknown command" in msg or "no permissions" in msg
