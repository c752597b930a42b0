"""A user-written tier: blocks in a dict, framed and verified like the built-in tiers.

Run it:  python examples/custom_tier.py
"""

from __future__ import annotations

import asyncio

from aiotier import LookupResult, PrimaryTier, SecondaryTier, TieringEngine, TierUsage
from aiotier.tiers.framing import encode_header, parse_header, verify_payload


class DictTier(SecondaryTier):
    """Blocks in a dict: the smallest complete tier (see docs/writing-a-tier.md)."""

    def __init__(self, *, name: str = "dict") -> None:
        super().__init__(name)
        self._data: dict[bytes, bytes] = {}

    async def lookup(self, key: bytes) -> LookupResult:
        return LookupResult.HIT if key in self._data else LookupResult.MISS

    async def read_into(self, key: bytes, buf: memoryview) -> int:
        blob = self._data.get(key)
        if blob is None:
            return -1  # gone since lookup: not an error
        header = parse_header(blob, where=self.name)
        payload = memoryview(blob)[header.payload_offset :]
        verify_payload(header, key, payload, where=self.name)  # raises BlockCorruptedError
        if len(payload) > len(buf):
            raise ValueError(f"{self.name}: block {key!r} is larger than the buffer")
        buf[: len(payload)] = payload
        return len(payload)

    async def write(self, key: bytes, data: bytes | memoryview) -> None:
        self._data[key] = encode_header(key, data) + bytes(data)

    async def remove(self, key: bytes) -> bool:
        return self._data.pop(key, None) is not None

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
