"""The memory tier keeps what it is given: a ``bytes`` as it is, a view copied into a buffer of
its own (reused from the block it replaces or evicts)."""

from __future__ import annotations

import time

from helpers import check_written_views_may_be_reused, read_one, write_one

from aiotier import BlockMeta, MemoryTier, TierSetup


async def read(tier: MemoryTier, key: bytes) -> bytes | None:
    buf = bytearray(64)
    n = await read_one(tier, key, memoryview(buf))
    return None if n < 0 else bytes(buf[:n])


async def test_a_written_view_s_buffer_may_be_reused_at_once() -> None:
    await check_written_views_may_be_reused(MemoryTier(1 << 20))


async def test_reusing_an_evicted_block_s_buffer_keeps_every_block_right() -> None:
    tier = MemoryTier(32)  # room for two 16-byte blocks
    await write_one(tier, b"a", memoryview(bytearray(b"a" * 16)))
    await write_one(tier, b"b", memoryview(bytearray(b"b" * 16)))
    await write_one(tier, b"c", memoryview(bytearray(b"c" * 10)))  # evicts a, into a's buffer
    await write_one(tier, b"b", memoryview(bytearray(b"B" * 12)))  # replaces b in place
    assert [await read(tier, k) for k in (b"a", b"b", b"c")] == [None, b"B" * 12, b"c" * 10]
    assert (tier.usage().blocks, tier.usage().bytes_used) == (2, 22)


async def test_evicted_blocks_handed_over_are_never_reused() -> None:
    tier = MemoryTier(16)
    await tier.open(TierSetup(evictions="bytes"))
    await write_one(tier, b"a", memoryview(bytearray(b"a" * 16)))
    await write_one(tier, b"b", memoryview(bytearray(b"b" * 16)))  # evicts a, handed over
    handed = tier.take_evictions()
    assert [(k, bytes(v)) for k, v in handed] == [(b"a", b"a" * 16)]
    await write_one(tier, b"c", memoryview(bytearray(b"c" * 16)))
    assert bytes(handed[0][1] or b"") == b"a" * 16


async def test_contains_hints_agree_with_contains_hint_key_by_key() -> None:
    """The batch answer the engine asks when a primary eviction drops clean blocks: held,
    absent, handed over on eviction (still answered as held until taken) and expired keys."""




    tier = MemoryTier(48)
    await tier.open(TierSetup(evictions="bytes"))
    for k in (b"a", b"b", b"c"):
        await write_one(tier, k, memoryview(bytearray(k * 16)))
    await write_one(tier, b"d", memoryview(bytearray(b"d" * 16)))  # evicts a: handed over
    await tier.write_many([(b"e", b"e" * 8)], [BlockMeta(expires_at=time.time() - 1)])
    keys = [b"a", b"b", b"c", b"d", b"e", b"absent"]
    expected = [tier.contains_hint(k) for k in keys]  # key by key, as the engine used to ask
    assert expected == [True, True, True, True, False, False]
    assert tier.contains_hints(keys) == expected

    class Odd(MemoryTier):
        def contains_hint(self, key: bytes) -> bool | None:
            return None  # cannot tell: its batch answer must say so too

    odd = Odd(1 << 10)
    await write_one(odd, b"x", memoryview(bytearray(b"x" * 8)))
    assert odd.contains_hints([b"x", b"y"]) == [None, None]
