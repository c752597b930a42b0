"""Values larger than a block through ``put``/``get``/``get_or_load``: whole or not at all, on
every tier, across evictions of some pieces and across a restart."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from seaweedfs_fixtures import S3Endpoint

from aiotier import (
    BlockingEngine,
    MemoryTier,
    ObjectStoreTier,
    PrimaryTier,
    RedisTier,
    SecondaryTier,
    SSDTier,
    TieringEngine,
)

BS = 256


def value(n: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


async def test_values_of_every_size_up_to_the_maximum_round_trip() -> None:
    async with TieringEngine(PrimaryTier(16, BS)) as e:
        assert e.max_value_bytes == 15 * BS
        for n in (0, 1, BS - 1, BS, BS + 1, 3 * BS + 7, 15 * BS):  # the largest fills it
            assert await e.put(f"v{n}", value(n, n)), n
            assert await e.get(f"v{n}") == value(n, n), n
        with pytest.raises(ValueError, match=f"takes values up to {15 * BS} bytes"):
            await e.put("too-big", value(15 * BS + 1))
        with pytest.raises(ValueError, match="names the pieces"):
            await e.put(b"\x00aiotier-piece/mine", b"x")
        assert e.stats().pinned_blocks == 0


async def test_a_small_value_that_looks_like_a_manifest_comes_back_as_stored() -> None:
    async with TieringEngine(PrimaryTier(8, BS)) as e:
        tricky = b"\x89aiotval" + bytes(56)
        assert await e.put("tricky", tricky)
        assert await e.get("tricky") == tricky


async def test_in_an_engine_of_small_blocks_a_lookalike_is_stored_as_it_is() -> None:
    """Found by the engine model test: blocks under 64 bytes cannot hold a manifest."""
    async with TieringEngine(PrimaryTier(4, 16)) as e:
        assert await e.put("k", b"\x89aiotval")
        assert await e.get("k") == b"\x89aiotval"
        with pytest.raises(ValueError, match="17 bytes, block_size is 16"):
            await e.put("k", bytes(17))


async def test_replacing_a_large_value_frees_the_old_pieces() -> None:
    async with TieringEngine(PrimaryTier(16, BS)) as e:
        assert await e.put("k", value(4 * BS, 1))
        blocks = e.stats().tiers["primary"].blocks
        assert blocks == 5  # four pieces and the block naming them
        assert await e.put("k", value(4 * BS, 2))
        assert e.stats().tiers["primary"].blocks == 5
        assert await e.get("k") == value(4 * BS, 2)
        assert await e.put("k", b"small now")
        assert e.stats().tiers["primary"].blocks == 1
        assert await e.get("k") == b"small now"
        assert await e.put("k", value(3 * BS, 3))
        assert await e.delete("k")
        assert e.stats().tiers["primary"].blocks == 0
        assert await e.get("k") is None


async def test_a_value_missing_a_piece_is_none_never_a_prefix() -> None:
    """With nowhere to demote to, filling the primary evicts the oldest pieces."""
    async with TieringEngine(PrimaryTier(6, BS), write_policy="none") as e:
        assert await e.put("big", value(3 * BS))
        for i in range(3):  # the least recently used blocks go: the big value's first pieces
            assert await e.put(f"small{i}", b"s")
        assert await e.get("big") is None


async def test_a_put_the_primary_cannot_hold_whole_leaves_the_old_value() -> None:
    async with TieringEngine(PrimaryTier(4, BS), write_policy="none") as e:
        assert await e.put("k", b"old")
        await e.lookup_prefix(["k"])
        spec = e.prepare_load(["k"])  # pinned: one of four slots cannot be evicted
        assert not await e.put("big", value(3 * BS))  # needs four slots
        e.complete_load(["k"])
        assert await e.get("k") == b"old"
        assert await e.get("big") is None
        assert spec.block_ids


async def test_large_values_go_down_and_come_back_through_a_memory_tier() -> None:
    async with TieringEngine(PrimaryTier(6, BS), [MemoryTier(1 << 20)]) as e:
        for i in range(6):
            assert await e.put(f"big{i}", value(2 * BS + i, i))
        for i in range(6):
            assert await e.get(f"big{i}") == value(2 * BS + i, i), i


async def test_get_or_load_and_blocking_engine_take_large_values() -> None:
    loads = 0

    async def load() -> bytes:
        nonlocal loads
        loads += 1
        await asyncio.sleep(0.01)
        return value(5 * BS)

    async with TieringEngine(PrimaryTier(16, BS)) as e:
        got = await asyncio.gather(*(e.get_or_load("k", load) for _ in range(20)))
        assert got == [value(5 * BS)] * 20 and loads == 1
        assert await e.get_or_load("k", load) == value(5 * BS)
        assert loads == 1

    def blocking() -> None:
        with BlockingEngine(PrimaryTier(16, BS)) as b:
            assert b.put("k", value(7 * BS))
            assert b.get("k") == value(7 * BS)

    await asyncio.to_thread(blocking)


async def test_readers_racing_a_replacement_see_the_old_or_the_new_value_whole() -> None:
    async with TieringEngine(PrimaryTier(64, BS), [MemoryTier(1 << 20)]) as e:
        versions = [value(4 * BS + v, v) for v in range(8)]
        assert await e.put("k", versions[0])
        seen: list[bytes | None] = []

        async def reader() -> None:
            for _ in range(50):
                seen.append(await e.get("k"))
                await asyncio.sleep(0)

        async def writer() -> None:
            for v in versions[1:]:
                assert await e.put("k", v)
                await asyncio.sleep(0)

        await asyncio.gather(reader(), reader(), writer())
        assert all(s is None or s in versions for s in seen)
        assert await e.get("k") == versions[-1]


async def test_large_values_survive_a_restart_on_the_ssd(tmp_path: Path) -> None:
    def engine() -> TieringEngine:
        return TieringEngine(PrimaryTier(8, BS), [SSDTier(str(tmp_path / "ssd"), 1 << 20)])

    async with engine() as e:
        for i in range(4):
            assert await e.put(f"big{i}", value(3 * BS + i, i))
    async with engine() as again:
        for i in range(4):
            assert await again.get(f"big{i}") == value(3 * BS + i, i), i


async def _through_a_shared_tier(make: object) -> None:
    assert callable(make)
    async with TieringEngine(PrimaryTier(8, BS), [make()]) as writer:
        assert await writer.put("big", value(5 * BS, 9))
        await writer.flush()
    # another engine on the same tier (another machine of the fleet) reads it back whole
    async with TieringEngine(PrimaryTier(8, BS), [make()]) as reader:
        assert await reader.get("big") == value(5 * BS, 9)


@pytest.mark.redis
async def test_large_values_through_redis(redis_url: str) -> None:
    namespace = f"values-{os.getpid()}-{id(object())}"
    await _through_a_shared_tier(lambda: RedisTier(redis_url, namespace=namespace))


@pytest.mark.s3
async def test_large_values_through_an_object_store(s3: S3Endpoint) -> None:
    await _through_a_shared_tier(
        lambda: ObjectStoreTier(s3.bucket, endpoint_url=s3.url, prefix=s3.prefix)
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["put", "get", "delete"]),
            st.integers(0, 5),
            st.integers(0, 6 * BS),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_every_get_returns_the_last_value_put_whole(ops: list[tuple[str, int, int]]) -> None:
    """Against a model dict, with a memory tier big enough that nothing is lost: every get
    returns exactly the last value put (or None after a delete)."""

    async def run() -> None:
        tiers: list[SecondaryTier] = [MemoryTier(1 << 22)]
        model: dict[str, bytes] = {}
        async with TieringEngine(PrimaryTier(8, BS), tiers) as e:
            for n, (op, key_i, size) in enumerate(ops):
                k = f"k{key_i}"
                if op == "put":
                    data = value(size, n)
                    assert await e.put(k, data)
                    model[k] = data
                elif op == "get":
                    assert await e.get(k) == model.get(k), (k, n)
                else:
                    await e.delete(k)
                    model.pop(k, None)
            for k, data in model.items():
                assert await e.get(k) == data
            assert e.stats().pinned_blocks == 0

    asyncio.run(run())
