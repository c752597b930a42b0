"""The command line and the examples, run as a user runs them (subprocesses, real files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env=env, check=False,
    )  # fmt: skip


def test_quickstart_runs_as_written() -> None:
    out = run("examples/quickstart.py")
    assert out.returncode == 0, out.stderr
    assert "after the promotion: HIT" in out.stdout


def test_demo_prints_a_summary_and_writes_json(tmp_path: Path) -> None:
    report = tmp_path / "demo.json"
    out = run("-m", "aiotier", "demo", "--steps", "30", "--requests", "120",
              "--ssd-dir", str(tmp_path / "ssd"), "--json", str(report))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "hit" in out.stdout and "dropped" in out.stdout and "primary" in out.stdout
    data = json.loads(report.read_text())
    assert set(data["tiers"]) == {"primary", "memory", "ssd"}
    assert data["tiers"]["primary"]["lookups"] > 0
    assert data["ended"] == "steps"
    assert all(t["errors"] == 0 for t in data["tiers"].values())
    # the SSD directory given on the command line is kept, and inspect reads it
    inspect = run("-m", "aiotier", "inspect", str(tmp_path / "ssd"), "--json")
    assert inspect.returncode == 0, inspect.stderr
    summary = json.loads(inspect.stdout)
    assert summary["format"] == 2
    assert summary["torn_slots"] == 0
    assert summary["index_from"] == "checkpoint"  # the demo closed its tiers cleanly
    assert summary["blocks"] + summary["free_slots"] == summary["slots"] > 0
    assert summary["allocated_bytes"] >= summary["file_bytes"] == summary["slots"] * summary[
        "slot_size"
    ]
    assert summary["last_start"] in ("new", "clean", "crash")


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--steps", "0"], "demo.steps"),
        (["--duration", "0"], "demo.duration"),
        (["--duration", "5", "--steps", "10"], "demo.duration"),
        (["--rate", "-1"], "demo.rate"),
    ],
)
def test_demo_rejects_bad_options(argv: list[str], field: str) -> None:
    out = run("-m", "aiotier", "demo", *argv)
    assert out.returncode != 0
    assert field in out.stderr
    assert "Traceback" not in out.stderr


def test_bench_quick_writes_every_case(tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    out = run("-m", "aiotier", "bench", "--quick", "--json", str(report), timeout=600)
    assert out.returncode == 0, out.stderr
    doc = json.loads(report.read_text())
    assert doc["machine"]["cpus"] >= 1
    names = {c["name"] for c in doc["cases"]}
    assert {"lookup_hit", "lookup_prefix", "scale", "memory", "memory_promote",
            "metrics_overhead", "ssd_promote", "ssd_demote", "redis_promote",
            "object_promote", "loop_lag", "cache_hit", "cache_stampede", "cache_large_value",
            "cache_ttl", "cache_write_through",
            "trace", "trace_tiered"} <= names  # fmt: skip
    for c in doc["cases"]:
        assert c["unit"] and isinstance(c["higher_is_better"], bool)
        if not c.get("skipped"):
            assert c["aiotier"] > 0
    # the noise-free figures are there (their values are not asserted: no timed assertions)
    promote = [c for c in doc["cases"] if c["name"] == "memory_promote"]
    assert {c["params"]["request_context"] for c in promote} == {True, False}
    assert all(c["python_calls_per_block"] > 0 for c in promote)
    (metrics,) = [c for c in doc["cases"] if c["name"] == "metrics_overhead"]
    assert metrics["sdk_calls_per_step"] > 0 and "flush_share" in metrics
    scale = [c for c in doc["cases"] if c["name"] == "scale"]
    assert {c["params"]["access"] for c in scale} == {"uniform", "hot_1000"}
    assert all(c["floor"]["value"] > 0 for c in scale)


def test_bench_case_names_match_the_suite() -> None:
    from aiotier_bench import CASE_GROUPS, cache, core, ssd

    assert tuple(core.CASES) == CASE_GROUPS["core"]
    assert tuple(ssd.CASES) == CASE_GROUPS["ssd"]
    assert CASE_GROUPS["cache"] == cache.CASE_NAMES


def test_bench_runs_chosen_cases_without_the_bench_extra(tmp_path: Path) -> None:
    """``--case`` runs only those; missing peers (diskcache, aiocache, redis-py, matplotlib) are
    left out with a note naming the extra, never a ModuleNotFoundError."""
    report = tmp_path / "bench.json"
    code = (
        "import sys\n"
        "for m in ('diskcache', 'aiocache', 'redis', 'matplotlib'): sys.modules[m] = None\n"
        "from aiotier.cli import main\n"
        f"sys.exit(main(['bench', '--quick', '--json', {str(report)!r}, "
        f"'--plot', {str(tmp_path / 'plot.png')!r}, '--case', 'lookup_hit', "
        "'--case', 'ssd_demote', '--case', 'redis_promote']))\n"
    )
    out = run("-c", code)
    assert out.returncode == 0, out.stderr
    assert "pip install 'aiotier[bench]'" in out.stderr
    assert "ModuleNotFoundError" not in out.stderr
    doc = json.loads(report.read_text())
    assert {c["name"] for c in doc["cases"]} == {"lookup_hit", "ssd_demote", "redis_promote"}
    for c in doc["cases"]:
        assert c["peer"] is None
    (redis_case,) = [c for c in doc["cases"] if c["name"] == "redis_promote"]
    assert "aiotier[bench]" in redis_case["skipped"]


@pytest.mark.parametrize("argv", [["inspect", "/nonexistent/aiotier"], ["nope"]])
def test_cli_errors_are_clear(argv: list[str]) -> None:
    out = run("-m", "aiotier", *argv)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr


def test_version_is_the_installed_one() -> None:
    import aiotier

    out = run("-m", "aiotier", "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"aiotier {aiotier.__version__}"


def test_help_is_plain_text_and_explains_every_option() -> None:
    import argparse

    from aiotier.cli import build_parser
    from aiotier_bench.suite import build_parser as bench_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, p in [("aiotier", parser), *sub.choices.items(), ("bench", bench_parser())]:
        unexplained = [a.dest for a in p._actions if not a.help and a is not sub]
        assert not unexplained, f"{name}: options without a help text: {unexplained}"
        text = p.format_help()
        assert "``" not in text and ":class:" not in text, text


def test_demo_config_applies_the_engine_table_and_refuses_tiers(tmp_path: Path) -> None:
    config = tmp_path / "demo.toml"
    config.write_text('[engine.admission]\nmemory = "after:1000000"\n')
    report = tmp_path / "demo.json"
    out = run("-m", "aiotier", "demo", "--steps", "20", "--requests", "200", "--primary-mib",
              "1", "--config", str(config), "--json", str(report))  # fmt: skip
    assert out.returncode == 0, out.stderr
    tiers = json.loads(report.read_text())["tiers"]
    assert tiers["memory"]["written_mib"] == 0 < tiers["primary"]["evictions"]  # none admitted

    config.write_text("[engine]\npromotion_timeout = -1\n")
    out = run("-m", "aiotier", "demo", "--config", str(config))
    assert out.returncode == 2 and "promotion_timeout must be > 0" in out.stderr
    config.write_text('[[tiers]]\ntype = "memory"\ncapacity_bytes = 1024\n')
    out = run("-m", "aiotier", "demo", "--config", str(config))
    assert out.returncode == 2 and "the demo builds its own primary and tiers" in out.stderr


def test_a_failed_demo_leaves_no_temporary_directory(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "aiotier", "demo", "--s3", "http://127.0.0.1:1/"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []


def test_bench_is_found_in_the_clone_and_says_how_to_install_it_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aiotier
    from aiotier.cli import bench_suite

    assert not (Path(aiotier.__file__).parent / "bench").exists()  # not shipped in the package
    out = run("-m", "aiotier", "bench", "--help")
    assert out.returncode == 0 and "usage: aiotier bench" in out.stdout, out.stderr
    assert "--case NAME" in out.stdout
    for name in ("aiotier_bench", "aiotier_bench.suite"):
        monkeypatch.setitem(sys.modules, name, None)  # neither installed...
    with pytest.raises(SystemExit, match=r"pip install \./benchmarks"):
        bench_suite(search=tmp_path)  # ...nor in this folder
