"""The suite's runner behind ``aiotier bench`` (and ``python -m aiotier_bench``): its options,
the cases chosen, one line per case, the JSON document and the plot."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from typing import Any

from aiotier import __version__

from . import CASE_GROUPS, CASE_NAMES
from .common import Case, Measure

__all__ = ["build_parser", "main", "run"]


def build_parser(prog: str = "aiotier bench") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Run the benchmark suite: each case against a floor and a peer library, "
        "medians and ratios (docs/benchmarks.md).",
    )
    ap.add_argument("--quick", action="store_true", help="a small version, under a minute")
    ap.add_argument("--json", metavar="FILE", help="write every case's figures to FILE")
    ap.add_argument(
        "--plot", metavar="FILE.png", help="draw the ratios to FILE.png (needs matplotlib)"
    )
    ap.add_argument(
        "--only", metavar="GROUPS", help=f"comma-separated groups: {','.join(CASE_GROUPS)}"
    )
    ap.add_argument(
        "--trace", action="append", metavar="FILE",
        help="replay this JSONL request trace (repeatable; implies --case trace) instead of "
        "the traces shipped in benchmarks/traces/",
    )  # fmt: skip
    ap.add_argument(
        "--case", action="append", choices=CASE_NAMES, metavar="NAME",
        help=f"run only this case (repeatable; with --only, both sets): {', '.join(CASE_NAMES)}",
    )  # fmt: skip
    return ap


def main(argv: list[str] | None = None, prog: str = "aiotier bench") -> int:
    return run(build_parser(prog).parse_args(argv))


# extra figures worth a line of their own under a case in the printed summary
_HEADLINE_EXTRAS = (
    "python_calls_per_block", "aiotier_over_floor", "primary_hit_rate", "cpu_overhead",
    "flush_share", "flush_cpu_ms_per_step", "sdk_calls_per_step", "with_recent_hints",
    "with_recent_hints_over_floor", "optimum_hit_ratio", "share_of_optimum", "us_per_request",
    "peer_us_per_request",
)  # fmt: skip


def _selected_cases(args: argparse.Namespace) -> set[str]:
    """The cases ``--case`` and ``--only`` name (every case when neither is given)."""
    wanted: set[str] = set(args.case or ())
    if args.trace:
        wanted.add("trace")  # --trace FILE names the case it feeds
    for group in (args.only or "").split(","):
        group = group.strip()
        if not group:
            continue
        if group not in CASE_GROUPS:
            raise SystemExit(
                f"aiotier bench: unknown group {group!r} (groups: {', '.join(CASE_GROUPS)})"
            )
        wanted.update(CASE_GROUPS[group])
    if not wanted:
        wanted = set(CASE_NAMES)
    if "loop_lag" in wanted:  # derived from the ticker figures of the I/O cases
        wanted |= {"ssd_promote", "redis_promote"}
    return wanted


def run(args: argparse.Namespace) -> int:
    """Run the cases ``args`` select, print them, write ``--json`` and ``--plot``."""
    from . import cache as cache_bench
    from . import core, ssd, trace_cases
    from . import objectstore as object_bench
    from . import redis as redis_bench

    wanted = _selected_cases(args)

    async def suite() -> list[Case]:
        cases: list[Case] = []
        core_cases = [n for n in CASE_GROUPS["core"] if n in wanted]
        if core_cases:
            print(f"running {', '.join(core_cases)}...", file=sys.stderr)
            cases += await core.run(args.quick, core_cases)
        ssd_cases = [n for n in CASE_GROUPS["ssd"] if n in wanted]
        if ssd_cases:
            print(f"running {', '.join(ssd_cases)}...", file=sys.stderr)
            cases += await ssd.run(args.quick, cases=ssd_cases)
        if "redis_promote" in wanted:
            print("running redis_promote...", file=sys.stderr)
            cases += await redis_bench.run_local(args.quick)
        if "object_promote" in wanted:
            print("running object_promote...", file=sys.stderr)
            cases += await object_bench.run_local(args.quick)
        cache_cases = tuple(n for n in CASE_GROUPS["cache"] if n in wanted)
        if cache_cases:
            print(f"running {', '.join(cache_cases)}...", file=sys.stderr)
            cases += await cache_bench.run(args.quick, cache_cases)
        if "trace" in wanted:
            print("running trace...", file=sys.stderr)
            cases += await trace_cases.run(args.quick, args.trace or ())
        return cases

    cases = asyncio.run(suite())
    cases += _loop_lag_cases(cases)
    doc: dict[str, Any] = {
        "aiotier_version": __version__,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "quick": bool(args.quick),
        "cases": [c.to_json() for c in cases],
    }
    for c in doc["cases"]:
        if c.get("skipped"):
            print(f"{c['name']:18} skipped: {c['skipped']}")
            continue
        floor, peer = c["floor"], c["peer"]
        print(
            f"{c['name']:18} {c['aiotier']:10.4g} {c['unit']:11}"
            f" floor {_num(floor and floor['value']):>8} (x{_num(c['ratio_to_floor'])})"
            f"  peer {_num(peer and peer['value']):>8} (x{_num(c['ratio_to_peer'])})"
        )
        params = " ".join(f"{k}={v}" for k, v in c["params"].items() if k != "via")
        print(f"{'':18} {params}")
        extras = [f"{k}={_num(c[k])}" for k in _HEADLINE_EXTRAS if c.get(k) is not None]
        if extras:
            print(f"{'':18} {' '.join(extras)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    if args.plot:
        from .plot import plot

        try:
            plot(doc, args.plot)
        except ImportError as exc:
            print(f"aiotier bench: no plot written: {exc}", file=sys.stderr)
    return 0


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _loop_lag_cases(cases: list[Any]) -> list[Any]:
    """The ``loop_lag`` case of BENCHMARKS.md: the ticker's p99 during each I/O case, against
    the same ticker with the loop idle (SSD) or during the floor's rounds (Redis)."""
    out = []
    for c in cases:
        lag = c.extra.get("loop_lag_p99_ms")
        if lag is None:
            continue
        base = c.extra.get("loop_lag_idle_p99_ms", c.extra.get("floor_loop_lag_p99_ms"))
        name = "idle loop" if "loop_lag_idle_p99_ms" in c.extra else "during the floor's rounds"
        out.append(
            Case(
                "loop_lag",
                {"during": c.name, **{k: v for k, v in c.params.items() if k != "rounds"}},
                "ms (p99)",
                False,
                lag,
                floor=None if base is None else Measure(f"ticker p99, {name}", base),
                extra={"max_ms": c.extra.get("loop_lag_max_ms")},
            )
        )
    return out
