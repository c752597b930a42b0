"""An SSD tier directory changed behind the tier's back by people and tools: an older
checkpoint restored from a backup, the lock file removed or replaced, a slot file truncated.
None of it may bring back older bytes, let two tiers write one directory, or lose whole blocks.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from helpers import read_one, remove_one, write_one

from aiotier.errors import TieringError
from aiotier.tiers import SSDTier
from aiotier.tiers._ssd.layout import Geometry

MiB = 1 << 20
SLOT = Geometry.slot_size_for(4096)


async def read(tier: SSDTier, key: bytes) -> bytes | None:
    buf = bytearray(4096)
    n = await read_one(tier, key, memoryview(buf))
    return None if n < 0 else bytes(buf[:n])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ssd"


async def test_a_restored_older_checkpoint_never_brings_back_older_bytes(
    root: Path, tmp_path: Path
) -> None:
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"old")
        await write_one(t, b"gone", b"was here")
    shutil.copy(root / "checkpoint", tmp_path / "backup")
    async with SSDTier(root, MiB) as t:
        await write_one(t, b"k", b"new")
        assert await remove_one(t, b"gone")
    shutil.copy(tmp_path / "backup", root / "checkpoint")  # put back from a backup
    async with SSDTier(root, MiB) as t:
        start = t.last_start
        assert start is not None and start.after == "crash"
        assert start.checkpoint == "stale (the slot files were written after it)"
        assert await read(t, b"k") == b"new"
        assert await read(t, b"gone") is None


async def test_a_restored_checkpoint_with_nothing_written_since_is_loaded(root: Path) -> None:
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"v")
    backup = (root / "checkpoint").read_bytes()
    async with SSDTier(root, MiB) as t:  # opened, nothing written, closed: sealed anew
        assert t.last_start is not None and t.last_start.checkpoint == "loaded"
    assert (root / "checkpoint").read_bytes() != backup
    async with SSDTier(root, MiB) as t:
        assert t.last_start is not None and t.last_start.checkpoint == "loaded"
        assert await read(t, b"k") == b"v"


async def test_a_whole_directory_restored_from_a_backup_loads_its_checkpoint(
    root: Path, tmp_path: Path
) -> None:
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"old")
    shutil.copytree(root, tmp_path / "backup")  # copy2 keeps the slot files' times
    async with SSDTier(root, MiB) as t:
        await write_one(t, b"k", b"new")
    shutil.rmtree(root)
    shutil.copytree(tmp_path / "backup", root)
    async with SSDTier(root, MiB) as t:  # slots and checkpoint of one moment: consistent
        assert t.last_start is not None and t.last_start.checkpoint == "loaded"
        assert await read(t, b"k") == b"old"


async def test_after_a_restored_checkpoint_and_a_crash_the_newest_copy_still_wins(
    root: Path, tmp_path: Path
) -> None:
    """The restored checkpoint's sequence numbers are behind the slots': trusted, it would
    number new writes below older copies on disk, and a later header scan would prefer them."""
    async with SSDTier(root, MiB, block_size=4096) as t:
        await write_one(t, b"k", b"v1")
    shutil.copy(root / "checkpoint", tmp_path / "backup")
    async with SSDTier(root, MiB) as t:
        await write_one(t, b"filler", b"f")  # takes the slot the next session's first write takes
        await write_one(t, b"k", b"v2")
    shutil.copy(tmp_path / "backup", root / "checkpoint")
    async with SSDTier(root, MiB) as t:
        await write_one(t, b"k", b"latest")
        shutil.copytree(root, tmp_path / "crashed")  # a kill: no checkpoint written
    (tmp_path / "crashed" / "checkpoint").unlink(missing_ok=True)
    async with SSDTier(tmp_path / "crashed", MiB) as t:
        assert await read(t, b"k") == b"latest"


@pytest.mark.parametrize("how", ["removed", "replaced"])
async def test_the_directory_stays_one_tier_s_when_its_lock_file_goes(
    root: Path, how: str
) -> None:
    async with SSDTier(root, MiB, block_size=4096) as first:
        await write_one(first, b"k", b"v")
        (root / "lock").unlink()  # a tmp cleaner, or an operator
        if how == "replaced":
            (root / "lock").write_bytes(b"")
        second = SSDTier(root, MiB)
        with pytest.raises(TieringError, match="locked by another open SSDTier"):
            await second.open()
        assert await read(first, b"k") == b"v"
    async with SSDTier(root, MiB) as third:  # released on close
        assert await read(third, b"k") == b"v"


async def test_a_slot_file_truncated_from_outside_keeps_every_block_written_after(
    root: Path,
) -> None:
    blocks = {f"k{i}".encode(): bytes([i]) * 3000 for i in range(32)}
    async with SSDTier(root, 64 * SLOT, block_size=4096) as t:
        os.truncate(root / "slots-0000", 0)
        assert await t.write_many(list(blocks.items())) == [None] * 32
        size = (root / "slots-0000").stat().st_size
        assert size % SLOT, "the file ends inside its last written slot"
    async with SSDTier(root, 64 * SLOT) as t:
        start = t.last_start
        assert start is not None and start.checkpoint.startswith("stale")
        assert start.blocks == 32
        for k, v in blocks.items():
            assert await read(t, k) == v
        assert (root / "slots-0000").stat().st_size == 64 * SLOT
