"""SSDTier (format 2) on real temporary directories: slots, restart, corruption, space, faults.

The tests look at and damage the slot files behind the tier's back; ``tier.locate(key)``
names the file and offset of a key's slot.
"""

# The tests look at the tier's directory behind its back, with plain blocking file calls.
# ruff: noqa: ASYNC240

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import stat
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from blockbuster import blockbuster_ctx
from helpers import check_written_views_may_be_reused, lookup_one, read_one, remove_one, write_one

from aiotier import BlockMeta
from aiotier._types import LookupResult
from aiotier.errors import BlockCorruptedError, ConfigError, TieringError, TierUnavailableError
from aiotier.tiers import SSDTier, TierSetup
from aiotier.tiers._ssd import ops
from aiotier.tiers._ssd.hops import HopRunner
from aiotier.tiers._ssd.layout import Geometry
from aiotier.tiers._ssd.ops import SlotReads, SlotSource
from aiotier.tiers._ssd.slot import HEAD_SIZE, encode_head
from aiotier.tiers._ssd.syscalls import NowaitProbe
from aiotier.tiers.ssd import inspect_directory

MiB = 1 << 20
BS = 512 * 1024  # block size of the default tier


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


def slot_files(root: Path) -> list[Path]:
    return sorted(root.glob("slots-*"))


def where(tier: SSDTier, key: bytes) -> tuple[Path, int]:
    loc = tier.locate(key)
    assert loc is not None, f"{key!r} is not in the tier"
    return Path(loc[0]), loc[1]


def raw_slot(tier: SSDTier, key: bytes, n: int | None = None) -> bytes:
    """The bytes of ``key``'s slot on disk: header, key and payload (or ``n`` bytes)."""
    path, off = where(tier, key)
    length = tier.index.length[tier.index.lru[key]]
    with path.open("rb") as f:
        f.seek(off)
        return f.read(HEAD_SIZE + len(key) + length if n is None else n)


def rewrite_slot(tier: SSDTier, key: bytes, fn: Callable[[bytearray], bytes]) -> None:
    """Replace ``key``'s slot bytes on disk with ``fn`` of them (same place, any length)."""
    path, off = where(tier, key)
    data = fn(bytearray(raw_slot(tier, key)))
    with path.open("r+b") as f:
        f.seek(off)
        f.write(data)


async def read(tier: SSDTier, key: bytes, cap: int = 2 * MiB) -> bytes | None:
    buf = bytearray(cap)
    n = await read_one(tier, key, memoryview(buf))
    return None if n < 0 else bytes(buf[:n])


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``cond`` on the loop until it holds (a deadline, never a fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


def slot_size(block_size: int) -> int:
    return Geometry.slot_size_for(block_size)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ssd"


@pytest.fixture
async def tier(root: Path) -> AsyncIterator[SSDTier]:
    t = SSDTier(root, 64 * MiB, block_size=BS)
    await t.open()
    try:
        yield t
    finally:
        await t.aclose()


def _runner(tier: SSDTier) -> HopRunner:
    """The open tier's runner: the seam to its threads (``SSDTier.runner``)."""
    assert tier.runner is not None
    return tier.runner


# -- basics -----------------------------------------------------------------------------------


async def test_a_written_view_s_buffer_may_be_reused_at_once(tier: SSDTier) -> None:
    await check_written_views_may_be_reused(tier)


async def test_write_then_read_returns_the_same_bytes(tier: SSDTier) -> None:
    data = os.urandom(300_000)
    await write_one(tier, b"k", data)
    assert await lookup_one(tier, b"k") is LookupResult.HIT
    assert tier.contains_hint(b"k") is True
    assert await read(tier, b"k") == data
    assert await lookup_one(tier, b"other") is LookupResult.MISS
    assert await read_one(tier, b"other", memoryview(bytearray(10))) == -1


async def test_memoryview_data_and_empty_block(tier: SSDTier) -> None:
    arena = bytearray(os.urandom(4096))
    await write_one(tier, b"view", memoryview(arena)[1024:2048])
    await write_one(tier, b"empty", b"")
    assert await read(tier, b"view") == bytes(arena[1024:2048])
    assert await read(tier, b"empty") == b""


async def test_read_into_a_short_buffer_is_a_value_error(tier: SSDTier) -> None:
    await write_one(tier, b"k", b"x" * 100)
    with pytest.raises(ValueError, match="100 bytes"):
        await read_one(tier, b"k", memoryview(bytearray(99)))
    assert await read(tier, b"k") == b"x" * 100
    assert tier.index.holds[tier.index.lru[b"k"]] == 0  # the refused read let go of its slot


async def test_slot_carries_header_key_and_payload(tier: SSDTier, root: Path) -> None:
    """Slot layout (docs/ssd.md): header with the shared frame inside, key, payload."""
    await write_one(tier, b"key", b"payload")
    seq = tier.index.seq[tier.index.lru[b"key"]]
    assert raw_slot(tier, b"key") == encode_head(b"key", seq, b"payload") + b"payload"
    assert raw_slot(tier, b"key", 48)[8:14] == b"ATSL\x02\x00"
    assert raw_slot(tier, b"key", 48)[24:28] == b"ATBK"
    [f] = slot_files(root)
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert f.stat().st_size == (64 * MiB // slot_size(BS)) * slot_size(BS)


async def test_overwrite_lands_in_another_slot_and_clears_the_old_one(tier: SSDTier) -> None:
    await write_one(tier, b"k", b"a" * 100)
    old_path, old_off = where(tier, b"k")
    await write_one(tier, b"k", b"b" * 5000)
    assert where(tier, b"k") != (old_path, old_off)
    assert await read(tier, b"k") == b"b" * 5000
    await until(lambda: _runner(tier).idle)
    with old_path.open("rb") as f:
        f.seek(old_off)
        assert f.read(8) == bytes(8)  # the replaced copy's header is cleared
    assert tier.usage().blocks == 1
    assert tier.usage().bytes_used == slot_size(BS)


async def test_remove_clears_the_slot_on_disk(tier: SSDTier) -> None:
    await write_one(tier, b"k", b"data")
    path, off = where(tier, b"k")
    assert await remove_one(tier, b"k") is True
    assert await remove_one(tier, b"k") is False
    assert await lookup_one(tier, b"k") is LookupResult.MISS
    with path.open("rb") as f:
        f.seek(off)
        assert f.read(8) == bytes(8)
    assert tier.usage().bytes_used == 0
    assert await tier.remove_many([b"k", b"absent"]) == [False, False]


async def test_clear_empties_the_index_and_clears_every_header_on_disk(
    tier: SSDTier, root: Path
) -> None:
    keys = [f"c{i}".encode() for i in range(10)]
    assert await tier.write_many([(k, k * 100) for k in keys]) == [None] * 10
    places = [where(tier, k) for k in keys]
    await tier.clear()
    assert await tier.lookup_many(keys) == [LookupResult.MISS] * 10
    assert tier.usage().blocks == 0 and tier.usage().bytes_used == 0
    for path, off in places:
        with path.open("rb") as f:
            f.seek(off)
            assert f.read(8) == bytes(8)
    await write_one(tier, b"after", b"new")  # the tier goes on
    assert await read(tier, b"after") == b"new"
    await tier.aclose()
    again = SSDTier(root, 64 * MiB)
    await again.open()
    try:
        assert again.usage().blocks == 1
        assert await again.lookup_many(keys) == [LookupResult.MISS] * 10
    finally:
        await again.aclose()


def test_a_clear_survives_a_kill_right_after_it(root: Path) -> None:
    """The headers are cleared on disk before clear() returns: a SIGKILL the moment it returns
    leaves nothing for the header scan to bring back. (The fdatasync after them, against power
    loss, is what no kill can show.)"""
    script = f"""
import asyncio, os, signal
from aiotier import SSDTier

async def main():
    t = SSDTier({str(root)!r}, 1 << 22, block_size={BS})
    await t.open()
    errors = await t.write_many([(b"k%d" % i, b"v" * 1000) for i in range(20)])
    assert errors == [None] * 20, errors
    await t.clear()
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()

    async def reopen() -> None:
        t = SSDTier(root, 1 << 22)
        await t.open()
        try:
            assert t.usage().started == "crash"
            assert t.usage().blocks == 0
            keys = [b"k%d" % i for i in range(20)]
            assert await t.lookup_many(keys) == [LookupResult.MISS] * 20
        finally:
            await t.aclose()

    asyncio.run(reopen())


async def test_read_many_into_one_bad_block_does_not_fail_its_neighbours(
    tier: SSDTier,
) -> None:
    blocks = {f"k{i}".encode(): os.urandom(10_000 + i) for i in range(20)}
    errs = await tier.write_many(list(blocks.items()))
    assert errs == [None] * 20
    rewrite_slot(tier, b"k3", _flip_payload)
    keys = [*blocks, b"absent", b"k5"]
    bufs = [memoryview(bytearray(20_000)) for _ in keys]
    bufs[-1] = memoryview(bytearray(10))  # too small for k5
    out = await tier.read_many_into(keys, bufs)
    for i, k in enumerate(keys[:20]):
        if k == b"k3":
            assert isinstance(out[i], BlockCorruptedError)
        else:
            assert out[i] == len(blocks[k])
            assert bytes(bufs[i][: len(blocks[k])]) == blocks[k]
    assert out[20] == -1
    assert isinstance(out[21], ValueError)
    assert await lookup_one(tier, b"k3") is LookupResult.MISS


async def test_read_many_into_puts_each_answer_at_its_key_s_position(tier: SSDTier) -> None:
    """Keys asked in another order than their slots (the tier reads in slot order, split over
    its threads), with absent and repeated keys, buffers too short, of another item format and
    of another type: each answer and each block's bytes land at the key's own position, and
    every slot the read pinned is let go."""
    blocks = {b"b%02d" % i: os.urandom(5_000 + 37 * i) for i in range(40)}
    assert await tier.write_many(list(blocks.items())) == [None] * 40
    keys = [*reversed(blocks), b"absent", b"b07", b"b11", b"b20", b"b03"]
    bufs: list[Any] = [memoryview(bytearray(8_000)) for _ in keys]
    bufs[5] = memoryview(bytearray(100))  # too short for its block
    bufs[-1] = memoryview(bytearray(8_000)).cast("I")  # 2000 items of 4 bytes
    bufs[-2] = bytearray(8_000)  # not a view
    out = await tier.read_many_into(keys, bufs)
    for i, k in enumerate(keys):
        if k == b"absent":
            assert out[i] == -1
        elif i == 5:
            assert isinstance(out[i], ValueError) and repr(k) in str(out[i])
        else:
            data = blocks[k]
            assert out[i] == len(data), (i, k, out[i])
            assert bytes(memoryview(bufs[i]).cast("B")[: len(data)]) == data
    assert all(tier.index.holds[s] == 0 for s in tier.index.lru.values())


async def test_a_buffer_the_kernel_cannot_read_into_fails_its_read_and_lets_its_slot_go(
    tier: SSDTier,
) -> None:
    await write_one(tier, b"k", b"x" * 100)
    strided = memoryview(bytearray(400))[::2]  # bytes, one dimension, not contiguous
    [answer] = await tier.read_many_into([b"k"], [strided])
    assert isinstance(answer, Exception) and not isinstance(answer, BlockCorruptedError)
    assert tier.index.holds[tier.index.lru[b"k"]] == 0
    assert await read(tier, b"k") == b"x" * 100  # the block is still there, unharmed


async def test_str_keys_are_their_utf8_bytes(tier: SSDTier) -> None:
    await write_one(tier, "é", b"1")  # type: ignore[arg-type]
    assert await read(tier, "é".encode()) == b"1"


async def test_keys_longer_than_the_limit_are_refused(tier: SSDTier) -> None:
    with pytest.raises(ValueError, match="1024"):
        await write_one(tier, b"k" * 1025, b"x")
    await write_one(tier, b"k" * 1024, b"x" * BS)  # the longest key with the largest block fits
    assert await read(tier, b"k" * 1024) == b"x" * BS


async def test_block_larger_than_the_block_size_is_refused(tier: SSDTier) -> None:
    with pytest.raises(ValueError, match="block size"):
        await write_one(tier, b"k", b"x" * (BS + 1))
    assert tier.usage().blocks == 0


def test_constructor_validates() -> None:
    with pytest.raises(ConfigError):
        SSDTier("/tmp/x", 0)
    with pytest.raises(ConfigError):
        SSDTier("/tmp/x", 10, io_threads=0)
    with pytest.raises(ConfigError):
        SSDTier("/tmp/x", 10, block_size=0)
    assert SSDTier("/tmp/x", 10).name == "ssd"
    assert SSDTier("/tmp/x", 10, name="disk").name == "disk"


async def test_the_block_size_comes_from_the_argument_the_engine_or_the_directory(
    root: Path,
) -> None:
    with pytest.raises(ConfigError, match="block size is not known"):
        await SSDTier(root, MiB).open()
    assert not root.exists() or not slot_files(root)
    t = SSDTier(root, MiB)
    await t.open(TierSetup(block_size=4096))  # what an engine does
    async with t:
        await write_one(t, b"k", b"v")
    async with SSDTier(root, MiB) as again:  # a reopened directory keeps its own
        assert again.block_size == 4096
        assert await read(again, b"k") == b"v"
    with pytest.raises(ConfigError, match="4096"):
        await SSDTier(root, MiB, block_size=8192).open()
    other = SSDTier(root, MiB, block_size=4096)
    with pytest.raises(ConfigError, match="8192"):
        await other.open(TierSetup(block_size=8192))


async def test_capacity_smaller_than_one_slot_is_a_clear_error(root: Path) -> None:
    with pytest.raises(ConfigError, match=r"capacity_bytes=1000 holds no slot"):
        await SSDTier(root, 1000, block_size=4096).open()


async def test_operations_after_aclose_are_unavailable(root: Path) -> None:
    t = SSDTier(root, MiB, block_size=4096)
    await t.open()
    await write_one(t, b"k", b"v")
    await t.aclose()
    with pytest.raises(TierUnavailableError):
        await read_one(t, b"k", memoryview(bytearray(8)))
    with pytest.raises(TierUnavailableError):
        await write_one(t, b"k", b"v")
    await t.aclose()  # idempotent


# -- space ------------------------------------------------------------------------------------


async def test_space_is_reserved_at_open_allocated_not_only_apparent(root: Path) -> None:
    capacity = 40 * MiB
    async with SSDTier(root, capacity, block_size=BS) as t:
        files = slot_files(root)
        expected = (capacity // slot_size(BS)) * slot_size(BS)
        assert sum(f.stat().st_size for f in files) == expected
        assert sum(f.stat().st_blocks * 512 for f in files) >= expected  # before any write
        assert t.usage().capacity_bytes == expected
        for i in range(100):  # more than fits: evictions, never growth
            await write_one(t, f"k{i}".encode(), os.urandom(BS))
        assert sum(f.stat().st_size for f in files) == expected
        assert t.usage().evictions == 100 - expected // slot_size(BS)


async def test_space_that_cannot_be_reserved_fails_open_naming_path_and_size(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    capacity = 16 * MiB
    with pytest.raises(TierUnavailableError) as info:
        await SSDTier(root, capacity, block_size=BS).open()
    msg = str(info.value)
    size = (capacity // slot_size(BS)) * slot_size(BS)
    assert f"cannot reserve {size} bytes for {root / 'slots-0000'}" in msg
    assert "No space left on device" in msg
    assert slot_files(root) == []  # nothing half-reserved stays behind
    monkeypatch.undo()
    async with SSDTier(root, capacity, block_size=BS) as t:  # and it opens once there is room
        await write_one(t, b"k", b"v")


async def test_more_capacity_than_the_disk_has_is_refused_before_anything_is_made(
    root: Path,
) -> None:
    st = os.statvfs(root.parent)
    free = st.f_bavail * st.f_frsize
    for capacity in (2 * free + MiB, 1 << 50):  # the second would need terabytes of index too
        started = time.monotonic()
        with pytest.raises(ConfigError, match=r"bytes free; lower capacity_bytes") as info:
            await SSDTier(root, capacity, block_size=4096).open()
        assert str(root) in str(info.value)
        assert time.monotonic() - started < 5  # refused up front, not after filling the disk
        assert not root.exists()  # nothing of the attempt is left
    async with SSDTier(root, MiB, block_size=8192) as t:  # another geometry, at once
        await write_one(t, b"k", b"v")


async def test_a_tier_at_capacity_evicts_instead_of_failing(root: Path) -> None:
    cap = 8 * slot_size(4096)
    async with SSDTier(root, cap, block_size=4096) as t:
        rng = __import__("random").Random(7)
        for round_ in range(10):
            items = [(f"r{round_}-{i}".encode(), os.urandom(rng.randrange(1, 4096)))
                     for i in range(5)]  # fmt: skip
            assert await t.write_many(items) == [None] * 5
            assert t.usage().blocks == min(8, 5 * (round_ + 1))
            assert t.usage().bytes_used <= cap
        assert t.usage().evictions == 50 - 8
        for k, v in items:
            assert await read(t, k) == v


# -- restart ----------------------------------------------------------------------------------


async def test_clean_restart_loads_the_checkpoint_and_keeps_every_block(root: Path) -> None:
    blocks = {f"block-{i}".encode(): os.urandom(1000 * (i % 7) + i) for i in range(300)}
    async with SSDTier(root, 64 * MiB, block_size=8192) as t:
        assert t.last_start is not None and t.last_start.after == "new"
        assert t.usage().started == "new"
        assert await t.write_many(list(blocks.items())) == [None] * len(blocks)
        before = t.usage()
    assert (root / "checkpoint").exists()
    async with SSDTier(root, 64 * MiB) as t2:
        assert not (root / "checkpoint").exists()  # consumed: a later crash cannot load it
        start = t2.last_start
        assert start is not None
        assert (start.after, start.checkpoint, start.blocks) == ("clean", "loaded", 300)
        assert t2.usage() == type(before)(before.blocks, before.bytes_used,
                                          before.capacity_bytes, "clean")  # fmt: skip
        for k, v in blocks.items():
            assert await lookup_one(t2, k) is LookupResult.HIT
            assert await read(t2, k) == v


async def test_clean_restart_keeps_exact_lru_order_including_reads(root: Path) -> None:
    async with SSDTier(root, 8 * slot_size(4096), block_size=4096) as t:
        for i in range(8):
            await write_one(t, f"k{i}".encode(), bytes([i]) * 1000)
        assert await read(t, b"k1") is not None
        assert await read(t, b"k0") is not None
    async with SSDTier(root, 8 * slot_size(4096)) as t2:
        for i in range(4):  # four new blocks evict the four least recently used
            await write_one(t2, f"new{i}".encode(), b"x")
        survivors = {k for k in (f"k{i}".encode() for i in range(8)) if t2.contains_hint(k)}
        assert survivors == {b"k6", b"k7", b"k1", b"k0"}
        await write_one(t2, b"newer", b"y")  # and the order within the survivors holds
        assert not t2.contains_hint(b"k6")


def crash_image(root: Path, dest: Path) -> Path:
    """The directory as a killed process leaves it: slot files as written, no checkpoint."""
    shutil.copytree(root, dest)
    (dest / "checkpoint").unlink(missing_ok=True)
    return dest


async def test_after_a_crash_the_header_scan_finds_every_block_in_write_order(
    root: Path, tmp_path: Path
) -> None:
    async with SSDTier(root, 6 * slot_size(4096), block_size=4096) as t:
        for i in range(6):
            await write_one(t, f"k{i}".encode(), bytes([i]) * 100)
        await read(t, b"k0")  # read recency lives in memory until a clean close
        image = crash_image(root, tmp_path / "image")
    async with SSDTier(image, 6 * slot_size(4096)) as t2:
        start = t2.last_start
        assert start is not None
        assert (start.after, start.checkpoint, start.blocks) == ("crash", "absent", 6)
        assert t2.usage().started == "crash"
        for i in range(6):
            assert await read(t2, f"k{i}".encode()) == bytes([i]) * 100
        for i in range(3):
            await write_one(t2, f"new{i}".encode(), b"x")
        survivors = {k for k in (f"k{i}".encode() for i in range(6)) if t2.contains_hint(k)}
        assert survivors == {b"k3", b"k4", b"k5"}  # write order: k0's read was lost


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-1] + bytes([b[-1] ^ 1]),  # a bit of the checksummed body
        lambda b: b[: len(b) // 2],  # truncated
        lambda b: b"ATCP" + os.urandom(len(b) - 4),  # garbage behind the magic
        lambda b: b"",
    ],
)
async def test_a_damaged_checkpoint_falls_back_to_the_header_scan(
    root: Path, damage: Callable[[bytes], bytes]
) -> None:
    blocks = {f"k{i}".encode(): os.urandom(3000) for i in range(20)}
    async with SSDTier(root, MiB, block_size=4096) as t:
        await t.write_many(list(blocks.items()))
    ck = root / "checkpoint"
    ck.write_bytes(damage(ck.read_bytes()))
    async with SSDTier(root, MiB) as t2:
        start = t2.last_start
        assert start is not None and start.after == "crash"
        assert start.checkpoint.startswith(("damaged", "not a checkpoint"))
        assert start.blocks == 20
        for k, v in blocks.items():
            assert await read(t2, k) == v


async def test_a_checkpoint_that_no_longer_fits_the_files_is_not_trusted(root: Path) -> None:
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"v")
    with (root / "slots-0000").open("r+b") as f:  # changed behind the closed tier's back
        f.truncate(slot_size(4096) * 3)
    async with SSDTier(root, MiB) as t2:
        start = t2.last_start
        assert start is not None and start.after == "crash"
        assert start.checkpoint.startswith("stale")
        assert await read(t2, b"k") == b"v"
        assert (root / "slots-0000").stat().st_size == (MiB // slot_size(4096)) * slot_size(4096)


async def test_torn_slots_found_by_the_scan_are_free(root: Path, tmp_path: Path) -> None:
    blocks = {f"k{i}".encode(): os.urandom(3000) for i in range(10)}
    async with SSDTier(root, MiB, block_size=4096) as t:
        await t.write_many(list(blocks.items()))
        image = crash_image(root, tmp_path / "image")
        path, off = where(t, b"k4")
    torn = image / path.name
    with torn.open("r+b") as f:  # a header cut short: its checksum fails
        f.seek(off + 20)
        f.write(b"\xff\xff")
    async with SSDTier(image, MiB) as t2:
        start = t2.last_start
        assert start is not None and (start.torn, start.blocks) == (1, 9)
        assert await lookup_one(t2, b"k4") is LookupResult.MISS
        for k, v in blocks.items():
            if k != b"k4":
                assert await read(t2, k) == v
        assert len(t2.index.free) == t2.index.slots - 9


async def test_of_two_copies_of_a_key_after_a_crash_the_newest_wins(
    root: Path, tmp_path: Path
) -> None:
    """A crash between a rewrite landing and the old copy's clearing leaves both copies."""
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"old" * 10)
        old_path, old_off = where(t, b"k")
        old_bytes = raw_slot(t, b"k")
        await write_one(t, b"k", b"new" * 20)
        await until(lambda: _runner(t).idle)
        image = crash_image(root, tmp_path / "image")
    with (image / old_path.name).open("r+b") as f:  # the old copy, as before its clearing
        f.seek(old_off)
        f.write(old_bytes)
    async with SSDTier(image, MiB) as t2:
        start = t2.last_start
        assert start is not None and (start.duplicates, start.blocks) == (1, 1)
        assert await read(t2, b"k") == b"new" * 20
    with (image / old_path.name).open("rb") as f:
        f.seek(old_off)
        assert f.read(8) == bytes(8)  # the losing copy was cleared


async def test_a_newest_copy_cut_short_by_a_crash_does_not_hide_the_older_one(
    root: Path, tmp_path: Path
) -> None:
    """fsync=True promises an acknowledged block survives: a later write of the key that the
    crash cut short (header on disk, payload not) must not replace it."""
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"acked" * 100)
        acked = raw_slot(t, b"k")
        acked_at = where(t, b"k")
        await write_one(t, b"k", b"newer" * 100)
        await until(lambda: _runner(t).idle)
        newer_at = where(t, b"k")
        image = crash_image(root, tmp_path / "image")
    with (image / acked_at[0].name).open("r+b") as f:
        f.seek(acked_at[1])
        f.write(acked)
    with (image / newer_at[0].name).open("r+b") as f:  # the newer payload never landed
        f.seek(newer_at[1] + HEAD_SIZE + 1 + 10)
        f.write(b"\x00" * 50)
    async with SSDTier(image, MiB) as t2:
        start = t2.last_start
        assert start is not None and start.duplicates == 1
        assert await read(t2, b"k") == b"acked" * 100


async def test_capacity_changes_at_restart_resize_the_files(root: Path) -> None:
    size = slot_size(4096)
    async with SSDTier(root, 10 * size, block_size=4096) as t:
        for i in range(10):
            await write_one(t, f"k{i}".encode(), bytes([i]) * 10)
    async with SSDTier(root, 4 * size) as t2:  # smaller: the blocks past the end go
        start = t2.last_start
        assert start is not None and (start.blocks, start.dropped) == (4, 6)
        assert sum(f.stat().st_size for f in slot_files(root)) == 4 * size
        assert {k for k in (f"k{i}".encode() for i in range(10)) if t2.contains_hint(k)} == {
            b"k0", b"k1", b"k2", b"k3"
        }
    async with SSDTier(root, 20 * size) as t3:  # larger: reserved again, blocks kept
        assert t3.usage().blocks == 4
        assert sum(f.stat().st_blocks * 512 for f in slot_files(root)) >= 20 * size
        assert await read(t3, b"k3") == bytes([3]) * 10


# -- corruption -------------------------------------------------------------------------------


def _flip_payload(b: bytearray) -> bytes:
    b[-10] ^= 0x01
    return bytes(b)


def _bad_slot_magic(b: bytearray) -> bytes:
    b[8:12] = b"XXXX"
    return bytes(b)


def _bad_version(b: bytearray) -> bytes:
    b[12] = 99
    return bytes(b)


def _bad_frame_magic(b: bytearray) -> bytes:
    b[24:28] = b"XXXX"
    return bytes(b)


def _bad_length(b: bytearray) -> bytes:
    b[32:40] = (12345).to_bytes(8, "little")
    return bytes(b)


def _older_write(b: bytearray) -> bytes:
    b[16:24] = (int.from_bytes(b[16:24], "little") - 1).to_bytes(8, "little")
    return bytes(b)


def _other_key(b: bytearray) -> bytes:
    payload = bytes(b[HEAD_SIZE + 1 :])
    seq = int.from_bytes(b[16:24], "little")
    return encode_head(b"j", seq, payload) + payload  # a whole, valid slot of another key


def _garbage(b: bytearray) -> bytes:
    return os.urandom(len(b))


def _zeros(b: bytearray) -> bytes:
    return bytes(len(b))


@pytest.mark.parametrize(
    "damage",
    [
        _flip_payload,
        _bad_slot_magic,
        _bad_version,
        _bad_frame_magic,
        _bad_length,
        _older_write,
        _other_key,
        _garbage,
        _zeros,
    ],
)
async def test_a_damaged_slot_is_a_miss_never_wrong_bytes(
    tier: SSDTier, damage: Callable[[bytearray], bytes]
) -> None:
    data = os.urandom(50_000)
    await write_one(tier, b"k", data)
    await write_one(tier, b"fine", b"neighbour")
    path, off = where(tier, b"k")
    rewrite_slot(tier, b"k", damage)
    buf = bytearray(100_000)
    with pytest.raises(BlockCorruptedError, match=r"ssd tier 'ssd'.*slots-0000"):
        await read_one(tier, b"k", memoryview(buf))
    assert await lookup_one(tier, b"k") is LookupResult.MISS  # dropped, not served again
    assert await read_one(tier, b"k", memoryview(buf)) == -1
    assert tier.usage().blocks == 1
    await until(lambda: _runner(tier).idle)
    with path.open("rb") as f:
        f.seek(off)
        assert f.read(8) == bytes(8)  # cleared: a restart does not find it either
    assert await read(tier, b"fine") == b"neighbour"
    await write_one(tier, b"k", data)  # the tier keeps working
    assert await read(tier, b"k") == data


async def test_a_truncated_slot_file_is_a_miss(root: Path) -> None:
    async with SSDTier(root, MiB, block_size=4096) as t:
        items = [(f"k{i}".encode(), bytes([i]) * 4000) for i in range(6)]
        await t.write_many(items)
        path, off = where(t, b"k5")
        with path.open("r+b") as f:  # behind the open tier's back, inside k5's slot
            f.truncate(off + HEAD_SIZE + 2 + 100)
        with pytest.raises(BlockCorruptedError, match="truncated"):
            await read(t, b"k5")
        assert await read(t, b"k0") == bytes([0]) * 4000
    async with SSDTier(root, MiB) as t2:  # the next open restores the file's reserved size
        assert await lookup_one(t2, b"k5") is LookupResult.MISS
        assert await read(t2, b"k4") == bytes([4]) * 4000


async def test_a_block_is_never_read_under_another_key_even_when_its_slot_is_reused(
    tier: SSDTier,
) -> None:
    await write_one(tier, b"a", b"A" * 1000)
    slot = tier.index.lru[b"a"]
    seq_a = tier.index.seq[slot]
    assert await remove_one(tier, b"a")
    await until(lambda: _runner(tier).idle)
    await write_one(tier, b"b", b"B" * 1000)
    assert tier.index.lru[b"b"] == slot  # the freed slot is the next one used
    assert await lookup_one(tier, b"a") is LookupResult.MISS
    assert await read_one(tier, b"a", memoryview(bytearray(1000))) == -1
    # a read planned for a's copy that reaches the slot after b took it: refused, not b's bytes
    buf = bytearray(1000)
    [result] = _read_op(tier, b"a", slot, seq_a, buf).start(_runner(tier).nowait)
    assert isinstance(result, BlockCorruptedError)  # so the caller never uses the buffer
    assert f"holds write {tier.index.seq[slot]}, the index expects {seq_a}" in str(result)
    # and the same write number with another key (a slot copied over) fails on the key
    seq_b = tier.index.seq[slot]
    [result] = _read_op(tier, b"a", slot, seq_b, buf).start(_runner(tier).nowait)
    assert isinstance(result, BlockCorruptedError) and "not b'a'" in str(result)
    assert await read(tier, b"b") == b"B" * 1000


def _read_op(tier: SSDTier, key: bytes, slot: int, seq: int, buf: bytearray) -> SlotReads:
    """A read op of ``key``'s write ``seq`` at ``slot`` (1000 bytes), planned as the tier
    plans one."""
    source = SlotSource(
        [key], [slot], [memoryview(buf)], [-1], {slot: seq}, {slot: 1000}, tier._fds,
        tier._per_file, tier._slot_size, tier.name,
    )  # fmt: skip
    return SlotReads(source, deque([0]), 1000, print)


async def test_foreign_slot_file_is_all_misses(root: Path, tmp_path: Path) -> None:
    """A slot file swapped for another tier's (same geometry, other blocks): every key of ours
    is a MISS; nothing of the other tier is served under our keys."""
    other = tmp_path / "other"
    for path, key in ((root, b"k"), (other, b"x")):
        async with SSDTier(path, MiB, block_size=4096) as t:
            await write_one(t, key, key * 100)
    (root / "checkpoint").unlink()
    shutil.copy(other / "slots-0000", root / "slots-0000")
    async with SSDTier(root, MiB) as t:
        assert await lookup_one(t, b"k") is LookupResult.MISS
        assert await read(t, b"x") == b"x" * 100  # the scan finds what the file holds


async def test_foreign_files_are_ignored_and_kept(root: Path) -> None:
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"v")
    (root / "notes.txt").write_text("mine")
    (root / "slots-x").write_bytes(b"x" * 100)
    async with SSDTier(root, MiB) as t:
        assert t.last_start is not None and t.last_start.foreign == 2
        assert await read(t, b"k") == b"v"
    assert (root / "notes.txt").read_text() == "mine"
    assert (root / "slots-x").exists()


async def test_a_symlink_planted_as_a_slot_file_is_refused(root: Path, tmp_path: Path) -> None:
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"v")
    outside = tmp_path / "outside"
    shutil.copy(root / "slots-0000", outside)
    (root / "slots-0000").unlink()
    (root / "slots-0000").symlink_to(outside)
    with pytest.raises(ConfigError, match="slots-0000"):
        await SSDTier(root, MiB).open()
    assert outside.exists()


@pytest.mark.parametrize("name", ["slots-0000", "checkpoint", "aiotier-ssd"])
async def test_a_fifo_planted_as_a_tier_file_is_refused_not_waited_on(
    root: Path, name: str
) -> None:
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"v")
    (root / name).unlink()
    os.mkfifo(root / name)  # opening it for reading would wait for a writer forever
    if name == "checkpoint":  # not a checkpoint to use: the headers are scanned
        info = await asyncio.wait_for(asyncio.to_thread(inspect_directory, root), 10)
        assert (info.source, info.blocks) == ("scan", 1)
        async with asyncio.timeout(10), SSDTier(root, MiB) as t:
            assert t.last_start is not None and t.last_start.checkpoint.startswith("unreadable")
            assert await read(t, b"k") == b"v"
        return
    with pytest.raises(TieringError, match="not a regular file"):
        await asyncio.wait_for(asyncio.to_thread(inspect_directory, root), 10)
    with pytest.raises(TieringError, match=name):
        await asyncio.wait_for(SSDTier(root, MiB).open(), 10)


async def test_a_directory_in_place_of_the_checkpoint_is_a_config_error(root: Path) -> None:
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"v")
    (root / "checkpoint").unlink()
    (root / "checkpoint").mkdir()
    with pytest.raises(ConfigError, match="cannot remove the checkpoint"):
        await SSDTier(root, MiB).open()


# -- directory and lock -----------------------------------------------------------------------


async def test_directory_is_created_with_mode_0700(root: Path) -> None:
    async with SSDTier(root / "deep" / "er", MiB, block_size=4096) as t:
        await write_one(t, b"k", b"v")
    d = root / "deep" / "er"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    marker = (d / "aiotier-ssd").read_text()
    assert marker.startswith("aiotier-ssd 2\nblock_size 4096\n")
    for f in d.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f


async def test_second_tier_on_the_same_path_is_refused(root: Path) -> None:
    async with SSDTier(root, MiB, block_size=4096) as first:
        await write_one(first, b"k", b"v")
        second = SSDTier(root, MiB, block_size=4096)
        with pytest.raises(TieringError, match="locked"):
            await second.open()
        assert await read(first, b"k") == b"v"
    async with SSDTier(root, MiB) as third:  # released on close
        assert await read(third, b"k") == b"v"


async def test_path_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        await SSDTier(f, MiB, block_size=4096).open()


async def test_foreign_non_empty_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("precious")
    with pytest.raises(ConfigError, match="not empty"):
        await SSDTier(tmp_path / "home", MiB, block_size=4096).open()
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["thesis.tex"]  # no lock


async def test_a_format_1_directory_is_refused_with_what_to_do(root: Path) -> None:
    root.mkdir()
    (root / "aiotier-ssd").write_text("aiotier-ssd 1\n")
    (root / "cf").mkdir()
    (root / "cf" / "cf4ab791c62b8d2b2109c90275287816-1c.blk").write_bytes(b"x" * 28)
    with pytest.raises(ConfigError, match=r"format 1.*delete the directory") as info:
        await SSDTier(root, MiB, block_size=4096).open()
    assert str(root) in str(info.value)
    assert (root / "cf" / "cf4ab791c62b8d2b2109c90275287816-1c.blk").exists()  # untouched
    assert slot_files(root) == []


async def test_unsupported_format_marker_is_refused(root: Path) -> None:
    root.mkdir()
    (root / "aiotier-ssd").write_text("aiotier-ssd 9\n")
    with pytest.raises(TieringError, match="format"):
        await SSDTier(root, MiB, block_size=4096).open()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permissions")
async def test_unwritable_directory_is_a_clear_error_at_open(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(TierUnavailableError, match="not writable"):
            await SSDTier(ro, MiB, block_size=4096).open()
        with pytest.raises(TierUnavailableError, match="cannot create"):
            await SSDTier(ro / "sub", MiB, block_size=4096).open()
    finally:
        ro.chmod(0o700)


async def test_read_only_filesystem_is_a_clear_error_at_open(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SSDTier(root, MiB, block_size=4096):
        pass
    real_open = os.open

    def erofs_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", erofs_open)
    with pytest.raises(TierUnavailableError, match="Read-only file system"):
        await SSDTier(root, MiB).open()


# -- budget and hand-over -------------------------------------------------------------------


async def test_eviction_follows_exact_lru_order(root: Path) -> None:
    async with SSDTier(root, 5 * slot_size(4096), block_size=4096) as t:
        for i in range(5):
            await write_one(t, f"k{i}".encode(), b"x" * 100)
        await read(t, b"k0")  # k1 is now the least recent
        await write_one(t, b"k5", b"y" * 100)
        assert [t.contains_hint(f"k{i}".encode()) for i in range(6)] == [
            True, False, True, True, True, True,
        ]  # fmt: skip
        await write_one(t, b"k6", b"y" * 100)
        assert not t.contains_hint(b"k2")
        assert t.usage().evictions == 2
        assert t.usage().blocks == 5


async def test_evicted_blocks_are_handed_over_with_their_bytes(root: Path) -> None:
    async with SSDTier(root, 3 * slot_size(4096), block_size=4096) as t:
        await t.open(TierSetup(evictions="bytes"))  # as under an engine with a tier below
        data = {f"k{i}".encode(): os.urandom(1000) for i in range(5)}
        for k, v in data.items():
            await write_one(t, k, v)
        assert t.take_evictions() == [(b"k0", data[b"k0"]), (b"k1", data[b"k1"])]
        assert t.take_evictions() == []
        await t.open(TierSetup(evictions="none"))
        await write_one(t, b"k9", b"z" * 1000)
        assert t.take_evictions() == []


async def test_evicted_block_stays_readable_until_the_tier_below_took_it(root: Path) -> None:
    async with SSDTier(root, 2 * slot_size(4096), block_size=4096) as t:
        await t.open(TierSetup(evictions="bytes"))
        await write_one(t, b"k0", b"0" * 1000)
        await write_one(t, b"k1", b"1" * 1000)
        # k0's eviction races with reads of it: they get its bytes, never a miss
        results = await asyncio.gather(
            write_one(t, b"k2", b"2" * 1000), *(read(t, b"k0") for _ in range(5))
        )
        assert results[1:] == [b"0" * 1000] * 5
        assert await lookup_one(t, b"k0") is LookupResult.HIT  # in memory, on its way down
        keys = [b"k0", b"k1", b"k2", b"absent"]
        assert t.contains_hints(keys) == [t.contains_hint(k) for k in keys]
        assert t.contains_hints(keys) == [True, True, True, False]
        assert await read(t, b"k0") == b"0" * 1000
        assert t.take_evictions() == [(b"k0", b"0" * 1000)]
        assert await lookup_one(t, b"k0") is LookupResult.MISS
        # a newer write of a block in transit supersedes the evicted bytes
        await write_one(t, b"k3", b"3" * 1000)  # evicts k1
        await write_one(t, b"k1", b"n" * 1000)  # evicts k2; k1's old bytes are no longer handed
        assert [k for k, _ in t.take_evictions()] == [b"k2"]
        assert await read(t, b"k1") == b"n" * 1000


async def test_contains_hints_agree_with_contains_hint_key_by_key(root: Path) -> None:
    """The batch answer the engine asks when a primary eviction drops clean blocks: held,
    absent and expired keys, asked in one pass as key by key."""
    async with SSDTier(root, MiB, block_size=4096) as t:
        await t.write_many([(b"a", b"a" * 10), (b"b", b"b" * 10)])
        keys = [b"a", b"b", b"absent"]
        assert t.contains_hints(keys) == [t.contains_hint(k) for k in keys] == [True, True, False]
        await t.write_many([(b"e", b"e" * 10)], [BlockMeta(expires_at=time.time() - 1)])
        keys = [b"a", b"e", b"absent"]
        assert t.contains_hints(keys) == [t.contains_hint(k) for k in keys] == [True, False, False]


async def test_batch_larger_than_the_tier_keeps_the_last_blocks(root: Path) -> None:
    async with SSDTier(root, 4 * slot_size(4096), block_size=4096) as t:
        items = [(f"k{i:02d}".encode(), bytes([i]) * 1000) for i in range(10)]
        assert await t.write_many(items) == [None] * 10
        assert {t.contains_hint(k) for k, _ in items[6:]} == {True}
        assert t.usage().blocks == 4
        for k, v in items[6:]:
            assert await read(t, k) == v


async def _reopen_and_count(root: Path) -> int:
    """Blocks a header scan finds (the checkpoint removed): what is really on disk."""
    (root / "checkpoint").unlink()
    return (await asyncio.to_thread(inspect_directory, root)).blocks


async def test_concurrent_writes_and_reads_of_the_same_keys(root: Path) -> None:
    async with SSDTier(root, MiB, block_size=4096) as t:
        keys = [f"k{i}".encode() for i in range(8)]

        async def writer(n: int) -> None:
            for r in range(20):
                k = keys[(n + r) % len(keys)]
                await write_one(t, k, k + bytes([n, r]) * (100 + r))

        async def reader() -> None:
            for r in range(50):
                k = keys[r % len(keys)]
                got = await read(t, k)
                assert got is None or got.startswith(k)

        await asyncio.gather(*(writer(n) for n in range(6)), *(reader() for _ in range(3)))
        assert t.usage().blocks == len(keys)
        for k in keys:
            got = await read(t, k)
            assert got is not None and got.startswith(k)
    assert await _reopen_and_count(root) == len(keys)


async def test_concurrent_writes_removes_and_evictions_keep_index_and_disk_in_step(
    root: Path,
) -> None:
    rng = __import__("random").Random(11)
    async with SSDTier(root, 6 * slot_size(4096), io_threads=3, block_size=4096) as t:
        keys = [f"k{i}".encode() for i in range(12)]

        async def worker(n: int) -> None:
            for _ in range(40):
                k = rng.choice(keys)
                op = rng.random()
                if op < 0.5:
                    await write_one(t, k, k + bytes([n]) * rng.randrange(10, 3000))
                elif op < 0.6:
                    await remove_one(t, k)
                elif op < 0.8:
                    await t.write_many([(k, k * 50), (rng.choice(keys), b"w" * 2000)])
                else:
                    got = await read(t, k)
                    assert got is None or got.startswith(k) or got == b"w" * 2000

        await asyncio.gather(*(worker(n) for n in range(8)))
        await until(lambda: _runner(t).idle)
        blocks = t.usage().blocks
        assert blocks <= 6
        assert sum(t.index.holds) == 0
        held = {k: await read(t, k) for k in keys if t.contains_hint(k)}
    assert await _reopen_and_count(root) == blocks
    async with SSDTier(root, 6 * slot_size(4096)) as t2:
        for k, v in held.items():
            assert await read(t2, k) == v


# -- hostile keys -----------------------------------------------------------------------------


HOSTILE = [
    b"../escape",
    b"../../../../../../tmp/escape",
    b"/etc/passwd",
    b"a\x00b",
    b"\x00",
    b"",
    b".",
    b"..",
    b"aa/../../x",
    ("é" * 512).encode(),  # 1024 bytes of unicode
    "🦀/../🐍".encode(),
    b"\xff\xfe not utf-8",
    b"CON",
    b"-rf",
    b"slots-0001",
    b"checkpoint",
]


async def test_hostile_keys_stay_inside_the_slots(root: Path, tmp_path: Path) -> None:
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    async with SSDTier(root, MiB, block_size=4096) as t:
        for i, k in enumerate(HOSTILE):
            await write_one(t, k, bytes([i]) * 10)
        for i, k in enumerate(HOSTILE):
            assert await read(t, k) == bytes([i]) * 10
        for k in HOSTILE:
            assert await remove_one(t, k)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ssd"]
    assert not Path("/tmp/escape").exists()
    assert {p.name for p in root.iterdir()} == {
        "lock", "aiotier-ssd", "checkpoint", "last-open", "slots-0000",
    }  # fmt: skip


# -- failures ---------------------------------------------------------------------------------


@pytest.fixture
def eio(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Make every ``os.pwritev`` fail with EIO while switched on."""
    real = os.pwritev
    state = {"on": False}

    def pwritev(fd: int, bufs: Any, offset: int) -> int:
        if state["on"]:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)

    def switch(on: bool) -> None:
        state["on"] = on

    return switch


async def test_a_failed_write_drops_the_older_copy_and_the_tier_goes_on(
    tier: SSDTier, root: Path, eio: Callable[[bool], None]
) -> None:
    await write_one(tier, b"old", b"1" * 1000)
    await write_one(tier, b"k", b"previous")
    size = sum(f.stat().st_size for f in slot_files(root))
    eio(True)
    with pytest.raises(TierUnavailableError, match="Input/output error") as info:
        await write_one(tier, b"k", b"newer")
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.EIO
    # the older version is gone too: no tier returns older bytes after a newer write
    assert await lookup_one(tier, b"k") is LookupResult.MISS
    assert await read(tier, b"k") is None
    errs = await tier.write_many([(b"a", b"x"), (b"b", b"y")])
    assert all(isinstance(e, TierUnavailableError) for e in errs)
    eio(False)
    await write_one(tier, b"k", b"after")
    assert await read(tier, b"k") == b"after"
    assert await read(tier, b"old") == b"1" * 1000
    assert tier.usage().blocks == 2
    assert sum(f.stat().st_size for f in slot_files(root)) == size  # never grows


async def test_a_failed_write_reports_the_older_copy_it_dropped_as_gone(
    tier: SSDTier, eio: Callable[[bool], None]
) -> None:
    await tier.open(TierSetup(evictions="keys"))  # as under an engine that reports evictions
    await tier.write_many([(b"k", b"previous"), (b"other", b"x")])
    eio(True)
    errors = await tier.write_many([(b"k", b"newer"), (b"new", b"y")])
    assert all(isinstance(e, TierUnavailableError) for e in errors)
    eio(False)
    assert tier.take_evictions() == [(b"k", None)]  # "new" never had a copy: nothing to report


async def test_a_key_written_twice_in_a_batch_holds_the_last_write(root: Path) -> None:
    async with SSDTier(root, MiB, block_size=4096) as t:
        items = [("k", b"early" * 10), (b"other", b"o"), (b"k", b"last")]
        assert await t.write_many(items) == [None, None, None]  # type: ignore[arg-type]
        assert await read(t, b"k") == b"last"
        assert await read(t, b"other") == b"o"
        assert t.usage().blocks == 2
    async with SSDTier(root, MiB, block_size=4096) as t:
        assert await read(t, b"k") == b"last"


async def test_when_the_last_write_of_a_key_fails_every_write_of_it_reports_the_failure(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doomed = b"the last write of k"
    real = os.pwritev

    def pwritev(fd: int, bufs: Any, offset: int) -> int:
        if any(bytes(b) == doomed for b in bufs):
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"before the batch")
        out = await t.write_many([(b"k", b"early"), (b"k", b"middle"), (b"k", doomed)])
        for error in out:
            assert isinstance(error, TierUnavailableError)
            assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.EIO
        assert await read(t, b"k") is None  # neither an earlier write's bytes nor the older copy
        # a last write refused before it reaches the disk: the earlier ones are not written
        out = await t.write_many([(b"k", b"early"), (b"k", b"x" * 4097)])
        assert [type(e) for e in out] == [ValueError, ValueError]
        assert await read(t, b"k") is None
    async with SSDTier(root, MiB, block_size=4096) as t:
        assert await read(t, b"k") is None


async def test_fsync_mode_syncs_each_batch_once_per_file_and_survives_restart(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    async with SSDTier(root, MiB, fsync=True, block_size=4096, io_threads=1) as t:
        await write_one(t, b"k", b"durable")
        assert len(synced) == 1
        assert await t.write_many([(f"b{i}".encode(), b"x") for i in range(10)]) == [None] * 10
        assert len(synced) == 2  # one group commit for the batch
        assert await remove_one(t, b"b0")
        assert len(synced) == 3  # a remove is durable too
    monkeypatch.undo()
    async with SSDTier(root, MiB) as t:
        assert await read(t, b"k") == b"durable"
        assert await lookup_one(t, b"b0") is LookupResult.MISS


# -- the event loop ---------------------------------------------------------------------------


async def test_cancelled_read_does_not_return_while_its_thread_writes_the_buffer(
    tier: SSDTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_one(tier, b"k", b"v" * 1000)
    entered = threading.Event()
    release = threading.Event()
    nowait = _runner(tier).nowait
    real = nowait.preadv

    def slow_preadv(*args: Any) -> int:  # on the tier's thread, before the buffer is written
        entered.set()
        assert release.wait(10)
        return real(*args)

    monkeypatch.setattr(nowait, "preadv", slow_preadv)
    buf = bytearray(1000)
    task = asyncio.ensure_future(read_one(tier, b"k", memoryview(buf)))
    await until(entered.is_set)
    task.cancel()
    for _ in range(50):
        await asyncio.sleep(0)
    assert not task.done()  # still waiting for the thread that holds the buffer
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert bytes(buf) == b"v" * 1000  # the thread finished before the caller got control back
    assert tier.index.holds[tier.index.lru[b"k"]] == 0


async def test_queued_read_cancelled_before_its_hop_is_withdrawn(root: Path) -> None:
    async with SSDTier(root, MiB, io_threads=1, block_size=4096) as t:
        await write_one(t, b"k", b"v" * 10)
        task = asyncio.ensure_future(read_one(t, b"k", memoryview(bytearray(10))))
        await asyncio.sleep(0)  # queued, the flush not yet run
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert t.index.holds[t.index.lru[b"k"]] == 0  # the withdrawn read let go of its slot
        assert await read(t, b"k") == b"v" * 10


async def test_a_read_whose_ops_wait_behind_busy_threads_lets_every_slot_go_when_cancelled(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both threads held by another read: a second read's ops wait in the queue; cancelled,
    they are taken back before any thread saw them, and every slot the read pinned is let go
    at once (no op took its blocks), while the first read still runs."""
    async with SSDTier(root, 16 * MiB, io_threads=2, block_size=BS) as t:  # two ops per read
        blocks = {b"k%d" % i: b"v%d" % i * 10 for i in range(8)}
        assert await t.write_many(list(blocks.items())) == [None] * 8
        first, second = list(blocks)[:2], list(blocks)[2:]
        nowait = _runner(t).nowait
        real = nowait.preadv
        entered: list[int] = []
        release = threading.Event()

        def held_preadv(*args: Any) -> int:
            entered.append(threading.get_ident())
            assert release.wait(10)
            return real(*args)

        monkeypatch.setattr(nowait, "preadv", held_preadv)
        bufs = [memoryview(bytearray(100)) for _ in blocks]
        busy = asyncio.ensure_future(t.read_many_into(first, bufs[:2]))
        await until(lambda: len(entered) == 2)  # each thread holds one of its blocks
        waiting = asyncio.ensure_future(t.read_many_into(second, bufs[2:]))
        await asyncio.sleep(0)  # its ops queued behind the busy threads
        assert all(t.index.holds[t.index.lru[k]] == 1 for k in second)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert [t.index.holds[t.index.lru[k]] for k in second] == [0] * 6
        release.set()
        assert await asyncio.wait_for(busy, 10) == [len(blocks[k]) for k in first]
        assert sum(t.index.holds) == 0
        for k, v in blocks.items():
            assert await read(t, k) == v


async def test_a_read_s_free_thread_reads_the_blocks_a_held_thread_has_not_reached(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ops of one read share its blocks: while one thread is held on its first block, the
    other reads every other block of the batch (its own and the held op's), so the threads of
    a batch end together however unevenly they run. Every answer lands at its key and every
    pin is let go."""
    async with SSDTier(root, 16 * MiB, io_threads=2, block_size=BS) as t:
        blocks = {b"b%02d" % i: os.urandom(1000 + i) for i in range(16)}
        assert await t.write_many(list(blocks.items())) == [None] * 16
        nowait = _runner(t).nowait
        real = nowait.preadv
        lock = threading.Lock()
        held = threading.Event()
        release = threading.Event()
        reads: dict[int, int] = {}

        def preadv(*args: Any) -> int:
            me = threading.get_ident()
            with lock:
                first = not held.is_set()
                held.set()
                reads[me] = reads.get(me, 0) + 1
            if first:
                assert release.wait(10)
            return real(*args)

        monkeypatch.setattr(nowait, "preadv", preadv)
        keys = list(blocks)
        bufs = [memoryview(bytearray(2000)) for _ in keys]
        task = asyncio.ensure_future(t.read_many_into(keys, bufs))
        await until(lambda: sum(reads.values()) == 16)  # all but the held block: read
        assert sorted(reads.values()) == [1, 15]
        assert not task.done()
        release.set()
        out = await asyncio.wait_for(task, 10)
        assert out == [len(v) for v in blocks.values()]
        assert [bytes(b[: len(v)]) for b, v in zip(bufs, blocks.values(), strict=True)] == list(
            blocks.values()
        )
        assert sum(t.index.holds) == 0


async def test_no_blocking_call_on_the_event_loop(root: Path) -> None:
    t = SSDTier(root, 16 * MiB, block_size=BS)
    with blockbuster_ctx():
        await t.open()
        await write_one(t, b"k", os.urandom(100_000))
        await t.write_many([(f"b{i}".encode(), os.urandom(300_000)) for i in range(20)])
        assert await lookup_one(t, b"k") is LookupResult.HIT
        out = await t.read_many_into(
            [b"k", b"b19"], [memoryview(bytearray(400_000)) for _ in range(2)]
        )
        assert out == [100_000, 300_000]
        assert await remove_one(t, b"k")
        await t.aclose()
        await t.open()  # from the checkpoint
        assert t.usage().blocks == 20
        await t.aclose()


def _drop_cached_pages(path: Path, offset: int, length: int) -> None:
    """Evict a range of ``path`` from the page cache (clean pages only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


async def _simulate_page_cache(
    tier: SSDTier,
    monkeypatch: pytest.MonkeyPatch,
    blocks: dict[bytes, bytes],
    cached: dict[bytes, int],
) -> list[tuple[str, bytes]]:
    """Read ``blocks`` in one op with the page cache simulated: a key in ``cached`` has only
    its first ``cached[key]`` bytes in memory. The order of non-blocking probes ("start") and
    of reads that wait for the disk ("complete")."""
    keys = list(blocks)
    bufs = [bytearray(len(v)) for v in blocks.values()]
    key_of_buf = {id(b): k for k, b in zip(keys, bufs, strict=True)}
    nowait = _runner(tier).nowait
    real_nowait = nowait.preadv
    order: list[tuple[str, bytes]] = []

    def preadv_nowait(fd: int, views: list[memoryview], offset: int) -> int:
        key = key_of_buf[id(views[1].obj)]
        order.append(("start", key))
        if key not in cached:
            return real_nowait(fd, views, offset)
        return os.preadv(fd, _first_bytes(views, cached[key]), offset) if cached[key] else 0

    real_read = ops.read_exact_into

    def read_exact_into(fd: int, views: list[memoryview], offset: int) -> int:
        order.append(("complete", key_of_buf[id(views[-1].obj)]))
        return real_read(fd, views, offset)

    monkeypatch.setattr(nowait, "preadv", preadv_nowait)
    monkeypatch.setattr(ops, "read_exact_into", read_exact_into)
    monkeypatch.setattr(tier, "_parts", lambda n, runner: 1)  # one op: the order is exact
    got = await tier.read_many_into(keys, [memoryview(b) for b in bufs])
    assert got == [len(v) for v in blocks.values()]
    assert [bytes(b) for b in bufs] == list(blocks.values())
    return order


async def test_scattered_cold_blocks_are_read_after_the_warm_ones(
    tier: SSDTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k1 wholly on disk, k3 cached for its first 70,000 bytes, the blocks far apart: every
    block is probed first, then the cold ones are advised together and read, each from where
    its cache ended."""
    blocks = {f"k{i}".encode(): os.urandom(300_000) for i in range(5)}
    for i, (k, v) in enumerate(blocks.items()):
        await write_one(tier, k, v)
        for j in range(3):  # blocks of other keys between them
            await write_one(tier, f"filler-{i}-{j}".encode(), b"f")
    assert all(b - a > 3 for a, b in pairwise(tier.index.lru[k] for k in blocks))
    order = await _simulate_page_cache(tier, monkeypatch, blocks, {b"k1": 0, b"k3": 70_000})
    assert order == [("start", k) for k in blocks] + [("complete", b"k1"), ("complete", b"k3")]


async def test_a_cold_forward_run_is_read_in_order_without_probing(
    tier: SSDTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks in neighbouring slots, cold from k1 on: the rest of the op is read in file order
    with plain reads, so the kernel's readahead streams it (no probe, no advice)."""
    blocks = {f"k{i}".encode(): os.urandom(300_000) for i in range(5)}
    await tier.write_many(list(blocks.items()))
    blocks = {k: blocks[k] for k in sorted(blocks, key=lambda k: tier.index.lru[k])}
    first, second, *rest = blocks
    order = await _simulate_page_cache(tier, monkeypatch, blocks, {second: 0})
    assert order == [("start", first), ("start", second)] + [
        ("complete", k) for k in (second, *rest)
    ]


async def test_while_the_tier_reads_from_the_disk_a_batch_is_one_stream_in_file_order(
    tier: SSDTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe found the disk a moment ago: the next batch goes to one thread and is read in
    file order, unprobed (one stream for the kernel's readahead), whatever order it came in."""
    blocks = {f"k{i}".encode(): os.urandom(300_000) for i in range(6)}
    await tier.write_many(list(blocks.items()))
    probe = _runner(tier).nowait
    probe.found_at = time.monotonic()
    probe.resting_until = probe.found_at + 60
    assert tier._parts(64, _runner(tier)) == 1
    in_file_order = sorted(blocks, key=lambda k: tier.index.lru[k])
    shuffled = {k: blocks[k] for k in reversed(in_file_order)}
    order = await _simulate_page_cache(tier, monkeypatch, shuffled, {})
    assert order == [("complete", k) for k in in_file_order]


def _first_bytes(views: list[memoryview], n: int) -> list[memoryview]:
    """The first ``n`` bytes of ``views`` (the part a partly cached file has in memory)."""
    out: list[memoryview] = []
    for v in views:
        if n <= 0:
            break
        out.append(v[:n])
        n -= min(n, v.nbytes)
    return out


async def test_really_cold_blocks_read_back_exactly(tier: SSDTier, root: Path) -> None:
    blocks = {f"k{i}".encode(): os.urandom(300_000) for i in range(6)}
    await tier.write_many(list(blocks.items()))
    for k in (b"k1", b"k3", b"k4"):
        path, off = where(tier, k)
        _drop_cached_pages(path, off, slot_size(BS))
    keys = list(blocks)
    bufs = [bytearray(300_000) for _ in keys]
    got = await tier.read_many_into(keys, [memoryview(b) for b in bufs])
    assert got == [300_000] * len(keys)
    assert [bytes(b) for b in bufs] == list(blocks.values())


async def test_reads_work_where_the_file_system_refuses_rwf_nowait(
    tier: SSDTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_one(tier, b"k", b"v" * 5000)
    real_preadv = os.preadv
    refused: list[int] = []

    def preadv(fd: int, views: Any, offset: int, flags: int = 0) -> int:
        if flags:
            refused.append(flags)
            raise OSError(errno.EOPNOTSUPP, "not supported")
        return real_preadv(fd, views, offset)

    nowait: NowaitProbe = _runner(tier).nowait
    monkeypatch.setattr(nowait, "flag", getattr(os, "RWF_NOWAIT", 0) or 8)
    monkeypatch.setattr(os, "preadv", preadv)
    assert await read(tier, b"k") == b"v" * 5000
    assert await read(tier, b"k") == b"v" * 5000
    assert len(refused) == 1  # asked once, then every read blocks
    assert nowait.flag == 0


# -- inspect ----------------------------------------------------------------------------------


def test_inspect_reads_a_directory_without_changing_it(root: Path) -> None:
    async def fill() -> None:
        async with SSDTier(root, MiB, block_size=4096) as t:
            await t.write_many([(b"a", b"1" * 100), (b"b", b"2" * 200)])

    asyncio.run(fill())
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    info = inspect_directory(root)
    assert (info.format, info.blocks, info.source, info.block_size) == (2, 2, "checkpoint", 4096)
    assert info.slots == MiB // slot_size(4096)
    assert info.free_slots == info.slots - 2
    assert info.allocated_bytes >= info.file_bytes == info.slots * slot_size(4096)
    assert info.last_start is not None and info.last_start["after"] == "new"
    (root / "checkpoint").unlink()
    info = inspect_directory(root)
    assert (info.blocks, info.source, info.torn) == (2, "scan", 0)
    after = {p.name: p.read_bytes() for p in root.iterdir()}
    before.pop("checkpoint")
    assert after == before


def test_the_nowait_probe_rests_after_finding_the_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe that found part of a block on disk sends the next reads straight to the disk
    path (no syscall) for ``rest`` seconds, then probes again."""
    calls: list[int] = []
    cached = {"bytes": 10}

    def preadv(fd: int, views: Any, offset: int, flags: int = 0) -> int:
        calls.append(flags)
        return cached["bytes"]

    monkeypatch.setattr(os, "preadv", preadv)
    clock = {"now": 100.0}
    monkeypatch.setattr("aiotier.tiers._ssd.syscalls.time.monotonic", lambda: clock["now"])
    probe = NowaitProbe(flag=8)
    view = [memoryview(bytearray(10)), memoryview(bytearray(90))]
    assert probe.preadv(3, view, 0) == 10  # 10 of 100 bytes cached: it found the disk
    assert probe.preadv(3, view, 0) == 0  # resting: no syscall
    assert len(calls) == 1
    clock["now"] += probe.rest + 0.001
    cached["bytes"] = 100
    assert probe.preadv(3, view, 0) == 100  # probing again; all cached: no rest
    assert probe.preadv(3, view, 0) == 100
    assert len(calls) == 3
    # reads that keep going to the disk path keep it resting, up to rest_max after the find
    cached["bytes"] = 0
    assert probe.preadv(3, view, 0) == 0
    found = clock["now"]
    while clock["now"] < found + probe.rest_max + 1:
        clock["now"] += probe.rest / 2
        probe.rest_on()
        assert probe.resting == (clock["now"] < found + probe.rest_max)


async def test_a_write_acknowledged_while_the_tier_closes_survives_the_restart(
    tmp_path: Path,
) -> None:
    # the second write waits for its key's turn while aclose() drains and saves the index: it
    # must either land before the checkpoint or fail, never be acknowledged and then lost
    for trial in range(20):
        root = str(tmp_path / f"t{trial}")
        tier = SSDTier(root, 64 * 8192, block_size=4096, fsync=True)
        await tier.open()
        first = asyncio.ensure_future(write_one(tier, b"k", b"2" * 4096))
        second = asyncio.ensure_future(write_one(tier, b"k", b"3" * 4096))
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(tier.aclose())
        _, acked, _ = await asyncio.gather(first, second, closing, return_exceptions=True)
        again = SSDTier(root, 64 * 8192, block_size=4096, fsync=True)
        await again.open()
        try:
            buf = bytearray(4096)
            assert await read_one(again, b"k", memoryview(buf)) == 4096
            if acked is None:  # the second write returned success
                assert bytes(buf[:1]) == b"3", f"trial {trial}: an acknowledged write was lost"
            else:
                assert isinstance(acked, TierUnavailableError)
        finally:
            await again.aclose()


async def test_a_batch_that_rewrites_a_key_never_hands_its_older_copy_down(
    tmp_path: Path,
) -> None:
    tier = SSDTier(str(tmp_path / "t"), 2 * 8192, block_size=4096)  # two slots
    await tier.open(TierSetup(evictions="bytes"))  # as under an engine with a tier below
    try:
        await write_one(tier, b"K", b"old" * 10)
        await write_one(tier, b"A", b"a" * 10)  # full; K is the least recent
        if await tier.write_many([(b"K", b"new" * 10), (b"X", b"x" * 10)]) != [None, None]:
            pytest.fail("the batch failed")
        buf = bytearray(4096)
        if await read_one(tier, b"K", memoryview(buf)) != 30 or buf[:30] != b"new" * 10:
            pytest.fail("the tier does not hold the new K")
        handed = {k: bytes(v or b"") for k, v in tier.take_evictions()}
        assert handed.get(b"K", b"new" * 10) == b"new" * 10, "K's older copy was handed down"
    finally:
        await tier.aclose()


async def test_start_reads_lands_by_callback_and_leaves_a_key_on_its_way_down_to_read_many_into(
    root: Path,
) -> None:
    async with SSDTier(root, 2 * slot_size(4096), block_size=4096) as t:
        await t.open(TierSetup(evictions="bytes"))
        await write_one(t, b"k0", b"0" * 1000)
        await write_one(t, b"k1", b"1" * 1000)
        got: list[list[int | Exception] | None] = []
        bufs = [memoryview(bytearray(4096)), memoryview(bytearray(10))]
        stop = t.start_reads([b"k1", b"k1"], bufs, got.append)
        assert stop is not None and got == []  # on the threads: it ends on a later loop turn
        await until(lambda: bool(got))
        assert isinstance(got[0], list) and got[0][0] == 1000
        assert isinstance(got[0][1], ValueError)  # a buffer too short, as read_many_into says
        assert bytes(bufs[0][:1000]) == b"1" * 1000
        assert t.index.holds[t.index.lru[b"k1"]] == 0
        await write_one(t, b"k2", b"2" * 1000)  # evicts k0: its bytes wait for the tier below
        assert t.start_reads([b"k0"], [memoryview(bytearray(4096))], got.append) is None
        assert len(got) == 1  # nothing started: read_many_into reads it from the hand-over
        assert await read(t, b"k0") == b"0" * 1000
