"""SSDTier on real temporary directories: format, restart, corruption, budget, faults, safety."""

# The tests look at the tier's directory behind its back, with plain blocking file calls.
# ruff: noqa: ASYNC240

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import stat
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from blockbuster import blockbuster_ctx

from aiotier._types import LookupResult
from aiotier.errors import BlockCorruptedError, ConfigError, TieringError, TierUnavailableError
from aiotier.tiers import SSDTier
from aiotier.tiers._ssd.hops import HopRunner
from aiotier.tiers._ssd.ops import ReadOp
from aiotier.tiers._ssd.syscalls import NowaitProbe
from aiotier.tiers.framing import HEADER, encode_header
from aiotier.tiers.ssd import block_relpath, key_digest, scan_directory

MiB = 1 << 20


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


def block_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("??/*.blk"))


def temp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(".tmp-*"))


def file_of(root: Path, key: bytes, payload_len: int) -> Path:
    size = HEADER.size + len(key) + payload_len
    return root / block_relpath(key_digest(key), size)


async def read(tier: SSDTier, key: bytes, cap: int = 2 * MiB) -> bytes | None:
    buf = bytearray(cap)
    n = await tier.read_into(key, memoryview(buf))
    return None if n < 0 else bytes(buf[:n])


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``cond`` on the loop until it holds (a deadline, never a fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ssd"


@pytest.fixture
async def tier(root: Path) -> AsyncIterator[SSDTier]:
    t = SSDTier(root, 64 * MiB)
    await t.open()
    try:
        yield t
    finally:
        await t.aclose()


# -- basics -----------------------------------------------------------------------------------


async def test_write_then_read_returns_the_same_bytes(tier: SSDTier) -> None:
    data = os.urandom(300_000)
    await tier.write(b"k", data)
    assert await tier.lookup(b"k") is LookupResult.HIT
    assert tier.contains_hint(b"k") is True
    assert await read(tier, b"k") == data
    assert await tier.lookup(b"other") is LookupResult.MISS
    assert await tier.read_into(b"other", memoryview(bytearray(10))) == -1


async def test_memoryview_data_and_empty_block(tier: SSDTier) -> None:
    arena = bytearray(os.urandom(4096))
    await tier.write(b"view", memoryview(arena)[1024:2048])
    await tier.write(b"empty", b"")
    assert await read(tier, b"view") == bytes(arena[1024:2048])
    assert await read(tier, b"empty") == b""


async def test_read_into_a_short_buffer_is_a_value_error(tier: SSDTier) -> None:
    await tier.write(b"k", b"x" * 100)
    with pytest.raises(ValueError, match="100 bytes"):
        await tier.read_into(b"k", memoryview(bytearray(99)))
    assert await read(tier, b"k") == b"x" * 100


async def test_overwrite_with_another_size_leaves_one_file(tier: SSDTier, root: Path) -> None:
    await tier.write(b"k", b"a" * 100)
    await tier.write(b"k", b"b" * 5000)
    assert await read(tier, b"k") == b"b" * 5000
    assert block_files(root) == [file_of(root, b"k", 5000)]
    await tier.write(b"k", b"c" * 5000)
    assert await read(tier, b"k") == b"c" * 5000
    assert tier.usage().blocks == 1
    assert tier.usage().bytes_used == HEADER.size + 1 + 5000


async def test_remove(tier: SSDTier, root: Path) -> None:
    await tier.write(b"k", b"data")
    assert await tier.remove(b"k") is True
    assert await tier.remove(b"k") is False
    assert await tier.lookup(b"k") is LookupResult.MISS
    assert block_files(root) == []
    assert tier.usage().bytes_used == 0


async def test_file_carries_the_shared_frame(tier: SSDTier, root: Path) -> None:
    await tier.write(b"key", b"payload")
    [f] = block_files(root)
    assert f.read_bytes() == encode_header(b"key", b"payload") + b"payload"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600


async def test_file_names_are_pinned(tier: SSDTier, root: Path) -> None:
    """Existing directories stay readable: a block's name is BLAKE2b-128 of its key, in hex,
    and the frame's size in hex (here 24 + 3 + 1 bytes)."""
    await tier.write(b"abc", b"v")
    assert block_files(root) == [root / "cf" / "cf4ab791c62b8d2b2109c90275287816-1c.blk"]
    assert block_relpath(key_digest(b"abc"), 28) == "cf/cf4ab791c62b8d2b2109c90275287816-1c.blk"


@pytest.mark.parametrize("size", [HEADER.size, 28, 0x10_0000, (1 << 40) + 3])
def test_block_names_parse_back_to_digest_and_size(size: int) -> None:
    from aiotier.tiers._ssd.layout import parse_block_name

    digest = key_digest(b"key-%d" % size)
    shard, name = block_relpath(digest, size).split("/")
    assert shard == digest.hex()[:2]
    assert parse_block_name(name, shard) == (digest, size)


async def test_read_many_into_one_bad_block_does_not_fail_its_neighbours(
    tier: SSDTier, root: Path
) -> None:
    blocks = {f"k{i}".encode(): os.urandom(10_000 + i) for i in range(20)}
    errs = await tier.write_many(list(blocks.items()))
    assert errs == [None] * 20
    bad = file_of(root, b"k3", len(blocks[b"k3"]))
    raw = bytearray(bad.read_bytes())
    raw[-1] ^= 0xFF
    bad.write_bytes(bytes(raw))
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
    assert await tier.lookup(b"k3") is LookupResult.MISS


async def test_str_keys_are_their_utf8_bytes(tier: SSDTier) -> None:
    await tier.write("é", b"1")  # type: ignore[arg-type]
    assert await read(tier, "é".encode()) == b"1"


async def test_keys_longer_than_the_limit_are_refused(tier: SSDTier) -> None:
    with pytest.raises(ValueError, match="1024"):
        await tier.write(b"k" * 1025, b"x")


async def test_block_larger_than_capacity_is_refused(root: Path) -> None:
    async with SSDTier(root, 1000) as t:
        with pytest.raises(ValueError, match="capacity"):
            await t.write(b"k", b"x" * 1000)
        assert t.usage().blocks == 0


def test_constructor_validates() -> None:
    with pytest.raises(ConfigError):
        SSDTier("/tmp/x", 0)
    with pytest.raises(ConfigError):
        SSDTier("/tmp/x", 10, io_threads=0)
    assert SSDTier("/tmp/x", 10).name == "ssd"
    assert SSDTier("/tmp/x", 10, name="disk").name == "disk"


async def test_operations_after_aclose_are_unavailable(root: Path) -> None:
    t = SSDTier(root, MiB)
    await t.open()
    await t.write(b"k", b"v")
    await t.aclose()
    with pytest.raises(TierUnavailableError):
        await t.read_into(b"k", memoryview(bytearray(8)))
    with pytest.raises(TierUnavailableError):
        await t.write(b"k", b"v")
    await t.aclose()  # idempotent


# -- restart ----------------------------------------------------------------------------------


async def test_restart_keeps_every_block(root: Path) -> None:
    blocks = {f"block-{i}".encode(): os.urandom(1000 * (i % 7) + i) for i in range(300)}
    async with SSDTier(root, 64 * MiB) as t:
        assert await t.write_many(list(blocks.items())) == [None] * len(blocks)
        before = t.usage()
    async with SSDTier(root, 64 * MiB) as t2:
        assert t2.usage() == before
        assert t2.last_scan is not None
        assert t2.last_scan.blocks == len(blocks)
        for k, v in blocks.items():
            assert await t2.lookup(k) is LookupResult.HIT
            assert await read(t2, k) == v


async def test_restart_keeps_exact_lru_order_including_reads(root: Path) -> None:
    size = HEADER.size + 2 + 1000
    async with SSDTier(root, 64 * MiB) as t:
        for i in range(8):
            await t.write(f"k{i}".encode(), bytes([i]) * 1000)
        assert await read(t, b"k1") is not None
        assert await read(t, b"k0") is not None
    # reopen with room for 4: the 4 most recently used survive
    async with SSDTier(root, 4 * size) as t2:
        assert t2.last_scan is not None
        assert t2.last_scan.evicted == 4
        survivors = {k for k in (f"k{i}".encode() for i in range(8)) if t2.contains_hint(k)}
        assert survivors == {b"k6", b"k7", b"k1", b"k0"}
        assert t2.evictions == 4
        # and the order within the survivors holds: the next write evicts k6
        await t2.write(b"new", b"x" * 999)
        assert not t2.contains_hint(b"k6")
        assert t2.contains_hint(b"k7")


async def test_after_a_crash_recency_comes_from_write_times(root: Path, tmp_path: Path) -> None:
    size = HEADER.size + 2 + 100
    async with SSDTier(root, 64 * MiB) as t:
        for i in range(6):
            await t.write(f"k{i}".encode(), b"x" * 100)
        await read(t, b"k0")  # read recency is in memory only until a clean close
        image = tmp_path / "image"
        shutil.copytree(root, image)  # the directory as a crash would leave it
    assert not (image / "recency").exists()
    async with SSDTier(image, 3 * size) as t2:
        survivors = {k for k in (f"k{i}".encode() for i in range(6)) if t2.contains_hint(k)}
        assert survivors == {b"k3", b"k4", b"k5"}


async def test_damaged_recency_file_falls_back_to_write_times(root: Path) -> None:
    size = HEADER.size + 2 + 100
    async with SSDTier(root, 64 * MiB) as t:
        for i in range(6):
            await t.write(f"k{i}".encode(), b"x" * 100)
        await read(t, b"k0")
    _rewrite(root / "recency", _flip_payload)
    async with SSDTier(root, 3 * size) as t2:
        survivors = {k for k in (f"k{i}".encode() for i in range(6)) if t2.contains_hint(k)}
        assert survivors == {b"k3", b"k4", b"k5"}


async def test_crash_image_is_recovered_temporaries_and_torn_files_removed(
    root: Path, tmp_path: Path
) -> None:
    blocks = {f"k{i}".encode(): os.urandom(5000) for i in range(10)}
    async with SSDTier(root, 64 * MiB) as t:
        await t.write_many(list(blocks.items()))
        # an image of the directory as a crash would leave it (lock file, no close)
        image = tmp_path / "image"
        shutil.copytree(root, image)
    shard = image / "00"
    (shard / ".tmp-deadbeef-1").write_bytes(b"half a block")
    torn = file_of(image, b"k4", 5000)
    with torn.open("r+b") as f:
        f.truncate(100)
    async with SSDTier(image, 64 * MiB) as t2:
        assert t2.last_scan is not None
        assert t2.last_scan.temporaries == 1
        assert t2.last_scan.torn == 1
        assert temp_files(image) == []
        assert not torn.exists()
        assert await t2.lookup(b"k4") is LookupResult.MISS
        for k, v in blocks.items():
            if k != b"k4":
                assert await read(t2, k) == v


async def test_duplicate_files_of_one_key_keep_the_newest(root: Path) -> None:
    async with SSDTier(root, 64 * MiB) as t:
        await t.write(b"k", b"old" * 10)
    old = file_of(root, b"k", 30)
    kept = old.read_bytes()
    async with SSDTier(root, 64 * MiB) as t:
        await t.write(b"k", b"new" * 20)
    # a crash between the rename of the new file and the unlink of the old one
    old.write_bytes(kept)
    st = file_of(root, b"k", 60).stat()
    os.utime(old, ns=(st.st_mtime_ns - 10**9, st.st_mtime_ns - 10**9))
    async with SSDTier(root, 64 * MiB) as t:
        assert t.last_scan is not None
        assert t.last_scan.duplicates == 1
        assert not old.exists()
        assert await read(t, b"k") == b"new" * 20


async def test_restart_with_smaller_capacity_evicts_down_to_budget(root: Path) -> None:
    async with SSDTier(root, 64 * MiB) as t:
        for i in range(20):
            await t.write(f"k{i:02d}".encode(), b"x" * 10_000)
    async with SSDTier(root, 50_000) as t2:
        assert t2.usage().bytes_used <= 50_000
        assert len(block_files(root)) == t2.usage().blocks == 4
        assert all(t2.contains_hint(f"k{i:02d}".encode()) for i in range(16, 20))


# -- corruption -------------------------------------------------------------------------------


def _rewrite(path: Path, fn: Callable[[bytearray], bytes]) -> None:
    path.write_bytes(fn(bytearray(path.read_bytes())))


def _flip_payload(b: bytearray) -> bytes:
    b[-10] ^= 0x01
    return bytes(b)


def _bad_magic(b: bytearray) -> bytes:
    b[0:4] = b"XXXX"
    return bytes(b)


def _bad_version(b: bytearray) -> bytes:
    b[4] = 99
    return bytes(b)


def _bad_length(b: bytearray) -> bytes:
    b[8:16] = (12345).to_bytes(8, "little")
    return bytes(b)


def _other_key(b: bytearray) -> bytes:
    payload = bytes(b[HEADER.size + 1 :])
    frame = encode_header(b"j", payload) + payload  # same sizes, another key: a foreign block
    return frame


def _garbage(b: bytearray) -> bytes:
    return os.urandom(len(b))


@pytest.mark.parametrize(
    "damage", [_flip_payload, _bad_magic, _bad_version, _bad_length, _other_key, _garbage]
)
async def test_damaged_file_is_corrupted_never_wrong_bytes(
    tier: SSDTier, root: Path, damage: Callable[[bytearray], bytes]
) -> None:
    data = os.urandom(50_000)
    await tier.write(b"k", data)
    await tier.write(b"fine", b"neighbour")
    path = file_of(root, b"k", len(data))
    _rewrite(path, damage)
    buf = bytearray(100_000)
    with pytest.raises(BlockCorruptedError, match="ssd"):
        await tier.read_into(b"k", memoryview(buf))
    assert not path.exists()  # dropped, not served again
    assert await tier.lookup(b"k") is LookupResult.MISS
    assert await tier.read_into(b"k", memoryview(buf)) == -1
    assert tier.usage().blocks == 1
    assert await read(tier, b"fine") == b"neighbour"
    await tier.write(b"k", data)  # the tier keeps working
    assert await read(tier, b"k") == data


async def test_truncated_file_is_corrupted(tier: SSDTier, root: Path) -> None:
    await tier.write(b"k", b"z" * 10_000)
    path = file_of(root, b"k", 10_000)
    with path.open("r+b") as f:
        f.truncate(HEADER.size + 1 + 5000)
    with pytest.raises(BlockCorruptedError, match="5000"):
        await read(tier, b"k")
    assert not path.exists()
    with path.open("wb") as f:  # shorter than a header
        f.write(b"AT")
    await tier.write(b"k", b"z" * 10_000)
    with path.open("r+b") as f:
        f.truncate(3)
    with pytest.raises(BlockCorruptedError, match="shorter than a header"):
        await read(tier, b"k")


def _drop_cached_pages(path: Path, offset: int = 0) -> None:
    """Evict ``path``'s pages from ``offset`` on from the page cache (clean pages only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, offset, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _page_cache_droppable(scratch: Path) -> bool:
    """Whether dropped pages stay dropped here (not on tmpfs); probed on a file of its own,
    since a non-blocking read of a dropped page starts reading it back."""
    scratch.write_bytes(os.urandom(256 * 1024))
    _drop_cached_pages(scratch)
    fd = os.open(scratch, os.O_RDONLY)
    try:
        return os.preadv(fd, [bytearray(256 * 1024)], 0, os.RWF_NOWAIT) < 256 * 1024
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@pytest.mark.parametrize("cached_prefix", [0, 64 * 1024])
async def test_reads_that_wait_for_the_disk_finish_after_the_warm_ones(
    tier: SSDTier, root: Path, monkeypatch: pytest.MonkeyPatch, cached_prefix: int
) -> None:
    """Cold blocks (none or only part of the file cached) are read after the hop's warm ones,
    advised WILLNEED together, and return exactly their bytes."""
    if not getattr(os, "RWF_NOWAIT", 0):
        pytest.skip("no RWF_NOWAIT on this platform: every read blocks")
    if not _page_cache_droppable(root.parent / "probe"):
        pytest.skip("the page cache cannot be dropped on this file system")
    blocks = {f"k{i}".encode(): os.urandom(300_000) for i in range(6)}
    await tier.write_many(list(blocks.items()))
    cold = [b"k1", b"k3", b"k4"]
    for k in cold:
        _drop_cached_pages(file_of(root, k, 300_000), cached_prefix)
    completed: list[bytes] = []
    real_complete = ReadOp.complete

    def complete(op: Any) -> int:
        completed.append(op.key)
        return real_complete(op)

    monkeypatch.setattr(ReadOp, "complete", complete)
    keys = list(blocks)
    bufs = [bytearray(300_000) for _ in keys]
    got = await tier.read_many_into(keys, [memoryview(b) for b in bufs])
    assert got == [300_000] * len(keys)
    assert [bytes(b) for b in bufs] == list(blocks.values())
    assert set(completed) <= set(cold)
    if not completed:  # the kernel kept or read back the pages before the tier looked
        pytest.skip("no block was cold by the time it was read")


async def test_cold_and_partly_cached_reads_continue_where_the_cache_ended(
    tier: SSDTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page cache simulated: k1 wholly on disk, k3 cached for its first 70,000 bytes."""
    blocks = {f"k{i}".encode(): os.urandom(300_000) for i in range(5)}
    await tier.write_many(list(blocks.items()))
    keys = list(blocks)
    bufs = [bytearray(300_000) for _ in keys]
    key_of_buf = {id(b): k for k, b in zip(keys, bufs, strict=True)}
    nowait = _runner(tier).nowait
    real_nowait = nowait.preadv
    cached = {b"k1": 0, b"k3": 70_000}
    order: list[tuple[str, bytes]] = []

    def preadv_nowait(fd: int, views: list[memoryview], offset: int) -> int:
        key = key_of_buf[id(views[1].obj)]
        order.append(("start", key))
        if key not in cached:
            return real_nowait(fd, views, offset)
        return os.preadv(fd, _first_bytes(views, cached[key]), offset) if cached[key] else 0

    real_complete = ReadOp.complete

    def complete(op: Any) -> int:
        order.append(("complete", op.key))
        return real_complete(op)

    monkeypatch.setattr(nowait, "preadv", preadv_nowait)
    monkeypatch.setattr(ReadOp, "complete", complete)
    got = await tier.read_many_into(keys, [memoryview(b) for b in bufs])
    assert got == [300_000] * len(keys)
    assert [bytes(b) for b in bufs] == list(blocks.values())
    assert order == [("start", k) for k in keys] + [("complete", b"k1"), ("complete", b"k3")]


def _runner(tier: SSDTier) -> HopRunner:
    """The open tier's runner: the seam to its threads (``SSDTier.runner``)."""
    assert tier.runner is not None
    return tier.runner


def _first_bytes(views: list[memoryview], n: int) -> list[memoryview]:
    """The first ``n`` bytes of ``views`` (the part a partly cached file has in memory)."""
    out: list[memoryview] = []
    for v in views:
        if n <= 0:
            break
        out.append(v[:n])
        n -= min(n, v.nbytes)
    return out


async def test_reads_work_where_the_file_system_refuses_rwf_nowait(
    tier: SSDTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    await tier.write(b"k", b"v" * 5000)
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


async def test_file_deleted_behind_the_tiers_back_is_absent(tier: SSDTier, root: Path) -> None:
    await tier.write(b"k", b"v" * 10)
    file_of(root, b"k", 10).unlink()
    assert await tier.read_into(b"k", memoryview(bytearray(10))) == -1
    assert await tier.lookup(b"k") is LookupResult.MISS
    assert tier.usage().blocks == 0


async def test_foreign_files_are_ignored_and_kept(root: Path) -> None:
    async with SSDTier(root, MiB) as t:
        await t.write(b"k", b"v")
    (root / "notes.txt").write_text("mine")
    (root / "ab" / "stray.bin").write_bytes(b"x" * 100)
    (root / "ab" / ("0" * 32 + "-10.blk")).write_bytes(b"wrong shard")
    os.symlink("/etc/hostname", root / "cd" / ("cd" + "0" * 30 + "-9.blk"))
    async with SSDTier(root, MiB) as t:
        assert t.last_scan is not None
        assert t.last_scan.foreign == 3
        assert t.usage().blocks == 1
        assert await read(t, b"k") == b"v"
    assert (root / "notes.txt").read_text() == "mine"
    assert (root / "ab" / "stray.bin").exists()


async def test_symlink_planted_at_a_block_path_is_never_followed(
    tier: SSDTier, root: Path, tmp_path: Path
) -> None:
    await tier.write(b"k", b"v" * 10)
    outside = tmp_path / "outside"
    outside.write_bytes(encode_header(b"k", b"w" * 10) + b"w" * 10)
    path = file_of(root, b"k", 10)
    path.unlink()
    path.symlink_to(outside)
    with pytest.raises(TierUnavailableError):  # ELOOP from O_NOFOLLOW: a fault, not bytes
        await read(tier, b"k")
    assert outside.exists()


# -- directory and lock -----------------------------------------------------------------------


async def test_directory_is_created_with_mode_0700(root: Path) -> None:
    async with SSDTier(root / "deep" / "er", MiB) as t:
        await t.write(b"k", b"v")
    d = root / "deep" / "er"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "00").stat().st_mode) == 0o700
    assert (d / "aiotier-ssd").read_text() == "aiotier-ssd 1\n"


async def test_second_tier_on_the_same_path_is_refused(root: Path) -> None:
    async with SSDTier(root, MiB) as first:
        await first.write(b"k", b"v")
        second = SSDTier(root, MiB)
        with pytest.raises(TieringError, match="locked"):
            await second.open()
        assert await read(first, b"k") == b"v"
    async with SSDTier(root, MiB) as third:  # released on close
        assert await read(third, b"k") == b"v"


async def test_path_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        await SSDTier(f, MiB).open()


async def test_foreign_non_empty_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("precious")
    with pytest.raises(ConfigError, match="not empty"):
        await SSDTier(tmp_path / "home", MiB).open()
    assert (tmp_path / "home" / "thesis.tex").exists()


async def test_unsupported_format_marker_is_refused(root: Path) -> None:
    root.mkdir()
    (root / "aiotier-ssd").write_text("aiotier-ssd 9\n")
    with pytest.raises(TieringError, match="format"):
        await SSDTier(root, MiB).open()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permissions")
async def test_unwritable_directory_is_a_clear_error_at_open(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(TierUnavailableError, match="not writable"):
            await SSDTier(ro, MiB).open()
        with pytest.raises(TierUnavailableError, match="cannot create"):
            await SSDTier(ro / "sub", MiB).open()
    finally:
        ro.chmod(0o700)


async def test_read_only_filesystem_is_a_clear_error_at_open(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SSDTier(root, MiB):
        pass
    real_open = os.open

    def erofs_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", erofs_open)
    with pytest.raises(TierUnavailableError, match="Read-only file system"):
        await SSDTier(root, MiB).open()


# -- budget -----------------------------------------------------------------------------------


async def test_budget_holds_after_many_writes(root: Path) -> None:
    cap = 2 * MiB
    rng = __import__("random").Random(7)
    async with SSDTier(root, cap) as t:
        for round_ in range(10):
            items = [
                (f"r{round_}-{i}".encode(), os.urandom(rng.randrange(1, 200_000)))
                for i in range(20)
            ]
            errs = await t.write_many(items)
            assert errs == [None] * len(items)
            u = t.usage()
            assert u.bytes_used <= cap
            on_disk = sum(p.stat().st_size for p in block_files(root))
            assert on_disk == u.bytes_used
            assert len(block_files(root)) == u.blocks
        assert t.evictions > 0
        assert temp_files(root) == []


async def test_eviction_follows_exact_lru_order(root: Path) -> None:
    size = HEADER.size + 2 + 100
    async with SSDTier(root, 5 * size) as t:
        for i in range(5):
            await t.write(f"k{i}".encode(), b"x" * 100)
        await read(t, b"k0")  # k1 is now the least recent
        await t.write(b"k5", b"y" * 100)
        assert [t.contains_hint(f"k{i}".encode()) for i in range(6)] == [
            True,
            False,
            True,
            True,
            True,
            True,
        ]
        await t.write(b"k6", b"y" * 100)
        assert not t.contains_hint(b"k2")
        assert t.evictions == 2
        assert len(block_files(root)) == 5


async def test_evicted_blocks_are_handed_over_with_their_bytes(root: Path) -> None:
    size = HEADER.size + 2 + 1000
    async with SSDTier(root, 3 * size) as t:
        t.handover_evicted = True
        data = {f"k{i}".encode(): os.urandom(1000) for i in range(5)}
        for k, v in data.items():
            await t.write(k, v)
        assert t.take_evicted() == [(b"k0", data[b"k0"]), (b"k1", data[b"k1"])]
        assert t.take_evicted() == []
        t.handover_evicted = False
        await t.write(b"k9", b"z" * 1000)
        assert t.take_evicted() == []


async def test_evicted_block_stays_readable_until_the_tier_below_took_it(root: Path) -> None:
    size = HEADER.size + 2 + 1000
    async with SSDTier(root, 2 * size) as t:
        t.handover_evicted = True
        await t.write(b"k0", b"0" * 1000)
        await t.write(b"k1", b"1" * 1000)
        # k0's eviction races with reads of it: they get its bytes, never a miss
        results = await asyncio.gather(
            t.write(b"k2", b"2" * 1000), *(read(t, b"k0") for _ in range(5))
        )
        assert results[1:] == [b"0" * 1000] * 5
        assert await t.lookup(b"k0") is LookupResult.HIT  # in memory, on its way down
        assert await read(t, b"k0") == b"0" * 1000
        assert t.take_evicted() == [(b"k0", b"0" * 1000)]
        assert await t.lookup(b"k0") is LookupResult.MISS
        # a newer write of a block in transit supersedes the evicted bytes
        await t.write(b"k3", b"3" * 1000)  # evicts k1
        await t.write(b"k1", b"n" * 1000)  # evicts k2; k1's old bytes are no longer handed
        assert [k for k, _ in t.take_evicted()] == [b"k2"]
        assert await read(t, b"k1") == b"n" * 1000


async def test_batch_larger_than_the_budget_keeps_the_last_blocks(root: Path) -> None:
    size = HEADER.size + 3 + 1000
    async with SSDTier(root, 4 * size) as t:
        items = [(f"k{i:02d}".encode(), bytes([i]) * 1000) for i in range(10)]
        assert await t.write_many(items) == [None] * 10
        assert len(block_files(root)) == 4
        assert {t.contains_hint(k) for k, _ in items[6:]} == {True}
        assert t.usage().blocks == 4
        for k, v in items[6:]:
            assert await read(t, k) == v


async def test_concurrent_writes_and_reads_of_the_same_keys(root: Path) -> None:
    async with SSDTier(root, MiB) as t:
        keys = [f"k{i}".encode() for i in range(8)]

        async def writer(n: int) -> None:
            for r in range(20):
                k = keys[(n + r) % len(keys)]
                await t.write(k, k + bytes([n, r]) * (100 + r))

        async def reader() -> None:
            for r in range(50):
                k = keys[r % len(keys)]
                got = await read(t, k)
                assert got is None or got.startswith(k)

        await asyncio.gather(*(writer(n) for n in range(6)), *(reader() for _ in range(3)))
        u = t.usage()
        assert sum(p.stat().st_size for p in block_files(root)) == u.bytes_used
        assert len(block_files(root)) == u.blocks == len(keys)
        last = {}
        for n in range(6):
            for r in range(20):
                last[keys[(n + r) % len(keys)]] = (n, r)
        for k in keys:
            got = await read(t, k)
            assert got is not None
            assert got.startswith(k)


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
]


async def test_hostile_keys_stay_inside_path(root: Path, tmp_path: Path) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    assert before == []
    async with SSDTier(root, 64 * MiB) as t:
        for i, k in enumerate(HOSTILE):
            await t.write(k, bytes([i]) * 10)
        for i, k in enumerate(HOSTILE):
            assert await read(t, k) == bytes([i]) * 10
        files = block_files(root)
        assert len(files) == len(HOSTILE)
        for f in files:
            assert f.resolve().is_relative_to(root.resolve())
            assert f.parent.parent == root
        for k in HOSTILE:
            assert await t.remove(k)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ssd"]
    assert not Path("/tmp/escape").exists()
    everything = [p for p in root.rglob("*") if p.is_file()]
    assert {p.name for p in everything} == {"lock", "aiotier-ssd", "recency"}


# -- failures ---------------------------------------------------------------------------------


@pytest.fixture
def enospc(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Make every ``os.writev`` fail with ENOSPC while switched on."""
    real = os.writev
    state = {"on": False}

    def writev(fd: int, bufs: Any) -> int:
        if state["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, bufs)

    monkeypatch.setattr(os, "writev", writev)

    def switch(on: bool) -> None:
        state["on"] = on

    return switch


async def test_enospc_fails_the_write_leaves_no_temporary_and_the_tier_goes_on(
    tier: SSDTier, root: Path, enospc: Callable[[bool], None]
) -> None:
    await tier.write(b"old", b"1" * 1000)
    await tier.write(b"k", b"previous")
    enospc(True)
    with pytest.raises(TierUnavailableError, match="No space left") as info:
        await tier.write(b"k", b"newer")
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC
    assert temp_files(root) == []
    # the older version is gone too: no tier returns older bytes after a newer write
    assert await tier.lookup(b"k") is LookupResult.MISS
    assert await read(tier, b"k") is None
    errs = await tier.write_many([(b"a", b"x"), (b"b", b"y")])
    assert all(isinstance(e, TierUnavailableError) for e in errs)
    assert temp_files(root) == []
    enospc(False)
    await tier.write(b"k", b"after")
    assert await read(tier, b"k") == b"after"
    assert await read(tier, b"old") == b"1" * 1000
    u = tier.usage()
    assert u.blocks == 2
    assert sum(p.stat().st_size for p in block_files(root)) == u.bytes_used


async def test_fsync_mode_writes_and_survives_restart(root: Path) -> None:
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    mp = pytest.MonkeyPatch()
    mp.setattr(os, "fsync", fsync)
    try:
        async with SSDTier(root, MiB, fsync=True) as t:
            await t.write(b"k", b"durable")
        assert len(synced) >= 2  # the file and its directory
    finally:
        mp.undo()
    async with SSDTier(root, MiB) as t:
        assert await read(t, b"k") == b"durable"


# -- the event loop ---------------------------------------------------------------------------


async def test_cancelled_read_does_not_return_while_its_thread_writes_the_buffer(
    tier: SSDTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    await tier.write(b"k", b"v" * 1000)
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
    task = asyncio.ensure_future(tier.read_into(b"k", memoryview(buf)))
    await until(entered.is_set)
    task.cancel()
    for _ in range(50):
        await asyncio.sleep(0)
    assert not task.done()  # still waiting for the thread that holds the buffer
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert bytes(buf) == b"v" * 1000  # the thread finished before the caller got control back


async def test_queued_read_cancelled_before_its_hop_is_withdrawn(root: Path) -> None:
    async with SSDTier(root, MiB, io_threads=1) as t:
        await t.write(b"k", b"v" * 10)
        task = asyncio.ensure_future(t.read_into(b"k", memoryview(bytearray(10))))
        await asyncio.sleep(0)  # queued, the flush not yet run
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await read(t, b"k") == b"v" * 10


async def test_no_blocking_call_on_the_event_loop(root: Path) -> None:
    from blockbuster import blockbuster_ctx

    t = SSDTier(root, 16 * MiB)
    with blockbuster_ctx():
        await t.open()
        await t.write(b"k", os.urandom(100_000))
        await t.write_many([(f"b{i}".encode(), os.urandom(300_000)) for i in range(20)])
        assert await t.lookup(b"k") is LookupResult.HIT
        out = await t.read_many_into(
            [b"k", b"b19"], [memoryview(bytearray(400_000)) for _ in range(2)]
        )
        assert out == [100_000, 300_000]
        assert await t.remove(b"k")
        await t.aclose()


def test_scan_directory_reads_without_changing(root: Path) -> None:
    async def fill() -> None:
        async with SSDTier(root, MiB) as t:
            await t.write_many([(b"a", b"1" * 100), (b"b", b"2" * 200)])

    asyncio.run(fill())
    (root / "00" / ".tmp-x").write_bytes(b"")
    info = scan_directory(root)
    assert (info.blocks, info.temporaries, info.torn) == (2, 1, 0)
    assert info.bytes == 2 * HEADER.size + 2 + 300
    assert (root / "00" / ".tmp-x").exists()


async def test_concurrent_writes_removes_and_evictions_keep_index_and_disk_in_step(
    root: Path,
) -> None:
    rng = __import__("random").Random(11)
    async with SSDTier(root, 20_000, io_threads=3) as t:
        keys = [f"k{i}".encode() for i in range(12)]

        async def worker(n: int) -> None:
            for _ in range(40):
                k = rng.choice(keys)
                op = rng.random()
                if op < 0.5:
                    await t.write(k, k + bytes([n]) * rng.randrange(10, 3000))
                elif op < 0.6:
                    await t.remove(k)
                elif op < 0.8:
                    await t.write_many([(k, k * 50), (rng.choice(keys), b"w" * 2000)])
                else:
                    got = await read(t, k)
                    assert got is None or got.startswith(k) or got == b"w" * 2000

        await asyncio.gather(*(worker(n) for n in range(8)))
        await until(lambda: _runner(t).idle)
        u = t.usage()
        assert u.bytes_used <= 20_000
        files = block_files(root)
        assert sum(p.stat().st_size for p in files) == u.bytes_used
        assert len(files) == u.blocks
        assert temp_files(root) == []


async def test_batched_reads_with_missing_and_planted_files(
    tier: SSDTier, root: Path, tmp_path: Path
) -> None:
    blocks = {f"k{i}".encode(): bytes([i]) * 5000 for i in range(6)}
    assert await tier.write_many(list(blocks.items())) == [None] * 6
    file_of(root, b"k1", 5000).unlink()  # gone behind the tier's back
    planted = file_of(root, b"k2", 5000)
    planted.unlink()
    planted.symlink_to(tmp_path / "elsewhere")  # never followed
    keys = list(blocks)
    bufs = [memoryview(bytearray(5000)) for _ in keys]
    out = await tier.read_many_into(keys, bufs)  # one hop: open + WILLNEED all, then read
    assert out[0] == out[3] == out[4] == out[5] == 5000
    assert out[1] == -1
    assert isinstance(out[2], TierUnavailableError)
    for i in (0, 3, 4, 5):
        assert bytes(bufs[i]) == blocks[keys[i]]
    assert await tier.lookup(b"k1") is LookupResult.MISS
