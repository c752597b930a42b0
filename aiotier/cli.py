"""The ``aiotier`` command: ``demo``, ``bench`` and ``inspect`` (``aiotier --help``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

__all__ = ["bench_suite", "build_parser", "main", "print_summary"]

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


def bench_suite(search: Path | None = None) -> ModuleType:
    """The benchmark suite's runner, ``aiotier_bench.suite``: installed (``pip install
    ./benchmarks``), else from the ``benchmarks/`` folder of the clone aiotier runs from (or
    ``search``). It is not part of the ``aiotier`` package."""
    try:
        return importlib.import_module("aiotier_bench.suite")
    except ModuleNotFoundError as exc:
        if exc.name not in ("aiotier_bench", "aiotier_bench.suite"):
            raise
    folder = search or Path(__file__).resolve().parent.parent / "benchmarks"
    if (folder / "aiotier_bench" / "suite.py").is_file():
        sys.path.insert(0, str(folder))
        return importlib.import_module("aiotier_bench.suite")
    raise SystemExit(
        "aiotier bench: the benchmark suite is not installed; it lives in the benchmarks/ "
        "folder of aiotier's repository. In a clone, `pip install -e '.[bench]'` runs it from "
        "there, or `pip install ./benchmarks` installs it (the aiotier-bench distribution)."
    )


def _bench(argv: list[str]) -> int:
    return int(bench_suite().main(argv, prog="aiotier bench"))


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

    sub.add_parser(
        "bench", help="run the benchmark suite (from a clone, or pip install ./benchmarks)",
        add_help=False,  # its options, --help included, are the suite's own
    )  # fmt: skip

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
    args, extra = ap.parse_known_args(argv)
    if args.command != "bench" and extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    from .errors import TieringError

    try:
        return _bench(extra) if args.command == "bench" else int(args.fn(args))
    except (TieringError, OSError, ImportError) as exc:  # ImportError: an extra is missing
        print(f"aiotier {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
