"""TTL through the cache API: a value past its TTL is a MISS for get, get_or_load, lookup and
lookup_prefix on every tier, its space is reclaimed, and each expiration is counted once, for
the tier that found it.

Time is real wall time (the expiry is shared by a fleet and kept across restarts): tests store
with short TTLs and poll, with a deadline, until the clock has passed the expiry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers import eventually

from aiotier import (
    BlockingEngine,
    LookupResult,
    MemoryTier,
    PrimaryTier,
    SimpleTier,
    SSDTier,
    TieringEngine,
    TierUsage,
    cached,
)
from aiotier.config import engine_from_config, load_config
from aiotier.errors import ConfigError
from aiotier.tiers.base import Buffer

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY
BLOCK = 4096
TTL = 0.5


async def past(ttl: float = TTL, timeout: float = 10.0) -> None:
    """Until ``ttl`` seconds from now have passed: every value stored with that TTL before
    the call is past it."""
    until = time.time() + ttl
    await eventually(lambda: time.time() > until, timeout, "the TTL ran out")


def expirations(engine: TieringEngine) -> dict[str, int]:
    """``aiotier_expirations_total`` by tier, as ``EngineStats`` counts it."""
    return {k[1]: v for k, v in engine.stats().counters.items() if k[0] == "expirations"}


def value(i: int, size: int = 100) -> bytes:
    return i.to_bytes(4, "little") * (size // 4)


async def test_a_value_past_its_ttl_is_a_miss_everywhere_in_the_primary() -> None:
    async with TieringEngine(PrimaryTier(16, BLOCK)) as e:
        assert await e.put("short", value(1), ttl=TTL)
        assert await e.put("long", value(2))
        # live: every read path answers it (the fast paths included)
        assert await e.get("short") == value(1)
        assert await e.lookup("short") is HIT
        assert await e.lookup_prefix(["long", "short"]) == 2
        assert await e.get_or_load("short", _never) == value(1)
        await past()
        assert await e.lookup("short") is MISS
        assert await e.lookup_prefix(["long", "short"]) == 1
        assert await e.get("short") is None
        calls: list[int] = []
        assert await e.get_or_load("short", _loader(b"fresh", calls), ttl=60) == b"fresh"
        assert calls == [1]
        assert await e.get("short") == b"fresh"
        assert await e.get("long") == value(2)  # a value without a TTL stays
        assert expirations(e) == {"primary": 1}
        assert e.stats().tiers["primary"].blocks == 2


async def test_a_value_over_several_blocks_expires_whole_and_every_block_is_reclaimed() -> None:
    big = bytes(range(256)) * 40  # 10,240 bytes: three pieces and a manifest
    async with TieringEngine(PrimaryTier(16, BLOCK)) as e:
        assert await e.put("big", big, ttl=TTL)
        assert e.stats().tiers["primary"].blocks == 4
        assert await e.get("big") == big
        assert await e.get_or_load("big", _never) == big
        await past()
        assert await e.get("big") is None
        e.end_step()  # the step boundary reclaims the pieces nobody asked for
        assert e.stats().tiers["primary"].blocks == 0
        assert expirations(e) == {"primary": 4}  # blocks: the manifest and three pieces


async def test_the_step_boundary_reclaims_expired_slots_nobody_asks_for() -> None:
    async with TieringEngine(PrimaryTier(64, BLOCK)) as e:
        for i in range(20):
            assert await e.put(f"k{i}", value(i), ttl=TTL)
        assert await e.put("stays", value(99))
        e.end_step()
        assert e.stats().tiers["primary"].blocks == 21  # nothing is due yet
        await past()
        e.end_step()
        assert e.stats().tiers["primary"].blocks == 1
        assert expirations(e) == {"primary": 20}
        assert await e.get("stays") == value(99)


async def test_a_put_without_ttl_replaces_a_value_with_one_and_it_no_longer_expires() -> None:
    async with TieringEngine(PrimaryTier(8, BLOCK)) as e:
        assert await e.put("k", value(1), ttl=TTL)
        assert await e.put("k", value(2))  # in place: the slot's deadline goes
        await past()
        assert await e.lookup("k") is HIT
        assert await e.get("k") == value(2)
        assert expirations(e) == {}


async def test_default_ttl_applies_to_put_and_get_or_load_but_a_call_overrides_it() -> None:
    async with TieringEngine(PrimaryTier(8, BLOCK), default_ttl=TTL) as e:
        assert await e.put("a", value(1))
        assert await e.get_or_load("b", _loader(value(2), [])) == value(2)
        assert await e.put("c", value(3), ttl=60)
        await past()
        assert [await e.lookup(k) for k in ("a", "b", "c")] == [MISS, MISS, HIT]
        assert expirations(e) == {"primary": 2}


async def test_default_ttl_from_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "aiotier.toml"
    text = f"[primary]\nnum_blocks = 8\nblock_size = {BLOCK}\n\n[engine]\ndefault_ttl = {TTL}\n"
    await asyncio.to_thread(path.write_text, text)
    engine = engine_from_config(await asyncio.to_thread(load_config, path))
    assert engine.options.default_ttl == TTL
    async with engine as e:
        assert await e.put("a", value(1))
        assert await e.lookup("a") is HIT
        await past()
        assert await e.lookup("a") is MISS


@pytest.mark.parametrize(
    ("ttl", "error"),
    [(0, ConfigError), (-1.0, ConfigError), (float("nan"), ConfigError),
     (float("inf"), ConfigError), ("60", TypeError), (True, TypeError)],
)  # fmt: skip
async def test_a_bad_ttl_names_ttl_and_changes_nothing(ttl: object, error: type) -> None:
    async with TieringEngine(PrimaryTier(8, BLOCK)) as e:
        assert await e.put("k", b"old")
        with pytest.raises(error, match="ttl"):
            await e.put("k", b"new", ttl=ttl)  # type: ignore[arg-type]
        with pytest.raises(error, match="ttl"):
            await e.get_or_load("other", _never, ttl=ttl)  # type: ignore[arg-type]
        assert await e.get("k") == b"old"
        assert e.stats().tiers["primary"].blocks == 1
    with pytest.raises(error, match="default_ttl"):
        TieringEngine(PrimaryTier(8, BLOCK), default_ttl=ttl)  # type: ignore[arg-type]
    with pytest.raises(error, match="ttl"):
        cached(e, ttl=ttl)  # type: ignore[arg-type]


async def test_a_ttl_needs_blocks_that_hold_the_head() -> None:
    async with TieringEngine(PrimaryTier(8, 64)) as e:
        with pytest.raises(ValueError, match=r"ttl=60.*72-byte head"):
            await e.put("k", b"v", ttl=60)
        assert await e.get("k") is None


async def test_cached_with_ttl_calls_the_function_again_once_it_expired() -> None:
    calls: list[int] = []
    async with TieringEngine(PrimaryTier(8, BLOCK)) as e:

        @cached(e, ttl=TTL)
        async def compute(x: int) -> bytes:
            calls.append(x)
            return value(x)

        assert await compute(7) == value(7)
        assert await compute(7) == value(7)
        assert calls == [7]
        await past()
        assert await compute(7) == value(7)
        assert calls == [7, 7]


def test_blocking_engine_put_takes_a_ttl() -> None:
    with BlockingEngine(PrimaryTier(8, BLOCK)) as e:
        assert e.put("k", value(1), ttl=TTL)
        until = time.time() + TTL
        assert e.get("k") == value(1)
        assert e.lookup("k") is HIT
        while time.time() <= until:  # a caller's thread: nothing to await
            time.sleep(0.01)
        assert e.lookup("k") is MISS
        assert e.get("k") is None


# -- the tiers -----------------------------------------------------------------------------------


async def test_memory_tier_expires_what_it_was_given_and_counts_it() -> None:
    memory = MemoryTier(1 << 20)
    async with TieringEngine(
        PrimaryTier(8, BLOCK), [memory], write_policy="write_through"
    ) as e:
        assert await e.put("k", value(1), ttl=TTL)
        assert await e.put("keep", value(2))
        await e.flush()
        e.clear_primary()  # only the memory tier holds them now
        assert await e.lookup("k") is RETRY  # live: promoted from the memory tier
        await e.wait(["k"])
        e.clear_primary()
        await past()
        assert await e.lookup("k") is MISS
        assert await e.lookup_prefix(["k"]) == 0
        assert await e.get("k") is None
        assert await e.get("keep") == value(2)
        e.end_step()
        assert expirations(e) == {"memory": 1}
        assert memory.usage().blocks == 1  # its space is reclaimed


async def test_ssd_tier_keeps_the_expiry_across_a_restart(tmp_path: Path) -> None:
    def engine() -> tuple[TieringEngine, SSDTier]:
        ssd = SSDTier(tmp_path / "ssd", 1 << 20)
        return TieringEngine(PrimaryTier(8, BLOCK), [ssd]), ssd

    e, ssd = engine()
    ttl = 3.0  # the write-down at close and the reopen happen before it runs out
    async with e:
        assert await e.put("k", value(1), ttl=ttl)
        assert await e.put("keep", value(2))
    # closed: the write-down put both on the disk; the expiry file holds k's deadline
    e, ssd = engine()
    async with e:
        assert ssd.usage().started == "clean"
        assert await ssd.lookup_many([b"k", b"keep"]) == [HIT, HIT]
    await past(ttl)
    e, ssd = engine()
    async with e:
        assert ssd.usage().blocks == 2  # found on the disk, past its deadline
        assert await e.lookup("k") is MISS  # the tier answers MISS itself
        assert await e.lookup_prefix(["keep", "k"]) is None  # keep is promoted, k a MISS
        await e.wait(["keep"])
        assert await e.lookup_prefix(["keep", "k"]) == 1
        assert await e.get("k") is None
        assert await e.get("keep") == value(2)
        e.end_step()
        assert expirations(e) == {"ssd": 1}
        await eventually(lambda: ssd.usage().blocks == 1, what="k's slot reclaimed")


class PlainTier(SimpleTier):
    """A user tier that knows nothing of expiry (no ``capabilities.expiry``)."""

    def __init__(self) -> None:
        super().__init__("plain")
        self.data: dict[bytes, bytes] = {}

    async def lookup(self, key: bytes) -> LookupResult:
        return HIT if key in self.data else MISS

    async def read_into(self, key: bytes, buf: memoryview) -> int:
        blob = self.data.get(key)
        if blob is None:
            return -1
        buf[: len(blob)] = blob
        return len(blob)

    async def write(self, key: bytes, data: Buffer) -> None:
        self.data[key] = bytes(data)

    async def remove(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None

    def usage(self) -> TierUsage:
        return TierUsage(len(self.data), sum(map(len, self.data.values())), None)


async def test_a_tier_without_expiry_never_serves_an_expired_value() -> None:
    plain = PlainTier()
    async with TieringEngine(
        PrimaryTier(8, BLOCK), [plain], write_policy="write_through"
    ) as e:
        assert await e.put("k", value(1), ttl=TTL)
        big = value(3, 3 * BLOCK)
        assert await e.put("big", big, ttl=TTL)
        await e.flush()
        e.clear_primary()
        await past()
        assert await e.get("big") is None  # its manifest lands expired: dropped
        # the tier still says HIT: the block is promoted, lands expired and is dropped there
        assert await e.lookup("k") is RETRY
        assert await e.wait(["k"]) == [MISS]
        assert await e.lookup("k") is MISS
        assert await e.get("k") is None
        await e.flush()
        assert b"k" not in plain.data and b"big" not in plain.data  # removed from the tier
        assert expirations(e)["plain"] == 2


async def _never() -> bytes:
    raise AssertionError("the loader ran for a value that is cached")


def _loader(data: bytes, calls: list[int]) -> object:
    async def load() -> bytes:
        calls.append(1)
        await asyncio.sleep(0)
        return data

    return load


def _keys(ks: Sequence[str]) -> list[bytes]:
    return [k.encode() for k in ks]
