"""The ``aiotier`` command: ``demo``, ``bench`` and ``inspect`` (``aiotier --help``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["build_parser", "main", "print_summary"]

_T = TypeVar("_T")


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .config import load_demo_config

    cfg = load_demo_config(args)
    console = Console()
    if cfg.metrics_port is not None:
        base = f"http://127.0.0.1:{cfg.metrics_port}"
        console.print(f"serving {base}/metrics, {base}/healthz and {base}/readyz")
    if cfg.forever:
        console.print(f"steady load of {cfg.rate:g} requests/s until Ctrl-C")
    try:
        result = _run(_demo_with_progress(cfg, console), args.loop)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: tiers closed, temporary files removed[/]")
        return 130
    print_summary(console, result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": result.steps, "seconds": result.seconds, "ended": result.ended,
                       **result.summary}, f, indent=2)  # fmt: skip
    return 0


def _run(coro: Coroutine[Any, Any, _T], loop: str) -> _T:
    """Run ``coro`` on the chosen event loop (``uvloop`` needs the ``uvloop`` extra)."""
    factory = None
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            coro.close()
            raise SystemExit(
                "aiotier: --loop uvloop needs uvloop: pip install 'aiotier[uvloop]'"
            ) from None
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


async def _demo_with_progress(cfg: Any, console: Any) -> Any:
    """The demo with a progress display; the first Ctrl-C ends it after the current step (the
    summary follows), a second one interrupts at once."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from .demo import DemoResult, run_demo

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        loop.remove_signal_handler(signal.SIGINT)  # the next Ctrl-C interrupts at once
        stop.set()

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.add_signal_handler(signal.SIGINT, on_sigint)  # main thread of a Unix process only
    if cfg.forever:
        columns: tuple[Any, ...] = ("[progress.description]{task.description}",
                                    TimeElapsedColumn())  # fmt: skip
        total = None
        what = "steady load (Ctrl-C stops)"
    elif cfg.duration is not None:
        columns = ("[progress.description]{task.description}", BarColumn(), TimeElapsedColumn())
        total, what = cfg.duration, f"steady load for {cfg.duration:g}s"
    else:
        columns = ("[progress.description]{task.description}", BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn())  # fmt: skip
        total, what = cfg.steps, "scheduler steps"

    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(what, total=total)

        def progress(r: DemoResult) -> None:
            done = r.steps if cfg.duration is None and not cfg.forever else r.seconds
            desc = f"{what}: {r.requests_done} requests done" if total is None else what
            bar.update(task, completed=done, description=desc)

        try:
            return await run_demo(cfg, progress, stop=stop)
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGINT)


def _count(n: float) -> str:
    """A count in at most 6 characters: exact below a million, then k/M/G."""
    if n < 1_000_000:
        return str(int(n))
    for div, unit in ((1e9, "G"), (1e6, "M")):
        if n >= div:
            return f"{n / div:.1f}{unit}" if n / div < 1000 else f"{n / div:.0f}{unit}"
    return str(int(n))  # pragma: no cover


def _mib(v: float) -> str:
    """MiB in at most 6 characters (GiB and TiB past that)."""
    for div, unit in ((1 << 20, "T"), (1 << 10, "G")):
        if v >= div:
            return f"{v / div:.1f}{unit}"
    return f"{v:.1f}"


def print_summary(console: Any, result: Any) -> None:
    """The demo's summary, every column readable whole in an 80-column terminal."""
    from rich import box
    from rich.table import Table

    s = result.summary
    ended = {"steps": "", "duration": "", "stopped": ", stopped by Ctrl-C"}[result.ended]
    table = Table(
        title=f"aiotier demo: {result.steps} steps, {result.requests_done} requests "
              f"finished in {result.seconds:.1f}s{ended}",
        box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
    )  # fmt: skip
    # MiB columns switch to G/T past 1024; counts to k/M/G past a million
    table.add_column("tier", overflow="fold")  # a long tier name wraps, never cut
    for col in ("lookups", "hit\nrate", "promoted", "evicted", "read\nMiB", "written\nMiB",
                "errors", "dropped"):  # fmt: skip
        table.add_column(col, justify="right", no_wrap=True)
    for name, t in s["tiers"].items():
        rate = "-" if t["hit_rate"] is None else f"{t['hit_rate']:.1%}"
        table.add_row(
            name, _count(t["lookups"]), rate, _count(t["promotions"]), _count(t["evictions"]),
            _mib(t["read_mib"]), _mib(t["written_mib"]), _count(t["errors"]),
            _count(t.get("dropped", 0)),
        )  # fmt: skip
    console.print(table)
    if any(t.get("dropped") for t in s["tiers"].values()):
        console.print(
            "dropped: demotions shed because the write-back backlog (max_pending_write_bytes) "
            "was full: the tiers below did not keep up with the blocks each step evicts (a slow "
            "or busy disk). Load shedding, not errors: aiotier_demotions_dropped_total."
        )
    delays = Table(title="lookup delays per request, ms",
                   box=box.SIMPLE_HEAD, pad_edge=False)  # fmt: skip
    for col in ("delay", "count", "p50", "p90", "p99"):
        delays.add_column(col, justify="right", no_wrap=True)
    for label, d in s["delays_ms"].items():
        cells = ["-" if d[p] is None else f"{d[p]:.3f}" for p in ("p50", "p90", "p99")]
        delays.add_row(label, _count(d["count"]), *cells)
    console.print(delays)
    console.print(
        f"blocks loaded {result.blocks_loaded}, stored {result.blocks_stored}, "
        f"{s['blocks_per_second']:.0f} blocks/s, allocation failures {s['allocation_failures']}"
    )


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
    from .bench import cache as cache_bench
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
        cache_cases = tuple(n for n in CASE_GROUPS["cache"] if n in wanted)
        if cache_cases:
            print(f"running {', '.join(cache_cases)}...", file=sys.stderr)
            cases += await cache_bench.run(args.quick, cache_cases)
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
        "last start us/block": (
            round(last.get("per_block_us", 0.0), 2) if last and last.get("blocks") else None
        ),
    }
    if args.json:
        print(json.dumps({k.replace(" ", "_").replace("/", "_per_"): v for k, v in rows.items()}))
    else:
        for k, v in rows.items():
            print(f"{k:20} {'-' if v is None else v}")
    return 0


_DESCRIPTION = (
    "aiotier: an asyncio-native tiering engine for blocks of bytes. "
    'Run "aiotier COMMAND --help" for a command\'s options.'
)


def build_parser() -> argparse.ArgumentParser:
    """The command line: every option has a help text (a test checks)."""
    from . import __version__
    from .bench import CASE_NAMES

    ap = argparse.ArgumentParser(
        prog="aiotier",
        description=_DESCRIPTION,
    )
    ap.add_argument(
        "--version", action="version", version=f"aiotier {__version__}",
        help="print the installed version and exit",
    )  # fmt: skip
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo", help="simulate an inference scheduler over the default tiers",
        description="Simulate an inference scheduler (lookups, loads, stores, steps) over a "
        "primary arena, a memory tier and an SSD tier in a temporary directory, then print "
        "what each tier served.",
    )  # fmt: skip
    demo.add_argument("--steps", type=int, help="steps of the quick tour (default 200)")
    demo.add_argument(
        "--requests", type=int, help="requests spread over the steps (default 1200)"
    )
    demo.add_argument(
        "--duration", type=float, metavar="SECONDS",
        help="run a steady load for this long instead of a number of steps",
    )  # fmt: skip
    demo.add_argument(
        "--rate", type=float, metavar="N",
        help="requests per second of the steady load (default 100)",
    )  # fmt: skip
    demo.add_argument(
        "--loop", choices=("asyncio", "uvloop"), default="asyncio",
        help="the event loop to run on (uvloop: pip install 'aiotier[uvloop]')",
    )  # fmt: skip
    demo.add_argument(
        "--primary-mib", type=int, metavar="MIB", help="size of the primary arena (default 24)"
    )
    demo.add_argument(
        "--ssd-dir", metavar="DIR",
        help="the SSD tier's directory, kept afterwards (default: a temporary one, removed)",
    )  # fmt: skip
    demo.add_argument(
        "--redis", dest="redis_url", metavar="URL",
        help="add a Redis tier: redis://HOST:PORT/DB (pip install 'aiotier[redis]')",
    )  # fmt: skip
    demo.add_argument(
        "--s3", dest="s3_url", metavar="URL",
        help="add an object store tier: s3://BUCKET/PREFIX/ or http://HOST:PORT/BUCKET/PREFIX/",
    )  # fmt: skip
    demo.add_argument(
        "--metrics-port", type=int, metavar="PORT",
        help="serve /metrics, /healthz and /readyz on 127.0.0.1:PORT; without --steps, "
        "--requests or --duration the demo then runs a steady load until Ctrl-C",
    )  # fmt: skip
    demo.add_argument("--json", metavar="FILE", help="also write the summary to FILE as JSON")
    demo.add_argument(
        "--config", metavar="FILE",
        help="a TOML file with [demo] (these settings) and [engine] (the engine's options)",
    )  # fmt: skip
    demo.set_defaults(fn=_demo)

    bench = sub.add_parser(
        "bench", help="run the benchmark suite",
        description="Run the benchmark suite: each case against a floor and a peer library, "
        "medians and ratios.",
    )  # fmt: skip
    bench.add_argument("--quick", action="store_true", help="a small version, under a minute")
    bench.add_argument("--json", metavar="FILE", help="write every case's figures to FILE")
    bench.add_argument(
        "--plot", metavar="FILE.png", help="draw the ratios to FILE.png (needs matplotlib)"
    )
    bench.add_argument(
        "--only", metavar="GROUPS", help="comma-separated groups: core,ssd,redis,s3,cache"
    )
    bench.add_argument(
        "--case", action="append", choices=CASE_NAMES, metavar="NAME",
        help=f"run only this case (repeatable; with --only, both sets): {', '.join(CASE_NAMES)}",
    )  # fmt: skip
    bench.set_defaults(fn=_bench)

    inspect = sub.add_parser(
        "inspect", help="summarise an SSD tier directory, format 2 (read-only)",
        description="Summarise an SSD tier directory without changing it: geometry, blocks, "
        "free slots and how its last start went.",
    )  # fmt: skip
    inspect.add_argument("path", help="the SSD tier's directory")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(fn=_inspect)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from .errors import TieringError

    try:
        return int(args.fn(args))
    except (TieringError, OSError, ImportError) as exc:  # ImportError: an extra is missing
        print(f"aiotier {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
