"""The SSD tier's slot writes on a thread, without a tier: runs of adjacent slots go out as one
``pwritev`` (header first, zeros over the rest of each slot) and never touch a slot outside
the op; every block reads back verified."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import read_one

from aiotier import SSDTier
from aiotier.tiers._ssd.layout import Geometry
from aiotier.tiers._ssd.ops import SlotWrites, read_slot
from aiotier.tiers._ssd.syscalls import NowaitProbe

SLOT = 8192


def write(fd: int, blocks: dict[int, tuple[bytes, int, bytes]]) -> list[OSError | None]:
    """Write ``{slot: (key, seq, payload)}`` as one op; its per-block errors."""
    op = SlotWrites(False, SLOT, lambda _op, _outcome: None)
    for slot, (key, seq, payload) in blocks.items():
        op.add(fd, slot * SLOT, key, seq, memoryview(payload), None, slot)
    handed, errors = op.start(NowaitProbe())
    assert handed == [None] * len(blocks)
    return errors


def test_adjacent_and_scattered_slots_read_back_and_leave_others_alone(tmp_path: Path) -> None:
    path = tmp_path / "slots"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 8 * SLOT)
        # slot 2 holds a block this op does not write: the run 0-1 and the lone 3 skip it
        assert write(fd, {2: (b"other", 1, b"o" * 5000)}) == [None]
        before = os.pread(fd, SLOT, 2 * SLOT)
        blocks = {
            0: (b"a", 2, b"A" * 10),  # short: zeros over the rest of its slot
            1: (b"b", 3, b"B" * 6000),
            3: (b"c", 4, b"C" * 8000),
            4: (b"d", 5, b""),
        }
        assert write(fd, blocks) == [None] * 4
        assert os.pread(fd, SLOT, 2 * SLOT) == before
        for slot, (key, seq, payload) in blocks.items():
            assert read_slot(fd, slot * SLOT, key, seq, len(payload)) == payload
        assert read_slot(fd, 2 * SLOT, b"other", 1, 5000) == b"o" * 5000
        tail = os.pread(fd, SLOT - 2000, 2000)  # slot 0 past its header and 10 bytes
        assert tail == bytes(len(tail))
    finally:
        os.close(fd)


def test_a_slot_rewritten_replaces_its_header_first(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "slots", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 2 * SLOT)
        assert write(fd, {0: (b"victim", 1, b"v" * 7000), 1: (b"next", 2, b"n" * 7000)}) == [
            None,
            None,
        ]
        assert write(fd, {0: (b"new", 3, b"w" * 100)}) == [None]
        assert read_slot(fd, 0, b"victim", 1, 7000) is None  # never served again
        assert read_slot(fd, 0, b"new", 3, 100) == b"w" * 100
        assert read_slot(fd, SLOT, b"next", 2, 7000) == b"n" * 7000
    finally:
        os.close(fd)


async def test_a_batch_of_short_blocks_in_large_slots_is_written_whole(tmp_path: Path) -> None:
    # 2 MiB slots, 1000-byte blocks: each slot's unused end is longer than one run of zeros,
    # so the writes may not all go in one pwritev (it would pass IOV_MAX and fail them all)
    bs = 2 << 20
    async with SSDTier(tmp_path / "ssd", 64 * Geometry.slot_size_for(bs), block_size=bs,
                       io_threads=2) as tier:  # fmt: skip
        items = [(b"k%03d" % i, bytes([i]) * 1000) for i in range(64)]  # 32 slots per thread
        assert await tier.write_many(items) == [None] * len(items)
        for key, data in items:
            buf = memoryview(bytearray(bs))
            assert buf[: await read_one(tier, key, buf)] == data
