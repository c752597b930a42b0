"""The object store client behind :class:`~aiotier.tiers.objectstore.ObjectStoreTier`: obstore.

obstore (Rust's ``object_store`` behind a thin Python layer) was chosen over aiobotocore by
measurement (docs/tiers.md, ``scripts/s3_clients.py``): it is the faster of the two for
256 KiB-4 MiB objects, and a GET's body arrives as one buffer owned by Rust, which the tier
verifies and copies once, straight into the arena view, where aiobotocore first assembles each
body in Python ``bytes``.

This module is the only one that knows obstore: it builds the store, performs the five requests
the tier needs (HEAD, GET, PUT, bulk DELETE, and a probe) and sorts every failure into one of
three kinds the tier handles differently:

- :class:`ServerBusy` - the server answered 5xx or 429 (throttling): retried with jittered
  back-off within the call's deadline; the server is up, so the circuit breaker is not told;
- :class:`Unreachable` - no answer (refused, reset, timed out): retried while the circuit stays
  closed, and counted by the breaker;
- :class:`Refused` - any other 4xx (credentials, permissions, a bad request): not retried.

A missing object is not an error: HEAD and GET answer ``None``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ...errors import ConfigError, TieringError

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "ObjectTooLarge",
    "ObstoreClient",
    "Refused",
    "ServerBusy",
    "Unreachable",
    "classify",
    "import_obstore",
]

_T = TypeVar("_T")

_MISSING_EXTRA: Final = (
    "ObjectStoreTier needs obstore, which is not installed: install the 's3' extra, "
    "e.g. pip install 'aiotier[s3]'"
)
_STATUS: Final = re.compile(r"status code: (\d{3})")
#: Name of the object the probe asks for; it never exists (names of blocks are hex digests).
PROBE_NAME: Final = ".aiotier-probe"


class ServerBusy(TieringError):
    """The server answered 5xx or 429: worth another try after a back-off."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Unreachable(TieringError):
    """The request got no answer: connection refused or reset, or it timed out."""


class Refused(TieringError):
    """The server answered with a 4xx that another try will not change."""


class ObjectTooLarge(Exception):
    """A GET's response announced more bytes than the caller takes: its body was not read."""

    def __init__(self, size: int, etag: str) -> None:
        super().__init__(f"{size} bytes")
        self.size = size
        self.etag = etag


def import_obstore() -> ModuleType:
    """The ``obstore`` module, or an ImportError that names the extra."""
    try:
        import obstore
    except ImportError as exc:
        raise ImportError(_MISSING_EXTRA) from exc
    return obstore


def _first_line(exc: BaseException) -> str:
    """obstore's messages carry a multi-line debug dump after the summary; keep the summary."""
    text = str(exc).strip()
    return text.split("\n\nDebug source:", 1)[0].splitlines()[0] if text else repr(exc)


def classify(exc: Exception) -> TieringError | None:
    """What an obstore exception means for the tier: ``None`` for a missing object, else one
    of :class:`ServerBusy`, :class:`Unreachable`, :class:`Refused` (message: obstore's
    summary line, no debug dump)."""
    if isinstance(exc, FileNotFoundError):
        return None
    text = str(exc)
    found = _STATUS.search(text)
    if found is not None:
        status = int(found.group(1))
        if status >= 500 or status == 429:
            return ServerBusy(_first_line(exc), status)
        return Refused(_first_line(exc))
    name = type(exc).__name__
    if name in ("PermissionDeniedError", "UnauthenticatedError", "InvalidPathError"):
        return Refused(_first_line(exc))
    return Unreachable(_first_line(exc))


class ObstoreClient:
    """One bucket through obstore: the requests the tier makes, failures classified.

    obstore retries nothing here (``max_retries=0``): the tier retries, within its own
    deadline, and counts what it retried. ``timeout`` also bounds each request inside the
    client, so a request abandoned by the tier does not linger in obstore's runtime.
    """

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None,
        region: str | None,
        timeout: float,
        connect_timeout: float,
        credential_provider: Any = None,
        client_options: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self._obs = import_obstore()
        from obstore.store import S3Store

        options: dict[str, Any] = {
            "timeout": timedelta(seconds=timeout),
            "connect_timeout": timedelta(seconds=connect_timeout),
        }
        if endpoint_url is not None and endpoint_url.lower().startswith("http://"):
            options["allow_http"] = True  # a local server (SeaweedFS, MinIO) without TLS
        options.update(client_options or {})
        cfg: dict[str, Any] = dict(config or {})
        if endpoint_url is not None:
            cfg["endpoint"] = endpoint_url
        if region is not None:
            cfg["region"] = region
        try:
            self.store = S3Store(
                bucket,
                config=cfg,  # type: ignore[arg-type]  # keys checked by obstore at run time
                client_options=options,  # type: ignore[arg-type]
                retry_config={"max_retries": 0},
                credential_provider=credential_provider,
            )
        except Exception as exc:  # obstore's configuration errors (unknown keys, bad URLs)
            raise ConfigError(f"object store {bucket!r}: {_first_line(exc)}") from exc

    async def _run(self, request: Callable[[], Awaitable[_T]]) -> _T | None:
        """``request()``; ``None`` when the object does not exist; failures classified."""
        try:
            return await request()
        except ObjectTooLarge:
            raise
        except Exception as exc:
            kind = classify(exc)
            if kind is None:
                return None
            raise kind from exc

    async def head(self, name: str) -> str | None:
        """The object's ETag ("" when the server sends none), or None when it does not exist."""
        meta = await self._run(lambda: self._obs.head_async(self.store, name))
        if meta is None:
            return None
        return str(meta.get("e_tag") or "")

    async def get(self, name: str, limit: int) -> tuple[memoryview, str] | None:
        """The object's bytes (a view of obstore's buffer: no copy) and ETag, or None;
        :class:`ObjectTooLarge` when the response's headers announce more than ``limit`` bytes
        (anyone who can write the bucket can put a huge object under a block's name: its
        body is dropped unread, the connection with it)."""
        obs = self._obs

        async def request() -> tuple[memoryview, str]:
            result = await obs.get_async(self.store, name)
            etag = str(result.meta.get("e_tag") or "")
            size = int(result.meta["size"])
            if size > limit:
                del result
                raise ObjectTooLarge(size, etag)
            return memoryview(await result.bytes_async()), etag

        return await self._run(request)

    async def put(self, name: str, frame: bytes) -> None:
        await self._run(lambda: self._obs.put_async(self.store, name, frame))

    async def delete(self, names: list[str]) -> None:
        """Delete every name (S3's bulk DeleteObjects, up to 1000 names a request)."""
        await self._run(lambda: self._obs.delete_async(self.store, names))

    async def list_page(self, prefix: str, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` names under ``prefix`` that sort after ``after``, in order (one
        request: a page asked for afresh, so a retry asks the same question again)."""
        obs = self._obs

        async def request() -> list[str]:
            stream = obs.list(self.store, prefix or None, offset=after, chunk_size=limit)
            try:
                chunk = await anext(stream)
            except StopAsyncIteration:
                return []
            return sorted(str(meta["path"]) for meta in chunk)

        return await self._run(request) or []

    async def probe(self, prefix: str) -> None:
        """GET an object that never exists: the answer shows the server is there, the bucket
        exists and our credentials work (a missing bucket or a refusal: :class:`Refused`)."""
        try:
            await self._obs.get_async(self.store, prefix + PROBE_NAME)
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise Refused(f"the bucket does not exist: {_first_line(exc)}") from exc
        except Exception as exc:
            kind = classify(exc)
            raise (kind or Unreachable(_first_line(exc))) from exc
