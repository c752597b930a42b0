"""Reads through redis-py bounded by the buffer they fill: ``GETRANGE``, never ``GET``.

Anyone who can write the tier's namespace can put any value under a block's key. ``GET`` (or
``MGET``) makes redis-py read all of it before the tier can look at it: a 96 MiB value cost
about 200 MiB at peak. ``GETRANGE key 0 L`` asks for one byte more than the longest frame the
reader's buffer takes (``L`` = header + key + buffer): a longer value is known to be too long
from that byte, and the rest of it never crosses the network. A batch is one pipeline of
``GETRANGE`` (one per node on a cluster): one round trip, as ``MGET`` was.

The zero-copy reader (``_resp``) bounds its reads itself: it reads a value's header and skips
a payload longer than its buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import BlockCorruptedError
from ..framing import HEADER, check_header, payload_into

__all__ = ["bounded_payload_into", "frame_limit", "get_ranges"]


def frame_limit(key: bytes, buf: memoryview) -> int:
    """The longest frame of ``key`` whose payload ``buf`` holds."""
    return HEADER.size + len(key) + len(buf)


async def get_ranges(
    client: Any, rkeys: Sequence[bytes], limits: Sequence[int]
) -> list[bytes | None]:
    """The first ``limit + 1`` bytes of each value, None for a missing key: one
    non-transactional pipeline, and a second only when a value came back empty (``GETRANGE``
    answers a missing key and an empty value alike; ``EXISTS`` tells them apart)."""
    pipe = client.pipeline(transaction=False)
    for rkey, limit in zip(rkeys, limits, strict=True):
        pipe.getrange(rkey, 0, limit)  # both ends included: limit + 1 bytes
    values: list[bytes | None] = list(await pipe.execute())
    empty = [i for i, v in enumerate(values) if not v]
    if empty:
        pipe = client.pipeline(transaction=False)
        for i in empty:
            pipe.exists(rkeys[i])
        for i, found in zip(empty, await pipe.execute(), strict=True):
            if not found:
                values[i] = None
    return values


def bounded_payload_into(value: bytes | None, key: bytes, buf: memoryview) -> int | Exception:
    """What :func:`get_ranges` brought for ``key``, reported as the zero-copy reader reports a
    value: its payload copied into ``buf`` and its length, -1 when absent, or what is wrong
    with it."""
    if value is None:
        return -1
    try:
        if len(value) > frame_limit(key, buf):
            _key_len, n, _digest = check_header(value[: HEADER.size + len(key)], key)
            if n > len(buf):
                return ValueError(f"block {key[:64]!r} is {n} bytes, buffer holds {len(buf)}")
            return BlockCorruptedError(f"value is longer than the {n}-byte block it frames")
        return payload_into(value, key, buf)
    except (BlockCorruptedError, ValueError) as exc:
        return exc
