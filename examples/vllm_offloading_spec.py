"""aiotier as vLLM's KV offloading manager, plugged in through a custom offloading spec.

vLLM's ``OffloadingConnector`` asks an ``OffloadingSpec`` for two things: a manager, which the
scheduler drives (lookups, loads, stores, events, the step end), and a worker, which moves the
bytes between the GPU and the offloaded medium. ``AiotierOffloadingManager`` is the manager:
aiotier's primary arena is the offloaded medium, its secondary tiers sit below it.

Run it as is:  python examples/vllm_offloading_spec.py

Without vLLM installed, ``main()`` plays vLLM's scheduler-side connector: each step it looks up
every waiting request's blocks one by one (``get_num_new_matched_tokens``), defers a request
whose blocks are on their way up, loads the hits and stores the new blocks of the requests it
admits (``update_state_after_alloc``, ``build_connector_meta``), finishes them, and ends the step
(``on_schedule_end``, ``take_events``). A dictionary plays the GPU.

With vLLM installed (its July 2026 layout, ``vllm.v1.kv_offload.base``), this module also
defines ``AiotierOffloadingSpec``; name it in the connector's configuration::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {
            "spec_name": "AiotierOffloadingSpec", "spec_module_path": "vllm_offloading_spec",
            "aiotier_num_blocks": 4096, "aiotier_block_bytes": 131072,
            "aiotier_ssd_path": "/var/cache/aiotier", "aiotier_ssd_bytes": 200000000000}}'

The worker below copies through the specs' memoryviews, so it runs where the scheduler runs:
vLLM's single-process executor (one GPU). See docs/vllm.md for what multi-process executors
need.
"""

from __future__ import annotations

import time
from typing import Any

from aiotier import MemoryTier, PrimaryTier
from aiotier.integrations.vllm import (
    AiotierOffloadingManager,
    LookupResult,
    PrimaryLoadStoreSpec,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)

BLOCK_BYTES = 4096


def block_keys(prompt: str) -> list[bytes]:
    """vLLM names a block by a hash chained over the tokens up to it; a prefix stands in."""
    words = prompt.split()
    return [make_offload_key(" ".join(words[: i + 1]).encode(), 0) for i in range(len(words))]


def kv_of(key: bytes) -> bytes:
    """The "KV" the model computes for a block: its key, repeated to fill the block."""
    return (key * (BLOCK_BYTES // len(key) + 1))[:BLOCK_BYTES]


class ToyConnectorScheduler:
    """The calls vLLM's ``OffloadingConnectorScheduler`` makes, in the order it makes them."""

    def __init__(self, manager: AiotierOffloadingManager) -> None:
        self.manager = manager
        self.gpu: dict[bytes, bytes] = {}  # what the worker copied onto the "GPU"

    def num_hits(self, ctx: ReqContext, keys: list[bytes]) -> int | None:
        """``get_num_new_matched_tokens``: leading hits, or None to be asked again next step.

        The scan goes on past a block on its way up (so every promotion of the prefix starts in
        this step) and stops at the first miss.
        """
        hits, on_the_way = 0, False
        for key in keys:
            answer = self.manager.lookup(key, ctx)
            if answer is LookupResult.MISS:
                break
            on_the_way |= answer is not LookupResult.HIT
            hits += 1
        return None if on_the_way else hits

    def load(self, ctx: ReqContext, keys: list[bytes]) -> None:
        """``update_state_after_alloc``: a load job; the worker copies, then it completes."""
        spec = self.manager.prepare_load(keys, ctx)
        assert isinstance(spec, PrimaryLoadStoreSpec)
        for key, buf in zip(keys, spec.buffers, strict=True):
            self.gpu[key] = bytes(buf)  # the worker's copy from the arena to the GPU
            assert self.gpu[key] == kv_of(key), "a loaded block holds another block's bytes"
        self.manager.complete_load(keys, ctx)

    def store(self, ctx: ReqContext, keys: list[bytes]) -> tuple[int, int]:
        """``build_connector_meta``: a store job for the blocks computed this step."""
        out = self.manager.prepare_store(keys, ctx)
        if out is None:  # every block is pinned: vLLM counts an allocation failure
            return 0, 0
        assert isinstance(out.store_spec, PrimaryLoadStoreSpec)
        for key, buf in zip(out.keys_to_store, out.store_spec.buffers, strict=True):
            buf[:] = kv_of(key)  # the worker's copy from the GPU to the arena
        self.manager.complete_store(keys, ctx)  # vLLM completes every key it prepared
        return len(out.keys_to_store), len(out.evicted_keys)


def main() -> None:
    prompts = {
        "r1": "the quick brown fox jumps over the lazy dog",
        "r2": "the quick brown fox sleeps under a tree",
        "r3": "the quick brown fox jumps over the lazy dog again",
    }
    manager = AiotierOffloadingManager.create(
        PrimaryTier(10, BLOCK_BYTES), [MemoryTier(256 * BLOCK_BYTES)]
    )
    scheduler = ToyConnectorScheduler(manager)
    arrivals = {1: ["r1"], 2: ["r2"], 3: ["r3"]}
    waiting: dict[str, ReqContext] = {}
    deferred: dict[str, int] = {}
    step = 0
    while step < 3 or waiting:
        step += 1
        for rid in arrivals.get(step, []):
            waiting[rid] = ReqContext(req_id=rid)
            manager.on_new_request(waiting[rid])
        admitted = []
        for rid, ctx in list(waiting.items()):
            keys = block_keys(prompts[rid])
            hits = scheduler.num_hits(ctx, keys)
            if hits is None:
                deferred[rid] = deferred.get(rid, 0) + 1
                if deferred[rid] == 1:
                    print(f"step {step}: {rid} deferred: its blocks are on their way up")
                continue
            if hits:
                scheduler.load(ctx, keys[:hits])
            stored, evicted = scheduler.store(ctx, keys[hits:])
            after = f" after {deferred[rid]} deferred step(s)" if rid in deferred else ""
            print(f"step {step}: {rid} admitted{after}: {hits} blocks reused, {stored} stored"
                  f" ({evicted} evicted to the memory tier)")  # fmt: skip
            admitted.append(rid)
            del waiting[rid]
            manager.on_request_finished(ctx)  # a one-token request: done in its first step
        manager.on_schedule_end(ScheduleEndContext(new_req_ids=admitted, preempted_req_ids=()))
        events = manager.take_events()
        if events:
            summary = ", ".join(
                f"{len(e.keys)} {'removed from' if e.removed else 'stored in'} "
                f"{e.ownership or e.medium.name}"
                for e in events
            )
            print(f"step {step} events: {summary}")
        time.sleep(0.005)  # the forward pass: promotions land meanwhile
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
    print(f"every loaded block verified; pinned blocks at the end: "
          f"{manager.engine.stats().pinned_blocks}")  # fmt: skip
    manager.shutdown()


# -- the vLLM side: only with vLLM installed -------------------------------------------------------

try:  # vLLM's July 2026 layout (PRs #45053, #46363, #46450)
    from vllm.v1.kv_offload import base as vllm_base
except ImportError:
    vllm_base = None

if vllm_base is not None:
    import warnings

    import torch

    from aiotier import SSDTier
    from aiotier.integrations.vllm import VllmTypes

    class AiotierVllmManager(AiotierOffloadingManager, vllm_base.OffloadingManager):
        """vLLM's manager ABC, its methods all supplied by AiotierOffloadingManager."""

    class ArenaCopyWorker(vllm_base.OffloadingWorker):
        """Copies blocks between vLLM's GPU KV tensors and the primary arena, through the
        specs' memoryviews (so in the scheduler's process only). One KV-cache group, one GPU
        block per offloaded block; a block's bytes are its page in every tensor, in order."""

        def __init__(self, kv_caches: Any) -> None:
            self.tensors = [t.tensor for t in kv_caches.tensors]
            self.finished: list[Any] = []

        def _gpu_pages(self, block_id: int) -> list[Any]:
            return [t[block_id].view(-1).view(torch.uint8) for t in self.tensors]

        def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
            for gpu_id, buf in zip(src_spec.block_ids, dst_spec.buffers, strict=True):
                data = torch.cat(self._gpu_pages(int(gpu_id))).cpu()
                torch.frombuffer(buf, dtype=torch.uint8)[: data.numel()].copy_(data)
            self.finished.append(vllm_base.TransferResult(job_id=job_id, success=True))
            return True

        def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
            for buf, gpu_id in zip(src_spec.buffers, dst_spec.block_ids, strict=True):
                with warnings.catch_warnings():  # load views are read-only; only read here
                    warnings.simplefilter("ignore", UserWarning)
                    data = torch.frombuffer(buf, dtype=torch.uint8)
                offset = 0
                for page in self._gpu_pages(int(gpu_id)):
                    page.copy_(data[offset : offset + page.numel()], non_blocking=False)
                    offset += page.numel()
            self.finished.append(vllm_base.TransferResult(job_id=job_id, success=True))
            return True

        def get_finished(self) -> list[Any]:
            done, self.finished = self.finished, []
            return done

        def wait(self, job_ids: Any) -> None:
            return None  # copies finish inside submit_*

        def shutdown(self) -> None:
            return None

    class AiotierOffloadingSpec(vllm_base.OffloadingSpec):
        """Name it as ``spec_name`` (with ``spec_module_path``) in the connector's config."""

        def get_manager(self) -> AiotierVllmManager:
            cfg = self.extra_config
            secondary = []
            if cfg.get("aiotier_ssd_path"):
                secondary.append(
                    SSDTier(cfg["aiotier_ssd_path"], int(cfg.get("aiotier_ssd_bytes", 1 << 36)))
                )
            primary = PrimaryTier(int(cfg["aiotier_num_blocks"]), int(cfg["aiotier_block_bytes"]))
            return AiotierVllmManager.create(
                primary, secondary, types=VllmTypes.from_module(vllm_base)
            )

        def get_worker(self, kv_caches: Any) -> ArenaCopyWorker:
            page_bytes = sum(t.page_size_bytes for t in kv_caches.tensors)
            if page_bytes != int(self.extra_config["aiotier_block_bytes"]):
                raise ValueError(
                    f"aiotier_block_bytes must be {page_bytes}, the bytes of one block in every "
                    "KV-cache tensor"
                )
            return ArenaCopyWorker(kv_caches)


if __name__ == "__main__":
    main()
