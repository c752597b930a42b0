"""The SSD tier's expiry file: each deadline is bound to the very write it was saved for, and a
damaged or foreign file is ignored (no deadline is better than a wrong one: the engine still
checks the expiry a value carries)."""

from __future__ import annotations

from pathlib import Path

from aiotier._core.deadlines import Deadlines
from aiotier.tiers._ssd.expiry import EXPIRY_NAME, load_expiry, save_expiry
from aiotier.tiers._ssd.index import SSDIndex


def index_of(*blocks: tuple[bytes, int, int]) -> SSDIndex:
    index = SSDIndex(8)
    for key, slot, seq in blocks:
        index.load(key, slot, seq, 10)
    index.loaded()
    return index


def test_a_deadline_comes_back_only_for_the_write_it_was_saved_for(tmp_path: Path) -> None:
    saved: Deadlines[bytes] = Deadlines()
    saved.arm(b"same", 100.0)
    saved.arm(b"rewritten", 200.0)
    saved.arm(b"gone", 300.0)
    save_expiry(str(tmp_path), index_of((b"same", 0, 5), (b"rewritten", 1, 6), (b"gone", 2, 7)),
                saved)  # fmt: skip
    # after a crash the scan finds "rewritten" at a later write, and "gone" not at all
    loaded: Deadlines[bytes] = Deadlines()
    note = load_expiry(str(tmp_path), index_of((b"same", 0, 5), (b"rewritten", 3, 9)), loaded)
    assert note == "loaded 1"
    assert loaded.at == {b"same": 100.0}


def test_no_deadline_no_file_and_a_damaged_file_is_ignored(tmp_path: Path) -> None:
    root = str(tmp_path)
    index = index_of((b"k", 0, 1))
    save_expiry(root, index, Deadlines())
    assert not (tmp_path / EXPIRY_NAME).exists()
    assert load_expiry(root, index, Deadlines()) == "absent"
    one: Deadlines[bytes] = Deadlines()
    one.arm(b"k", 50.0)
    save_expiry(root, index, one)
    blob = bytearray((tmp_path / EXPIRY_NAME).read_bytes())
    blob[20] ^= 1
    (tmp_path / EXPIRY_NAME).write_bytes(bytes(blob))
    loaded: Deadlines[bytes] = Deadlines()
    assert load_expiry(root, index, loaded) == "damaged (checksum mismatch)"
    assert not loaded.at
    (tmp_path / EXPIRY_NAME).write_bytes(b"not ours at all, but long enough to look")
    assert load_expiry(root, index, loaded).startswith("damaged")
