"""What a demoted ``put`` costs in ``ssd_demote``'s engine round, counted: the noise-free figures
beside the case's GB/s medians.

``python -m aiotier_bench.demote_instructions`` builds the case's engine (a 64-block
``PrimaryTier`` of 256 KiB blocks over an ``SSDTier`` in a temporary directory, write-back,
every evicted block written), runs two rounds of 1024 puts to fill the tier, and counts the
third, where every write evicts one (the puts in steps of 64 with a loop turn between, then
``flush``):

- the event loop thread's callgrind instructions per put while the puts run, and over the whole
  round (the puts and the flush: the writes' ends reach the loop too), each also without the
  copies (``memcpy``/``memmove``/``memset``: the put's copy into the arena, the victim's copy
  out of it) and with the loop's turns (``epoll_wait`` calls);
- the tier threads' GIL releases per block written (``PyEval_SaveThread`` calls: each system
  call, each hash of more than 64 KiB, each post to the loop), and their instructions per block
  outside the copies. While the loop computes, a thread waits up to a switch interval (5 ms) to
  win the GIL back after each release (``docs/ssd.md``, "Writes under a busy event loop"), so
  releases per block are what the convoy costs;
- the loop thread's Python calls per put (``sys.setprofile``, in a run of its own), while the
  puts run and over the round.

``--block-kib`` and ``--blocks`` change the size (1024 KiB and 256 blocks: the case's other).
Needs what :mod:`.trace_instructions` needs; how many of the round's writes end during the
puts depends on how the threads are scheduled (under callgrind, one at a time), so the round's
figures are the steadier ones.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from aiotier import PrimaryTier, SSDTier, TieringEngine
from aiotier.tiers._ssd.layout import Geometry

from .counting import CallCounter
from .trace_instructions import _LIB_ENV, _build_toggle

__all__ = ["main"]

BATCH = 64  # the primary's blocks, and puts per step (as ssd_demote)
ROUNDS = 3  # two to fill the tier, the third counted
_COPIES = re.compile(r"mem(cpy|move|set)")
_CALLS = re.compile(r"calls=(\d+) ")
_NAMED = re.compile(r"c?fn=\((\d+)\)(?: (.*))?")


async def _round(where: str, block_size: int, blocks: int, calls: bool) -> str:
    """Inside callgrind (or the call counter): two rounds, then the counted one. Under
    callgrind the loop thread's costs are dumped before the counted round, after its puts and
    after its flush (a dump holds the calling thread's costs only: the tier threads' costs
    stay whole, in the file written at exit)."""
    dump = None if calls else ctypes.CDLL(os.environ[_LIB_ENV]).dump
    payload = random.Random(4).randbytes(block_size)
    slot = Geometry.slot_size_for(block_size)
    tier = SSDTier(where, 2 * blocks * slot)
    engine = TieringEngine(  # (callgrind runs it ~50x slower than the case: a long io_timeout)
        PrimaryTier(BATCH, block_size), [tier], write_policy="write_back",
        max_pending_write_bytes=2 * blocks * block_size, io_timeout=600.0,
    )  # fmt: skip
    await engine.open()
    phases: list[CallCounter] = []

    def mark(more: bool = True) -> None:
        """End the phase counted now (if any); start the next one when ``more``."""
        if dump is not None:
            dump()
            return
        if phases:
            phases[-1].__exit__(None, None, None)
        if more:
            phases.append(CallCounter().__enter__())

    for r in range(ROUNDS):
        keys = [f"demote-{r}-{i}".encode() for i in range(blocks)]
        items = [(k, k[-8:].rjust(8, b"-") + payload[8:]) for k in keys]
        last = r == ROUNDS - 1
        if last:
            mark()
        for i, (k, v) in enumerate(items, 1):
            if not await engine.put(k, v):
                raise RuntimeError("put failed")
            if i % BATCH == 0:
                await asyncio.sleep(0)
        if last:
            mark()
        await engine.flush(timeout=300.0)
        if last:
            mark(more=False)
    counters = engine.stats().counters
    if counters.get(("tier_errors", tier.name, "write"), 0):
        raise RuntimeError("a demotion failed")
    written = counters.get(("write_bytes", tier.name), 0) // block_size
    await engine.aclose(flush=False)
    return f"written={written} calls={[c.calls for c in phases]}"


def _callgrind(args: list[str]) -> tuple[Path, str]:
    """Run this module ``--inside`` under callgrind, one file per thread; the directory of the
    files (the caller removes it) and what the run printed."""
    where = Path(tempfile.mkdtemp())
    env = {**os.environ, _LIB_ENV: str(_build_toggle(where)), "PYTHONHASHSEED": "0"}
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--separate-threads=yes",
         f"--callgrind-out-file={where / 'cg.out'}", sys.executable, "-m",
         "aiotier_bench.demote_instructions", *args, "--inside"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    if run.returncode:
        print(run.stdout, run.stderr[-3000:], file=sys.stderr)
        raise SystemExit(1)
    return where, run.stdout


def _costs(path: Path) -> tuple[int, int, dict[str, int]]:
    """A thread's instructions, those in the copies, and its calls to a few functions."""
    summary = subprocess.run(["callgrind_annotate", "--threshold=100", str(path)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    total = copies = 0
    for line in summary.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if m is None:
            continue
        ir = int(m[1].replace(",", ""))
        if "PROGRAM TOTALS" in m[2]:
            total = ir
        elif _COPIES.search(m[2].split(" [")[0].rsplit(":", 1)[-1]):
            copies += ir
    names: dict[str, str] = {}
    wanted = {"PyEval_SaveThread": 0, "epoll_wait": 0}
    callee = None
    for line in path.read_text().splitlines():
        m = _NAMED.match(line)
        if m is not None:
            if m[2]:
                names[m[1]] = m[2].strip()
            callee = names.get(m[1]) if line.startswith("cfn") else None
        elif callee in wanted and (c := _CALLS.match(line)) is not None:
            wanted[callee] += int(c[1])
    return total, copies, wanted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiotier_bench.demote_instructions",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--block-kib", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=1024)
    parser.add_argument("--calls", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    bs, n = args.block_kib << 10, args.blocks
    if args.inside:
        with tempfile.TemporaryDirectory() as tmp:
            print(asyncio.run(_round(tmp, bs, n, args.calls)))
        return 0
    size = ["--block-kib", str(args.block_kib), "--blocks", str(n)]
    calls = subprocess.run(
        [sys.executable, "-m", "aiotier_bench.demote_instructions", *size, "--calls",
         "--inside"], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    m = re.search(r"calls=\[(\d+), (\d+)\]", calls)
    assert m is not None, calls
    during, flush = int(m[1]), int(m[2])
    where, out = _callgrind(size)
    try:
        written = int(re.search(r"written=(\d+)", out)[1])  # type: ignore[index]
        puts, flushed = (_costs(where / f"cg.out.{part}-01") for part in (2, 3))
        released = helper_ir = helper_copies = 0
        for f in where.iterdir():
            if re.fullmatch(r"cg\.out-(0[2-9]|[1-9]\d)", f.name):  # the tier threads, whole
                ir, cp, c = _costs(f)
                helper_ir, helper_copies = helper_ir + ir, helper_copies + cp
                released += c["PyEval_SaveThread"]
    finally:
        subprocess.run(["rm", "-rf", str(where)], check=True)
    print(f"ssd_demote, {n} puts of {args.block_kib} KiB in steps of {BATCH}, each evicting to "
          "an SSDTier (the third round):")  # fmt: skip
    for what, (ir, cp, c) in (("while the puts run", puts), ("during the flush", flushed)):
        print(f"  loop thread {what}: {ir / n:,.0f} instructions per put, {(ir - cp) / n:,.0f} "
              f"outside the copies; {c['epoll_wait']} loop turns")  # fmt: skip
    print(f"  loop thread Python calls per put: {during / n:.1f} while the puts run, "
          f"{flush / n:.1f} during the flush")  # fmt: skip
    print(f"  tier threads, over the process ({written} blocks written in {ROUNDS} rounds, the "
          f"tier's open and close): {released / written:.2f} GIL releases and "
          f"{(helper_ir - helper_copies) / written:,.0f} instructions outside the copies per "
          "block")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
