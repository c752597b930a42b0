"""``AiotierOffloadingSpec`` and ``ArenaWorker`` with vLLM's own types, without running a model.

The spec is built from vLLM's ``OffloadingConfig`` (as vLLM builds it from its config), the
worker from vLLM's ``CanonicalKVCaches`` over CPU tensors standing for the GPU's KV cache, and
jobs from vLLM's ``GPULoadStoreSpec``: every ``blocks_per_chunk``, groups starting inside a
chunk, several KV-cache groups and tensors, two tensor-parallel ranks sharing a chunk.

Skipped where vLLM is not installed (scripts/vllm_ci.sh runs them with it).
"""

from __future__ import annotations

import glob
import os
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

REQUIRED = os.environ.get("AIOTIER_TEST_VLLM") == "required"
try:
    import torch
    from vllm.v1.kv_offload import base as vb
    from vllm.v1.kv_offload import config as vc

    with warnings.catch_warnings():  # vLLM's and torch's own, at import: not the code under test
        warnings.simplefilter("ignore", DeprecationWarning)
        import vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics  # noqa: F401
except Exception as exc:
    if REQUIRED:
        raise RuntimeError(f"AIOTIER_TEST_VLLM=required and vLLM does not import: {exc!r}") from exc
    pytest.skip(
        f"vLLM is not installed here ({exc.__class__.__name__}: {exc}); scripts/vllm_ci.sh "
        "runs these tests with it",
        allow_module_level=True,
    )

from aiotier import ConfigError, PrimaryTier, SharedArena  # noqa: E402
from aiotier.integrations.vllm import AiotierOffloadingSpec, LookupResult  # noqa: E402
from aiotier.integrations.vllm.spec import arena_stem  # noqa: E402
from aiotier.integrations.vllm.worker import ArenaWorker  # noqa: E402


def offloading_config(
    extra: dict[str, Any], *, per_block: int = 1024, blocks_per_chunk: int = 1, world: int = 1,
    rank: int = 0, engine_id: str | None = None,
) -> Any:  # fmt: skip
    return vc.OffloadingConfig(
        groups=(vc.OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=per_block,
        enable_kv_cache_events=False,
        extra_config=extra,
        engine_id=engine_id or uuid.uuid4().hex,
        model=vc.OffloadingModelConfig(name="m", dtype="float32"),
        cache=vc.OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
        parallel=vc.OffloadingParallelConfig(
            rank=rank, world_size=world, tp_size=world, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )  # fmt: skip


# -- the spec: configuration -------------------------------------------------------------------


def test_the_block_size_is_derived_from_vllms_layout() -> None:
    extra = {"aiotier": {"primary": {"num_blocks": 8}}}
    spec = AiotierOffloadingSpec(offloading_config(extra, blocks_per_chunk=4, world=2))
    assert (spec.block_size, spec.num_blocks, spec.worker_chunk_bytes) == (8192, 8, 4096)


def test_a_block_size_that_differs_from_vllms_is_refused() -> None:
    extra = {"aiotier": {"primary": {"num_blocks": 8, "block_size": 4096}}}
    with pytest.raises(ConfigError, match=r"primary.block_size is 4096.*2048 bytes.*set 2048"):
        AiotierOffloadingSpec(offloading_config(extra, blocks_per_chunk=2))
    extra["aiotier"]["primary"]["block_size"] = 2048
    assert AiotierOffloadingSpec(offloading_config(extra, blocks_per_chunk=2)).block_size == 2048


def test_num_blocks_from_cpu_bytes_to_use() -> None:
    extra = {"aiotier": {"primary": {}}, "cpu_bytes_to_use": 10_000}
    assert AiotierOffloadingSpec(offloading_config(extra)).num_blocks == 9
    with pytest.raises(ConfigError, match=r"primary\.num_blocks is required"):
        AiotierOffloadingSpec(offloading_config({"aiotier": {"primary": {}}}))
    tiny = {"aiotier": {"primary": {}}, "cpu_bytes_to_use": 5}
    with pytest.raises(ConfigError, match="holds no offloaded chunk"):
        AiotierOffloadingSpec(offloading_config(tiny))


def test_the_config_may_be_a_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "aiotier.toml"
    path.write_text(
        f'[primary]\nnum_blocks = 4\n\n[[tiers]]\ntype = "ssd"\npath = "{tmp_path / "ssd"}"\n'
        f"capacity_bytes = 1048576\n"
    )
    spec = AiotierOffloadingSpec(offloading_config({"aiotier": str(path)}))
    manager = spec.get_manager()
    try:
        assert [t.name for t in manager.engine.engine.tiers] == ["ssd"]
        assert manager.engine.engine.primary.num_blocks == 4
    finally:
        manager.shutdown()


def test_missing_or_wrong_aiotier_config_is_named() -> None:
    with pytest.raises(ConfigError, match=r'kv_connector_extra_config\["aiotier"\] is required'):
        AiotierOffloadingSpec(offloading_config({}))
    with pytest.raises(ConfigError, match="expected a mapping or a TOML file's path, got int"):
        AiotierOffloadingSpec(offloading_config({"aiotier": 3}))
    with pytest.raises(ConfigError, match=r"primary\.num_blocks: expected int, got 'many'"):
        AiotierOffloadingSpec(offloading_config({"aiotier": {"primary": {"num_blocks": "many"}}}))
    with pytest.raises(ConfigError, match="primary: expected a table, got 3"):
        AiotierOffloadingSpec(offloading_config({"aiotier": {"primary": 3}}))
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.type: expected one of"):
        AiotierOffloadingSpec(
            offloading_config({"aiotier": {"primary": {"num_blocks": 2}, "tiers": [{}]}})
        ).get_manager()


def test_the_manager_owns_the_named_segment_and_removes_it() -> None:
    engine_id = uuid.uuid4().hex
    # a stem or shared_memory in the config cannot move the arena from where workers look
    primary = {"num_blocks": 4, "shared_memory": False, "shared_memory_stem": "elsewhere"}
    extra = {"aiotier": {"primary": primary}}
    spec = AiotierOffloadingSpec(offloading_config(extra, engine_id=engine_id))
    manager = spec.get_manager()
    assert isinstance(manager, vb.OffloadingManager)
    name = f"{arena_stem(engine_id)}-4x1024"
    assert manager.engine.engine.primary.shared_memory_name == name
    assert os.path.exists(f"/dev/shm/{name}")
    # a second engine with the same id (a stale segment, a second vLLM) is refused by name
    other = AiotierOffloadingSpec(
        offloading_config({"aiotier": {"primary": {"num_blocks": 4}}}, engine_id=engine_id)
    )
    with pytest.raises(ConfigError, match=f"named '{name}' exists already"):
        other.get_manager()
    assert manager.lookup(b"k" * 36, vb.ReqContext(req_id="r")) is vb.LookupResult.MISS
    assert LookupResult is not vb.LookupResult  # the stand-in is not what vLLM compares
    manager.shutdown()
    assert not glob.glob(f"/dev/shm/{arena_stem(engine_id)}-*")


# -- the worker: copies ------------------------------------------------------------------------


def kv_caches(pages: list[int], groups: list[list[int]], num_gpu_blocks: int = 12) -> Any:
    """CPU tensors standing for the GPU KV cache, filled with distinct bytes."""
    tensors = []
    for i, page in enumerate(pages):
        t = torch.arange(num_gpu_blocks * page, dtype=torch.int64).remainder(251).add(i)
        tensors.append(vb.CanonicalKVCacheTensor(t.to(torch.int8).view(num_gpu_blocks, page), page))
    refs = [[vb.CanonicalKVCacheRef(tensor_idx=t, page_size_bytes=pages[t]) for t in g]
            for g in groups]  # fmt: skip
    return vb.CanonicalKVCaches(tensors=tensors, group_data_refs=refs)


def slot_bytes(primary: PrimaryTier, slot: int) -> bytes:
    """A slot's bytes as another process sees them (through the segment's name)."""
    assert primary.shared_memory_name is not None
    with SharedArena(primary.shared_memory_name, primary.num_blocks, primary.block_size) as a:
        view = a.slot(slot)
        data = bytes(view)
        view.release()
    return data


class SlotSpec(vb.LoadStoreSpec):  # what crosses to a worker: slot ids only
    def __init__(self, block_ids: list[int]) -> None:
        self.block_ids = tuple(block_ids)


def make_worker(kv: Any, primary: PrimaryTier, stem: str, bpc: int, offset: int = 0,
                chunk: int | None = None) -> ArenaWorker:  # fmt: skip
    pages = sum(t.page_size_bytes for t in kv.tensors)
    return ArenaWorker(
        kv, arena_stem=stem, num_blocks=primary.num_blocks, block_size=primary.block_size,
        blocks_per_chunk=bpc, offset=offset, chunk_bytes=chunk or pages * bpc,
    )  # fmt: skip


@pytest.mark.parametrize("bpc", [1, 2, 4])
@pytest.mark.parametrize("first", [0, 1, 3])
def test_store_then_load_round_trips_through_slot_ids(bpc: int, first: int) -> None:
    """GPU blocks 2.. of a request starting at block index ``first`` go to slots, come back
    into other GPU blocks; a chunk's bytes are tensor by tensor, each tensor's pages in order."""
    if first >= bpc and first % bpc == 0 and first:
        pytest.skip("same as first=0")
    pages = [64, 32]
    kv = kv_caches(pages, [[0, 1]])
    stem = "aiotier-test-" + uuid.uuid4().hex[:12]
    primary = PrimaryTier(8, sum(pages) * bpc, shared_memory_stem=stem)
    worker = make_worker(kv, primary, stem, bpc)
    try:
        n = 5
        gpu_ids = list(range(2, 2 + n))
        skip = first % bpc
        n_slots = -(-(skip + n) // bpc)
        slots = [7 - i for i in range(n_slots)]  # any slots, in any order
        spec = vb.GPULoadStoreSpec(gpu_ids, group_sizes=[n], block_indices=[first])
        before = [t.tensor.clone() for t in kv.tensors]
        assert worker.submit_store(1, spec, SlotSpec(slots))
        (done,) = worker.get_finished()
        assert (done.job_id, done.success, done.transfer_size) == (1, True, n * sum(pages))
        assert done.transfer_time > 0
        # the layout: block j of the request is chunk (skip+j)//bpc, page (skip+j)%bpc
        for j, gpu in enumerate(gpu_ids):
            slot, sub = slots[(skip + j) // bpc], (skip + j) % bpc
            at = 0
            for t, page in enumerate(pages):
                got = slot_bytes(primary, slot)[at + sub * page : at + (sub + 1) * page]
                assert got == before[t][gpu].numpy().tobytes(), (j, t)
                at += page * bpc
        # load into other GPU blocks
        targets = list(range(7, 7 + n))
        for t in kv.tensors:
            t.tensor[targets] = 0
        load = vb.GPULoadStoreSpec(targets, group_sizes=[n], block_indices=[first])
        assert worker.submit_load(2, SlotSpec(slots), load)
        assert [r.job_id for r in worker.get_finished()] == [2]
        for t, b in zip(kv.tensors, before, strict=True):
            assert torch.equal(t.tensor[targets], b[gpu_ids])
    finally:
        worker.shutdown()
        primary.release_shared_memory()


def test_groups_copy_only_their_own_tensors() -> None:
    pages = [16, 48]
    kv = kv_caches(pages, [[0], [1]])
    stem = "aiotier-test-" + uuid.uuid4().hex[:12]
    primary = PrimaryTier(4, sum(pages) * 2, shared_memory_stem=stem)
    worker = make_worker(kv, primary, stem, bpc=2)
    try:
        spec = vb.GPULoadStoreSpec([1, 2, 3, 4], group_sizes=[2, 2], block_indices=[0, 2])
        worker.submit_store(1, spec, SlotSpec([0, 1]))
        assert worker.get_finished()[0].transfer_size == 2 * 16 + 2 * 48
        slot0, slot1 = slot_bytes(primary, 0), slot_bytes(primary, 1)
        assert slot0[:32] == kv.tensors[0].tensor[[1, 2]].numpy().tobytes()
        assert slot0[32:] == bytes(96)  # group 0's chunk holds nothing of tensor 1
        assert slot1[32:] == kv.tensors[1].tensor[[3, 4]].numpy().tobytes()
        with pytest.raises(ValueError, match="a job for 1 KV-cache groups; this worker has 2"):
            worker.submit_store(2, vb.GPULoadStoreSpec([1], [1], [0]), SlotSpec([0]))
        with pytest.raises(ValueError, match=r"need 1 slots, the job has 0"):
            worker.submit_store(3, vb.GPULoadStoreSpec([1, 2], [1, 1], [0, 0]), SlotSpec([0]))
        with pytest.raises(ValueError, match=r"slot ids out of 0\.\.3"):
            worker.submit_store(4, vb.GPULoadStoreSpec([1], [1, 0], [0, 0]), SlotSpec([4]))
    finally:
        worker.shutdown()
        primary.release_shared_memory()


def test_two_ranks_share_a_chunk_each_in_its_part() -> None:
    pages = [32]
    stem = "aiotier-test-" + uuid.uuid4().hex[:12]
    primary = PrimaryTier(2, 2 * 32, shared_memory_stem=stem)
    kvs = [kv_caches(pages, [[0]]), kv_caches(pages, [[0]])]
    kvs[1].tensors[0].tensor.add_(100)
    workers = [
        make_worker(kv, primary, stem, 1, offset=rank * 32, chunk=32)
        for rank, kv in enumerate(kvs)
    ]
    try:
        for w in workers:
            w.submit_store(1, vb.GPULoadStoreSpec([5], [1], [0]), SlotSpec([1]))
        slot = slot_bytes(primary, 1)
        assert slot[:32] == kvs[0].tensors[0].tensor[5].numpy().tobytes()
        assert slot[32:] == kvs[1].tensors[0].tensor[5].numpy().tobytes()
    finally:
        for w in workers:
            w.shutdown()
        primary.release_shared_memory()


def test_a_worker_without_its_arena_says_so() -> None:
    kv = kv_caches([32], [[0]])
    worker = ArenaWorker(kv, arena_stem="aiotier-test-missing", num_blocks=2, block_size=32,
                         blocks_per_chunk=1, offset=0, chunk_bytes=32)  # fmt: skip
    with pytest.raises(RuntimeError, match="'aiotier-test-missing-2x32' does not exist"):
        worker.submit_load(1, SlotSpec([0]), vb.GPULoadStoreSpec([0], [1], [0]))
    with pytest.raises(ValueError, match="scheduler sized 64"):
        ArenaWorker(kv, arena_stem="x", num_blocks=2, block_size=64, blocks_per_chunk=1,
                    offset=0, chunk_bytes=64)  # fmt: skip
