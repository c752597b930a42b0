"""aiotier as vLLM's KV offloading manager: the calls vLLM's scheduler makes, played without vLLM.

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

Inside vLLM, the manager comes from the spec aiotier ships,
``aiotier.integrations.vllm.AiotierOffloadingSpec``, with a worker that copies between vLLM's KV
cache and the arena in vLLM's own processes; name it in vLLM's configuration::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {
            "spec_module_path": "aiotier.integrations.vllm", "spec_name": "AiotierOffloadingSpec",
            "cpu_bytes_to_use": 8000000000,
            "aiotier": {"tiers": [{"type": "ssd", "path": "/var/cache/aiotier",
                                   "capacity_bytes": 200000000000}]}}}'

(docs/vllm.md, "Run it in vLLM").
"""

from __future__ import annotations

import time

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


if __name__ == "__main__":
    main()
