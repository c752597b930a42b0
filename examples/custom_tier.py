"""A user-written tier: blocks in a dict, framed and verified like the built-in tiers.

Run it:  python examples/custom_tier.py
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiotier import BlockMeta, LookupResult, PrimaryTier, SecondaryTier, TieringEngine, TierUsage
from aiotier.tiers.framing import encode_header, parse_header, verify_payload


class DictTier(SecondaryTier):
    """Blocks in a dict: the smallest complete tier (see docs/writing-a-tier.md).

    Each method answers a batch, one entry per key in order; a key's failure is returned in
    its place, so one bad block never fails its neighbours.
    """

    def __init__(self, *, name: str = "dict") -> None:
        super().__init__(name)
        self._data: dict[bytes, bytes] = {}

    async def lookup_many(self, keys: Sequence[bytes]) -> list[LookupResult]:
        return [LookupResult.HIT if k in self._data else LookupResult.MISS for k in keys]

    async def read_many_into(
        self, keys: Sequence[bytes], bufs: Sequence[memoryview]
    ) -> list[int | Exception]:
        out: list[int | Exception] = []
        for key, buf in zip(keys, bufs, strict=True):
            blob = self._data.get(key)
            if blob is None:
                out.append(-1)  # gone since lookup: not an error
                continue
            try:
                header = parse_header(blob, where=self.name)
                payload = memoryview(blob)[header.payload_offset :]
                verify_payload(header, key, payload, where=self.name)  # BlockCorruptedError
                if len(payload) > len(buf):
                    raise ValueError(f"{self.name}: block {key!r} is larger than the buffer")
            except Exception as exc:
                out.append(exc)
                continue
            buf[: len(payload)] = payload
            out.append(len(payload))
        return out

    async def write_many(
        self,
        items: Sequence[tuple[bytes, bytes | memoryview]],
        meta: Sequence[BlockMeta] | None = None,
    ) -> list[Exception | None]:
        for key, data in items:  # in order: of two writes of a key, the last one stays
            self._data[key] = encode_header(key, data) + bytes(data)
        return [None] * len(items)

    async def remove_many(self, keys: Sequence[bytes]) -> list[bool | Exception]:
        return [self._data.pop(k, None) is not None for k in keys]

    def usage(self) -> TierUsage:
        return TierUsage(len(self._data), sum(map(len, self._data.values())), None)


async def main() -> None:
    below = DictTier()
    async with TieringEngine(PrimaryTier(2, 1024), [below]) as engine:
        for i in range(4):
            await engine.put(f"k{i}", b"block %d" % i)
        await engine.flush()
        print("written down to the custom tier:", below.usage().blocks, "blocks")
        print("promoted back:", await engine.get("k0"))
        # a corrupted value is a MISS, never wrong bytes
        below._data[b"k1"] = below._data[b"k1"][:-1] + b"!"
        print("corrupted block reads as:", await engine.get("k1"))
        engine.end_step()
        errors = engine.stats().counters.get(("tier_errors", "dict", "read"), 0)
        print("counted read errors:", errors)


if __name__ == "__main__":
    asyncio.run(main())
