"""The scheduler protocol: lookup_prefix, RETRY, admission, loads, stores and end_step.

A toy scheduler serves requests whose prompts share prefixes. Blocks below the primary arena
answer RETRY while their promotion runs; the scheduler simply asks again next step, as vLLM's
scheduler does, and admits the request once its prefix is settled.

Run it:  python examples/scheduler_loop.py
"""

from __future__ import annotations

import asyncio

from aiotier import MemoryTier, PrimaryTier, RequestContext, TieringEngine

BLOCK = 4096


def blocks_of(prompt: str) -> list[bytes]:
    # name each block by the prefix it ends, as KV caches do with token-hash chains
    words = prompt.split()
    return [" ".join(words[: i + 1]).encode() for i in range(len(words))]


async def main() -> None:
    memory = MemoryTier(64 * BLOCK)
    async with TieringEngine(PrimaryTier(6, BLOCK), [memory]) as engine:
        prompts = {
            "r1": "the quick brown fox jumps",
            "r2": "the quick brown dog sleeps",
            "r3": "a slow green turtle walks",
            "r4": "the quick brown fox runs",
        }
        waiting = dict(prompts)
        step = 0
        while waiting:
            step += 1
            admitted = []
            for rid, prompt in list(waiting.items()):
                req = RequestContext(rid)
                keys = blocks_of(prompt)
                hits = await engine.lookup_prefix(keys, req)
                if hits is None:
                    print(f"step {step}: {rid} RETRY (a block is being promoted)")
                    continue
                spec = engine.prepare_load(keys[:hits], req)  # zero-copy views, pinned
                loaded = sum(len(buf) for buf in spec.buffers)  # a real server copies them here
                engine.complete_load(keys[:hits], req)
                out = engine.prepare_store(keys[hits:], req)  # compute the rest, store it
                if out is None:
                    print(f"step {step}: {rid} waits: every block is pinned")
                    continue
                for buf in out.store_spec.buffers:
                    buf[:5] = b"kv..."
                stored = list(out.keys_to_store)
                engine.complete_store(stored, req, sizes=[5] * len(stored))
                print(f"step {step}: {rid} admitted: {hits} blocks reused ({loaded} bytes), "
                      f"{len(stored)} stored")
                admitted.append(rid)
                del waiting[rid]
            engine.end_step(new_req_ids=admitted, finished_req_ids=admitted)
            await asyncio.sleep(0.001)  # the forward pass: promotions progress meanwhile
        # r1 again, much later: its blocks went down to the memory tier and come back
        req = RequestContext("r5")
        keys = blocks_of(prompts["r1"])
        print("r5 (same prompt as r1):", await engine.lookup_prefix(keys, req), "-> waiting")
        print("after wait:", await engine.wait(keys))
        print("r5 now reuses", await engine.lookup_prefix(keys, req), "blocks")
        engine.end_step(new_req_ids=["r5"], finished_req_ids=["r5"])


if __name__ == "__main__":
    asyncio.run(main())
