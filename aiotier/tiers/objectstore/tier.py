"""A secondary tier in an S3-compatible object store (AWS S3, SeaweedFS, MinIO, R2, ...).

Objects are the same self-describing frames as SSD files and Redis values (header, key,
xxh3-64 checksum), verified on every read: a foreign, truncated or overwritten object is a
counted MISS and never handed out. Object names are ``prefix`` plus 32 hex digits of a hash of
the block key (:func:`~aiotier.tiers.framing.block_digest`), so no key, however hostile, names
an object outside ``prefix``, and names spread evenly over the bucket's key space.

Every call has a deadline (``timeout``; a batch shares one): 5xx and throttling answers are
retried with jittered exponential back-off until it passes. Connectivity failures feed a circuit
breaker (:class:`~aiotier.tiers._net.outage.ServerGuard`): once open, calls fail at once (the engine
counts MISSes and failed writes, callers see no exception) and a probe closes it again when the
server answers. At most ``max_concurrency`` requests are in flight per tier at any time (the
rules in full: :mod:`.requests`).

A bucket has no cheap size, so :meth:`ObjectStoreTier.usage` reports what this tier instance
wrote (and has not seen removed), not what the bucket holds; expiry is the bucket's business
(a lifecycle rule on the prefix, see docs/operations.md). What else the tier remembers of its
objects, and for how long, is in :mod:`.memory`.

obstore is an optional dependency (the ``s3`` extra), imported when a tier is created, so
``import aiotier`` works without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from ..._validate import check_bool, check_int, check_positive
from ...errors import ConfigError, TieringError
from .._batches import LastWrites
from .._net.late_writes import LateWriteGuard
from .._net.outage import GuardedTier, ServerGuard
from ..base import BlockMeta, Buffer, SecondaryTier, TierCapabilities, TierSetup, TierUsage
from ..framing import block_digest, encode_frame
from .client import ObstoreClient, Refused, ServerBusy, Unreachable
from .expiry import ObjectExpiry
from .lookahead import LookAhead
from .memory import ObjectMemory
from .reads import ObjectReads
from .requests import ObjectRequests, RequestingTier

__all__ = ["ObjectStoreTier"]

_log = logging.getLogger("aiotier.objectstore")

#: Names listed per request by ``clear`` (S3 answers at most 1000).
_CLEAR_PAGE = 1000


class ObjectStoreTier(ObjectReads, RequestingTier, GuardedTier, SecondaryTier):
    """Blocks as objects under ``prefix`` in an S3-compatible ``bucket``.

    Credentials come from obstore's usual sources, never from code: the ``AWS_ACCESS_KEY_ID`` /
    ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` environment variables, web identity
    tokens, ECS and EC2 instance metadata; ``credential_provider`` takes any obstore credential
    provider (e.g. ``obstore.auth.boto3.Boto3CredentialProvider`` for ``~/.aws`` profiles).
    ``endpoint_url`` names a server other than AWS (``http://`` works, for local servers);
    ``region`` defaults to ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else us-east-1.

    ``timeout`` bounds every call (a batch shares one deadline), retries included; it is below
    the engine's default ``promotion_timeout`` (5 s), so a slow read ends by the tier's deadline;
    ``connect_timeout`` bounds each connection attempt. ``immutable_keys=True`` declares that a
    key's bytes never change: a write of a key the bucket already holds is skipped (HEAD before
    PUT) and counted in :attr:`skipped_writes`. ``recent_ttl`` / ``recent_capacity`` bound what
    the tier remembers of objects it wrote or read (answered without a request by
    :meth:`contains_hint` and lookups). A lookup GETs the objects it is asked about (a HEAD
    instead where the look-ahead budget is full) and keeps each body, up to ``lookahead_bytes``
    in all and ``lookahead_ttl`` seconds each, for the read that promotes it: one request per
    promoted block instead of two (``lookahead_bytes=0``: HEADs only). ``client_options`` and
    ``config`` go to obstore's ``S3Store`` as they are (e.g. ``{"root_certificate": ...}``
    for a private CA).
    """

    capabilities = TierCapabilities(clearable=True, expiry=True)

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "aiotier/",
        endpoint_url: str | None = None,
        region: str | None = None,
        name: str = "object",
        max_concurrency: int = 32,
        timeout: float = 4.0,
        connect_timeout: float = 1.0,
        immutable_keys: bool = False,
        failure_threshold: int = 3,
        probe_interval: float = 1.0,
        recent_ttl: float = 60.0,
        recent_capacity: int = 65536,
        lookahead_bytes: int = 64 << 20,
        lookahead_ttl: float = 5.0,
        retry_base: float = 0.02,
        retry_cap: float = 1.0,
        credential_provider: Any = None,
        client_options: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name)
        _check_arguments(
            bucket=bucket, prefix=prefix, endpoint_url=endpoint_url,
            max_concurrency=max_concurrency, failure_threshold=failure_threshold,
            recent_ttl=recent_ttl, recent_capacity=recent_capacity,
            lookahead_bytes=lookahead_bytes, immutable_keys=immutable_keys,
            positive={"timeout": timeout, "connect_timeout": connect_timeout,
                      "probe_interval": probe_interval, "retry_base": retry_base,
                      "retry_cap": retry_cap, "lookahead_ttl": lookahead_ttl},
        )  # fmt: skip
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint_url = endpoint_url
        self.region = region
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.immutable_keys = immutable_keys
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.client = ObstoreClient(
            bucket,
            endpoint_url=endpoint_url,
            region=region,
            timeout=timeout,
            connect_timeout=min(connect_timeout, timeout),
            credential_provider=credential_provider,
            client_options=client_options,
            config=config,
        )
        self._guard = ServerGuard(
            f"object tier {name!r}",
            self._where,
            lambda: self.client.probe(prefix),
            failure_threshold=failure_threshold,
            probe_interval=probe_interval,
            timeout=timeout,
            log=_log,
        )
        self._requests = ObjectRequests(
            f"object tier {name!r}",
            self._where,
            self._guard,
            max_concurrency=max_concurrency,
            timeout=timeout,
            retry_base=retry_base,
            retry_cap=retry_cap,
        )
        self._memory = ObjectMemory(recent_capacity, recent_ttl, time.monotonic)
        self._lookahead = LookAhead(lookahead_bytes, lookahead_ttl, time.monotonic)
        self._block_size: int | None = None
        self._largest_frame = 0
        self._late = LateWriteGuard(f"object tier {name!r}", _log)
        #: Reads whose bytes failed verification (answered as a MISS, never returned).
        self.corrupted = 0
        #: Reads answered from the body their lookup fetched (no request of their own).
        self.lookahead_reads = 0
        #: Writes skipped because the bucket already held the key (``immutable_keys``).
        self.skipped_writes = 0
        self._expiry = ObjectExpiry()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> ObjectStoreTier:
        """A tier from one URL: ``s3://BUCKET/PREFIX/`` (AWS) or
        ``http(s)://HOST:PORT/BUCKET/PREFIX/`` (another server, path-style); without a
        prefix, the default one. ``kwargs`` go to the constructor."""
        scheme, sep, rest = url.partition("://")
        scheme = scheme.lower()
        if not sep or scheme not in ("s3", "http", "https"):
            raise ConfigError(
                f"object store URL must be s3://BUCKET/PREFIX/ or "
                f"http(s)://HOST:PORT/BUCKET/PREFIX/: {url!r}"
            )
        if scheme != "s3":
            host, _, rest = rest.partition("/")
            kwargs.setdefault("endpoint_url", f"{scheme}://{host}")
        bucket, _, prefix = rest.partition("/")
        if prefix:
            kwargs.setdefault("prefix", prefix if prefix.endswith("/") else prefix + "/")
        return cls(bucket, **kwargs)

    def __repr__(self) -> str:
        return (
            f"<ObjectStoreTier name={self.name!r} bucket={self.bucket!r} prefix={self.prefix!r} "
            f"circuit={self._guard.breaker.state.value}>"
        )

    def _where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} at {self.endpoint_url or 'AWS'}"

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self, setup: TierSetup | None = None) -> None:
        """Check the bucket once: a server that does not answer is not fatal (the circuit opens
        and the probe reconnects later), a missing bucket or refused credentials are
        :class:`~aiotier.errors.ConfigError`. The setup's block size sizes the look-ahead room
        one body takes."""
        if setup is not None and setup.block_size is not None:
            self._block_size = setup.block_size
        self._guard.reopen()
        try:
            async with asyncio.timeout(self.timeout):
                await self.client.probe(self.prefix)
        except Refused as exc:
            await self.aclose()
            raise ConfigError(f"object tier {self.name!r} ({self._where()}): {exc}") from exc
        except (Unreachable, ServerBusy, TimeoutError) as exc:
            _log.warning("object tier %r: server not reachable at open: %s", self.name, exc)
            self._guard.trip()
        else:
            self._guard.success()

    async def aclose(self) -> None:
        """Stop the probe and let go of fetched bodies; later calls fail with
        :class:`TierUnavailableError`."""
        self._lookahead.clear()
        await self._guard.aclose()

    def object_name(self, key: bytes) -> str:
        """The object that holds ``key``: ``prefix`` and 32 hex digits of BLAKE2b."""
        return self.prefix + block_digest(key).hex()

    def _name_or_none(self, key: object) -> str | None:
        try:
            return self.object_name(key)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None

    # -- the batch operations ---------------------------------------------------------------------

    async def clear(self) -> None:
        """Delete every block object under ``prefix`` (the whole fleet's; not other objects
        there): one pass over the listing, each page of up to 1000 names one request, its
        blocks deleted in one bulk request, each with its own deadline."""
        after: str | None = None
        started = self._late.clear_started()
        requests = self._requests
        while names := await requests.send(
            "clear", partial(self.client.list_page, self.prefix, after, _CLEAR_PAGE),
            requests.deadline(),
        ):
            after = names[-1]
            if blocks := [n for n in names if _is_block_name(n, self.prefix)]:
                await requests.send(
                    "clear", partial(self.client.delete, blocks), requests.deadline()
                )
        self._memory.clear()
        self._expiry.clear()
        self._lookahead.clear()
        self._late.cleared(started)

    def usage(self) -> TierUsage:
        """What this tier instance wrote and has not seen removed or gone.

        The bucket is shared and has no cheap size (and lifecycle rules expire objects on
        their own), so this is this engine's view, not the bucket's; capacity is unbounded.
        """
        return TierUsage(
            self._memory.written_objects, self._memory.written_bytes, None,
            expirations=self._expiry.expirations,
        )  # fmt: skip

    def counters(self) -> dict[str, int]:
        """Requests sent (retries included), retries, reads that failed verification, writes
        skipped (``immutable_keys``), reads served by the look-ahead, connectivity errors."""
        return {
            **super().counters(),
            "requests": self.requests,
            "retries": self.retries,
            "corrupted": self.corrupted,
            "skipped_writes": self.skipped_writes,
            "lookahead_reads": self.lookahead_reads,
        }

    def contains_hint(self, key: bytes) -> bool | None:
        """True for a key this tier wrote or read within ``recent_ttl`` seconds; otherwise it
        cannot tell (another engine may have written or removed it), so None, never False."""
        return True if self._memory.fresh(self.object_name(key)) else None

    # -- batched forms ---------------------------------------------------------------------------

    async def write_many(
        self, items: Sequence[tuple[bytes, Buffer]], meta: Sequence[BlockMeta] | None = None
    ) -> list[Exception | None]:
        """A PUT of each block, at most ``max_concurrency`` at once (each frame is built when
        its request gets a slot, so memory stays bounded by the slots, not the batch). Of two
        writes of one key only the last is sent (PUTs run at once: the server would keep
        either); the earlier ones get its outcome."""
        deadline = self._requests.deadline()
        late = self._late
        # each key's expiry, of its last write in the batch (the one carried out)
        expires: dict[str | None, float | None] = {}
        if meta is not None:
            names = [self._name_or_none(k) for k, _ in items]
            expires = {n: m.expires_at for n, m in zip(names, meta, strict=True)}

        async def one(item: tuple[bytes, Buffer]) -> None:
            key, data = item
            name = self.object_name(key)
            expires_at = expires.get(name)
            self._lookahead.changed(name)
            if self.immutable_keys and await self._held(name, deadline):
                self.skipped_writes += 1
                self._memory.seen(name)
                late.written(name, data)  # immutable keys: the bytes held are these
                return
            frame = encode_frame(key, data, expires_at)

            async def put() -> None:
                try:
                    await self.client.put(name, frame)
                except BaseException as exc:
                    if not _not_carried_out(exc):  # it may still land, after a later write
                        late.cut_short([(name, data)])
                    raise

            try:
                await self._requests.send("write", put, deadline)
            finally:  # a lookup that fetched while the PUT was under way got the old bytes
                self._lookahead.changed(name)
            late.written(name, data)
            self._memory.written(name, len(frame))
            self._expiry.wrote(name, expires_at)

        # the last write of each object, in the batch's order (a bad key is sent: it fails)
        batch = LastWrites([self._name_or_none(k) for k, _ in items])
        outcomes = batch.spread(await self._requests.each(batch.pick(items), one))
        return [o if isinstance(o, Exception) else None for o in outcomes]

    async def remove_many(self, keys: Sequence[bytes]) -> list[bool | Exception]:
        """A HEAD of each key (S3 does not say whether a DELETE found anything), then one bulk
        DELETE of those present."""
        names = [self.object_name(k) for k in keys]
        for name in names:
            self._lookahead.changed(name)
        deadline = self._requests.deadline()
        heads = await self._requests.each(
            names, lambda n: self._requests.send("remove", lambda: self.client.head(n), deadline)
        )
        present = [n for n, h in zip(names, heads, strict=True) if isinstance(h, str)]
        for name in names:
            self._memory.removing(name)
            self._expiry.forget(name)
        failed: Exception | None = None
        if present:
            try:
                await self._requests.send("remove", lambda: self.client.delete(present), deadline)
            except TieringError as exc:
                failed = exc
            finally:  # a lookup that fetched while the DELETE was under way got the old bytes
                for name in present:
                    self._lookahead.changed(name)
        out: list[bool | Exception] = []
        for name, head in zip(names, heads, strict=True):
            if isinstance(head, Exception):
                out.append(head)
            elif head is not None and failed is not None:
                out.append(failed)
            else:
                self._memory.gone(name)
                self._late.removed(name)
                out.append(head is not None)
        return out

    # -- helpers ---------------------------------------------------------------------------------

    async def _delete_expired(self) -> None:
        """Delete the objects found past their expiry (best effort: one that stays is found
        expired again by the next read)."""
        names = self._expiry.take_pending()
        if not names:
            return
        for name in names:
            self._lookahead.changed(name)
        deadline = self._requests.deadline()
        with contextlib.suppress(TieringError):
            await self._requests.send("remove", lambda: self.client.delete(names), deadline)

    async def _held(self, name: str, deadline: float) -> bool:
        """Whether the bucket holds a sound-looking object under ``name`` (``immutable_keys``)."""
        if self._memory.fresh(name):
            return True
        etag = await self._requests.send("write", lambda: self.client.head(name), deadline)
        return etag is not None and not self._memory.refused(name, etag)

    def _corrupted(self, name: str, etag: str) -> None:
        """An object failed verification: count it, and answer MISS for it (by its ETag) until
        it is written again. It is not deleted: the bucket is shared, and a DELETE could race
        with another engine's fresh write of the key."""
        self.corrupted += 1
        self._memory.refuse(name, etag)
        _log.warning("object tier %r: %s failed verification; answered as a MISS", self.name, name)


def _check_arguments(
    *,
    bucket: object,
    prefix: object,
    endpoint_url: object,
    max_concurrency: object,
    failure_threshold: object,
    recent_ttl: object,
    recent_capacity: object,
    lookahead_bytes: object,
    immutable_keys: object,
    positive: dict[str, object],
) -> None:
    """Raise naming the first bad argument of :class:`ObjectStoreTier` (``aiotier._validate``)."""
    if not isinstance(bucket, str) or not bucket or "/" in bucket:
        raise ConfigError(f"bucket must be a bucket name, got {bucket!r}")
    _check_prefix(prefix)
    if endpoint_url is not None and (
        not isinstance(endpoint_url, str)
        or not endpoint_url.lower().startswith(("http://", "https://"))
    ):
        raise ConfigError(f"endpoint_url must be an http:// or https:// URL, got {endpoint_url!r}")
    check_int("max_concurrency", max_concurrency)
    for label, value in positive.items():
        check_positive(label, value)
    check_int("failure_threshold", failure_threshold)
    check_positive("recent_ttl", recent_ttl, allow_zero=True)
    check_int("recent_capacity", recent_capacity, minimum=0)
    check_int("lookahead_bytes", lookahead_bytes, minimum=0)
    check_bool("immutable_keys", immutable_keys)


def _is_block_name(name: str, prefix: str) -> bool:
    """Whether ``name`` is one :meth:`ObjectStoreTier.object_name` makes under ``prefix``."""
    digest = name[len(prefix) :]
    return (
        name.startswith(prefix)
        and len(digest) == 32
        and all(c in "0123456789abcdef" for c in digest)
    )


def _check_prefix(prefix: object) -> None:
    """A prefix is empty or ``/``-separated non-empty segments ending in ``/``, of characters
    that need no escaping in any S3 implementation."""
    if not isinstance(prefix, str):
        raise ConfigError(f"prefix must be a str, got {prefix!r}")
    if prefix == "":
        return
    segments = prefix.split("/")
    if (
        not prefix.endswith("/")
        or any(s in ("", ".", "..") for s in segments[:-1])
        or any(not (c.isascii() and (c.isalnum() or c in "-_.!*'()/")) for c in prefix)
    ):
        raise ConfigError(
            f"ObjectStoreTier prefix must be empty or end with '/', made of non-empty segments "
            f"of letters, digits and -_.!*'() (not '.' or '..'): {prefix!r}"
        )


def _not_carried_out(exc: BaseException) -> bool:
    """A PUT's failure that says the server did not store it: a 4xx, or throttled (429, 503)."""
    return isinstance(exc, Refused) or (isinstance(exc, ServerBusy) and exc.status in (429, 503))
