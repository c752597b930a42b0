"""The ``aiotier`` command: ``demo``, ``bench`` and ``inspect``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from typing import Any

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from .config import load_demo_config
    from .demo import run_demo

    cfg = load_demo_config(args)
    console = Console()
    if cfg.metrics_port is not None:
        console.print(f"serving /metrics on http://127.0.0.1:{cfg.metrics_port}/metrics")
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("simulating scheduler steps", total=cfg.steps)
        try:
            result = asyncio.run(run_demo(cfg, lambda n: bar.update(task, completed=n)))
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: tiers closed, temporary files removed[/]")
            return 130
    s = result.summary
    table = Table(title=f"aiotier demo: {result.steps} steps, {result.requests_done} requests "
                        f"finished in {result.seconds:.1f}s")  # fmt: skip
    for col in ("tier", "lookups", "hit rate", "promoted", "evicted", "read MiB",
                "written MiB", "errors"):  # fmt: skip
        table.add_column(col, justify="right", no_wrap=True)
    for name, t in s["tiers"].items():
        rate = "-" if t["hit_rate"] is None else f"{t['hit_rate']:.1%}"
        table.add_row(
            name, str(t["lookups"]), rate, str(t["promotions"]), str(t["evictions"]),
            f"{t['read_mib']:.1f}", f"{t['written_mib']:.1f}", str(t["errors"]),
        )  # fmt: skip
    console.print(table)
    delays = Table(title="lookup delays per request (ms, bucket-interpolated)")
    for col in ("delay", "count", "p50", "p90", "p99"):
        delays.add_column(col, justify="right", no_wrap=True)
    for label, d in s["delays_ms"].items():
        cells = ["-" if d[p] is None else f"{d[p]:.3f}" for p in ("p50", "p90", "p99")]
        delays.add_row(label, str(d["count"]), *cells)
    console.print(delays)
    console.print(
        f"blocks loaded {result.blocks_loaded}, stored {result.blocks_stored}, "
        f"{s['blocks_per_second']:.0f} blocks/s, allocation failures {s['allocation_failures']}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": result.steps, "seconds": result.seconds, **s}, f, indent=2)
    return 0


# extra figures worth a line of their own under a case in the printed summary
_HEADLINE_EXTRAS = (
    "python_calls_per_block", "aiotier_over_floor", "primary_hit_rate", "cpu_overhead",
    "flush_share", "flush_cpu_ms_per_step", "sdk_calls_per_step", "with_recent_hints",
    "with_recent_hints_over_floor",
)  # fmt: skip


def _selected_cases(args: argparse.Namespace) -> set[str]:
    """The cases ``--case`` and ``--only`` name (every case when neither is given)."""
    from .bench import CASE_GROUPS, CASE_NAMES

    wanted: set[str] = set(args.case or ())
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


def _bench(args: argparse.Namespace) -> int:
    from . import __version__
    from .bench import CASE_GROUPS, core, ssd
    from .bench import objectstore as object_bench
    from .bench import redis as redis_bench
    from .bench.common import Case

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
        from .bench.plot import plot

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
    from .bench.common import Case, Measure

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


def _inspect(args: argparse.Namespace) -> int:
    from .tiers.ssd import inspect_directory

    info = inspect_directory(args.path)
    last = info.last_start
    rows: dict[str, Any] = {
        "format": info.format,
        "block size": info.block_size,
        "slot size": info.slot_size,
        "slot files": info.files,
        "slots": info.slots,
        "blocks": info.blocks,
        "bytes": info.bytes_used,
        "free slots": info.free_slots,
        "file bytes": info.file_bytes,
        "allocated bytes": info.allocated_bytes,
        "index from": info.source,
        "torn slots": info.torn,
        "duplicates": info.duplicates,
        "last start": None if last is None else last.get("after"),
        "last start seconds": None if last is None else round(last.get("seconds", 0.0), 3),
        "last start us/block": None if last is None else round(last.get("per_block_us", 0.0), 2),
    }
    if args.json:
        print(json.dumps({k.replace(" ", "_").replace("/", "_per_"): v for k, v in rows.items()}))
    else:
        for k, v in rows.items():
            print(f"{k:20} {'-' if v is None else v}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .bench import CASE_NAMES

    ap = argparse.ArgumentParser(prog="aiotier", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="simulate an inference scheduler over the default tiers")
    demo.add_argument("--steps", type=int)
    demo.add_argument("--requests", type=int)
    demo.add_argument("--primary-mib", type=int)
    demo.add_argument("--ssd-dir")
    demo.add_argument("--redis", dest="redis_url", metavar="URL")
    demo.add_argument(
        "--s3", dest="s3_url", metavar="URL",
        help="add an object store tier: s3://BUCKET/PREFIX/ or http://HOST:PORT/BUCKET/PREFIX/",
    )  # fmt: skip
    demo.add_argument("--metrics-port", type=int)
    demo.add_argument("--json", metavar="FILE")
    demo.add_argument("--config", metavar="FILE", help="a TOML file with a [demo] table")
    demo.set_defaults(fn=_demo)

    bench = sub.add_parser("bench", help="run the benchmark suite")
    bench.add_argument("--quick", action="store_true", help="a small version, under a minute")
    bench.add_argument("--json", metavar="FILE")
    bench.add_argument("--plot", metavar="FILE.png")
    bench.add_argument("--only", help="comma-separated groups: core,ssd,redis,s3")
    bench.add_argument(
        "--case", action="append", choices=CASE_NAMES, metavar="NAME",
        help=f"run only this case (repeatable; with --only, both sets): {', '.join(CASE_NAMES)}",
    )  # fmt: skip
    bench.set_defaults(fn=_bench)

    inspect = sub.add_parser(
        "inspect", help="summarise an SSD tier directory, format 2 (read-only)"
    )
    inspect.add_argument("path")
    inspect.add_argument("--json", action="store_true")
    inspect.set_defaults(fn=_inspect)

    args = ap.parse_args(argv)
    from .errors import TieringError

    try:
        return int(args.fn(args))
    except (TieringError, OSError) as exc:
        print(f"aiotier {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
