"""Instructions per promoted block in ``memory_promote``'s round, counted by callgrind: the
noise-free figure beside the case's µs medians.

``python -m aiotier_bench.promote_instructions anonymous`` (or ``request``, ``bare``,
``bare_inline``) builds the case's setup (4096 blocks of 4 KiB in a ``MemoryTier`` under a
128-block ``PrimaryTier``, batches of 64), runs two rounds to warm it, and counts the third
(``lookup_prefix`` + ``wait`` + ``end_step`` per batch, as the case's round) with callgrind's
collection switched on only around it. Needs what :mod:`.trace_instructions` needs.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import random
import sys

from aiotier import MemoryTier, PrimaryTier, RequestContext, TieringEngine

from .bare import BareEngine
from .core import PROMOTE_BATCH, PROMOTE_BLOCK, PROMOTE_PRIMARY
from .trace_instructions import _LIB_ENV, counted_instructions

__all__ = ["main"]

VARIANTS = ("anonymous", "request", "bare", "bare_inline")
N_KEYS = 4096


async def _counted_round(variant: str) -> None:
    """Inside callgrind: the setup, two warm rounds, then one round counted."""
    toggle = ctypes.CDLL(os.environ[_LIB_ENV]).toggle
    bs, n = PROMOTE_BLOCK, PROMOTE_BATCH
    keys = [b"promote-%08d" % i for i in range(N_KEYS)]
    payload = random.Random(4).randbytes(bs)
    values = [k.rjust(24, b"-") + payload[24:] for k in keys]
    batches = [keys[i : i + n] for i in range(0, N_KEYS, n)]
    tier = MemoryTier(2 * N_KEYS * bs)
    await tier.write_many(list(zip(keys, values, strict=True)))
    engine: TieringEngine | BareEngine
    if variant.startswith("bare"):
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiotier_bench.promote_instructions",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        asyncio.run(_counted_round(args.variant))
        return 0
    run, instructions = counted_instructions(["aiotier_bench.promote_instructions", args.variant])
    if instructions is None:
        print(run.stdout, run.stderr[-2000:], file=sys.stderr)
        return 1
    print(f"memory_promote {args.variant}: {instructions / N_KEYS:,.0f} instructions per block "
          f"({N_KEYS} blocks in batches of {PROMOTE_BATCH})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
