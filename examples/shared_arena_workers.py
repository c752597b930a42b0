"""A scheduler process and worker processes sharing the primary arena, as a vLLM executor with
tensor parallelism would: the scheduler drives aiotier (lookups, loads, stores); each worker
maps the arena by name and moves the bytes of the slots the specs name.

Run it as is:  python examples/shared_arena_workers.py

The scheduler stores "KV" that a worker computes into the slots of a ``prepare_store``, then
loads it back through the slots of a ``prepare_load`` that another worker reads. Workers here
are ``multiprocessing`` processes receiving slot ids over a pipe; in vLLM they are the model's
workers, and the slot ids travel in the connector's metadata.
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.connection import Connection

from aiotier import BlockingEngine, MemoryTier, PrimaryTier, RequestContext, SharedArena

NUM_BLOCKS, BLOCK_BYTES = 16, 4096


def kv_of(key: str) -> bytes:
    """The "KV" a worker computes for a block: its key, repeated to fill the block."""
    raw = key.encode()
    return (raw * (BLOCK_BYTES // len(raw) + 1))[:BLOCK_BYTES]


def worker(name: str, conn: Connection) -> None:
    """Serve ("store", slot, key) by writing the block, ("load", slot, key) by checking it."""
    with SharedArena(name, NUM_BLOCKS, BLOCK_BYTES) as arena:
        while (job := conn.recv()) is not None:
            kind, slot, key = job
            view = arena.slot(slot)
            if kind == "store":
                view[:] = kv_of(key)
                conn.send("stored")
            else:
                conn.send("ok" if bytes(view) == kv_of(key) else "WRONG BYTES")
            view.release()


def main() -> None:
    primary = PrimaryTier(NUM_BLOCKS, BLOCK_BYTES, shared_memory=True)
    name = primary.shared_memory_name
    assert name is not None
    ctx = mp.get_context("spawn")  # a fresh interpreter per worker, as vLLM starts them
    pipes = [ctx.Pipe() for _ in range(2)]
    workers = [ctx.Process(target=worker, args=(name, child)) for _, child in pipes]
    for p in workers:
        p.start()
    (writer, _), (reader, _) = pipes
    try:
        with BlockingEngine(primary, [MemoryTier(1 << 20)]) as engine:
            keys = ["prompt-0", "prompt-1", "prompt-2"]
            req = RequestContext("r1")
            out = engine.prepare_store(keys, req)
            assert out is not None
            for key, slot in zip(out.keys_to_store, out.store_spec.block_ids, strict=True):
                writer.send(("store", slot, key.decode()))
                assert writer.recv() == "stored"
            engine.complete_store(out.keys_to_store, req, sizes=[BLOCK_BYTES] * len(keys))
            print(f"worker 1 stored {len(keys)} blocks in slots {list(out.store_spec.block_ids)}")

            req2 = RequestContext("r2")
            hits = engine.lookup_prefix(keys, req2)
            spec = engine.prepare_load(keys[:hits], req2)
            answers = []
            for key, slot in zip(keys, spec.block_ids, strict=True):
                reader.send(("load", slot, key))
                answers.append(reader.recv())
            engine.complete_load(keys[:hits], req2)
            engine.end_step(finished_req_ids=["r1", "r2"])
            print(f"worker 2 loaded {hits} blocks: {', '.join(answers)}")
            print(f"pinned blocks at the end: {engine.stats().pinned_blocks}")
    finally:
        for conn, _ in pipes:
            conn.send(None)
        for p in workers:
            p.join(timeout=30)
    print(f"workers exited with {[p.exitcode for p in workers]}")


if __name__ == "__main__":
    main()
