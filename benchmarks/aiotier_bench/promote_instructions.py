"""Instructions per promoted block in ``memory_promote``'s round, counted by callgrind: the
noise-free figure beside the case's µs medians.

``python -m aiotier_bench.promote_instructions anonymous`` (or ``request``, ``bare``,
``bare_inline``) builds the case's setup (4096 blocks of 4 KiB in a ``MemoryTier`` under a
128-block ``PrimaryTier``, batches of 64), runs two rounds to warm it, and counts the third
(``lookup_prefix`` + ``wait`` + ``end_step`` per batch, as the case's round) with callgrind's
collection switched on only around it. Needs what :mod:`.trace_instructions` needs.

``ssd`` counts the event loop's side of ``ssd_promote``'s warm round instead: 512 blocks of
256 KiB in an ``SSDTier`` (a temporary directory), the same primary and batches, the loop
thread's instructions only (the tier's threads copy and hash the blocks).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import random
import sys
import tempfile

from aiotier import MemoryTier, PrimaryTier, RequestContext, SSDTier, TieringEngine
from aiotier.tiers._ssd.layout import Geometry

from .bare import BareEngine
from .core import PROMOTE_BATCH, PROMOTE_BLOCK, PROMOTE_PRIMARY
from .trace_instructions import _LIB_ENV, counted_instructions

__all__ = ["main"]

VARIANTS = ("anonymous", "request", "bare", "bare_inline", "ssd")
N_KEYS = 4096
SSD_KEYS, SSD_BLOCK = 512, 256 * 1024


async def _counted_round(variant: str, where: str) -> None:
    """Inside callgrind: the setup, two warm rounds, then one round counted."""
    toggle = ctypes.CDLL(os.environ[_LIB_ENV]).toggle
    ssd = variant == "ssd"
    bs, count = (SSD_BLOCK, SSD_KEYS) if ssd else (PROMOTE_BLOCK, N_KEYS)
    n = PROMOTE_BATCH
    keys = [b"promote-%08d" % i for i in range(count)]
    payload = random.Random(4).randbytes(bs)
    values = [k.rjust(24, b"-") + payload[24:] for k in keys]
    batches = [keys[i : i + n] for i in range(0, count, n)]
    tier: MemoryTier | SSDTier
    if ssd:
        tier = SSDTier(where, 2 * count * Geometry.slot_size_for(bs), block_size=bs)
        await tier.open()
        for at in range(0, count, n):
            await tier.write_many(list(zip(keys[at : at + n], values[at : at + n], strict=True)))
    else:
        tier = MemoryTier(2 * count * bs)
        await tier.write_many(list(zip(keys, values, strict=True)))
    engine: TieringEngine | BareEngine
    if variant.startswith("bare"):
        assert isinstance(tier, MemoryTier)
        engine = BareEngine(PROMOTE_PRIMARY, bs, tier, inline=variant == "bare_inline")
    else:
        engine = TieringEngine(PrimaryTier(PROMOTE_PRIMARY, bs), [tier], max_promotion_share=1.0)
        await engine.open()
    serial = 0
    for counted in (False, False, True):
        if counted:
            toggle()
        previous: tuple[str, ...] = ()
        for b in batches:
            if variant == "request":
                assert isinstance(engine, TieringEngine)
                serial += 1
                req = RequestContext(f"promote-{serial}")
                await engine.lookup_prefix(b, req)
                await engine.wait(b)
                engine.end_step(new_req_ids=(req.req_id,), finished_req_ids=previous)
                previous = (req.req_id,)
            else:
                await engine.lookup_prefix(b)
                await engine.wait(b)
                engine.end_step()
        if isinstance(engine, TieringEngine) and previous:
            engine.end_step(finished_req_ids=previous)
        if counted:
            toggle()
    if isinstance(engine, TieringEngine):
        await engine.aclose(flush=False)
    if ssd:
        await tier.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiotier_bench.promote_instructions",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        with tempfile.TemporaryDirectory() as where:
            asyncio.run(_counted_round(args.variant, where))
        return 0
    ssd = args.variant == "ssd"
    run, instructions = counted_instructions(
        ["aiotier_bench.promote_instructions", args.variant], main_thread_only=ssd
    )
    if instructions is None:
        print(run.stdout, run.stderr[-2000:], file=sys.stderr)
        return 1
    if ssd:
        per_batch = instructions / (SSD_KEYS // PROMOTE_BATCH)
        print(f"ssd_promote warm, the event loop's thread: {per_batch:,.0f} instructions per "
              f"batch of {PROMOTE_BATCH} blocks of {SSD_BLOCK >> 10} KiB")  # fmt: skip
        return 0
    print(f"memory_promote {args.variant}: {instructions / N_KEYS:,.0f} instructions per block "
          f"({N_KEYS} blocks in batches of {PROMOTE_BATCH})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
