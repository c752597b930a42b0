"""The primary arena in shared memory: another process reads the slots of a ``prepare_load`` and
writes those of a ``prepare_store`` by slot id, its exit leaves the segment alone, and the
engine's close removes it."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import textwrap

import pytest

from aiotier import ConfigError, MemoryTier, PrimaryTier, RequestContext, SharedArena, TieringEngine
from aiotier.shared_arena import segment_name

BLOCK = 4096
R1 = RequestContext("r1")


def worker(script: str) -> str:
    """Run ``script`` in a fresh Python process (as a vLLM worker would be); its stdout."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "leaked" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout.strip()


async def test_a_worker_process_loads_and_stores_through_slot_ids() -> None:
    # creating a segment makes system calls (and may start the resource tracker): not on a loop
    primary = await asyncio.to_thread(PrimaryTier, 8, BLOCK, shared_memory=True)
    name = primary.shared_memory_name
    assert name is not None
    async with TieringEngine(primary, [MemoryTier(1 << 20)]) as e:
        assert await e.put("cached", b"C" * BLOCK)
        load = e.prepare_load(["cached"], R1)
        store = e.prepare_store(["computed"], R1)
        assert store is not None
        (load_slot,), (store_slot,) = load.block_ids, store.store_spec.block_ids
        out = await asyncio.to_thread(
            worker,
            f"""
            from aiotier import SharedArena
            with SharedArena({name!r}, 8, {BLOCK}) as arena:
                loaded = bytes(arena.slot({load_slot}))
                view = arena.slot({store_slot})
                view[:] = b"W" * {BLOCK}
                view.release()
            print(loaded == b"C" * {BLOCK})
            """,
        )
        assert out == "True"
        e.complete_load(["cached"], R1)
        e.complete_store(["computed"], R1, sizes=[BLOCK])
        assert await e.get("computed") == b"W" * BLOCK
        # the worker's exit did not remove the segment: another one attaches
        out = await asyncio.to_thread(
            worker,
            f"""
            from aiotier import SharedArena
            arena = SharedArena({name!r}, 8, {BLOCK})
            print(bytes(arena.slot({store_slot})[:4]))
            arena.close()
            """,
        )
        assert out == "b'WWWW'"
    with pytest.raises(FileNotFoundError):
        await asyncio.to_thread(SharedArena, name, 8, BLOCK)  # the engine's close removed it


def test_a_shared_arena_checks_what_it_is_given() -> None:
    primary = PrimaryTier(2, 64, shared_memory=True)
    name = primary.shared_memory_name
    assert name is not None
    try:
        with pytest.raises(ConfigError, match="2 slots of 64 bytes, not 4 of 64"):
            SharedArena(name, 4, 64)
        with pytest.raises(ConfigError, match="2 slots of 64 bytes, not 4 of 32"):
            SharedArena(name, 4, 32)  # the same bytes cut otherwise: slot 1 would be wrong
        with SharedArena(name, 2, 64) as arena:
            with pytest.raises(ValueError, match=r"slot 2 is not in 0\.\.1"):
                arena.slot(2)
            view = arena.slot(1)
            view[:3] = b"abc"
            assert bytes(primary.arena.slot_view(1)[:3]) == b"abc"  # the same memory
            view.release()
        with pytest.raises(ValueError, match="closed"):
            arena.slot(0)
    finally:
        primary.release_shared_memory()
        primary.release_shared_memory()  # once is enough; again does nothing


def test_a_private_arena_has_no_shared_memory() -> None:
    primary = PrimaryTier(2, 64)
    assert primary.shared_memory_name is None
    primary.release_shared_memory()  # nothing to do


def test_a_primary_whose_shared_memory_was_released_is_refused_by_a_new_engine() -> None:
    primary = PrimaryTier(2, 64, shared_memory=True)

    async def twice() -> None:
        async with TieringEngine(primary):
            pass  # closing releases the segment's name
        assert primary.shared_memory_released
        with pytest.raises(ConfigError, match="create a new PrimaryTier"):
            await TieringEngine(primary).open()

    asyncio.run(twice())


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="segments are files in /dev/shm on Linux")
def test_every_page_of_a_shared_arena_is_reserved_when_it_is_made() -> None:
    primary = PrimaryTier(64, 4096, shared_memory=True)
    try:
        name = primary.shared_memory_name
        assert name is not None
        st = os.stat(os.path.join("/dev/shm", name))
        assert st.st_blocks * 512 >= 64 * 4096  # allocated, not a sparse file
    finally:
        primary.release_shared_memory()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="segments are files in /dev/shm on Linux")
def test_a_primary_no_engine_ever_opened_removes_its_segment_when_collected() -> None:
    primary = PrimaryTier(2, 64, shared_memory=True)
    name = primary.shared_memory_name
    assert name is not None and os.path.exists(os.path.join("/dev/shm", name))
    del primary
    gc.collect()
    assert not os.path.exists(os.path.join("/dev/shm", name))


_FORKED_CHILD_EXITS = """
import gc, os, sys
from aiotier import PrimaryTier
primary = PrimaryTier(4, 64, shared_memory=True)
name = primary.shared_memory_name
pid = os.fork()
if pid == 0:  # a helper forked from the scheduler: drops its copy and exits normally
    del primary
    gc.collect()
    sys.exit(0)
os.waitpid(pid, 0)
print(os.path.exists(os.path.join("/dev/shm", name)))
primary.release_shared_memory()
"""


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="segments are files in /dev/shm on Linux")
def test_a_forked_child_that_exits_leaves_its_parents_segment_alone() -> None:
    run = [sys.executable, "-c", _FORKED_CHILD_EXITS]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr


def test_a_named_arena_is_found_by_its_stem_and_geometry() -> None:
    """A worker that knows the stem (vLLM's derives it from the engine id) and the geometry
    attaches without being told the name; a second arena of that name is refused."""
    stem = f"aiotier-test-{os.getpid()}"
    primary = PrimaryTier(2, 64, shared_memory_stem=stem)
    try:
        assert primary.shared_memory_name == segment_name(stem, 2, 64) == f"{stem}-2x64"
        with SharedArena(segment_name(stem, 2, 64), 2, 64) as arena:
            everything = arena.slots()
            everything[64:] = b"s" * 64
            assert len(everything) == 128
            everything.release()
            view = arena.slot(1)
            assert bytes(view) == b"s" * 64
            view.release()
        with pytest.raises(ConfigError, match=f"named '{stem}-2x64' exists already"):
            PrimaryTier(2, 64, shared_memory_stem=stem)
    finally:
        primary.release_shared_memory()
    for bad in ("", "a/b", "x" * 201):
        with pytest.raises(ConfigError, match="shared memory name stem must be"):
            PrimaryTier(2, 64, shared_memory_stem=bad)
