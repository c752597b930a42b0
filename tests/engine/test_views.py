"""The views ``prepare_load`` and ``prepare_store`` hand out are released at ``complete_*``:
a late use raises instead of reading or writing whatever block reuses the slot."""

from __future__ import annotations

import asyncio
import pickle

import pytest
from helpers import block

from aiotier import PrimaryTier, RequestContext, TieringEngine

R1 = RequestContext("r1")


async def test_a_load_view_used_after_complete_load_raises() -> None:
    async with TieringEngine(PrimaryTier(1, 64)) as e:
        assert await e.put("a", block(1))
        spec = e.prepare_load(["a"], R1)
        view = spec.buffers[0]
        assert bytes(view) == block(1)
        e.complete_load(["a"], R1)
        assert await e.put("b", block(2))  # the only slot: a is evicted, b takes its slot
        with pytest.raises(ValueError, match="released"):
            bytes(view)


async def test_a_store_view_written_after_complete_store_raises_and_changes_nothing() -> None:
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        out = e.prepare_store(["s"], R1)
        assert out is not None
        view = out.store_spec.buffers[0]
        view[:3] = b"abc"
        e.complete_store(["s"], R1, sizes=[3])
        with pytest.raises(ValueError, match="released"):
            view[:3] = b"xyz"
        assert await e.get("s") == b"abc"


async def test_completing_part_of_a_batch_releases_only_those_views() -> None:
    async with TieringEngine(PrimaryTier(4, 64)) as e:
        for i in range(3):
            assert await e.put(f"k{i}", block(i))
        views = e.prepare_load(["k0", "k1", "k2"], R1).buffers
        e.complete_load(["k1"], R1)
        with pytest.raises(ValueError, match="released"):
            bytes(views[1])
        assert [bytes(views[0]), bytes(views[2])] == [block(0), block(2)]
        e.complete_load(["k2", "k0"], R1)
        for v in views:
            with pytest.raises(ValueError, match="released"):
                bytes(v)


async def test_a_key_loaded_twice_keeps_its_views_until_both_loads_complete() -> None:
    """Nothing tells which of two loads of one key a complete_load ends (concurrent tasks end
    in any order): both views stay valid until the second completion."""
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        assert await e.put("a", block(1))
        first = e.prepare_load(["a"], R1).buffers[0]
        second = e.prepare_load(["a"], R1).buffers[0]
        e.complete_load(["a"], R1)
        assert bytes(first) == bytes(second) == block(1)
        e.complete_load(["a"], R1)
        for v in (first, second):
            with pytest.raises(ValueError, match="released"):
                bytes(v)


async def test_two_tasks_loading_one_key_each_read_their_view_until_they_complete() -> None:
    async with TieringEngine(PrimaryTier(4, 16)) as e:
        assert await e.put("k0", b"kk")

        async def load() -> None:
            spec = e.prepare_load(["k0"], R1)
            seen = [bytes(b) for b in spec.buffers]
            await asyncio.sleep(0)
            assert [bytes(b) for b in spec.buffers] == seen == [b"kk"]
            e.complete_load(["k0"], R1)

        await asyncio.gather(load(), load())
        assert e.stats().pinned_blocks == 0


async def test_a_finished_request_s_views_are_released() -> None:
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        assert await e.put("a", block(1))
        e.end_step(new_req_ids=["r1"])
        load = e.prepare_load(["a"], R1).buffers[0]
        out = e.prepare_store(["s"], R1)
        assert out is not None
        e.end_step(finished_req_ids=["r1"])  # never completed: the request lets go
        for v in (load, out.store_spec.buffers[0]):
            with pytest.raises(ValueError, match="released"):
                bytes(v)
        assert e.stats().pinned_blocks == 0


async def test_a_view_someone_exported_cannot_be_released_and_stays_valid() -> None:
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        out = e.prepare_store(["s"], R1)
        assert out is not None
        view = out.store_spec.buffers[0]
        held = pickle.PickleBuffer(view)  # holds an export of the view (nothing is pickled)
        view[:1] = b"q"
        e.complete_store(["s"], R1, sizes=[1])  # no error: released as far as it can be
        assert bytes(view[:1]) == b"q"
        assert await e.get("s") == b"q"
        held.release()


async def test_views_handed_out_before_a_clear_go_at_release_cleared_and_later_ones_stay() -> None:
    async with TieringEngine(PrimaryTier(4, 64)) as e:
        assert await e.put("a", block(1))
        before = e.prepare_load(["a"], R1).buffers[0]
        e.clear_primary()
        assert await e.put("a", block(2))
        after = e.prepare_load(["a"], R1).buffers[0]
        assert bytes(before) == block(1)  # its slot is still pinned: the old bytes
        e.release_cleared()
        with pytest.raises(ValueError, match="released"):
            bytes(before)
        assert bytes(after) == block(2)
        e.complete_load(["a"], R1)
        with pytest.raises(ValueError, match="released"):
            bytes(after)


async def test_views_first_read_after_their_complete_come_out_released() -> None:
    """A spec's views are made when first read: read only after the complete (a caller that
    kept the spec), they are released as if made at the prepare, never the slot's bytes."""
    async with TieringEngine(PrimaryTier(2, 64)) as e:
        out = e.prepare_store(["s"], R1)
        assert out is not None
        e.complete_store(["s"], R1, sizes=[0])
        assert await e.put("t", block(3))
        load = e.prepare_load(["t"], R1)
        e.complete_load(["t"], R1)
        for view in (out.store_spec.buffers[0], load.buffers[0]):
            with pytest.raises(ValueError, match="released"):
                bytes(view)
        assert load.buffers is load.buffers  # made once


async def test_views_first_read_after_part_of_their_batch_completed() -> None:
    async with TieringEngine(PrimaryTier(4, 64)) as e:
        out = e.prepare_store(["a", "b"], R1)
        assert out is not None
        e.complete_store(["a"], R1, sizes=[0])
        done, open_ = out.store_spec.buffers
        with pytest.raises(ValueError, match="released"):
            done[:1] = b"x"
        open_[:2] = b"bb"
        e.complete_store(["b"], R1, sizes=[2])
        assert await e.get("b") == b"bb"
        with pytest.raises(ValueError, match="released"):
            bytes(open_)


async def test_load_views_read_late_show_the_bytes_prepared() -> None:
    """A load's views made after a put replaced the key show the block pinned at the prepare
    (its slot stays the loader's until complete_load)."""
    async with TieringEngine(PrimaryTier(4, 64)) as e:
        assert await e.put("a", b"old")
        spec = e.prepare_load(["a"], R1)
        assert await e.put("a", b"newer")
        assert [bytes(v) for v in spec.buffers] == [b"old"]
        assert spec.buffers[0].readonly
        e.complete_load(["a"], R1)
        assert spec == spec and spec.block_ids == spec.block_ids
        with pytest.raises(AttributeError):
            spec.block_ids = (0,)  # type: ignore[misc]
