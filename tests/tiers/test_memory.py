"""The memory tier keeps what it is given: a ``bytes`` as it is, a view copied into a buffer of
its own (reused from the block it replaces or evicts)."""

from __future__ import annotations

from helpers import check_written_views_may_be_reused, read_one, write_one

from aiotier import MemoryTier, TierSetup


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
