"""Instructions per request inside the trace replay's timed calls, counted by callgrind: the
noise-free CPU figure of the ``trace`` case (µs medians move 10-30% between runs on a shared
machine; these counts move well under 1%).

``python -m aiotier_bench.trace_instructions aiotier arc conversation`` (or ``vllm lru
synthetic``, ``adapter lru conversation``: aiotier through its vLLM adapter, ...) replays the
counted window of the ``trace`` case (the first
``COUNT_WINDOW`` requests at ``COUNT_SHARE`` of their unique blocks) under ``valgrind
--tool=callgrind --collect-atstart=no`` and switches collection on only while the replay's
meter runs, i.e. inside the calls into the cache that ``us_per_request`` times. The switch is
callgrind's own client request (``CALLGRIND_TOGGLE_COLLECT``), compiled once into a tiny shared
library with the system's C compiler and valgrind's headers. Needs ``valgrind``, ``gcc`` and
``valgrind/callgrind.h``; hash randomisation is fixed (``PYTHONHASHSEED=0``) so that two runs of
one commit execute the same instructions.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from .trace_cases import COUNT_SHARE, COUNT_WINDOW

__all__ = ["main"]

_TOGGLE_C = (
    "#include <valgrind/callgrind.h>\n"
    "void toggle(void) { CALLGRIND_TOGGLE_COLLECT; }\n"
    "void dump(void) { CALLGRIND_DUMP_STATS; }\n"
)
_LIB_ENV = "AIOTIER_CALLGRIND_TOGGLE"


def _build_toggle(where: Path) -> Path:
    src, lib = where / "toggle.c", where / "libtoggle.so"
    src.write_text(_TOGGLE_C)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def counted_instructions(
    module_args: list[str], *, main_thread_only: bool = False
) -> tuple[subprocess.CompletedProcess[str], int | None]:
    """Run ``python -m MODULE ARGS --inside`` under callgrind (collection off until the module
    toggles it): the run, and the instructions counted (None if callgrind reported none);
    ``main_thread_only``: those of the main thread (the event loop's), not its helpers'."""
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        out = where / "callgrind.out"
        env = {**os.environ, _LIB_ENV: str(_build_toggle(where)), "PYTHONHASHSEED": "0"}
        threads = ["--separate-threads=yes"] if main_thread_only else []
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no", *threads,
             f"--callgrind-out-file={out}", sys.executable, "-m", *module_args, "--inside"],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        counted = where / "callgrind.out-01" if main_thread_only else out
        summary = subprocess.run(["callgrind_annotate", str(counted)], capture_output=True,
                                 text=True, check=True).stdout  # fmt: skip
    total = re.search(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", summary)
    return run, None if total is None else int(total[1].replace(",", ""))


def _replay_counted(
    who: str, policy: str, trace: str, admission: str, requests: int, share: float
) -> tuple[int, int]:
    """Inside callgrind: the first ``requests`` requests (0: all) at ``share`` of their unique
    blocks, with collection on only inside the meter's stretches. Returns (requests, hits)."""
    from aiotier import PrimaryTier

    from . import trace_replay
    from .trace_cases import ADMISSIONS, BLOCK_SIZE, _engine_run, _vllm_run
    from .trace_vllm import adapter_replay
    from .traces import load_trace, shipped_traces

    toggle = ctypes.CDLL(os.environ[_LIB_ENV]).toggle
    meter = trace_replay._Meter
    start, stop = meter.start, meter.stop

    def counted_start(self: trace_replay._Meter) -> None:
        start(self)
        toggle()

    def counted_stop(self: trace_replay._Meter) -> None:
        toggle()
        stop(self)

    meter.start, meter.stop = counted_start, counted_stop  # type: ignore[method-assign]
    paths = [p for p in shipped_traces() if p.stem.startswith(trace)] or [Path(trace)]
    small = load_trace(paths[0], None)
    if requests:  # the whole trace let go of: a larger heap makes each collection cost more
        small = small.window(requests)
    capacity = max(1, round(share * small.unique_blocks))
    if who == "vllm":
        result = asyncio.run(_vllm_run(small, capacity, policy))
    elif who == "adapter":  # vLLM's scheduler thread runs no loop: nor does this one
        primary = PrimaryTier(capacity, BLOCK_SIZE, policy=policy)
        result = adapter_replay(small, primary, ADMISSIONS[admission]())
    else:
        result = asyncio.run(_engine_run(small, capacity, policy, admission))
    return len(small.requests), result.hits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiotier_bench.trace_instructions",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("who", choices=("aiotier", "adapter", "vllm"),
                        help="aiotier's engine, its vLLM adapter (AiotierOffloadingManager) "
                        "or vLLM's manager")  # fmt: skip
    parser.add_argument("policy", help="lru, arc or lfuda (vLLM: lru or arc)")
    parser.add_argument("trace", help="a shipped trace's name (conversation, synthetic) or a file")
    parser.add_argument("--admission", default="all", help="aiotier's admission (default: all)")
    parser.add_argument("--requests", type=int, default=COUNT_WINDOW,
                        help=f"replay the first N requests (default {COUNT_WINDOW}: the trace "
                        "case's counted window; 0: the whole trace)")  # fmt: skip
    parser.add_argument("--share", type=float, default=COUNT_SHARE, help="capacity as a share "
                        f"of their unique blocks (default {COUNT_SHARE})")  # fmt: skip
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        requests, hits = _replay_counted(args.who, args.policy, args.trace, args.admission,
                                         args.requests, args.share)  # fmt: skip
        print(f"requests={requests} hits={hits}")
        return 0
    run, instructions = counted_instructions(
        ["aiotier_bench.trace_instructions", args.who, args.policy, args.trace,
         "--admission", args.admission, "--requests", str(args.requests),
         "--share", str(args.share)]
    )  # fmt: skip
    counts = re.search(r"requests=(\d+) hits=(\d+)", run.stdout)
    if counts is None or instructions is None:
        print(run.stdout, run.stderr[-2000:], file=sys.stderr)
        return 1
    requests, hits = int(counts[1]), int(counts[2])
    label = f"{args.who} {args.policy}" + (f" {args.admission}" if args.who != "vllm" else "")
    print(f"{label} {args.trace}: {instructions / requests:,.0f} instructions per request "
          f"({requests} requests at {args.share:.0%} of their blocks, {hits} hits)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
