"""SSDTier under the engine: promotion, write-back demotion, restart, corruption, faults."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from blockbuster import blockbuster_ctx
from helpers import aiotier_tasks, eventually

from aiotier import ConfigError, LookupResult, PrimaryTier, TieringEngine, TieringError
from aiotier.tiers import MemoryTier, SSDTier
from aiotier.tiers._ssd.layout import Geometry
from aiotier.tiers._ssd.slot import HEAD_SIZE

BS = 64 * 1024
SLOT = Geometry.slot_size_for(BS)


@pytest.fixture(autouse=True)
def no_blocking_calls_in_the_event_loop() -> Iterator[None]:
    """The suite's blocking-call guard, scoped to the library.

    These tests inspect and damage the tier's files behind its back with plain blocking calls
    on purpose; any blocking call made by ``aiotier`` code on the event loop still fails.
    """
    with blockbuster_ctx(scanned_modules=["aiotier"]) as bb:
        for name in ("threading.Lock.acquire", "threading.Lock.acquire_lock"):
            bb.functions[name].deactivate()
        yield


def slot_of(tier: SSDTier, key: bytes) -> tuple[Path, int]:
    loc = tier.locate(key)
    assert loc is not None
    return Path(loc[0]), loc[1]


def read_slot(tier: SSDTier, key: bytes, payload_len: int) -> bytes:
    path, off = slot_of(tier, key)
    with path.open("rb") as f:
        f.seek(off)
        return f.read(HEAD_SIZE + len(key) + payload_len)


def blob(i: int, n: int = BS) -> bytes:
    return (i.to_bytes(4, "little") * (n // 4 + 1))[:n]


async def seed(root: Path, blocks: dict[bytes, bytes]) -> dict[bytes, tuple[Path, int]]:
    """A tier directory holding ``blocks`` (for an engine of BS-byte blocks); their slots."""
    async with SSDTier(root, 64 << 20, block_size=BS) as t:
        assert await t.write_many(list(blocks.items())) == [None] * len(blocks)
        return {k: slot_of(t, k) for k in blocks}


async def test_promotion_from_ssd_lookup_retry_wait_hit_with_the_right_bytes(
    tmp_path: Path,
) -> None:
    blocks = {f"k{i}".encode(): blob(i, BS - i) for i in range(8)}
    await seed(tmp_path / "ssd", blocks)
    engine = TieringEngine(PrimaryTier(16, BS), [SSDTier(tmp_path / "ssd", 64 << 20)])
    async with engine:
        keys = list(blocks)
        assert await engine.lookup(keys[0]) is LookupResult.RETRY
        assert await engine.lookup_prefix(keys) is None  # the rest start promoting too
        assert await engine.wait(keys, timeout=10) == [LookupResult.HIT] * len(keys)
        spec = engine.prepare_load(keys)
        for k, buf in zip(keys, spec.buffers, strict=True):
            assert bytes(buf) == blocks[k]
        engine.complete_load(keys)
        assert await engine.lookup(b"absent") is LookupResult.MISS
        counters = engine.stats().counters
        assert counters.get(("promotions", "ssd", "ok"), 0) == len(keys)


async def test_get_promotes_from_ssd(tmp_path: Path) -> None:
    await seed(tmp_path / "ssd", {b"k": b"value" * 100})
    async with TieringEngine(PrimaryTier(4, BS), [SSDTier(tmp_path / "ssd", 1 << 20)]) as engine:
        assert await engine.get(b"k") == b"value" * 100
        assert await engine.get(b"other") is None


async def test_write_back_demotion_lands_on_disk(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    ssd = SSDTier(root, 64 << 20)
    async with TieringEngine(PrimaryTier(4, BS), [ssd], write_policy="write_back") as engine:
        for i in range(12):
            assert await engine.put(f"k{i}".encode(), blob(i))
        await engine.flush(timeout=10)
        # the 8 evicted from the 4-block primary were written down, bytes intact
        for i in range(8):
            k = f"k{i}".encode()
            assert ssd.contains_hint(k)
            assert read_slot(ssd, k, BS)[-BS:] == blob(i)
        assert await engine.get(b"k0") == blob(0)  # and promote back


async def test_engine_restart_keeps_the_hot_set(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    async with TieringEngine(PrimaryTier(8, BS), [SSDTier(root, 64 << 20)]) as engine:
        for i in range(20):
            assert await engine.put(f"k{i}".encode(), blob(i, 1000 + i))
    # aclose wrote the primary-only blocks down: every block is on disk after the restart
    async with TieringEngine(PrimaryTier(8, BS), [SSDTier(root, 64 << 20)]) as engine2:
        for i in range(20):
            assert await engine2.get(f"k{i}".encode()) == blob(i, 1000 + i)


async def test_second_engine_on_the_same_path_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    async with TieringEngine(PrimaryTier(4, BS), [SSDTier(root, 1 << 20)]) as engine:
        await engine.put(b"k", b"v")
        other = TieringEngine(PrimaryTier(4, BS), [SSDTier(root, 1 << 20)])
        with pytest.raises(TieringError, match="locked"):
            await other.open()
        assert await engine.get(b"k") == b"v"


def _damage(where: tuple[Path, int], how: str) -> None:
    """Damage the slot at ``where`` behind the tier's back: a payload byte, the file cut off
    inside the slot, or the whole slot overwritten with garbage."""
    path, off = where
    with path.open("r+b") as f:
        if how == "payload":
            f.seek(off + HEAD_SIZE + 3 + 100)
            byte = f.read(1)
            f.seek(off + HEAD_SIZE + 3 + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        elif how == "truncate":
            f.truncate(off + SLOT // 2)
        else:
            f.seek(off)
            f.write(os.urandom(SLOT))


@pytest.mark.parametrize("how", ["payload", "truncate", "garbage"])
async def test_corrupted_file_is_a_miss_and_the_engine_keeps_working(
    tmp_path: Path, how: str
) -> None:
    root = tmp_path / "ssd"
    blocks = {b"good": blob(2), b"bad": blob(1)}  # bad is in the second slot
    slots = await seed(root, blocks)
    async with TieringEngine(PrimaryTier(4, BS), [SSDTier(root, 64 << 20)]) as engine:
        _damage(slots[b"bad"], how)  # behind the tier's back, after its index was built
        assert await engine.lookup(b"bad") is LookupResult.RETRY
        assert await engine.wait([b"bad"], timeout=10) == [LookupResult.MISS]
        assert await engine.lookup(b"bad") is LookupResult.MISS
        assert await engine.get(b"bad") is None  # never wrong bytes
        assert await engine.get(b"good") == blob(2)
        assert engine.stats().counters.get(("tier_errors", "ssd", "read"), 0) >= 1


async def test_a_torn_slot_found_at_open_is_free_and_a_plain_miss(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    slots = await seed(root, {b"good": blob(2), b"torn": blob(1)})
    (root / "checkpoint").unlink()  # as a crash leaves it
    path, off = slots[b"torn"]
    with path.open("r+b") as f:  # the header half written
        f.seek(off + 30)
        f.write(b"\x00" * 10)
    ssd = SSDTier(root, 64 << 20)
    async with TieringEngine(PrimaryTier(4, BS), [ssd]) as engine:
        assert ssd.last_start is not None and ssd.last_start.torn == 1
        assert engine.stats().tiers["ssd"].started == "crash"
        assert await engine.lookup(b"torn") is LookupResult.MISS
        assert await engine.get(b"good") == blob(2)


async def test_the_engine_gives_the_tier_its_block_size(tmp_path: Path) -> None:
    ssd = SSDTier(tmp_path / "ssd", 1 << 20)
    async with TieringEngine(PrimaryTier(4, 4096), [ssd]) as engine:
        assert ssd.block_size == 4096
        assert await engine.put(b"k", b"v" * 4096)
    assert engine.stats().tiers["ssd"].started == "new"
    # a directory made for other blocks, or a tier told another size, is a clear error
    other = TieringEngine(PrimaryTier(4, 8192), [SSDTier(tmp_path / "ssd", 1 << 20)])
    with pytest.raises(ConfigError, match="4096"):
        await other.open()
    mismatched = TieringEngine(PrimaryTier(4, 8192), [SSDTier(tmp_path / "x", 1 << 20,
                                                              block_size=4096)])  # fmt: skip
    with pytest.raises(ConfigError, match="8192"):
        await mismatched.open()


async def test_disk_errors_during_write_back_are_counted_and_the_engine_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ssd"
    real = os.pwritev
    broken = {"on": True}

    def pwritev(fd: int, bufs: Any, offset: int) -> int:
        if broken["on"]:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    ssd = SSDTier(root, 64 << 20)
    async with TieringEngine(PrimaryTier(2, BS), [ssd]) as engine:
        for i in range(6):
            assert await engine.put(f"k{i}".encode(), blob(i))
        await engine.flush(timeout=10)
        assert engine.stats().counters.get(("tier_errors", "ssd", "write"), 0) >= 4
        broken["on"] = False
        for i in range(6, 12):
            assert await engine.put(f"k{i}".encode(), blob(i))
        await engine.flush(timeout=10)
        assert ssd.contains_hint(b"k6")
        assert await engine.get(b"k6") == blob(6)


async def test_ssd_evictions_cascade_to_the_tier_below(tmp_path: Path) -> None:
    root = tmp_path / "ssd"
    ssd = SSDTier(root, 3 * SLOT)
    below = MemoryTier(64 << 20, name="below")
    async with TieringEngine(PrimaryTier(2, BS), [ssd, below]) as engine:
        for i in range(9):
            assert await engine.put(f"k{i}".encode(), blob(i))
        await engine.flush(timeout=10)
        await engine.flush(timeout=10)  # the cascade is queued by the first flush's writes
        assert ssd.usage().evictions > 0
        assert ssd.usage().bytes_used <= 3 * SLOT
        for i in range(9):
            assert await engine.get(f"k{i}".encode()) == blob(i)


@pytest.mark.parametrize("wrapped", [False, True])
async def test_evictions_of_the_last_tier_are_reported_as_removed_events(
    tmp_path: Path, wrapped: bool
) -> None:
    """With nothing below, the SSD tier names what it evicts (keys read from the victims'
    headers): replaying the events gives exactly what the tier holds, in LRU order. The same
    through ``FaultyTier`` with no faults (it forwards the setup and the hand-over)."""
    from aiotier.testing import FaultyTier

    root = tmp_path / "ssd"
    ssd = SSDTier(root, 3 * SLOT)
    tier = FaultyTier(ssd, seed=0) if wrapped else ssd
    async with TieringEngine(PrimaryTier(2, BS), [tier], write_policy="write_back") as engine:
        for i in range(9):
            assert await engine.put(f"k{i}".encode(), blob(i))
        await engine.flush(timeout=10)
        held: set[bytes] = set()
        removed_order: list[bytes] = []
        for ev in engine.take_events():
            if ev.tier != "ssd":
                continue
            if ev.removed:
                held.difference_update(ev.keys)
                removed_order.extend(ev.keys)
            else:
                held.update(ev.keys)
        on_disk = {k for i in range(9) if ssd.contains_hint(k := f"k{i}".encode())}
        assert held == on_disk == {b"k4", b"k5", b"k6"}  # k7, k8 still in the primary
        assert removed_order == [b"k0", b"k1", b"k2", b"k3"]  # least recently written first
        assert ssd.usage().evictions == 4
        assert ssd.take_evictions() == []  # taken by the engine


async def test_evictions_with_nothing_below_read_nothing_from_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The victims' keys are in the index: naming them costs no read (a tier used alone, or
    the last tier of an engine); only a hand-over to a tier below reads their bytes."""
    from aiotier.tiers._ssd import ops

    reads: list[int] = []
    real = ops.read_slot
    monkeypatch.setattr(ops, "read_slot", lambda *a: reads.append(1) or real(*a))
    async with SSDTier(tmp_path / "ssd", 2 * Geometry.slot_size_for(100), block_size=100) as t:
        assert await t.write_many([(f"k{i}".encode(), b"v" * 100) for i in range(5)]) == [None] * 5
        assert t.usage().evictions == 3
        assert t.take_evictions() == []  # a tier used alone keeps none
    assert reads == []


async def test_an_ssd_tier_whose_own_lookup_hangs_is_bounded_by_promotion_timeout(
    tmp_path: Path,
) -> None:
    # the SSD tier's own lookups answer from memory and are asked with no timer; a subclass's
    # lookup_many may await anything and is bounded as every tier's is
    blocks = {b"k": blob(1)}
    await seed(tmp_path / "ssd", blocks)

    class Hanging(SSDTier):
        async def lookup_many(self, keys: Any) -> list[LookupResult]:
            await asyncio.Event().wait()
            raise AssertionError("never set")

    engine = TieringEngine(
        PrimaryTier(4, BS), [Hanging(tmp_path / "ssd", 64 << 20)], promotion_timeout=0.2
    )
    async with engine:
        assert await engine.lookup(b"k") is LookupResult.MISS
        counters = engine.stats().counters
        assert counters.get(("tier_errors", "ssd", "lookup"), 0) == 1
        assert engine.stats().promotions_in_flight == 0


def held_reads(
    tier: SSDTier, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """Make the open tier's reads wait on their thread: (entered, release)."""
    entered, release = threading.Event(), threading.Event()
    assert tier.runner is not None
    nowait = tier.runner.nowait
    real = nowait.preadv

    def held(*args: Any) -> int:  # on the tier's thread, before the buffer is written
        entered.set()
        assert release.wait(10)
        return real(*args)

    monkeypatch.setattr(nowait, "preadv", held)
    return entered, release


async def test_an_ssd_promotion_runs_with_no_task_and_lands_only_after_the_lookup(
    tmp_path: Path,
) -> None:
    blocks = {f"k{i}".encode(): blob(i) for i in range(4)}
    await seed(tmp_path / "ssd", blocks)
    async with TieringEngine(PrimaryTier(8, BS), [SSDTier(tmp_path / "ssd", 64 << 20)]) as e:
        keys = list(blocks)
        assert await e.lookup_prefix(keys) is None
        assert await e.lookup(keys[0]) is LookupResult.RETRY  # in flight until the loop reads
        assert aiotier_tasks("promote") == []  # the read ends by callback, not in a task
        assert await e.wait(keys, timeout=10) == [LookupResult.HIT] * 4
        spec = e.prepare_load(keys)
        assert [bytes(b) for b in spec.buffers] == list(blocks.values())
        e.complete_load(keys)


async def test_a_hung_ssd_read_is_given_up_at_promotion_timeout_and_its_slot_kept_until_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed(tmp_path / "ssd", {b"k": blob(1)})
    tier = SSDTier(tmp_path / "ssd", 64 << 20)
    async with TieringEngine(PrimaryTier(1, BS), [tier], promotion_timeout=0.2) as e:
        entered, release = held_reads(tier, monkeypatch)
        assert await e.lookup(b"k") is LookupResult.RETRY
        await eventually(entered.is_set)
        assert await e.wait([b"k"], timeout=5) == [LookupResult.MISS]  # given up at the timeout
        counters = e.stats().counters
        assert counters.get(("promotions", "ssd", "timeout"), 0) == 1
        assert counters.get(("tier_errors", "ssd", "read"), 0) == 1
        # the thread may still write into the slot: it stays pinned, so a store finds no room
        assert e.stats().pinned_blocks == 1
        assert e.prepare_store([b"new"]) is None
        release.set()
        await eventually(lambda: e.stats().pinned_blocks == 0)
        assert e.prepare_store([b"new"]) is not None
        assert e.stats().promotions_in_flight == 0


async def test_aclose_waits_for_an_ssd_read_on_its_thread_and_counts_it_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed(tmp_path / "ssd", {b"k": blob(1), b"j": blob(2)})
    tier = SSDTier(tmp_path / "ssd", 64 << 20, io_threads=1)
    e = TieringEngine(PrimaryTier(4, BS), [tier], promotion_timeout=30)
    await e.open()
    entered, release = held_reads(tier, monkeypatch)
    assert await e.lookup(b"k") is LookupResult.RETRY
    await eventually(entered.is_set)
    e.end_step()
    assert await e.lookup(b"j") is LookupResult.RETRY  # queued behind k's read: one thread
    await asyncio.sleep(0)  # the loop starts j's read, which waits for the thread
    closing = asyncio.ensure_future(e.aclose())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not closing.done()  # k's thread may still write into the arena
    release.set()
    await asyncio.wait_for(closing, 10)
    counters = e.stats().counters
    assert counters.get(("promotions", "ssd", "cancelled"), 0) == 2  # k ran, j was withdrawn
    assert counters.get(("promotions", "ssd", "ok"), 0) == 0
    assert tier.index.holds[tier.index.lru[b"j"]] == 0  # closed tier: its index still readable
